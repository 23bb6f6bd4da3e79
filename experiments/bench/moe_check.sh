#!/usr/bin/env bash
# Qwen3-MoE at the qwen3-moe-small shape (docs/moe.md): the checkpoint's tensor names, lockstep's
# logprobs against transformers (f32), GRPO 64 x 256 for 2 steps in one pass and in 4,096-token
# micro-batches (bit_equal, KL, the same weights).
# From the repo root on the GPU machine, after `bash experiments/visit/gpu_check.sh build` here
# and carrying .gpu/: `O=$OUT bash experiments/bench/moe_check.sh`. Makes the random checkpoint once.
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
mkdir -p "$O"
[ -x /tmp/lockstep ] || { gunzip -c ${G:-.gpu}/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee -a "$O/gpu.txt"
fields='"step":[0-9]*\|"bit_equal_frac":[0-9.e-]*\|"kl_k1":[0-9.e-]*\|"trainer_weights_fingerprint":"[0-9a-f]*"\|"step_s":[0-9.]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*\|"gen_preempted":[0-9]*'
poll() { ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.2; done ) > "$1" 2>/dev/null & echo $!; }
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
