#!/usr/bin/env bash
# Session 57's device visit. From the repo root on the GPU machine with .gpu/ carried (a build of
# the session's commit), `O=$OUT PART="..." bash docs/journal/visit-scripts/visit_s57.sh`.
#   defaults17a  issue 60: the 1.7B 256 x 4096 rung with the defaults (recomputation and sizes
#                auto), step 0, checkpoint kept for the next call
#   defaults17b  the same run resumed for steps 1 and 2 (no checkpoint after them: the call's
#                time; --allow-config-change records the one changed key)
#   serve        issue 63: serve's per-level table with the engine's tokens a step and ms a step
#                beside `lockstep sample`'s, the clients in 8 and in 16 processes
#   serve2       the same with the HTTP front on 2 threads (serve.workers=2, the old default)
#   h200         issue 60's 141 GB column: configs/qwen3-4b.toml (refused on an 80 GB card) and
#                the 0.6B rung as written, sizes auto, 2 and 1 steps
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
mkdir -p "$O"
source experiments/bench/gpu_env.sh
plan() { grep -h "memory plan\|auto sizes\|recompute" "$1" | head -3 | cut -c1-700; }
r17() {  # $1 steps, $2 extra --set pairs, $3 resume (1 or empty), $4 time limit
  O=$O SCALE_TAG=defaults SCALE_SET="--set task.reward=char_f1 --set train.on_mismatch=stop --set train.keep_checkpoints=1 $2" SCALE_ARGS="--max-steps $1 ${5:-}" \
    SCALE_RESUME=$3 SCALE_LIMIT=$4 bash experiments/bench/scale.sh qwen3-1.7b:256x4096:3
  plan $O/qwen3-1.7b-256x4096-defaults.log
}
for part in ${PART:-defaults17a}; do
case "$part" in
defaults17a)
  r17 1 "--set train.checkpoint_every=1" "" ${LIMIT17:-400} ;;
defaults17b)
  r17 2 "--set train.checkpoint_every=0" 1 ${LIMIT17:-560} --allow-config-change ;;
serve)
  O=$O/serve06 SERVE_CLIENTS=${SERVE_CLIENTS:-64,256} SERVE_BENCH_ARGS="--processes 8,16" bash experiments/bench/serve_bench.sh qwen3-0.6b 0 128 1000 2>&1 | tail -14 ;;
serve2)   # the HTTP front on 2 threads, as before serve.workers: the A/B of the threads alone
  O=$O/serve06-w2 SERVE_CLIENTS=${SERVE_CLIENTS:-64,256} SERVE_SET="--set serve.workers=2" SERVE_BENCH_ARGS="--processes 8" bash experiments/bench/serve_bench.sh qwen3-0.6b 0 128 0 2>&1 | tail -8 ;;
h200)
  O=$O SCALE_SET="--set task.reward=char_f1 --set train.on_mismatch=stop" SCALE_ARGS="--max-steps 2" SCALE_LIMIT=330 \
    bash experiments/bench/scale.sh qwen3-4b:128x2048:2
  plan $O/qwen3-4b-128x2048.log
  O=$O SCALE_SET="--set task.reward=char_f1 --set train.on_mismatch=stop" SCALE_ARGS="--max-steps 1" SCALE_LIMIT=200 \
    bash experiments/bench/scale.sh qwen3-0.6b:512x2048:1
  plan $O/qwen3-0.6b-512x2048.log ;;
esac
done
