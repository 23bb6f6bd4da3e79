#!/usr/bin/env bash
# The next device visit, written in session 54 (its device calls ran out before its CPU-built
# MoE work could be checked on CUDA). From the repo root on the GPU machine with .gpu/ carried
# (a build of the session's last commit), `O=$OUT PART=... bash docs/journal/visit-scripts/visit_s54.sh`.
#   serve     the serve benchmark's per-level table (lockstep sample at max_batch = clients), 0.6B then 8B
#   moecheck  the engine checks at the qwen3-moe-1b shape in bf16 (lockstep check --preset)
#   moe1b     issue 65's GRPO target: qwen3-moe-1b, 256 x 1024, one step a call (RESUME=1 for the next):
#             bit_equal, KL, routing_agreement 1, expert load
#   moefast   the same rung with the ablation's fast sampler kernels (+ TIS): routing agreement measured
#   moeaux    the same rung with train.router_aux_loss_coef = 0.001 and LoRA r16 on every expert, 1 step
#   a3b       Qwen3-30B-A3B's shape: lockstep sample 1000 x 100 (bf16) and transformers' generate on the same weights
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
mkdir -p "$O"
for part in ${PART:-serve}; do
case "$part" in
serve)
  O=$O/serve06 bash experiments/bench/serve_bench.sh qwen3-0.6b 0 128 1000 2>&1 | tail -9
  O=$O/serve8b bash experiments/bench/serve_bench.sh qwen3-8b 0 128 1000 2>&1 | tail -9 ;;
moecheck)
  [ -x /tmp/lockstep ] || { gunzip -c ${G:-.gpu}/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
  timeout 500 /tmp/lockstep check --preset qwen3-moe-1b --dtypes bf16 2>&1 | tail -16 ;;
moe1b) O=$O bash experiments/bench/moe_rung.sh qwen3-moe-1b 256 1024 moe1b ;;
moefast) O=$O MOE_SET="--set ablation.sampler_kernels=fast --set ablation.correction=tis" bash experiments/bench/moe_rung.sh qwen3-moe-1b 256 1024 moe1b-fast ;;
moeaux) O=$O MOE_SET="--set train.router_aux_loss_coef=0.001 --set lora.rank=16 --set train.lr=1e-5" bash experiments/bench/moe_rung.sh qwen3-moe-1b 256 1024 moe1b-aux-lora ;;
a3b)
  source experiments/bench/gpu_env.sh
  ck=/tmp/checkpoints/qwen3-30b-a3b
  [ -f $ck/config.json ] || python3 experiments/fixtures/make_real_shape.py qwen3-30b-a3b $ck > $O/make-a3b.log 2>&1 || { tail -3 $O/make-a3b.log; exit 1; }
  # 1000 prompts of 32 random token ids (equal lengths: transformers' batches need no padding)
  python3 -c "import json, random; r = random.Random(7); [print(json.dumps({'id': i, 'prompt_ids': [r.randrange(300, 151000) for _ in range(32)]})) for i in range(1000)]" > /tmp/a3b.jsonl
  p=$(poll $O/a3b.mem)
  timeout ${LIMIT:-300} /tmp/lockstep sample --set model.path=$ck --set model.dtype=bf16 --set sampler.input=/tmp/a3b.jsonl --set sampler.output=/tmp/a3b-out.jsonl \
    --set sampler.temperature=0 --set sampler.max_new_tokens=100 --set sampler.context=160 --set sampler.max_batch=256 --set log.progress=false > $O/a3b.log 2>&1
  echo "lockstep sample 1000 x 100 at 30B-A3B: exit $?, peak $(sort -n $O/a3b.mem | tail -1) MiB"; kill $p
  grep -h "memory plan\|sampled\|sample-timing" $O/a3b.log | head -4
  timeout ${HF_LIMIT:-240} python3 experiments/bench/seed_bench_hf.py $ck /tmp/a3b.jsonl 100 256 2>&1 | grep sample-timing | sed 's/^/transformers generate: /' ;;
esac
done
