#!/usr/bin/env bash
# `lockstep serve` on the GPU (issue 63): streamed greedy requests from 1, 16, 64 and 256 clients
# (TTFT, ITL, tokens/s), each level's bits against the first and against `lockstep sample` of
# the same prompts (timed too: the offline throughput the server is compared with), and N
# identical requests among N random neighbours (1 unique completion expected). From the repo
# root on the GPU machine with .gpu/ carried:
#   O=$OUT bash experiments/bench/serve_bench.sh [SHAPE [PROMPTS [MAX_TOKENS [IDENTICAL]]]]   # qwen3-0.6b 256 128 1000
# SERVE_BENCH_ARGS="--whole" or "--processes 8" pass through to serve_bench.py.
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
shape=${1:-qwen3-0.6b}; n=${2:-256}; m=${3:-128}; identical=${4:-1000}
mkdir -p "$O"
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
ck=/tmp/checkpoints/$shape
if [ ! -f "$ck/config.json" ]; then
    python3 experiments/fixtures/make_real_shape.py "$shape" "$ck" > "$O/make-$shape.log" 2>&1 || { echo "make $shape failed"; tail -3 "$O/make-$shape.log"; exit 1; }
fi
python3 - "$n" "$ck" > /tmp/serve-prompts.jsonl <<'PY'
import json, random, sys
n, ck = int(sys.argv[1]), sys.argv[2]
vocab = json.load(open(f"{ck}/config.json"))["vocab_size"]
rng = random.Random(20261207)
for i in range(n):
    print(json.dumps({"id": i, "prompt_ids": [rng.randrange(300, vocab - 3) for _ in range(32)]}))
PY
common=(--set "model.path=$ck" --set model.dtype=bf16 --set sampler.max_batch=256 --set "sampler.context=$(( m + 64 ))" --set "sampler.max_new_tokens=$m" --set log.progress=false)
start=$(date +%s.%N)
/tmp/lockstep sample "${common[@]}" --set sampler.temperature=0 --set sampler.input=/tmp/serve-prompts.jsonl --set sampler.output=/tmp/serve-sample.jsonl > "$O/serve-sample.log" 2>&1 || { echo "lockstep sample failed"; tail -5 "$O/serve-sample.log"; exit 1; }
echo "lockstep sample, $n prompts x $m greedy tokens, whole process: $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s ($(grep -o 'tokens/s[^,]*' "$O/serve-sample.log" | tail -1))"
/tmp/lockstep serve "${common[@]}" --set serve.port=0 > "$O/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
address=""
for _ in $(seq 1 600); do
    address=$(grep -o 'listening on http://[^ ]*' "$O/serve.log" | head -1 | sed 's#listening on http://##')
    [ -n "$address" ] && break
    kill -0 $server 2>/dev/null || { echo "the server exited"; tail -5 "$O/serve.log"; exit 1; }
    sleep 0.5
done
[ -n "$address" ] || { echo "the server did not start"; tail -5 "$O/serve.log"; exit 1; }
python3 experiments/bench/serve_bench.py "$address" /tmp/serve-prompts.jsonl --clients "${SERVE_CLIENTS:-1,16,64,256}" --max-tokens "$m" \
    --identical "$identical" --sample-output /tmp/serve-sample.jsonl ${SERVE_BENCH_ARGS:-} | tee "$O/serve-bench.md"
rc=${PIPESTATUS[0]}
curl -s "http://$address/metrics" > "$O/serve-metrics.txt" 2>/dev/null
exit $rc
