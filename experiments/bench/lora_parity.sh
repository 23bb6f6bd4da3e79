#!/usr/bin/env bash
# LoRA against PEFT at the Qwen3-0.6B shape (docs/lora.md): a random PEFT adapter, lockstep's logprobs
# against PEFT + transformers (f32 and bf16), a LoRA GRPO run (64 x 256, 2 steps) whose saved adapter
# PEFT then loads and is compared the same way.
# From the repo root on the GPU machine, after `bash experiments/visit/gpu_check.sh build` here
# and carrying .gpu/: `O=$OUT bash experiments/bench/lora_parity.sh`. Makes the random checkpoint once.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
ck=/tmp/checkpoints/qwen3-0.6b
[ -f $ck/config.json ] || python3 experiments/fixtures/make_real_shape.py qwen3-0.6b $ck > $O/make06.log 2>&1 || { tail -3 $O/make06.log; exit 1; }
python3 experiments/fixtures/make_peft_adapter.py $ck /tmp/peft-adapter --rank 16 --alpha 32 2>&1 | tail -1
python3 experiments/bench/family_parity.py $ck $O/lora-peft --adapter /tmp/peft-adapter --prompts 8 --new 32 2>&1 | tail -2
python3 experiments/bench/family_parity.py $ck $O/lora-peft-bf16 --adapter /tmp/peft-adapter --prompts 8 --new 32 --dtype bf16 2>&1 | tail -1
timeout 300 /tmp/lockstep train configs/qwen3-0.6b.toml --set model.path=$ck --set task.path=$ck/task.jsonl --set lora.rank=16 --set lora.alpha=32 \
  --set task.reward=char_f1 --set train.prompts_per_step=4 --set train.steps=2 --set sampler.max_new_tokens=256 --set sampler.context=320 \
  --set log.runs_dir=/tmp/runs --set log.run_name=lora06 --set train.checkpoint_every=1 > $O/lora06.log 2>&1
echo "LoRA GRPO 0.6B 64 x 256, 2 steps: exit $?"; grep -h "memory plan\|error" $O/lora06.log | head -4
grep -o "$fields" /tmp/runs/lora06/metrics.jsonl | tr '\n' ' '; echo
python3 experiments/bench/family_parity.py $ck $O/lora-lockstep --adapter /tmp/runs/lora06/checkpoints/step-000002 --prompts 8 --new 32 2>&1 | tail -1
