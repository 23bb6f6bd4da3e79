#!/usr/bin/env bash
# GPU check, in two halves because the H200 machine has no Rust toolchain.
#
#   bash experiments/visit/gpu_check.sh build   # here (CPU machine): build the CUDA binaries into .gpu/
#   bash experiments/visit/gpu_check.sh build-autotune   # optional: lockstep-autotune (burn's autotuned ops)
#   bash experiments/visit/gpu_check.sh run     # there (H200), from the repo root: run the battery
#
# `run` prints one markdown table: lockstep's kernels and burn's default ops (autotune on,
# fusion off) per op, dtype (f32, bf16) and batch size, bit-identical yes/no and max |diff|,
# and exits non-zero if any lockstep kernel is not bitwise batch invariant.
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${1:-}" in
build)  # lockstep's GPU binaries; burn's ops without autotune (autotune picks kernels by timing,
        # which makes the backward's bits differ between processes)
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/lockstep-target}"
    export CUDARC_CUDA_VERSION=13000
    cargo build --locked --profile gpu -p shared-kernels -p trainer --no-default-features \
        --features shared-kernels/cuda,trainer/cuda --bin lockstep-battery --bin lockstep
    mkdir -p .gpu
    for bin in lockstep-battery lockstep; do
        strip -o .gpu/$bin "$CARGO_TARGET_DIR/gpu/$bin"
        gzip -9 -f .gpu/$bin
    done
    ls -la .gpu
    ;;
build-autotune)  # the same CLI with burn's autotuned defaults, for the "burn autotuned" contrast
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/lockstep-target}"
    export CUDARC_CUDA_VERSION=13000
    cargo build --locked --profile gpu -p trainer --no-default-features \
        --features shared-kernels/cuda,shared-kernels/autotune,trainer/cuda --bin lockstep
    mkdir -p .gpu
    strip -o .gpu/lockstep-autotune "$CARGO_TARGET_DIR/gpu/lockstep"
    gzip -9 -f .gpu/lockstep-autotune
    ls -la .gpu
    ;;
run)
    out="${OUT:-.gpu/out}"
    mkdir -p "$out"
    for bin in lockstep-battery lockstep; do
        gunzip -c .gpu/$bin.gz > /tmp/$bin && chmod +x /tmp/$bin
    done
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
    set -o pipefail
    /tmp/lockstep-battery --large --dtypes f32,bf16 --burn-defaults 2>&1 | tee "$out/battery.md"
    ;;
*)
    echo "usage: $0 build|build-autotune|run" >&2
    exit 2
    ;;
esac
