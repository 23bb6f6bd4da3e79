# session 28: issue 25's steady state (Qwen3-8B shape, 1000 x 100 greedy, batches of 256).
#   PART=seed-profile  the seed benchmark's matched arms (cold, warm; host view per engine step),
#                      then one warm run with cubecl's profiler: kernels by GPU time
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
tiles)
  for spec in ${TILE_SPECS:-qwen3-8b:256,8192 qwen3-1.7b:256,16384 qwen3-0.6b:256,16384}; do
    LOCKSTEP_KERNEL_CACHE=/tmp/tile-cache timeout ${TILE_LIMIT:-200} /tmp/lockstep bench --preset ${spec%%:*} --dtype bf16 --tile-sweep --matmul-m ${spec#*:} --repeats 5 > $O/tiles-${spec%%:*}.md 2> $O/tiles-${spec%%:*}.err
    echo "$spec rc $?"; grep "tile-sweep\|rror" $O/tiles-${spec%%:*}.err
  done ;;
esac
