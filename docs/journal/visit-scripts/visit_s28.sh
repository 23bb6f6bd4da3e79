# session 28: issue 25's steady state (Qwen3-8B shape, 1000 x 100 greedy, batches of 256).
#   PART=seed-profile  the seed benchmark's matched arms (cold, warm; host view per engine step),
#                      then one warm run with cubecl's profiler: kernels by GPU time
#   PART=ab            the waves tile rule against the coverage rule (LOCKSTEP_WGMMA_PICK) in one visit:
#                      the seed benchmark's matched arms (bits compared), 1.7B decode at 256 rows,
#                      then the battery (every tile either rule picks = tc-tiles, as bits)
#   PART=rung17        step 0 of the 1.7B 256 x 4096 rung with session 27's settings (its weights after
#                      step 0: 4ff415b8dedb1350), on the waves tile rule
#   PART=tiles         every warpgroup matmul tile at the 8B, 1.7B and 0.6B projection shapes
#                      (decode M = 256, prefill / training M), bits checked against the pick
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
case ${PART:-seed-profile} in
seed-profile)
  SEED_ARMS="${SEED_ARMS:-matched-cold matched-warm}" O=$O/seed bash experiments/seed_bench.sh qwen3-8b ${SEED_N:-1000} 100 256 2>&1 | tail -8
  grep "steady state\|sample-timing" $O/seed/seed-matched-*.log
  d=/tmp/profile-seed; rm -rf $d; mkdir -p $d
  printf '[profiling.logger]\nlevel = "basic"\nfile = "%s/profile.log"\n' "$d" > $d/cubecl.toml
  head -${PROFILE_N:-512} /tmp/seed-prompts.jsonl > /tmp/seed-prompts-profile.jsonl
  (cd $d && LOCKSTEP_KERNEL_CACHE=/tmp/seed-kernel-cache timeout ${PROFILE_LIMIT:-200} /tmp/lockstep sample --set model.path=/tmp/checkpoints/qwen3-8b --set model.dtype=bf16 \
     --set sampler.input=/tmp/seed-prompts-profile.jsonl --set sampler.output=/tmp/seed-profile.jsonl --set sampler.max_new_tokens=100 \
     --set sampler.temperature=0 --set sampler.max_batch=256 --set sampler.context=164 --set log.progress=false 2>&1 | tail -4)
  python3 experiments/profile_summary.py $d/profile.log --top 30 | tee $O/seed-profile.md
  ls -la $d | head ;;
ab)
  SEED_ARMS="matched-cold matched-warm coverage-warm" O=$O/seed bash experiments/seed_bench.sh qwen3-8b 1000 100 256 2>&1 | tail -9
  grep "steady state" $O/seed/seed-*.log
  for pick in waves coverage; do
    echo "### 1.7B decode, 256 requests x (32 + 128), LOCKSTEP_WGMMA_PICK=$pick"
    LOCKSTEP_WGMMA_PICK=$pick timeout ${DECODE_LIMIT:-120} /tmp/lockstep bench --preset qwen3-1.7b --dtype bf16 --concurrency 256 --prompt-len 32 --new-tokens 128 --kernels matched --skip-ops --repeats 3 2>&1 | grep "^|\|bench:\|rror"
  done
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${BATTERY_LIMIT:-240} /tmp/lockstep-battery --dtypes f32,bf16 > $O/battery.md 2>&1; echo "battery rc $?"
  grep -c "| yes |" $O/battery.md; grep "wgmma" $O/battery.md | head -30; grep -i "| no |" $O/battery.md | head ;;
rung17)
  set_="--set task.reward=char_f1 --set sampler.kv_budget_mib=61500 --set train.on_mismatch=stop"
  SCALE_SET="$set_" SCALE_ARGS="--max-steps 1" O=$O SCALE_LIMIT=${LIMIT:-480} bash experiments/scale.sh qwen3-1.7b:256x4096:8:16384 2>&1 | tail -1
  python3 -c "
import json,sys
for x in map(json.loads, open(sys.argv[1])):
    t=x['timing']; a=x['agreement']
    print('step', x['step'], 'fp', x['trainer_weights_fingerprint'], 'sampler_fp', x['sampler_weights_fingerprint'], 'bit_equal', a['bit_equal_frac'], 'kl_k1', a['kl_k1'], 'tokens', a['tokens'], 'gen', round(t['gen_s'],1), 'launch', round(t['gen_launch_s'],1), 'wait', round(t['gen_wait_s'],1), 'steps', t['gen_engine_steps'], 'preempted', t['gen_preempted'], 'update', round(t['update_s'],1), 'step_s', round(x['step_s'],1))
" $O/qwen3-1.7b-256x4096-mb16384.metrics.jsonl
  echo "peak memory MiB: $(sort -n $O/qwen3-1.7b-256x4096-mb16384.mem | tail -1)" ;;
tiles)
  for spec in ${TILE_SPECS:-qwen3-8b:256,8192 qwen3-1.7b:256,16384 qwen3-0.6b:256,16384}; do
    LOCKSTEP_KERNEL_CACHE=/tmp/tile-cache timeout ${TILE_LIMIT:-200} /tmp/lockstep bench --preset ${spec%%:*} --dtype bf16 --tile-sweep --matmul-m ${spec#*:} --repeats 5 > $O/tiles-${spec%%:*}.md 2> $O/tiles-${spec%%:*}.err
    echo "$spec rc $?"; grep "tile-sweep\|rror" $O/tiles-${spec%%:*}.err
  done ;;
esac
