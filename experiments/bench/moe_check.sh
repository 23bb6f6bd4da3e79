#!/usr/bin/env bash
# Qwen3-MoE at the qwen3-moe-small shape (docs/moe.md): the checkpoint's tensor names, lockstep's
# logprobs against transformers (f32), GRPO 64 x 256 for 2 steps in one pass and in 4,096-token
# micro-batches (bit_equal, KL, the same weights).
# From the repo root on the GPU machine, after `bash experiments/visit/gpu_check.sh build` here
# and carrying .gpu/: `O=$OUT bash experiments/bench/moe_check.sh`. Makes the random checkpoint once.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
ck=/tmp/checkpoints/qwen3-moe-small
[ -f $ck/config.json ] || python3 experiments/fixtures/make_real_shape.py qwen3-moe-small $ck > $O/make-moe.log 2>&1 || { tail -5 $O/make-moe.log; exit 1; }
tail -1 $O/make-moe.log | cut -c1-300
python3 -c "from safetensors import safe_open; k=sorted(safe_open('$ck/model.safetensors', 'pt').keys()); e=[n for n in k if 'experts' in n]; print(len(k), 'tensors,', len(e), 'expert tensors, e.g.', e[:3])"
python3 experiments/bench/family_parity.py $ck $O/moe-parity --prompts 8 --new 32 2>&1 | tail -2
for mb in auto 4096; do
  timeout 200 /tmp/lockstep train configs/qwen3-1.7b.toml --set model.path=$ck --set task.path=$ck/task.jsonl --set task.reward=char_f1 \
    --set train.prompts_per_step=4 --set train.steps=2 --set sampler.max_new_tokens=256 --set sampler.context=320 --set sampler.max_batch=64 \
    --set train.micro_batch_tokens=$mb --set log.runs_dir=/tmp/runs --set log.run_name=moe-$mb > $O/moe-$mb.log 2>&1
  echo "MoE GRPO 64 x 256, micro_batch_tokens $mb: exit $?"; grep -h "memory plan\|error\|note" $O/moe-$mb.log | head -3
  grep -o "$fields" /tmp/runs/moe-$mb/metrics.jsonl | tr '\n' ' '; echo
done
