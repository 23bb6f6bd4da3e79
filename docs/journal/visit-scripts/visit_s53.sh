#!/usr/bin/env bash
# The next device visit, written in session 53 (its device time went to issue 60's rungs and the
# serve benchmark): the checks its CPU-only work still owes the GPU. From the repo root on the GPU
# machine with .gpu/ carried, `O=$OUT PART=... bash docs/journal/visit-scripts/visit_s53.sh`.
#   top       top_logprobs on CUDA: lockstep serve at the 0.6B shape, experiments/bench/serve_top_check.py
#             (greedy token first with equal bits, listed tokens' bits, 32 copies among 32 neighbours)
#   battery   experiments/visit/gpu_check.sh run (every kernel row after the attention folder moves)
#   lora8b    configs/qwen3-8b-lora.toml, 128 x 2048, 3 steps (one a call, RESUME=1): bit_equal, KL, peak
#   h200      (kind nvidia-h200) the README's real-shape command and configs/qwen3-8b.toml as written
#   servegap  the 0.6B serve benchmark three ways: as before, clients over 8 processes, whole answers
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
mkdir -p "$O"
[ -x /tmp/lockstep ] || { gunzip -c ${G:-.gpu}/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee -a "$O/gpu.txt"
fields='"step":[0-9]*\|"bit_equal_frac":[0-9.e-]*\|"kl_k1":[0-9.e-]*\|"trainer_weights_fingerprint":"[0-9a-f]*"\|"step_s":[0-9.]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*'
poll() { ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.2; done ) > "$1" 2>/dev/null & echo $!; }
shape() { [ -f /tmp/checkpoints/$1/config.json ] || python3 experiments/fixtures/make_real_shape.py $1 /tmp/checkpoints/$1 > $O/make-$1.log 2>&1 || { tail -3 $O/make-$1.log; exit 1; }; }
for part in ${PART:-top}; do
case "$part" in
top)
  shape qwen3-0.6b; ck=/tmp/checkpoints/qwen3-0.6b
  /tmp/lockstep serve --set model.path=$ck --set model.dtype=bf16 --set sampler.max_batch=128 --set sampler.context=192 --set serve.port=0 > $O/top-serve.log 2>&1 &
  server=$!
  for _ in $(seq 1 240); do a=$(grep -o 'listening on http://[^ ]*' $O/top-serve.log | sed 's#listening on http://##'); [ -n "$a" ] && break; sleep 0.5; done
  python3 experiments/bench/serve_top_check.py "$a" 151936 32; kill $server; wait $server ;;
battery) bash experiments/visit/gpu_check.sh run 2>&1 | tail -6 ;;
lora8b)
  shape qwen3-8b; ck=/tmp/checkpoints/qwen3-8b; p=$(poll $O/lora8b.mem)
  timeout ${LIMIT:-570} /tmp/lockstep train configs/qwen3-8b-lora.toml --set model.path=$ck --set task.path=$ck/task.jsonl --set task.reward=char_f1 \
    --set train.steps=3 --set train.checkpoint_every=1 --set log.runs_dir=/tmp/runs --max-steps 1 ${RESUME:+--resume} > $O/lora8b.log 2>&1
  echo "LoRA 8B 128 x 2048: exit $?, peak $(sort -n $O/lora8b.mem | tail -1) MiB"; kill $p
  grep -h "memory plan\|auto sizes\|error" $O/lora8b.log | head -4; grep -o "$fields" /tmp/runs/qwen3-8b-lora/metrics.jsonl | tr '\n' ' '; echo ;;
h200)
  shape qwen3-0.6b; mkdir -p checkpoints && ln -sfn /tmp/checkpoints/qwen3-0.6b checkpoints/qwen3-0.6b; p=$(poll $O/readme06.mem)
  timeout 400 /tmp/lockstep train configs/qwen3-0.6b.toml --max-steps 1 > $O/readme06.log 2>&1
  echo "configs/qwen3-0.6b.toml --max-steps 1: exit $?, peak $(sort -n $O/readme06.mem | tail -1) MiB"; kill $p
  grep -h "memory plan\|auto sizes" $O/readme06.log | head -2; grep -o "$fields" runs/qwen3-0.6b/metrics.jsonl | tr '\n' ' '; echo
  O=$O bash experiments/bench/sample_8b.sh 2>&1 | tail -5 ;;
servegap)
  for args in "" "--processes 8" "--whole --processes 8"; do
    echo "### SERVE_BENCH_ARGS=$args"; SERVE_BENCH_ARGS="$args" O=$O/servegap bash experiments/bench/serve_bench.sh qwen3-0.6b 256 128 0 2>&1 | tail -7
  done ;;
esac
done
