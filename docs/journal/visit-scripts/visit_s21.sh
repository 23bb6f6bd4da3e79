# prepared in session 20 for the next visit: the redesign's before/after proof on the H200 (issue 23) and
# the 4B rung for 8 steps (issue 21), in back-to-back calls of one warm machine (each call must follow the
# previous within the 30-s idle release: the checkpoint lives on that machine). Session 21: 4b2, called at
# once after 4b1, still reached a fresh machine (no checkpoint); a run that must continue is safer
# inside one 10-minute call (the 4B rung holds 7 steps from a cold start).
#   PART=verify  full battery (f32 + bf16), engine checks, the GPU quickstart vs session 18's metrics, then
#                with VERIFY_06B=1, 0.6B 512 x 2048 step 0 (weights must be ef4829e7211e1545, as in sessions 17, 19, 20)
#   PART=4b1     4B 128 x 2048 full-parameter, 8,192-token micro-batches with recomputation: steps 0-2 + checkpoint
#                (56 GB with AdamW: ~90 s to write)
#   PART=4b2     the same run resumed: steps 3-7, no final checkpoint (~81 s a step, session 18)
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
part=${PART:-verify}
fps() { python3 -c "
import json,sys
for x in map(json.loads, open(sys.argv[1])):
    t=x['timing']; a=x['agreement']
    print('step', x['step'], 'fp', x['trainer_weights_fingerprint'], 'grad_norm', x['grad_norm'], 'bit_equal', a['bit_equal_frac'], 'kl_k1', a['kl_k1'], 'tokens', a['tokens'], 'gen', round(t['gen_s'],1), 'update', round(t['update_s'],1), 'step_s', round(x['step_s'],1))" "$1"; }
case $part in
verify)
  # the 4B checkpoint for the next call, made beside the checks (they compare bits, not times)
  ( [ -f /tmp/checkpoints/qwen3-4b/config.json ] || python3 experiments/make_real_shape.py qwen3-4b /tmp/checkpoints/qwen3-4b > $O/make-qwen3-4b.log 2>&1 ) &
  maker=$!
  TOTAL_LIMIT=330 OUT=$O bash experiments/gpu_visit.sh battery-full check quickstart 2>&1 | grep -v "^|" | tail -12
  wait $maker; echo "4B checkpoint: $(ls /tmp/checkpoints/qwen3-4b 2>&1 | tr '\n' ' ')"
  [ "${VERIFY_06B:-0}" = 1 ] || { echo "0.6B step 0 skipped (VERIFY_06B=1 runs it; the 4B rung's step 0 checks real scale)"; exit 0; }
  set_="--set task.reward=char_f1 --set sampler.kv_budget_mib=62000 --set sampler.max_batch=256 --set train.on_mismatch=stop"
  SCALE_SET="$set_" SCALE_ARGS="--max-steps 1" O=$O SCALE_LIMIT=230 bash experiments/scale.sh qwen3-0.6b:512x2048:8:16384 2>&1 | tail -1
  fps $O/qwen3-0.6b-512x2048-mb16384.metrics.jsonl; echo "sessions 17, 19, 20: step 0 ef4829e7211e1545" ;;
4b1|4b2)
  set_="--set task.reward=char_f1 --set sampler.kv_budget_mib=42000 --set sampler.max_batch=128 --set train.recompute_layers=true --set train.on_mismatch=stop"
  if [ $part = 4b1 ]; then resume=""; steps=3; final=true; else resume=1; steps=5; final=false; fi
  SCALE_SET="$set_ --set train.final_checkpoint=$final" SCALE_ARGS="--max-steps $steps" SCALE_RESUME=$resume O=$O SCALE_LIMIT=570 bash experiments/scale.sh qwen3-4b:128x2048:8:8192 2>&1 | tail -1
  grep "resuming\|checkpoint " $O/qwen3-4b-128x2048-mb8192.log | head -3
  fps $O/qwen3-4b-128x2048-mb8192.metrics.jsonl
  [ $part = 4b1 ] && echo "sessions 17, 18 (before the redesign): step 0 29f943f40ec64c89 grad_norm 1.2121871899"
  echo "peak memory MiB: $(sort -n $O/qwen3-4b-128x2048-mb8192.mem | tail -1)" ;;
esac
