# session 22: issue 24's workloads at a real shape, and where issue 25's checkpoint load spends its time.
#   PART=recipes  Qwen3-0.6B-shaped chat checkpoint + verl-layout parquet: GRPO with the math verifier,
#                 then GRPO, Dr. GRPO, DAPO, GSPO with a Python reward, 3 steps each (experiments/rl_recipes.sh)
#   PART=load     the 8B-shaped checkpoint (4 shards) made with transformers, then `lockstep bench --load-bench`:
#                 the memory-mapped load, staged by cubecl or copied by the driver, 1-8 threads, split by phase,
#                 fingerprints compared (run before and after the dtype fix in load.rs)
#   PART=seed     issue 25's benchmark after the load fix: SEED_ARMS="matched-cold matched-warm transformers"
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
case ${PART:-recipes} in
recipes)
  O=$O RECIPE_LIMIT=${RECIPE_LIMIT:-150} bash experiments/rl_recipes.sh ${RECIPES:-} ;;
load)
  ck=/tmp/checkpoints/qwen3-8b
  t=$(date +%s)
  [ -f $ck/config.json ] || python3 experiments/make_real_shape.py qwen3-8b $ck > $O/make-qwen3-8b.log 2>&1 || { tail -3 $O/make-qwen3-8b.log; exit 1; }
  echo "8B checkpoint made in $(( $(date +%s) - t )) s: $(ls $ck | tr '\n' ' ')"
  free -g | head -2
  /tmp/lockstep bench --preset tiny --dtype bf16 --save-model $ck --load-bench 2>&1 | tee $O/load-bench.md | tail -12 ;;
seed)
  SEED_ARMS="matched-cold matched-warm transformers" O=$O bash experiments/seed_bench.sh 2>&1 | tail -14
  grep -h "^weights:" $O/seed-matched-*.log ;;
esac
