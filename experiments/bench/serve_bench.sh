#!/usr/bin/env bash
# `lockstep serve` on the GPU (issue 63): streamed greedy requests from 1, 16, 64 and 256 clients
# (TTFT, ITL, tokens/s), each level's bits against the first and against `lockstep sample` of
# the same prompts (timed too: the offline throughput the server is compared with), and N
# identical requests among N random neighbours (1 unique completion expected). From the repo
# root on the GPU machine with .gpu/ carried:
#   O=$OUT bash experiments/bench/serve_bench.sh [SHAPE [PROMPTS [MAX_TOKENS [IDENTICAL]]]]   # qwen3-0.6b 0 128 1000
# PROMPTS 0: 8 x the largest client count (each level times 4 C prompts after 4 C untimed ones).
# Each level is compared with `lockstep sample` at sampler.max_batch = C on the same prompts (its
# steady rate: after the first wave, which compiles the kernels); the clients run in 8
# processes, the server warmed by each level's untimed half. SERVE_CLIENTS (1,16,64,256) and
# SERVE_BENCH_ARGS (e.g. "--whole" or "--processes 1") pass through to serve_bench.py; SERVE_SET adds
# --set pairs to the server's command (e.g. "--set serve.workers=2"). SERVE_CPUS / CLIENT_CPUS
# (taskset lists, e.g. 0-7 and 8-15) pin `lockstep serve` and every `lockstep sample` to the first
# cores and the clients to the others, as if the clients ran on another machine: the server is
# compared with the sampler on the same cores, without the clients' processes competing.
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
shape=${1:-qwen3-0.6b}; n=${2:-0}; m=${3:-128}; identical=${4:-1000}
clients=${SERVE_CLIENTS:-1,16,64,256}
largest=$(tr ',' '\n' <<< "$clients" | sort -n | tail -1)
[ "$n" -gt 0 ] || n=$(( 8 * largest ))
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
pin_server=(); pin_clients=()
[ -n "${SERVE_CPUS:-}" ] && pin_server=(taskset -c "$SERVE_CPUS")
[ -n "${CLIENT_CPUS:-}" ] && pin_clients=(taskset -c "$CLIENT_CPUS")
common=(--set "model.path=$ck" --set model.dtype=bf16 --set sampler.max_batch=256 --set "sampler.context=$(( m + 64 ))" --set "sampler.max_new_tokens=$m" --set log.progress=false)
start=$(date +%s.%N)
${pin_server[@]+"${pin_server[@]}"} /tmp/lockstep sample "${common[@]}" --set sampler.temperature=0 --set sampler.input=/tmp/serve-prompts.jsonl --set sampler.output=/tmp/serve-sample.jsonl > "$O/serve-sample.log" 2>&1 || { echo "lockstep sample failed"; tail -5 "$O/serve-sample.log"; exit 1; }
echo "lockstep sample, $n prompts x $m greedy tokens, whole process: $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s ($(grep -o 'sampled .*tokens/s' "$O/serve-sample.log" | tail -1))"
rates=""
for c in ${clients//,/ }; do  # lockstep sample at each level's concurrency, on the level's prompts
    head -$(( 4 * c )) /tmp/serve-prompts.jsonl > /tmp/serve-level.jsonl
    ${pin_server[@]+"${pin_server[@]}"} /tmp/lockstep sample "${common[@]}" --set sampler.max_batch=$c --set sampler.temperature=0 --set sampler.input=/tmp/serve-level.jsonl --set sampler.output=/tmp/serve-level-out.jsonl > "$O/serve-sample-$c.log" 2>&1 || { echo "lockstep sample at max_batch $c failed"; tail -5 "$O/serve-sample-$c.log"; exit 1; }
    rate=$(grep -o 'sample-timing .*' "$O/serve-sample-$c.log" | sed 's/^sample-timing //' | python3 -c "
import json, sys
v = json.load(sys.stdin)
steady = v['steady_s'] > 0 and v['steady_engine_steps'] > 0
part = 'steady' if steady else 'all'
tokens, s, steps = (v['steady_tokens'], v['steady_s'], v['steady_engine_steps']) if steady else (v['tokens'], v['sample_s'], v['all_engine_steps'])
steps = max(steps, 1)
print(f'{round(tokens / s)}:{tokens / steps:.2f}:{s * 1000 / steps:.3f}:{v[part + \"_launch_s\"] * 1000 / steps:.3f}:{v[part + \"_wait_s\"] * 1000 / steps:.3f}:{v.get(part + \"_replayed_steps\", float(\"nan\")) / steps:.3f}')")
    rates="$rates${rates:+,}$c=$rate"
done
echo "lockstep sample's steady tokens/s : tokens a step : ms a step : launch ms : wait ms : replayed fraction, by sampler.max_batch: $rates"
${pin_server[@]+"${pin_server[@]}"} /tmp/lockstep serve "${common[@]}" --set serve.port=0 ${SERVE_SET:-} > "$O/serve.log" 2>&1 &
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
${pin_clients[@]+"${pin_clients[@]}"} python3 experiments/bench/serve_bench.py "$address" /tmp/serve-prompts.jsonl --clients "$clients" --max-tokens "$m" \
    --identical "$identical" --sample-output /tmp/serve-sample.jsonl --warmup --processes 8 --sample-rates "$rates" ${SERVE_BENCH_ARGS:-} | tee "$O/serve-bench.md"
rc=${PIPESTATUS[0]}
curl -s "http://$address/metrics" > "$O/serve-metrics.txt" 2>/dev/null
exit $rc
