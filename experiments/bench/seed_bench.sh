#!/usr/bin/env bash
# The seed's benchmark (issue 25, Thinking Machines' setting): Qwen3-8B's shape, N prompts of 32 ids,
# M greedy new tokens, one GPU, every arm in one run. From the repo root on the GPU machine, after
# `bash experiments/visit/gpu_check.sh build` here and carrying .gpu/:
#   O=$OUT bash experiments/bench/seed_bench.sh [SHAPE [N [M [MAX_BATCH]]]]     # default qwen3-8b 1000 100 256
# SEED_ARMS picks the arms (default: matched-cold matched-warm graphs-warm fast-warm transformers
# torch-graphs; the two matched arms always run);
# "coverage-warm" adds the matched kernels under the earlier tile rule (LOCKSTEP_WGMMA_PICK=coverage);
# "computerates-graphs": the graphs arm under the `waves-compute-rates` tile rule
# (LOCKSTEP_WGMMA_PICK=waves-compute-rates), after a run that fills the kernel cache for its tiles.
# "wide-warm" the matched kernels with every request admitted at once (max_batch WIDE, default 1024:
# vLLM's max_num_seqs on GPUs of 70 GB and more), timed over all N after a run that fills the
# kernel cache for its tile shapes; its completions must equal the batch-MAX_BATCH arms' as bits.
# "graphs-warm" and "wide-graphs": the same two batch sizes with decode steps replayed as captured
# graphs, row counts padded (`lockstep sample`'s defaults); the matched arms launch every step
# (LOCKSTEP_DECODE_GRAPHS=off). All completions must equal the cold arm's as bits.
# Arms, each its own process on the same random-weight checkpoint (experiments/fixtures/make_real_shape.py):
#   matched (cold)   lockstep sample, batch-invariant kernels, empty kernel cache
#   matched (warm)   the same command again: the kernel cache filled by the first
#   fast (warm)      ablation.sampler_kernels = fast (cuBLAS-like split reductions), same cache
#   transformers     `generate`, greedy, batches of MAX_BATCH (experiments/bench/seed_bench_hf.py)
#   torch-graphs     (in SEED_ARMS) the tuned, not batch-invariant reference: Qwen3 in torch with
#                    cuBLAS, flash SDPA, compiled norms and every decode step a CUDA graph
#                    (experiments/bench/seed_bench_torch_graphs.py): the fast arm that no host launch bounds
# Prints one markdown table (experiments/bench/seed_bench_table.py): steady-state seconds (from the end of
# the first wave of MAX_BATCH requests to the last), whole-process seconds, load seconds, tokens/s,
# ratio to the physical limit; and writes $O/seed-bench.md.
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
shape=${1:-qwen3-8b}; n=${2:-1000}; m=${3:-100}; batch=${4:-256}
mkdir -p "$O"
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
ck=/tmp/checkpoints/$shape
if [ ! -f "$ck/config.json" ]; then
    python3 experiments/fixtures/make_real_shape.py "$shape" "$ck" > "$O/make-$shape.log" 2>&1 || { echo "make $shape failed"; tail -3 "$O/make-$shape.log"; exit 1; }
fi
rm -f /tmp/seed-matched-*.jsonl /tmp/seed-coverage-*.jsonl /tmp/seed-wide-*.jsonl /tmp/seed-graphs-*.jsonl /tmp/seed-computerates-*.jsonl /tmp/seed-fast-*.jsonl /tmp/seed-torch-graphs.jsonl
python3 - "$n" "$ck" > /tmp/seed-prompts.jsonl <<'PY'
import json, random, sys
n, ck = int(sys.argv[1]), sys.argv[2]
vocab = json.load(open(f"{ck}/config.json"))["vocab_size"]
rng = random.Random(20261202)
for i in range(n):
    print(json.dumps({"id": i, "prompt_ids": [rng.randrange(300, vocab - 3) for _ in range(32)]}))
PY
cache=/tmp/seed-kernel-cache
rm -rf "$cache"
arm() {  # name, then --set pairs
    local name=$1; shift
    local start end
    start=$(date +%s.%N)
    LOCKSTEP_KERNEL_CACHE=$cache /usr/bin/time -v /tmp/lockstep sample --set "model.path=$ck" --set model.dtype=bf16 \
        --set sampler.input=/tmp/seed-prompts.jsonl --set "sampler.output=/tmp/seed-$name.jsonl" \
        --set "sampler.max_new_tokens=$m" --set sampler.temperature=0 --set "sampler.max_batch=$batch" \
        --set "sampler.context=$(( m + 64 ))" --set log.progress=false "$@" > "$O/seed-$name.log" 2>&1
    local rc=$?
    end=$(date +%s.%N)
    echo "whole_process_s $(python3 -c "print($end - $start)") rc $rc" >> "$O/seed-$name.log"
}
arms=" ${SEED_ARMS:-matched-cold matched-warm graphs-warm fast-warm transformers torch-graphs} "
export LOCKSTEP_DECODE_GRAPHS=off  # every arm launches its steps, but the graphs arms
arm matched-cold
arm matched-warm
# the earlier rule's tiles are other kernels: one run fills the cache with them, the next is timed
[[ "$arms" == *" coverage-warm "* ]] && LOCKSTEP_WGMMA_PICK=coverage arm coverage-fill && LOCKSTEP_WGMMA_PICK=coverage arm coverage-warm
wide=${WIDE:-1024}
[[ "$arms" == *" wide-warm "* ]] && arm wide-fill --set "sampler.max_batch=$wide" && arm wide-warm --set "sampler.max_batch=$wide"
# decode steps replayed as captured graphs, at both batch sizes
[[ "$arms" == *" graphs-warm "* ]] && LOCKSTEP_DECODE_GRAPHS=on LOCKSTEP_DECODE_GRAPH_PADDING=on arm graphs-warm
# the `waves-compute-rates` tile rule (other tiles at 129-256 rows: a fill run, then the timed one)
[[ "$arms" == *" computerates-graphs "* ]] && LOCKSTEP_WGMMA_PICK=waves-compute-rates LOCKSTEP_DECODE_GRAPHS=on LOCKSTEP_DECODE_GRAPH_PADDING=on arm computerates-fill \
    && LOCKSTEP_WGMMA_PICK=waves-compute-rates LOCKSTEP_DECODE_GRAPHS=on LOCKSTEP_DECODE_GRAPH_PADDING=on arm computerates-graphs
[[ "$arms" == *" wide-graphs "* ]] && LOCKSTEP_DECODE_GRAPHS=on LOCKSTEP_DECODE_GRAPH_PADDING=on arm wide-graphs --set "sampler.max_batch=$wide"
[[ "$arms" == *" fast-warm "* ]] && arm fast-warm --set ablation.sampler_kernels=fast
python_arm() {  # name, then the command: its log and whole-process seconds, as `arm` writes them
    local name=$1; shift
    local start rc
    start=$(date +%s.%N)
    PYTHONUNBUFFERED=1 "$@" > "$O/seed-$name.log" 2>&1
    rc=$?
    echo "whole_process_s $(python3 -c "print($(date +%s.%N) - $start)") rc $rc" >> "$O/seed-$name.log"
}
[[ "$arms" == *" transformers "* ]] && python_arm transformers python3 experiments/bench/seed_bench_hf.py "$ck" /tmp/seed-prompts.jsonl "$m" "$batch"
[[ "$arms" == *" torch-graphs "* ]] && TORCH_ARM_PROFILE=${TORCH_ARM_PROFILE:-on} python_arm torch-graphs \
    python3 experiments/bench/seed_bench_torch_graphs.py "$ck" /tmp/seed-prompts.jsonl "$m" "$batch" /tmp/seed-torch-graphs.jsonl
# every matched arm must agree with the cold one token for token (same kernels and bits, whatever
# the kernel cache or the tile schedule)
python3 - /tmp/seed-matched-cold.jsonl /tmp/seed-matched-warm.jsonl /tmp/seed-coverage-warm.jsonl /tmp/seed-wide-warm.jsonl /tmp/seed-graphs-warm.jsonl /tmp/seed-computerates-graphs.jsonl /tmp/seed-wide-graphs.jsonl > "$O/seed-cache-bits.txt" <<'PY'
import json, os, struct, sys
load = lambda p: [json.loads(l) for l in open(p)]
bits = lambda xs: [struct.pack("<f", x) for x in xs]
a = load(sys.argv[1])
for other in sys.argv[2:]:
    if not os.path.exists(other):
        continue
    b = load(other)
    same = len(a) == len(b) and all(x["token_ids"] == y["token_ids"] and bits(x["logprobs"]) == bits(y["logprobs"]) for x, y in zip(a, b))
    print(f"matched cold vs {os.path.basename(other)}: {'identical' if same else 'DIFFERENT'} token ids and logprob bits over {len(a)} completions")
PY
SEED_GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" python3 experiments/bench/seed_bench_table.py "$O" "$ck/config.json" "$n" "$m" "$batch" "$wide" | tee "$O/seed-bench.md"
cat "$O/seed-cache-bits.txt"
# the other arithmetic's greedy tokens: how often the reference arm picks the matched arm's token
# (random bf16 weights put near-ties everywhere: this shows the arms run one model, not bits)
[ -f /tmp/seed-torch-graphs.jsonl ] && python3 - /tmp/seed-matched-cold.jsonl /tmp/seed-torch-graphs.jsonl <<'PY' | tee -a "$O/seed-bench.md"
import json, sys
a, b = ([json.loads(l)["token_ids"] for l in open(p)] for p in sys.argv[1:3])
first = sum(x[:1] == y[:1] for x, y in zip(a, b))
prefix = sum(next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y))) for x, y in zip(a, b))
print(f"\ntorch-graphs vs matched: first token equal in {first}/{len(a)} completions; mean common prefix {prefix / len(a):.1f} tokens")
PY
