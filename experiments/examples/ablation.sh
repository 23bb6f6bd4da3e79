#!/usr/bin/env bash
# The ablation matrix: sampler kernels {matched, fast[, split_k, bf16_logits]} x correction {none, tis, mis, ppo_clip}
# x seeds, on a built-in task; then a table and plots read back from the TensorBoard files.
#
#   bash experiments/examples/ablation.sh [--tiny] [--seeds "0 1 2"] [--jobs N] [--kernels "matched fast split_k bf16_logits"] [--config FILE] [--out DIR] [--runs DIR] [--resume] [-- --set key=value ...]
#
# Long matrices across several sessions or device calls: --runs DIR keeps the cells' run folders
# (checkpoints) outside --out, so --out holds only what comes back (the report and each cell's
# metrics.jsonl); --resume continues every cell from its last checkpoint (a finished cell does
# nothing, a cell without one starts); `-- --max-steps N` ends each cell's call after N more steps
# with a checkpoint. E.g. on a warm GPU machine, one call after another:
#   bash experiments/examples/ablation.sh --config C.toml --jobs 12 --runs /tmp/abl --out $OUT --resume -- --max-steps 50
#
# --tiny: a few steps per cell (what CI runs). Extra `--set` overrides after `--` apply to every
# cell (e.g. `-- --set model.dtype=bf16` on the H200). --jobs N runs N cells at once (on a GPU
# they share the device, so compare step times only within one run). --config FILE starts every
# cell from that TOML instead of the built-in defaults + the short-run settings below. Uses $LOCKSTEP (default: cargo run).
set -euo pipefail
cd "$(dirname "$0")/../.."
tiny=0
seeds="0 1"
jobs=1
kernel_sets="matched fast"
config=()
out="experiments/ablation-out"
runs=""
resume=0
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --tiny) tiny=1; shift ;;
        --seeds) seeds="$2"; shift 2 ;;
        --jobs) jobs="$2"; shift 2 ;;
        --kernels) kernel_sets="$2"; shift 2 ;;
        --config) config=("$2"); shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --runs) runs="$2"; shift 2 ;;
        --resume) resume=1; shift ;;
        --) shift; extra=("$@"); break ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ -z "${LOCKSTEP:-}" ]; then
    cargo build --locked -q -p trainer --bin lockstep
    LOCKSTEP="${CARGO_TARGET_DIR:-target}/debug/lockstep"
fi
runs="${runs:-$out/runs}"
[ "$resume" = 1 ] || rm -rf "$runs"
mkdir -p "$runs" "$out"
if [ "$tiny" = 1 ]; then
    base=(--set train.steps=3 --set train.sft_steps=4 --set train.sft_batch=8 --set train.prompts_per_step=2
          --set train.group_size=4 --set sampler.max_new_tokens=4 --set train.checkpoint_every=0)
elif [ ${#config[@]} -gt 0 ]; then
    base=()
else
    base=(--set train.steps=30 --set train.sft_steps=40 --set train.lr=3e-4 --set train.prompts_per_step=16
          --set train.warmup_steps=0)
fi
run_cell() {
    local name="$1"; shift
    local again=()
    rm -f "$runs/$name.failed"
    if [ "$resume" = 1 ] && ls "$runs/$name"/checkpoints/step-*/state.json > /dev/null 2>&1; then again=(--resume); fi
    "$LOCKSTEP" train "${config[@]}" "${base[@]}" "$@" --set log.progress=false --set "log.runs_dir=$runs" --set "log.run_name=$name" \
        "${again[@]}" "${extra[@]}" >> "$runs/$name.log" 2>&1 || { echo "cell $name failed:" >&2; tail -5 "$runs/$name.log" >&2; touch "$runs/$name.failed"; }
    mkdir -p "$out/metrics"
    cp "$runs/$name/metrics.jsonl" "$out/metrics/$name.jsonl" 2> /dev/null || true
}
# each seed draws its own embedded model; a checkpoint (model.path, in --config or after --)
# brings its weights, and lockstep refuses model.init_seed beside it
checkpoint=0
if printf '%s\n' "${extra[@]}" | grep -q '^model\.path=.'; then checkpoint=1; fi
if [ ${#config[@]} -gt 0 ] && awk '/^\[/ {s=$0} s=="[model]" && /^[ \t]*path[ \t]*=[ \t]*"[^"]/ {f=1} END {exit !f}' "${config[0]}"; then checkpoint=1; fi
dirs=()
for kernels in $kernel_sets; do
    for correction in none tis mis ppo_clip; do
        for seed in $seeds; do
            name="${kernels}-${correction}-s${seed}"
            echo "== $name" >&2
            while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
            run_cell "$name" --set "ablation.sampler_kernels=$kernels" --set "ablation.correction=$correction" \
                --set "train.seed=$seed" $([ "$checkpoint" = 1 ] || echo --set "model.init_seed=$((seed + 1))") &
            dirs+=("$runs/$name")
        done
    done
done
wait
if ls "$runs"/*.failed > /dev/null 2>&1; then
    echo "failed cells: $(cd "$runs" && ls *.failed | sed 's/.failed//' | tr '\n' ' ')" >&2
    exit 1
fi
"$LOCKSTEP" report "${dirs[@]}" --out "$out" --target-reward 0.5
echo "wrote $out/table.md, $out/reward.png, $out/kl.png, $out/logprob_abs_diff_max.png; by arm (seeds thin, their mean bold, matched grey): $out/arms.md, $out/arms_{reward,kl,grad_norm,entropy}.png" >&2
