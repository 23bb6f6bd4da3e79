# session 37: the attention backward's softmax statistics from the training forward
# (LOCKSTEP_BACKWARD_STATS=forward, the default) instead of the backward's own pass over the keys.
#   PART=battery  the battery (bf16): the new group `attention backward statistics` (statistics and
#                 dQ/dK/dV from the forward = recomputed, as bits; the forward writing them = the
#                 sampler's forward) and every other row
#   PART=boundaries  --boundaries-only (bf16): among them a 6,000-token sequence's attention gradients
#                 alone = between neighbours, now through the forward that writes the statistics
#   PART=ab       the 1.7B update (4 x 4,096) with LOCKSTEP_BACKWARD_STATS=recompute and forward,
#                 alternating, one binary
#   PART=profile  cubecl's per-kernel profile of the same update (MmaBackwardQueryKernel was 4674 µs
#                 a launch, MmaFlashKernel 3457, session 36 v9)
#   PART=rung17   the 1.7B rung's step 0 (256 x 4,096): weights 4ff415b8dedb1350 if no bit moved
#   PART=fastmath the next visit's (not run in session 37): LOCKSTEP_BACKWARD_MATH=fast, the backward's
#                 probabilities by ex2.approx and a reciprocal (other gradient bits): the battery
#                 group `attention backward fast math` (bits alone = in a launch, 2% accuracy),
#                 then the 1.7B update exact / fast / exact / fast
#   PART=rung06   the 0.6B rung's step 0 (512 x 2,048): weights ef4829e7211e1545
#   PART=rung4    the 4B full-parameter rung's step 0 (recomputed layers: the statistics come from
#                 the recomputed forward): weights 29f943f40ec64c89
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
fields='"trainer_weights_fingerprint":"[0-9a-f]*"\|"bit_equal_frac":[0-9.]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*\|"grad_norm":[0-9.]*\|"step_s":[0-9.]*'
for part in ${PART:-battery}; do case $part in
battery)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${BATTERY_LIMIT:-300} /tmp/lockstep-battery --dtypes bf16 > $O/battery.md 2>&1; echo "battery rc $?: $(grep -c '| yes |' $O/battery.md) rows identical, $(grep -ci '| no |' $O/battery.md) not"
  grep -i "statistics\|checks bit-identical\|error" $O/battery.md | head -14 ;;
boundaries)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${BOUNDARY_LIMIT:-500} /tmp/lockstep-battery --boundaries-only --dtypes bf16 > $O/boundaries.md 2>&1; echo "boundaries rc $?"
  grep -i "attention\|checks bit-identical\|error" $O/boundaries.md | head -14 ;;
fastmath)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${BATTERY_LIMIT:-300} /tmp/lockstep-battery --dtypes bf16 > $O/battery-fast.md 2>&1; echo "battery rc $?: $(grep -c '| yes |' $O/battery-fast.md) rows identical, $(grep -ci '| no |' $O/battery-fast.md) not"
  grep -i "fast\|checks bit-identical\|error" $O/battery-fast.md | head -6
  for v in exact fast exact fast; do
    echo "### LOCKSTEP_BACKWARD_MATH=$v"; LOCKSTEP_BACKWARD_MATH=$v timeout 120 /tmp/lockstep bench --preset qwen3-1.7b --dtype bf16 --concurrency none --trainer-only --trainer-batches 4 --trainer-len 4096 --repeats 2 2>&1 | grep "^| 4\|rror"
  done | tee $O/fast-ab.md ;;
ab)
  for v in ${AB_ORDER:-recompute forward recompute forward}; do
    echo "### LOCKSTEP_BACKWARD_STATS=$v"; LOCKSTEP_BACKWARD_STATS=$v timeout 120 /tmp/lockstep bench --preset qwen3-1.7b --dtype bf16 --concurrency none --trainer-only --trainer-batches 4 --trainer-len 4096 --repeats 2 2>&1 | grep "^| 4\|rror"
  done | tee $O/stats-ab.md ;;
profile)
  UPDATE_SHAPES="qwen3-1.7b:4x4096" UPDATE_LIMIT=120 OUT=$O/profile bash experiments/gpu_visit.sh profile-update > /dev/null 2>&1
  sed -n 1,14p $O/profile/profile-update.md ;;
rung17)
  SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=61500 --set train.on_mismatch=stop" SCALE_ARGS="--max-steps ${STEPS:-1}" \
    O=$O/rung17 SCALE_LIMIT=${RUNG_LIMIT:-420} bash experiments/scale.sh qwen3-1.7b:256x4096:8:16384 2>&1 | tail -1
  grep -o "$fields" $O/rung17/*.metrics.jsonl | tr '\n' ' '; echo
  echo "peak memory MiB: $(sort -n $O/rung17/*.mem | tail -1)" ;;
rung06)
  SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=62000 --set sampler.max_batch=256 --set train.on_mismatch=stop" SCALE_ARGS="--max-steps ${STEPS:-1}" \
    O=$O/rung06 SCALE_LIMIT=${RUNG_LIMIT:-300} bash experiments/scale.sh qwen3-0.6b:512x2048:8:16384 2>&1 | tail -1
  grep -o "$fields" $O/rung06/*.metrics.jsonl | tr '\n' ' '; echo
  echo "peak memory MiB: $(sort -n $O/rung06/*.mem | tail -1)" ;;
rung4)
  SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=42000 --set sampler.max_batch=128 --set train.recompute_layers=true --set train.on_mismatch=stop" \
    SCALE_ARGS="--max-steps ${STEPS:-1}" O=$O/rung4 SCALE_LIMIT=${RUNG_LIMIT:-300} bash experiments/scale.sh qwen3-4b:128x2048:8:8192 2>&1 | tail -1
  grep -o "$fields" $O/rung4/*.metrics.jsonl | tr '\n' ' '; echo
  echo "peak memory MiB: $(sort -n $O/rung4/*.mem | tail -1)" ;;
esac; done
tar -C $O -czf /tmp/visit.tgz . && mv /tmp/visit.tgz $O/visit.tgz
