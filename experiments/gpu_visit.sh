#!/usr/bin/env bash
# Measurements for one H200 visit, run there from the repo root after
# `bash experiments/gpu_check.sh build` here. Parts run in the order given, each with its own
# time limit so one slow part cannot lose the others' output; results are packed into
# $OUT/visit.tgz (the device tool returns at most 8 files).
#
#   bash experiments/gpu_visit.sh check bench            # engine invariance + sampler bench
#   bash experiments/gpu_visit.sh train ablation         # H200 training run + ablation matrix
#   bash experiments/gpu_visit.sh battery parity         # kernel battery, transformers parity
#
# Env: TRAIN_ARGS, ABLATION_ARGS, BENCH_ARGS add arguments; *_LIMIT override the time limits (s).
set -uo pipefail
dest="${OUT:-.gpu/out}"
out=/tmp/visit-out
rm -rf "$out" && mkdir -p "$out" "$dest"
for bin in lockstep-battery lockstep; do
    [ -x /tmp/$bin ] || { gunzip -c .gpu/$bin.gz > /tmp/$bin && chmod +x /tmp/$bin; }
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
for part in "$@"; do
    echo "== $part ($(date +%T))"
    case "$part" in
    check)
        timeout "${CHECK_LIMIT:-240}" /tmp/lockstep check --preset small --dtypes f32,bf16 --seed "${SEED:-1}" 2>&1 | tee "$out/check.md"
        echo "-- contrast: the same checks with the fast (burn default) kernels in the sampler"
        timeout "${CHECK_LIMIT:-240}" /tmp/lockstep check --preset small --dtypes bf16 --fast --seed "${SEED:-1}" 2>&1 | tee "$out/check-fast.md"
        ;;
    bench)
        timeout "${BENCH_LIMIT:-300}" /tmp/lockstep bench --preset small --dtype bf16 --concurrency 1,8,64,256 \
            --prompt-len 32 --new-tokens 32 --repeats 5 ${BENCH_ARGS:-} 2>&1 | tee "$out/bench.md"
        ;;
    train)
        # the H200 config; metrics.jsonl and TensorBoard files are written every step, so a
        # run cut by the limit still leaves its curves
        timeout "${TRAIN_LIMIT:-500}" /tmp/lockstep train configs/h200.toml --set log.runs_dir=/tmp/runs ${TRAIN_ARGS:-} 2>&1 | tail -n 400 > "$out/train.log"
        tail -n 30 "$out/train.log"
        cp /tmp/runs/h200/metrics.jsonl "$out/train-metrics.jsonl" 2>/dev/null
        /tmp/lockstep report /tmp/runs/h200 --out "$out/train-report" 2>&1 | tail -n 5
        ;;
    ablation)
        LOCKSTEP=/tmp/lockstep timeout "${ABLATION_LIMIT:-500}" bash experiments/ablation.sh --config configs/h200.toml \
            --out /tmp/abl ${ABLATION_ARGS:-} > "$out/ablation.log" 2>&1
        tail -n 20 "$out/ablation.log"
        /tmp/lockstep report /tmp/abl/runs/*/ --out "$out/ablation" 2>&1 | tail -n 25
        ;;
    battery)
        timeout "${BATTERY_LIMIT:-200}" /tmp/lockstep-battery --large --dtypes f32,bf16 2>&1 | tee "$out/battery.md"
        ;;
    parity)
        timeout 120 python3 shared-kernels/tests/fixtures/make_tiny_qwen3.py "$out/tiny-qwen3" 2>&1 | tail -3
        ;;
    *) echo "unknown part $part" ;;
    esac
done
echo "== done ($(date +%T))"
tar czf "$dest/visit.tgz" -C "$out" .
ls -la "$dest"
