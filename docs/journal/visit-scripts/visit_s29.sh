# session 29 (prepared without a GPU; the session's device time was spent): issue 25's benchmark
# with every request admitted at once.
#   PART=wide  the seed benchmark (Qwen3-8B shape, 1000 x 100 greedy): matched arms at max_batch 256
#              (cold, warm) and at max_batch 1024 (vLLM's max_num_seqs on GPUs of >= 70 GB), the
#              latter timed over all 1000 after a run that fills the kernel cache for its tiles;
#              the completions of max_batch 256 and 1024 compared as bits (batch invariance at 8B)
#   PART=graphs the engine checks with LOCKSTEP_DECODE_GRAPHS=on (the CUDA capture, bits), then 0.6B
#              decode with steps replayed as graphs against launched steps in one run
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
case ${PART:-wide} in
wide)
  SEED_ARMS="${SEED_ARMS:-matched-cold matched-warm wide-warm}" O=$O/seed bash experiments/seed_bench.sh qwen3-8b ${SEED_N:-1000} 100 256 2>&1 | tail -9
  grep "steady state\|sample-timing\|memory plan" $O/seed/seed-*.log ;;
graphs)
  # does the CUDA capture succeed, and are replayed steps launched steps as bits (the engine
  # checks with the variable on), then decode tok/s and host time a step, graphs against launches
  LOCKSTEP_DECODE_GRAPHS=on timeout ${CHECK_LIMIT:-300} /tmp/lockstep check --preset small --dtypes f32,bf16 2>&1 | tee $O/check-graphs.md | tail -20
  timeout ${BENCH_LIMIT:-300} /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency 16,64,256 --prompt-len 32 \
      --new-tokens 128 --kernels matched,graphs --skip-ops --repeats 3 2>&1 | grep "^|\|bench:\|rror\|warning" ;;
esac
