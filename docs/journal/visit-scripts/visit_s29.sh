# session 29 (prepared without a GPU; the session's device time was spent): issue 25's benchmark
# with every request admitted at once.
#   PART=wide  the seed benchmark (Qwen3-8B shape, 1000 x 100 greedy): matched arms at max_batch 256
#              (cold, warm) and at max_batch 1024 (vLLM's max_num_seqs on GPUs of >= 70 GB), the
#              latter timed over all 1000 after a run that fills the kernel cache for its tiles;
#              the completions of max_batch 256 and 1024 compared as bits (batch invariance at 8B)
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
case ${PART:-wide} in
wide)
  SEED_ARMS="${SEED_ARMS:-matched-cold matched-warm wide-warm}" O=$O/seed bash experiments/seed_bench.sh qwen3-8b ${SEED_N:-1000} 100 256 2>&1 | tail -9
  grep "steady state\|sample-timing\|memory plan" $O/seed/seed-*.log ;;
esac
