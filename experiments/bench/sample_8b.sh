#!/usr/bin/env bash
# `lockstep sample configs/qwen3-8b.toml` at the Qwen3-8B shape (docs/scale.md): 64 prompts x 128 greedy
# tokens with a 20,000 MiB pool by this build and by ${G:-.gpu}/lockstep-old.gz (an older build to
# compare: each one's peak, and the outputs byte for byte), then the config as written (auto pool)
# with 256 prompts x 256 new tokens.
# From the repo root on the GPU machine, after `bash experiments/visit/gpu_check.sh build` here
# and carrying .gpu/: `O=$OUT bash experiments/bench/sample_8b.sh`. Makes the random checkpoint once (experiments/fixtures/make_real_shape.py).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
ck=/tmp/checkpoints/qwen3-8b; t=$(date +%s)
[ -f $ck/config.json ] || python3 experiments/fixtures/make_real_shape.py qwen3-8b $ck > $O/make-8b.log 2>&1 || { tail -3 $O/make-8b.log; exit 1; }
echo "8B made in $(( $(date +%s) - t )) s"
head -64 $ck/task.jsonl > /tmp/p8b.jsonl
bins=lockstep
if [ -f ${G:-.gpu}/lockstep-old.gz ]; then
  gunzip -c ${G:-.gpu}/lockstep-old.gz > /tmp/lockstep-old && chmod +x /tmp/lockstep-old && bins="lockstep-old lockstep"
fi
for bin in $bins; do
  p=$(poll $O/$bin-8b.mem)
  timeout 200 /tmp/$bin sample configs/qwen3-8b.toml --set model.path=$ck --set sampler.input=/tmp/p8b.jsonl --set sampler.output=/tmp/$bin-8b.jsonl \
    --set sampler.temperature=0 --set sampler.max_new_tokens=128 --set sampler.max_batch=64 --set sampler.kv_budget_mib=20000 > $O/$bin-8b.log 2>&1
  echo "$bin: exit $?, peak $(sort -n $O/$bin-8b.mem | tail -1) MiB"; kill $p
  grep -h "memory plan\|sampled" $O/$bin-8b.log | head -3
done
if [ "$bins" != lockstep ]; then
  cmp /tmp/lockstep-old-8b.jsonl /tmp/lockstep-8b.jsonl && echo "outputs identical byte for byte ($(wc -l < /tmp/lockstep-8b.jsonl) completions)"
fi
head -256 $ck/task.jsonl > /tmp/p8b-256.jsonl
p=$(poll $O/auto-8b.mem); t=$(date +%s)
timeout 200 /tmp/lockstep sample configs/qwen3-8b.toml --set model.path=$ck --set sampler.input=/tmp/p8b-256.jsonl --set sampler.output=/tmp/auto-8b.jsonl \
  --set sampler.max_new_tokens=256 > $O/auto-8b.log 2>&1
echo "configs/qwen3-8b.toml as written (256 prompts, 256 new tokens): exit $? in $(( $(date +%s) - t )) s, peak $(sort -n $O/auto-8b.mem | tail -1) MiB"; kill $p
grep -h "memory plan\|auto\|sampled" $O/auto-8b.log | head -4
