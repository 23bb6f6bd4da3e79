# session 34: what the update's small kernels cost at the 1.7B rung's micro-batch, then the logits kernels.
#   PART=profile  the 1.7B update (4 x 4,096) by kernel (cubecl's profiler, top 45), then ncu GPU
#                 times of the logits kernels (logprob, its gradient, casts) in the same bench, and
#                 the logprob rows of the ops bench (1-1,024 rows of the full vocabulary)
#   PART=ncuall   ncu's GPU time of every kernel of the same bench (one warm-up update and one timed)
#   PART=battery  the whole battery (f32, bf16), with the fused backward group at a real MLP shape
#   PART=swiglu1  the 1.7B update, the previous build (.gpu/lockstep-base.gz) and this one alternating
#   PART=rung     the 0.6B rung's step 0 (512 x 2048): weights ef4829e7211e1545 if the update's bits held
#   PART=rung17   the 1.7B rung's step 0 (256 x 4,096): weights 4ff415b8dedb1350 if the update's bits held
#   PART=rung4    (not run: no device time left) the 4B rung's step 0: weights 29f943f40ec64c89 if the bits held
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
case ${PART:-profile} in
profile)
  UPDATE_SHAPES="qwen3-1.7b:4x4096" UPDATE_LIMIT=120 OUT=$O/profile bash experiments/gpu_visit.sh profile-update > /dev/null 2>&1
  sed -n 1,60p $O/profile/profile-update.md
  timeout ${NCU_LIMIT:-200} ncu --clock-control none --kernel-name regex:'logprob|cast_element|row_sum|fold' --launch-count ${NCU_COUNT:-60} \
    --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed --csv \
    /tmp/lockstep bench --preset qwen3-1.7b --dtype bf16 --concurrency none --trainer-only --trainer-batches 4 --trainer-len 4096 --repeats 1 > $O/ncu-logits.csv 2> $O/ncu-logits.err
  echo "ncu rc $?"; python3 - $O/ncu-logits.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; rows = rows[1:]
ki, mi, vi = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
ii = head.index("ID")
by = collections.defaultdict(dict)
for r in rows:
    by[(r[ii], r[ki][:60])][r[mi]] = r[vi]
for (i, k), m in sorted(by.items(), key=lambda x: int(x[0][0])):
    print(i, k, m.get("gpu__time_duration.sum"), m.get("launch__grid_size"), m.get("launch__block_size"), m.get("launch__registers_per_thread"), m.get("sm__warps_active.avg.pct_of_peak_sustained_active"), m.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"))
PY
  tail -3 $O/ncu-logits.err
  timeout 120 /tmp/lockstep bench --preset qwen3-1.7b --dtype bf16 --concurrency none --no-burn --repeats 5 --memory-only 2>&1 | grep "hbm read\|logprob\|rror" > $O/logprob-rows.md; cat $O/logprob-rows.md
  tar -C $O -czf /tmp/profile.tgz . && mv /tmp/profile.tgz $O/profile.tgz ;;
ncuall)
  timeout ${NCU_LIMIT:-450} ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    /tmp/lockstep bench --preset qwen3-1.7b --dtype bf16 --concurrency none --trainer-only --trainer-batches 4 --trainer-len 4096 --repeats 1 > $O/ncu-update.csv 2> $O/ncu-update.err
  echo "ncu rc $?"; tail -3 $O/ncu-update.err
  python3 experiments/ncu_summary.py $O/ncu-update.csv --top 45 | tee $O/ncu-update.md
  python3 experiments/ncu_summary.py $O/ncu-update.csv --grids --top 80 > $O/ncu-update-grids.md
  xz -9 $O/ncu-update.csv
  tar -C $O -czf /tmp/ncuall.tgz . && mv /tmp/ncuall.tgz $O/ncuall.tgz ;;
battery)
  # the whole battery (f32, bf16), with the fused backward group at a real MLP shape
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${BATTERY_LIMIT:-300} /tmp/lockstep-battery --dtypes f32,bf16 > $O/battery.md 2>&1; echo "battery rc $?: $(grep -c '| yes |' $O/battery.md) rows identical, $(grep -ci '| no |' $O/battery.md) not"
  grep -i "backward .*launch\|checks bit-identical\|error" $O/battery.md | head
  tar -C $O -czf /tmp/battery.tgz . && mv /tmp/battery.tgz $O/battery.tgz ;;
swiglu1)
  # the 1.7B update with the previous build (.gpu/lockstep-base.gz) and this one, alternating
  gunzip -c .gpu/lockstep-base.gz > /tmp/lockstep-base && chmod +x /tmp/lockstep-base
  for b in ${AB_ORDER:-base lockstep base lockstep}; do
    echo "### $b"; timeout 120 /tmp/${b/base/lockstep-base} bench --preset qwen3-1.7b --dtype bf16 --concurrency none --trainer-only --trainer-batches 4 --trainer-len 4096 --repeats 2 2>&1 | grep "^| 4\|rror"
  done | tee $O/update-ab.md
  tar -C $O -czf /tmp/swiglu1.tgz . && mv /tmp/swiglu1.tgz $O/swiglu1.tgz ;;
rung)
  # the 0.6B rung's step 0 (512 x 2048): the update's bits must leave ef4829e7211e1545
  SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=62000 --set sampler.max_batch=256 --set train.on_mismatch=stop" O=$O/rung \
    SCALE_LIMIT=${RUNG_LIMIT:-300} bash experiments/scale.sh qwen3-0.6b:512x2048:1:16384 2>&1 | tail -1
  grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"\|"bit_equal_frac":[0-9.]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*\|"grad_norm":[0-9.]*' $O/rung/*.metrics.jsonl | tr '\n' ' '; echo
  tar -C $O -czf /tmp/rung.tgz . && mv /tmp/rung.tgz $O/rung.tgz ;;
rung17)
  # the 1.7B rung's step 0 (256 x 4,096), session 27's settings: weights 4ff415b8dedb1350 if the
  # update's bits held
  SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=61500 --set train.on_mismatch=stop" SCALE_ARGS="--max-steps 1" \
    O=$O/rung17 SCALE_LIMIT=${RUNG_LIMIT:-400} bash experiments/scale.sh qwen3-1.7b:256x4096:8:16384 2>&1 | tail -1
  grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"\|"bit_equal_frac":[0-9.]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*\|"grad_norm":[0-9.]*' $O/rung17/*.metrics.jsonl | tr '\n' ' '; echo
  echo "peak memory MiB: $(sort -n $O/rung17/*.mem | tail -1)"
  tar -C $O -czf /tmp/rung17.tgz . && mv /tmp/rung17.tgz $O/rung17.tgz ;;
rung4)
  # not run in session 34 (no device time left): the 4B full-parameter rung's step 0 with
  # session 26's settings (recompute reruns the fused backwards): weights 29f943f40ec64c89
  SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=42000 --set sampler.max_batch=128 --set train.recompute_layers=true --set train.on_mismatch=stop" \
    SCALE_ARGS="--max-steps 1" O=$O/rung4 SCALE_LIMIT=${RUNG_LIMIT:-400} bash experiments/scale.sh qwen3-4b:128x2048:8:8192 2>&1 | tail -1
  grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"\|"bit_equal_frac":[0-9.]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*\|"grad_norm":[0-9.]*' $O/rung4/*.metrics.jsonl | tr '\n' ' '; echo
  tar -C $O -czf /tmp/rung4.tgz . && mv /tmp/rung4.tgz $O/rung4.tgz ;;
esac
