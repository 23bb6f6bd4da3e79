# session 42: the seed benchmark with a fast arm that no host launch bounds (issue 25).
#   PART=seed   experiments/seed_bench.sh with SEED_ARMS (default: matched cold and warm, the
#               graphs arm, lockstep's fast ablation, transformers, and the torch reference arm:
#               cuBLAS, flash SDPA, compiled norms, every decode step a CUDA graph)
set -u
O=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $O/gpu.txt
for part in ${PART:-seed}; do case $part in
seed)
  mkdir -p $O/seed
  SEED_ARMS="${SEED_ARMS:-matched-cold matched-warm graphs-warm fast-warm transformers torch-graphs}" O=$O/seed bash experiments/seed_bench.sh 2>&1 | tail -30
  grep -h "check against\|compiled ops\|torch.compile failed\|Error\|error" $O/seed/seed-torch-graphs.log | head -8
  tar -czf $O/seed.tgz -C $O seed && rm -rf $O/seed ;;
esac; done
