#!/usr/bin/env bash
# Session 58's device visit: session 57's parts (visit_s57.sh) plus
#   servepin  issue 63: serve's table with `lockstep serve` and `lockstep sample` on cores 0-7 and
#             the clients on 8-15 (as on another machine), with the engine thread's launch /
#             wait / between-steps ms a step beside sample's
# `O=$OUT PART="..." bash docs/journal/visit-scripts/visit_s58.sh`
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
mkdir -p "$O"
rest=""
for part in ${PART:-servepin}; do
case "$part" in
servepin)
  O=$O/serve06-pinned SERVE_CPUS=0-7 CLIENT_CPUS=8-15 SERVE_CLIENTS=${SERVE_CLIENTS:-64,256} SERVE_BENCH_ARGS="--processes 8" \
    bash experiments/bench/serve_bench.sh qwen3-0.6b 0 128 0 2>&1 | tail -9 ;;
serveunpinned)
  O=$O/serve06 SERVE_CLIENTS=${SERVE_CLIENTS:-64,256} SERVE_BENCH_ARGS="--processes 8" \
    bash experiments/bench/serve_bench.sh qwen3-0.6b 0 128 0 2>&1 | tail -9 ;;
*) O=$O PART=$part bash docs/journal/visit-scripts/visit_s57.sh ;;
esac
done
