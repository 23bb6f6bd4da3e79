#!/usr/bin/env bash
# Session 50's device visit (issue 60's targets on an 80 GB H100): from the repo root on the GPU
# machine with .gpu/ carried, `O=$OUT PART=... bash docs/journal/visit-scripts/visit_s50.sh`.
#   make     the random 0.6B and 1.7B checkpoints (before any run, so no torch process shares the card)
#   auto06   0.6B 512 x 2048, 3 steps, no size key set (auto micro-batch and KV pool)
#   hand06   0.6B 512 x 2048, 2 steps, hand-sized (MICRO tokens, KV MiB; the best of session 49)
#   rung17   1.7B 256 x 4096, auto sizes, one step a call (checkpoint each step; RESUME=1 continues)
#   quick    README line 1's run (configs/quickstart.toml) with this build and .gpu/lockstep-old.gz
#            (a130335, before issues 60-62): every field and weight fingerprint compared
#   battery  the kernel battery (.gpu-battery/lockstep-battery.gz): every kernel batch invariant
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
mkdir -p "$O"
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee -a "$O/gpu.txt"
fields='"step":[0-9]*\|"bit_equal_frac":[0-9.e-]*\|"kl_k1":[0-9.e-]*\|"trainer_weights_fingerprint":"[0-9a-f]*"\|"step_s":[0-9.]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*\|"gen_preempted":[0-9]*'
defaults="--set task.reward=char_f1 --set train.on_mismatch=stop"
rung() { # NAME RUNG [extra SCALE_SET]
  local name=$1 r=$2; shift 2
  SCALE_SET="$defaults $*" SCALE_ARGS="--max-steps ${STEPS:-1}" O=$O/$name SCALE_LIMIT=${RUNG_LIMIT:-560} bash experiments/bench/scale.sh "$r" 2>&1 | tail -1
  grep -h "memory plan\|auto sizes\|out of device memory\|error" $O/$name/*.log | head -6
  grep -o "$fields" $O/$name/*.metrics.jsonl | tr '\n' ' '; echo
  echo "peak memory MiB: $(sort -n $O/$name/*.mem | tail -1)"
}
for part in ${PART:-make}; do
case "$part" in
make)
  for shape in qwen3-0.6b qwen3-1.7b; do
    ck=/tmp/checkpoints/$shape
    [ -f $ck/config.json ] || python3 experiments/fixtures/make_real_shape.py $shape $ck > $O/make-$shape.log 2>&1 || { tail -3 $O/make-$shape.log; exit 1; }
  done; ls /tmp/checkpoints ;;
auto06) STEPS=3 rung auto06 qwen3-0.6b:512x2048:3 ;;
hand06) STEPS=2 SCALE_KV_MIB=${KV:-49994} rung hand06 qwen3-0.6b:512x2048:3:${MICRO:-5120} ;;
quick)
  gunzip -c .gpu/lockstep-old.gz > /tmp/lockstep-old && chmod +x /tmp/lockstep-old
  for bin in lockstep-old lockstep; do
    start=$(date +%s)
    /tmp/$bin train configs/quickstart.toml --set log.runs_dir=/tmp/qs-$bin --set log.progress=false > $O/quick-$bin.log 2>&1
    echo "$bin quickstart: exit $? in $(( $(date +%s) - start )) s; $(tail -1 $O/quick-$bin.log)"
  done
  python3 experiments/bench/compare_runs.py /tmp/qs-lockstep-old/quickstart /tmp/qs-lockstep/quickstart --label "quickstart a130335 vs this build"
  grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"' /tmp/qs-lockstep/quickstart/metrics.jsonl | tail -1 ;;
battery)
  gunzip -c .gpu-battery/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  start=$(date +%s)
  timeout ${BATTERY_LIMIT:-300} /tmp/lockstep-battery --large --dtypes f32,bf16 > $O/battery.md 2>&1
  echo "battery: exit $? in $(( $(date +%s) - start )) s, $(grep -c '| yes' $O/battery.md) rows bit-identical, $(grep -c '| no' $O/battery.md) not"; tail -3 $O/battery.md ;;
rung17) SCALE_RESUME=${RESUME:-} STEPS=1 rung rung17 qwen3-1.7b:256x4096:3 --set train.checkpoint_every=1 ;;
esac
done
