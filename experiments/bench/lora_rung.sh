#!/usr/bin/env bash
# GRPO with LoRA at a real shape on the GPU (docs/lora.md): `MAX_STEPS` steps a call (default 1;
# a warm machine keeps /tmp/runs, so RESUME=1 on the next call continues the run), with
# `char_f1` rewards (the random model scores 0 everywhere on `exact`), the peak memory, the
# plan's line and each step's metrics; then the docs/lora.md row (scale_row.py with the rank).
# From the repo root on the GPU machine with .gpu/ carried:
#   O=$OUT bash experiments/bench/lora_rung.sh qwen3-8b                  # configs/qwen3-8b-lora.toml
#   O=$OUT RESUME=1 bash experiments/bench/lora_rung.sh qwen3-8b         # its next step
#   O=$OUT MAX_STEPS=3 LORA_ARGS="configs/qwen3-4b.toml --set lora.rank=32 --set lora.alpha=64 \
#     --set lora.target_modules=all-linear --set train.lr=1e-5" bash experiments/bench/lora_rung.sh qwen3-4b
# Makes the random checkpoint once (experiments/fixtures/make_real_shape.py).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
shape=${1:?usage: lora_rung.sh SHAPE}
ck=/tmp/checkpoints/$shape; run=lora-$shape
[ -f $ck/config.json ] || python3 experiments/fixtures/make_real_shape.py $shape $ck > $O/make-$shape.log 2>&1 || { tail -3 $O/make-$shape.log; exit 1; }
p=$(poll $O/$run.mem)
trap 'kill $p 2>/dev/null' EXIT
timeout ${LIMIT:-570} /tmp/lockstep train ${LORA_ARGS:-configs/qwen3-8b-lora.toml} --set model.path=$ck --set task.path=$ck/task.jsonl --set task.reward=char_f1 \
  --set log.run_name=$run --set log.runs_dir=/tmp/runs --set train.checkpoint_every=1 --max-steps ${MAX_STEPS:-1} ${RESUME:+--resume} > $O/$run.log 2>&1
rc=$?
kill $p 2>/dev/null
echo "$run: exit $rc, peak $(sort -n $O/$run.mem | tail -1) MiB"
grep -h "memory plan\|auto sizes\|error" $O/$run.log | head -4
grep -o "$fields" /tmp/runs/$run/metrics.jsonl | tr '\n' ' '; echo
rank=$(grep -o 'rank = [0-9]*' /tmp/runs/$run/config.resolved.toml | head -1 | grep -o '[0-9]*$')
python3 experiments/bench/scale_row.py "$shape LoRA r$rank" $rc - $O/$run.mem /tmp/runs/$run/metrics.jsonl $ck/config.json $rank
exit $rc
