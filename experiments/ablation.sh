#!/usr/bin/env bash
# The ablation matrix: sampler kernels {matched, fast} x correction {none, tis, mis, ppo_clip}
# x seeds, on a built-in task; then a table and plots read back from the TensorBoard files.
#
#   bash experiments/ablation.sh [--tiny] [--seeds "0 1 2"] [--out DIR] [-- --set key=value ...]
#
# --tiny: a few steps per cell (what CI runs). Extra `--set` overrides after `--` apply to every
# cell (e.g. `-- --set model.dtype=bf16` on the H200). Uses $LOCKSTEP (default: cargo run).
set -euo pipefail
cd "$(dirname "$0")/.."
tiny=0
seeds="0 1"
out="experiments/ablation-out"
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --tiny) tiny=1; shift ;;
        --seeds) seeds="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ -z "${LOCKSTEP:-}" ]; then
    cargo build --locked -q -p trainer --bin lockstep
    LOCKSTEP="${CARGO_TARGET_DIR:-target}/debug/lockstep"
fi
runs="$out/runs"
rm -rf "$runs"
mkdir -p "$runs"
if [ "$tiny" = 1 ]; then
    base=(--set train.steps=3 --set train.sft_steps=4 --set train.sft_batch=8 --set train.prompts_per_step=2
          --set train.group_size=4 --set sampler.max_new_tokens=4 --set train.checkpoint_every=0)
else
    base=(--set train.steps=30 --set train.sft_steps=40 --set train.lr=3e-4 --set train.prompts_per_step=16
          --set train.warmup_steps=0)
fi
dirs=()
for kernels in matched fast; do
    for correction in none tis mis ppo_clip; do
        for seed in $seeds; do
            name="${kernels}-${correction}-s${seed}"
            echo "== $name" >&2
            "$LOCKSTEP" train "${base[@]}" --set "ablation.sampler_kernels=$kernels" --set "ablation.correction=$correction" \
                --set "train.seed=$seed" --set "model.init_seed=$((seed + 1))" --set log.progress=false \
                --set "log.runs_dir=$runs" --set "log.run_name=$name" "${extra[@]}" > "$runs/$name.log" 2>&1 \
                || { echo "cell $name failed:" >&2; tail -5 "$runs/$name.log" >&2; exit 1; }
            dirs+=("$runs/$name")
        done
    done
done
"$LOCKSTEP" report "${dirs[@]}" --out "$out" --target-reward 0.5
echo "wrote $out/table.md, $out/reward.png, $out/kl.png, $out/logprob_abs_diff_max.png" >&2
