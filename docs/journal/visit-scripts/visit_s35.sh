# session 35 (no device lent): what the next visit runs first, on the build of session 35's HEAD.
#   PART=battery  the whole battery (f32, bf16): the fused backward group now also runs the per-head
#                 rmsnorm on the plane kernels (forward = cube kernel, backward = op chain) at
#                 4,096 x 16 x 128
#   PART=battery-planes  the battery (bf16) with LOCKSTEP_NORM_PLANES=on: every row, the model contract
#                 (sampler vs trainer logprobs) included, with the per-head norms on planes
#   PART=boundaries  --boundaries-only (bf16, f32): the one-launch backwards and the norm plane
#                 kernels across element 2^31 (never run on the H200 yet)
#   PART=planes   the 1.7B update (4 x 4,096) with LOCKSTEP_NORM_PLANES off and on, alternating in
#                 one process chain (same binary): the plane kernels against 26.6 ms of row cubes
#   PART=profile  cubecl's per-kernel profile of the same update with LOCKSTEP_NORM_PLANES=on: the plane
#                 kernels' µs a launch against session 34's v10 (RmsnormKernel 173.1, RmsnormBackwardKernel
#                 301.3 for the per-head rows), and the vectorised KV writes (WriteKvKernel 104.5 µs there)
#   PART=rung17   the 1.7B rung's step 0 (256 x 4,096) with LOCKSTEP_NORM_PLANES=on: weights
#                 4ff415b8dedb1350 if the plane kernels keep the bits end to end
#   PART=rung4    the 4B full-parameter rung's step 0 (recompute reruns the fused backwards):
#                 weights 29f943f40ec64c89 (session 34's PART=rung4, never run)
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
case ${PART:-battery} in
battery)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${BATTERY_LIMIT:-300} /tmp/lockstep-battery --dtypes f32,bf16 > $O/battery.md 2>&1; echo "battery rc $?: $(grep -c '| yes |' $O/battery.md) rows identical, $(grep -ci '| no |' $O/battery.md) not"
  grep -i "on planes\|checks bit-identical\|error" $O/battery.md | head
  tar -C $O -czf /tmp/battery.tgz . && mv /tmp/battery.tgz $O/battery.tgz ;;
battery-planes)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  LOCKSTEP_NORM_PLANES=on timeout ${BATTERY_LIMIT:-300} /tmp/lockstep-battery --dtypes bf16 > $O/battery-planes.md 2>&1; echo "battery (planes) rc $?: $(grep -c '| yes |' $O/battery-planes.md) rows identical, $(grep -ci '| no |' $O/battery-planes.md) not"
  grep -i "contract\|checks bit-identical\|error" $O/battery-planes.md | head
  tar -C $O -czf /tmp/battery-planes.tgz . && mv /tmp/battery-planes.tgz $O/battery-planes.tgz ;;
boundaries)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${BOUNDARY_LIMIT:-500} /tmp/lockstep-battery --boundaries-only --dtypes bf16,f32 > $O/boundaries.md 2>&1; echo "boundaries rc $?"
  grep -i "across element\|checks bit-identical\|error" $O/boundaries.md | head -14
  tar -C $O -czf /tmp/boundaries.tgz . && mv /tmp/boundaries.tgz $O/boundaries.tgz ;;
planes)
  for v in ${AB_ORDER:-off on off on}; do
    echo "### LOCKSTEP_NORM_PLANES=$v"; LOCKSTEP_NORM_PLANES=$v timeout 120 /tmp/lockstep bench --preset qwen3-1.7b --dtype bf16 --concurrency none --trainer-only --trainer-batches 4 --trainer-len 4096 --repeats 2 2>&1 | grep "^| 4\|rror"
  done | tee $O/planes-ab.md
  tar -C $O -czf /tmp/planes.tgz . && mv /tmp/planes.tgz $O/planes.tgz ;;
profile)
  LOCKSTEP_NORM_PLANES=on UPDATE_SHAPES="qwen3-1.7b:4x4096" UPDATE_LIMIT=120 OUT=$O/profile bash experiments/gpu_visit.sh profile-update > /dev/null 2>&1
  sed -n 1,45p $O/profile/profile-update.md
  tar -C $O -czf /tmp/profile.tgz . && mv /tmp/profile.tgz $O/profile.tgz ;;
rung17)
  LOCKSTEP_NORM_PLANES=on SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=61500 --set train.on_mismatch=stop" SCALE_ARGS="--max-steps 1" \
    O=$O/rung17 SCALE_LIMIT=${RUNG_LIMIT:-400} bash experiments/scale.sh qwen3-1.7b:256x4096:8:16384 2>&1 | tail -1
  grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"\|"bit_equal_frac":[0-9.]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*\|"grad_norm":[0-9.]*' $O/rung17/*.metrics.jsonl | tr '\n' ' '; echo
  echo "peak memory MiB: $(sort -n $O/rung17/*.mem | tail -1)"
  tar -C $O -czf /tmp/rung17.tgz . && mv /tmp/rung17.tgz $O/rung17.tgz ;;
rung4)
  SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=42000 --set sampler.max_batch=128 --set train.recompute_layers=true --set train.on_mismatch=stop" \
    SCALE_ARGS="--max-steps 1" O=$O/rung4 SCALE_LIMIT=${RUNG_LIMIT:-400} bash experiments/scale.sh qwen3-4b:128x2048:8:8192 2>&1 | tail -1
  grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"\|"bit_equal_frac":[0-9.]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*\|"grad_norm":[0-9.]*' $O/rung4/*.metrics.jsonl | tr '\n' ' '; echo
  tar -C $O -czf /tmp/rung4.tgz . && mv /tmp/rung4.tgz $O/rung4.tgz ;;
esac
