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
moehost)  # what bounds MoE decode: lockstep sample's per-step host view at qwen3-moe-1b, 512 x 128, max_batch 256 and 64
  source experiments/bench/gpu_env.sh
  ck=/tmp/checkpoints/qwen3-moe-1b
  [ -f $ck/config.json ] || python3 experiments/fixtures/make_real_shape.py qwen3-moe-1b $ck > $O/make-moe1b.log 2>&1
  python3 -c "import json, random; r = random.Random(7); [print(json.dumps({'id': i, 'prompt_ids': [r.randrange(300, 151000) for _ in range(32)]})) for i in range(512)]" > /tmp/moe.jsonl
  for b in 256 64; do
    timeout ${LIMIT:-150} /tmp/lockstep sample --set model.path=$ck --set model.dtype=bf16 --set sampler.input=/tmp/moe.jsonl --set sampler.output=/tmp/moe-out.jsonl \
      --set sampler.temperature=0 --set sampler.max_new_tokens=128 --set sampler.context=192 --set sampler.max_batch=$b --set log.progress=false > $O/moehost-$b.log 2>&1
    echo "lockstep sample 512 x 128 at qwen3-moe-1b, max_batch $b: exit $?"; grep -h "sampled\|engine steps\|sample-timing" $O/moehost-$b.log | cut -c1-600 | head -6
  done ;;
serveunpinned)
  O=$O/serve06 SERVE_CLIENTS=${SERVE_CLIENTS:-64,256} SERVE_BENCH_ARGS="--processes 8" \
    bash experiments/bench/serve_bench.sh qwen3-0.6b 0 128 0 2>&1 | tail -9 ;;
*) O=$O PART=$part bash docs/journal/visit-scripts/visit_s57.sh ;;
esac
done
