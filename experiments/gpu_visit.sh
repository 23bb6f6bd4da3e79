#!/usr/bin/env bash
# Everything measured in one H200 visit (run there from the repo root, after
# `bash experiments/gpu_check.sh build` here). Each part has its own time limit so one slow
# part cannot lose the others' output. Results land in $OUT (the device tool's folder).
set -uo pipefail
out="${OUT:-.gpu/out}"
mkdir -p "$out"
for bin in lockstep-battery lockstep; do
    gunzip -c .gpu/$bin.gz > /tmp/$bin && chmod +x /tmp/$bin
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
echo "== parity fixture (transformers)"
timeout 120 python3 shared-kernels/tests/fixtures/make_tiny_qwen3.py "$out/tiny-qwen3" 2>&1 | tail -3
echo "== battery: lockstep kernels, f32 + bf16, large shapes"
timeout 200 /tmp/lockstep-battery --large --dtypes f32,bf16 2>&1 | tee "$out/battery.md"
echo "== battery: burn defaults (autotune on, fusion off), f32 + bf16"
timeout 150 /tmp/lockstep-battery --large --dtypes f32,bf16 --burn-defaults --no-lockstep 2>&1 | tee "$out/battery-burn.md"
echo "== bench"
timeout 100 /tmp/lockstep bench --preset small --dtype bf16 --concurrency 1,8,64,256 --prompt-len 32 --new-tokens 32 --repeats 5 2>&1 | tee "$out/bench.md"
echo "== done"
