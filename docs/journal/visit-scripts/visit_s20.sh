# session 20 visit: issue 21's target rung (0.6B 512 x 2048) for the 8 steps a rung the issue asks for, in
# three back-to-back calls of one warm machine (10 minutes a call): steps 0-2 from scratch, then steps 3-5
# and 6-7, each resumed from the previous call's checkpoint. Session 17 ran steps 0-2 in one process:
# weights ef4829e7211e1545, 735502562a50689a, aa68a8bf6d82e804. Each call must follow the previous one
# within the machine's 30-s idle release (the checkpoint lives on that machine only): the first
# attempt's continuation was lost that way.
#   PART=rung1 | rung2 | rung3
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
part=${PART:-rung1}
set_="--set task.reward=char_f1 --set sampler.kv_budget_mib=62000 --set sampler.max_batch=256 --set train.final_checkpoint=true --set train.on_mismatch=stop"
case $part in
rung1) SCALE_SET="$set_" SCALE_ARGS="--max-steps 3" O=$O SCALE_LIMIT=570 bash experiments/scale.sh qwen3-0.6b:512x2048:8:16384 2>&1 | tail -1 ;;
rung2) SCALE_SET="$set_" SCALE_ARGS="--max-steps 3" SCALE_RESUME=1 O=$O SCALE_LIMIT=570 bash experiments/scale.sh qwen3-0.6b:512x2048:8:16384 2>&1 | tail -1 ;;
rung3) SCALE_SET="$set_" SCALE_ARGS="--max-steps 2" SCALE_RESUME=1 O=$O SCALE_LIMIT=570 bash experiments/scale.sh qwen3-0.6b:512x2048:8:16384 2>&1 | tail -1 ;;
esac
grep "resuming\|checkpoint \|^step" $O/qwen3-0.6b-512x2048-mb16384.log | head -12
python3 -c "
import json,sys
for x in map(json.loads, open(sys.argv[1])):
    t=x['timing']; a=x['agreement']
    print('step', x['step'], 'fp', x['trainer_weights_fingerprint'], 'sampler_fp', x['sampler_weights_fingerprint'], 'grad_norm', x['grad_norm'], 'bit_equal', a['bit_equal_frac'], 'kl_k1', a['kl_k1'], 'tokens', a['tokens'], 'gen', round(t['gen_s'],1), 'logprob', round(t['logprob_s'],1), 'update', round(t['update_s'],1), 'sync', round(t['sync_s'],2), 'step_s', round(x['step_s'],1))
" $O/qwen3-0.6b-512x2048-mb16384.metrics.jsonl
echo "peak memory MiB: $(sort -n $O/qwen3-0.6b-512x2048-mb16384.mem | tail -1)"
