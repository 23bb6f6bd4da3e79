#!/bin/bash
# Refactor check on the CPU: six short GRPO runs (plain, micro-batched, PPO epochs, a parquet
# dataset with chat prompts, micro-batches with per-layer recomputation, the ablation's split-K
# sampler with TIS) and their metrics without timings, one JSON line per step. Run it
# before and after a change that must not change a bit, then `cmp` the two metrics.txt files.
#   bash experiments/bench/bits_compare.sh OUT_DIR [LOCKSTEP_BINARY]
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
B="${2:-${CARGO_TARGET_DIR:-$repo/target}/debug/lockstep}"
D="$1"; rm -rf "$D"; mkdir -p "$D"; cd "$D"
cp "$repo/trainer/tests/fixtures/datasets/verl_math.parquet" .
printf '{%% for m in messages %%}{{ m.role }}: {{ m.content }} {%% endfor %%}assistant:' > t.jinja
common=(--set train.steps=3 --set train.sft_steps=10 --set log.progress=false --set log.tensorboard=false --set train.prompts_per_step=2 --set train.group_size=4 --set sampler.max_new_tokens=6 --set task.reward=char_f1)
"$B" train "${common[@]}" --set log.run_name=a >/dev/null 2>&1
"$B" train "${common[@]}" --set log.run_name=b --set train.micro_batch_tokens=20 >/dev/null 2>&1
"$B" train "${common[@]}" --set log.run_name=c --set train.mini_batches=2 --set train.ppo_epochs=2 --set train.clip_high=0.28 >/dev/null 2>&1
"$B" train "${common[@]}" --set log.run_name=d --set task.name=dataset --set task.path=verl_math.parquet --set task.prompt_format=chat --set task.chat_template=t.jinja --set task.answer_key=reward_model.ground_truth >/dev/null 2>&1
"$B" train "${common[@]}" --set log.run_name=e --set train.micro_batch_tokens=20 --set train.recompute_layers=true >/dev/null 2>&1
"$B" train "${common[@]}" --set log.run_name=f --set ablation.sampler_kernels=split_k --set ablation.correction=tis --set train.on_mismatch=warn >/dev/null 2>&1
for r in a b c d e f; do
    python3 -c "
import json, sys
for l in open('runs/$r/metrics.jsonl'):
    m = json.loads(l)
    for k in ('step_s', 'tokens_per_s', 'timing', 'aliases'):
        m.pop(k, None)
    print('$r', json.dumps(m, sort_keys=True))
"
done > metrics.txt
wc -l < metrics.txt
