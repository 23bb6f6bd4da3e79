# session 25: the data-parallel commits of sessions 23-24 (gradient blocks, ZeRO-1, the stop
# signal, the mended accumulate) on the H200 at a real shape, on the one GPU this session has.
#   PART=verify   the battery's boundary rows, the engine checks, a 0.6B 16 x 1024 GRPO step
#                 against sessions 16-23's weights, then 0.6B 32 x 1024 with train.gradient_blocks=2
#                 as 1 rank, 2 ranks (ZeRO-1) and 2 ranks unsharded, the ranks as threads on this
#                 GPU (`lockstep train --ranks-in-threads N`): every rank's weights after each step
#   PART=profile17  the 1.7B update at the 1.7B 256 x 4096 rung's micro-batch (4 x 4,096 tokens):
#                 wall time, then kernels by GPU time (what holds the update's MFU at 13%)
#   PART=rung17 STEPS17=2 [RESUME=1]  the 1.7B 256 x 4096 target rung toward its 8 steps, in back-to-back
#                 calls of one warm machine (the checkpoint lives there only), each resumed from
#                 the previous call's checkpoint; on_mismatch=stop (no scoring pass)
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
case ${PART:-verify} in
verify)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout 150 /tmp/lockstep-battery --boundaries-only --dtypes bf16 > $O/battery.md 2>&1; echo "battery exit $?"; grep -i "identical\|differ\|rows" $O/battery.md | tail -3
  timeout 120 /tmp/lockstep check --preset small --dtypes bf16 > $O/check.md 2>&1; echo "check exit $?"; tail -3 $O/check.md
  SCALE_SET="--set task.reward=char_f1" SCALE_LIMIT=150 O=$O/grpo bash experiments/scale.sh qwen3-0.6b:16x1024:1 | tail -1
  python3 -c "import json,sys; [print({k: v for k, v in json.loads(l).items() if k in ('trainer_weights_fingerprint', 'grad_norm', 'step_s')}) for l in open(sys.argv[1])]" $O/grpo/*.metrics.jsonl
  ck=/tmp/checkpoints/qwen3-0.6b
  for spec in "1 true" "2 true" "2 false"; do
    set -- $spec
    t=$(date +%s)
    timeout 200 /tmp/lockstep train configs/qwen3-0.6b.toml --ranks-in-threads $1 --set model.path=$ck --set task.path=$ck/task.jsonl \
      --set train.prompts_per_step=2 --set train.group_size=16 --set train.steps=2 --set sampler.max_new_tokens=1024 --set sampler.context=1088 \
      --set sampler.max_batch=32 --set sampler.kv_budget_mib=0 --set train.micro_batch_tokens=4096 --set train.gradient_blocks=2 \
      --set train.shard_optimizer=$2 --set task.reward=char_f1 --set train.final_checkpoint=false --set train.checkpoint_every=0 \
      --set log.runs_dir=/tmp/runs-threads-$1-$2 --set log.tensorboard=false --set log.progress=false > $O/threads-$1-$2.log 2>&1
    echo "ranks $1 shard_optimizer $2: exit $? in $(( $(date +%s) - t )) s"; grep "^rank" $O/threads-$1-$2.log
    grep -v "^rank" $O/threads-$1-$2.log | grep -i "error\|panic" | head -3
  done ;;
profile17)
  UPDATE_SHAPES="${SHAPES17:-qwen3-1.7b:4x4096}" OUT=$O/profile bash experiments/gpu_visit.sh profile-update 2>&1 | tail -50 ;;
rung17)
  set_="--set task.reward=char_f1 --set sampler.kv_budget_mib=61500 --set train.final_checkpoint=true --set train.on_mismatch=stop"
  SCALE_SET="$set_" SCALE_ARGS="--max-steps ${STEPS17:-2}" SCALE_RESUME=${RESUME:-} O=$O SCALE_LIMIT=${LIMIT:-575} bash experiments/scale.sh qwen3-1.7b:256x4096:8:16384 2>&1 | tail -1
  grep "resuming\|checkpoint \|^step\|rror" $O/qwen3-1.7b-256x4096-mb16384.log | head -12
  python3 -c "
import json,sys
for x in map(json.loads, open(sys.argv[1])):
    t=x['timing']; a=x['agreement']
    print('step', x['step'], 'fp', x['trainer_weights_fingerprint'], 'sampler_fp', x['sampler_weights_fingerprint'], 'grad_norm', x['grad_norm'], 'bit_equal', a['bit_equal_frac'], 'kl_k1', a['kl_k1'], 'tokens', a['tokens'], 'gen', round(t['gen_s'],1), 'logprob', round(t['logprob_s'],1), 'update', round(t['update_s'],1), 'sync', round(t['sync_s'],2), 'step_s', round(x['step_s'],1))
" $O/qwen3-1.7b-256x4096-mb16384.metrics.jsonl
  echo "peak memory MiB: $(sort -n $O/qwen3-1.7b-256x4096-mb16384.mem | tail -1)" ;;
esac
