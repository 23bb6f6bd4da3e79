# session 22: issue 24's workloads at a real shape, and where issue 25's checkpoint load spends its time.
#   PART=recipes  Qwen3-0.6B-shaped chat checkpoint + verl-layout parquet: GRPO with the math verifier,
#                 then GRPO, Dr. GRPO, DAPO, GSPO with a Python reward, 3 steps each (experiments/rl_recipes.sh)
#   PART=load     the 8B-shaped checkpoint (4 shards) made with transformers, then `lockstep bench --load-bench`:
#                 the memory-mapped load, staged by cubecl or copied by the driver, 1-8 threads, split by phase,
#                 fingerprints compared (run before and after the dtype fix in load.rs)
#   PART=seed     issue 25's benchmark after the load fix: SEED_ARMS="matched-cold matched-warm transformers"
#   PART=save     the 0.6B checkpoint write (7.2 GB of f32 masters and AdamW moments) by the previous binary
#                 (.gpu/lockstep-oldsave.gz) and the pipelined writer, same run settings; the files compared
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
save)
  ck=/tmp/checkpoints/qwen3-0.6b
  [ -f $ck/config.json ] || python3 experiments/make_real_shape.py qwen3-0.6b $ck > $O/make-qwen3-0.6b.log 2>&1 || exit 1
  gunzip -c .gpu/lockstep-oldsave.gz > /tmp/lockstep-oldsave && chmod +x /tmp/lockstep-oldsave
  for bin in lockstep-oldsave lockstep; do
    rm -rf /tmp/runs/save-$bin
    /tmp/$bin train configs/qwen3-0.6b.toml --set model.path=$ck --set task.path=$ck/task.jsonl --set train.steps=1 \
      --set train.prompts_per_step=2 --set train.group_size=4 --set sampler.max_new_tokens=64 --set sampler.context=192 \
      --set sampler.max_batch=8 --set sampler.kv_budget_mib=0 --set task.reward=char_f1 --set train.final_checkpoint=true \
      --set log.runs_dir=/tmp/runs --set log.run_name=save-$bin --set log.tensorboard=false > $O/save-$bin.log 2>&1
    echo "$bin: exit $? $(grep '^checkpoint ' $O/save-$bin.log)"
  done
  for f in model.safetensors optimizer.safetensors; do
    cmp /tmp/runs/save-lockstep-oldsave/checkpoints/step-000001/$f /tmp/runs/save-lockstep/checkpoints/step-000001/$f && echo "$f: identical bytes"
  done ;;
seed)
  SEED_ARMS="matched-cold matched-warm transformers" O=$O bash experiments/seed_bench.sh 2>&1 | tail -14
  grep -h "^weights:" $O/seed-matched-*.log ;;
esac
