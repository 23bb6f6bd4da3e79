# session 27: the 1.7B 256 x 4096 rung for its 8 steps with admission that reserves every
# running answer's KV blocks (sampler.kv_reserve = 1, the new default: no preemption; session
# 25-26's runs admitted whenever a prompt fit and preempted 7,710 times a step).
#   PART=rung17 STEPS17=N [RESUME=1]  N more steps of the rung, in back-to-back calls of one warm
#                 machine (the checkpoint lives there only), each resumed from the previous call's
#                 checkpoint; on_mismatch=stop (no scoring pass); session 25's settings otherwise
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
case ${PART:-rung17} in
rung17)
  set_="--set task.reward=char_f1 --set sampler.kv_budget_mib=61500 --set train.final_checkpoint=true --set train.on_mismatch=stop"
  SCALE_SET="$set_" SCALE_ARGS="--max-steps ${STEPS17:-2}" SCALE_RESUME=${RESUME:-} O=$O SCALE_LIMIT=${LIMIT:-575} bash experiments/scale.sh qwen3-1.7b:256x4096:8:16384 2>&1 | tail -1
  grep "resuming\|checkpoint\|^step\|rror\|memory plan" $O/qwen3-1.7b-256x4096-mb16384.log | head -12
  python3 -c "
import json,sys
for x in map(json.loads, open(sys.argv[1])):
    t=x['timing']; a=x['agreement']
    print('step', x['step'], 'fp', x['trainer_weights_fingerprint'], 'sampler_fp', x['sampler_weights_fingerprint'], 'grad_norm', x['grad_norm'], 'bit_equal', a['bit_equal_frac'], 'kl_k1', a['kl_k1'], 'tokens', a['tokens'], 'gen', round(t['gen_s'],1), 'launch', round(t['gen_launch_s'],1), 'wait', round(t['gen_wait_s'],1), 'steps', t['gen_engine_steps'], 'preempted', t['gen_preempted'], 'update', round(t['update_s'],1), 'sync', round(t['sync_s'],2), 'step_s', round(x['step_s'],1))
" $O/qwen3-1.7b-256x4096-mb16384.metrics.jsonl
  echo "peak memory MiB: $(sort -n $O/qwen3-1.7b-256x4096-mb16384.mem | tail -1)" ;;
esac
