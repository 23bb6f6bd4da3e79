# session 41: the stored-dS dQ fix (c8a693f) on a GPU, and LOCKSTEP_BACKWARD_MATH=fast's
# rung fingerprints before it becomes the default (session 39's script with a shorter dq part).
#   PART=ab       the 1.7B update (4 x 4,096) exact / fast / exact / fast, one binary, one machine
#   PART=battery  the battery (bf16), its groups `attention backward fast math` and `exact math` among the rows
#   PART=rung17 / rung06 / rung4   the rungs' step 0 with MATH (default fast): the weights
#                 fingerprints the arithmetic change gives (exact: 4ff415b8dedb1350,
#                 ef4829e7211e1545, 29f943f40ec64c89)
#   PART=dq       the 1.7B update: exact+recompute, then fast with LOCKSTEP_BACKWARD_DQ
#                 recompute / stored twice, then exact+recompute again (stored: dQ from the key
#                 kernel's dS, the same bits, battery-checked)
#   PART=twice    the 0.6B 64 x 1024 step 0 twice with MATH: run to run in every field
# MATH=exact|fast sets LOCKSTEP_BACKWARD_MATH for the rung parts (unset: the binary's default).
# KV06 (MiB, default 62000): the 0.6B rung's KV pool (smaller on an 80 GB card: preemptions, the same bits).
set -u
O=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $O/gpu.txt
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
[ -n "${MATH:-}" ] && export LOCKSTEP_BACKWARD_MATH=$MATH
fields='"trainer_weights_fingerprint":"[0-9a-f]*"\|"bit_equal_frac":[0-9.]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*\|"grad_norm":[0-9.]*\|"step_s":[0-9.]*\|"loss":[-0-9.e]*'
for part in ${PART:-ab}; do case $part in
ab)
  for v in exact fast exact fast; do
    echo "### LOCKSTEP_BACKWARD_MATH=$v"; LOCKSTEP_BACKWARD_MATH=$v timeout 150 /tmp/lockstep bench --preset qwen3-1.7b --dtype bf16 --concurrency none --trainer-only --trainer-batches 4 --trainer-len 4096 --repeats 2 2>&1 | grep "^| \|rror"
  done | tee $O/fast-ab.md ;;
dq)
  for md in exact:recompute fast:recompute fast:stored fast:recompute fast:stored exact:recompute; do
    m=${md%:*}; d=${md#*:}
    echo "### LOCKSTEP_BACKWARD_MATH=$m LOCKSTEP_BACKWARD_DQ=$d"; LOCKSTEP_BACKWARD_MATH=$m LOCKSTEP_BACKWARD_DQ=$d timeout 150 /tmp/lockstep bench --preset qwen3-1.7b --dtype bf16 --concurrency none --trainer-only --trainer-batches 4 --trainer-len 4096 --repeats ${REPEATS:-2} 2>&1 | grep "^| 4\|rror"
  done | tee $O/dq-ab.md ;;
battery)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${BATTERY_LIMIT:-300} /tmp/lockstep-battery --dtypes bf16 > $O/battery.md 2>&1; echo "battery rc $?: $(grep -c '| yes |' $O/battery.md) rows identical, $(grep -ci '| no |' $O/battery.md) not"
  grep -i "math\|stored\|checks bit-identical\|error" $O/battery.md | head -16 ;;
rung17)
  SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=61500 --set train.on_mismatch=stop" SCALE_ARGS="--max-steps ${STEPS:-1}" \
    O=$O/rung17 SCALE_LIMIT=${RUNG_LIMIT:-420} bash experiments/scale.sh qwen3-1.7b:256x4096:8:16384 2>&1 | tail -1
  grep -o "$fields" $O/rung17/*.metrics.jsonl | tr '\n' ' '; echo
  echo "peak memory MiB: $(sort -n $O/rung17/*.mem | tail -1)" ;;
rung06)
  SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=${KV06:-62000} --set sampler.max_batch=256 --set train.on_mismatch=stop" SCALE_ARGS="--max-steps ${STEPS:-1}" \
    O=$O/rung06 SCALE_LIMIT=${RUNG_LIMIT:-300} bash experiments/scale.sh qwen3-0.6b:512x2048:8:16384 2>&1 | tail -1
  grep -o "$fields" $O/rung06/*.metrics.jsonl | tr '\n' ' '; echo
  echo "peak memory MiB: $(sort -n $O/rung06/*.mem | tail -1)" ;;
rung4)
  SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=42000 --set sampler.max_batch=128 --set train.recompute_layers=true --set train.on_mismatch=stop" \
    SCALE_ARGS="--max-steps ${STEPS:-1}" O=$O/rung4 SCALE_LIMIT=${RUNG_LIMIT:-300} bash experiments/scale.sh qwen3-4b:128x2048:8:8192 2>&1 | tail -1
  grep -o "$fields" $O/rung4/*.metrics.jsonl | tr '\n' ' '; echo
  echo "peak memory MiB: $(sort -n $O/rung4/*.mem | tail -1)" ;;
twice)
  for i in 1 2; do
    SCALE_SET="--set task.reward=char_f1 --set train.on_mismatch=stop" SCALE_ARGS="--max-steps 1" O=$O/twice$i SCALE_LIMIT=150 bash experiments/scale.sh qwen3-0.6b:64x1024:2:16384 2>&1 | tail -1
    grep -o "$fields" $O/twice$i/*.metrics.jsonl | tr '\n' ' '; echo
  done ;;
esac; done
tar -C $O -czf /tmp/visit.tgz . && mv /tmp/visit.tgz $O/visit.tgz
