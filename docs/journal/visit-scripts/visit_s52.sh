#!/usr/bin/env bash
# Session 52's device visit: session 51's parts (issue 60's last targets on an 80 GB H100, LoRA,
# MoE, serve) and agent episodes at the 0.6B shape. From the repo root on the GPU machine with
# .gpu/ carried, `O=$OUT PART=... bash docs/journal/visit-scripts/visit_s52.sh`.
#   rung17    configs/qwen3-1.7b.toml (256 x 4096, no size key set) one step a call with a checkpoint
#             after each (RESUME=1 continues): scale.sh's row, the plan's line, the peak
#   readme06  README's real-shape commands as written: make_real_shape.py into checkpoints/qwen3-0.6b,
#             then `lockstep train configs/qwen3-0.6b.toml` (--max-steps 1)
#   serve     experiments/bench/serve_bench.sh at the 0.6B shape: 1-256 streaming clients, bits
#             against lockstep sample, 1000 identical requests among 1000 neighbours
#   lora      (after a build with LoRA, unpacked afresh) a random PEFT adapter on the 0.6B shape:
#             lockstep's logprobs against PEFT + transformers (f32), then a LoRA GRPO run's
#             saved adapter loaded by PEFT and compared the same way
#   moe       (a build with MoE) qwen3-moe-small: the checkpoint's tensor names, lockstep's logprobs
#             against transformers (f32), GRPO 64 x 256 for 2 steps in one pass and in 4,096-token
#             micro-batches (bit_equal, KL, the same weights)
#   agents    (a build with agents) 256 episodes a step (32 records x 8) of 4-8 chat turns, 64
#             tokens a turn, at the 0.6B shape, 2 steps: bit_equal, KL, episode means, step phases
#   sample8b  `lockstep sample configs/qwen3-8b.toml` greedy (64 prompts x 128 tokens, a 20,000 MiB
#             pool) with this build and ${G:-.gpu}/lockstep-old.gz (a130335, two copies of the weights):
#             each one's peak and the outputs compared byte for byte; then the config with its
#             auto pool (256 prompts, 256 new tokens)
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
mkdir -p "$O"
[ -x /tmp/lockstep ] || { gunzip -c ${G:-.gpu}/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee -a "$O/gpu.txt"
fields='"step":[0-9]*\|"bit_equal_frac":[0-9.e-]*\|"kl_k1":[0-9.e-]*\|"trainer_weights_fingerprint":"[0-9a-f]*"\|"step_s":[0-9.]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*\|"gen_preempted":[0-9]*'
poll() { ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.2; done ) > "$1" 2>/dev/null & echo $!; }
for part in ${PART:-rung17}; do
case "$part" in
rung17)
  SCALE_RESUME=${RESUME:-} SCALE_SET="--set task.reward=char_f1 --set train.on_mismatch=stop --set train.checkpoint_every=1" \
    SCALE_ARGS="--max-steps 1" O=$O/rung17 SCALE_LIMIT=${RUNG_LIMIT:-570} bash experiments/bench/scale.sh qwen3-1.7b:256x4096:3 2>&1 | tail -1
  grep -h "memory plan\|auto sizes\|out of device memory\|error\|resum" $O/rung17/*.log | head -8
  grep -o "$fields" $O/rung17/*.metrics.jsonl | tr '\n' ' '; echo
  echo "peak memory MiB: $(sort -n $O/rung17/*.mem | tail -1)"; ls /tmp/runs/*/checkpoints 2>/dev/null | tail -3 ;;
readme06)
  t=$(date +%s)
  python3 experiments/fixtures/make_real_shape.py qwen3-0.6b checkpoints/qwen3-0.6b > $O/make06.log 2>&1 || { tail -3 $O/make06.log; exit 1; }
  echo "made in $(( $(date +%s) - t )) s"
  p=$(poll $O/readme06.mem); t=$(date +%s)
  timeout 400 /tmp/lockstep train configs/qwen3-0.6b.toml --max-steps 1 > $O/readme06.log 2>&1
  echo "lockstep train configs/qwen3-0.6b.toml --max-steps 1: exit $? in $(( $(date +%s) - t )) s, peak $(sort -n $O/readme06.mem | tail -1) MiB"; kill $p
  grep -h "memory plan\|auto sizes\|out of device memory\|error" $O/readme06.log | head -6
  grep -o "$fields" runs/qwen3-0.6b/metrics.jsonl | tr '\n' ' '; echo ;;
sample8b)
  ck=/tmp/checkpoints/qwen3-8b; t=$(date +%s)
  [ -f $ck/config.json ] || python3 experiments/fixtures/make_real_shape.py qwen3-8b $ck > $O/make-8b.log 2>&1 || { tail -3 $O/make-8b.log; exit 1; }
  echo "8B made in $(( $(date +%s) - t )) s"
  head -64 $ck/task.jsonl > /tmp/p8b.jsonl
  gunzip -c ${G:-.gpu}/lockstep-old.gz > /tmp/lockstep-old && chmod +x /tmp/lockstep-old
  for bin in lockstep-old lockstep; do
    p=$(poll $O/$bin-8b.mem)
    timeout 200 /tmp/$bin sample configs/qwen3-8b.toml --set model.path=$ck --set sampler.input=/tmp/p8b.jsonl --set sampler.output=/tmp/$bin-8b.jsonl \
      --set sampler.temperature=0 --set sampler.max_new_tokens=128 --set sampler.max_batch=64 --set sampler.kv_budget_mib=20000 > $O/$bin-8b.log 2>&1
    echo "$bin: exit $?, peak $(sort -n $O/$bin-8b.mem | tail -1) MiB"; kill $p
    grep -h "memory plan\|sampled" $O/$bin-8b.log | head -3
  done
  cmp /tmp/lockstep-old-8b.jsonl /tmp/lockstep-8b.jsonl && echo "outputs identical byte for byte ($(wc -l < /tmp/lockstep-8b.jsonl) completions)"
  head -256 $ck/task.jsonl > /tmp/p8b-256.jsonl
  p=$(poll $O/auto-8b.mem); t=$(date +%s)
  timeout 200 /tmp/lockstep sample configs/qwen3-8b.toml --set model.path=$ck --set sampler.input=/tmp/p8b-256.jsonl --set sampler.output=/tmp/auto-8b.jsonl \
    --set sampler.max_new_tokens=256 > $O/auto-8b.log 2>&1
  echo "configs/qwen3-8b.toml as written (256 prompts, 256 new tokens): exit $? in $(( $(date +%s) - t )) s, peak $(sort -n $O/auto-8b.mem | tail -1) MiB"; kill $p
  grep -h "memory plan\|auto\|sampled" $O/auto-8b.log | head -4 ;;
serve) O=$O/serve bash experiments/bench/serve_bench.sh qwen3-0.6b ${SERVE_PROMPTS:-256} ${SERVE_TOKENS:-128} ${SERVE_IDENTICAL:-1000} 2>&1 | tail -16 ;;
lora)
  gunzip -c ${G:-.gpu}/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep
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
  python3 experiments/bench/family_parity.py $ck $O/lora-lockstep --adapter /tmp/runs/lora06/checkpoints/step-000002 --prompts 8 --new 32 2>&1 | tail -1 ;;
moe)
  gunzip -c ${G:-.gpu}/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep
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
  done ;;
agents)
  gunzip -c ${G:-.gpu}/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep
  ck=/tmp/checkpoints/qwen3-0.6b
  [ -f $ck/config.json ] || python3 experiments/fixtures/make_real_shape.py qwen3-0.6b $ck > $O/make06.log 2>&1 || { tail -3 $O/make06.log; exit 1; }
  mkdir -p /tmp/agents
  printf '%s' "{% for m in messages %}<|im_start|>{{ m.role }}{{ '\\n' }}{{ m.content }}{% if m.role == 'assistant' %}<|endoftext|>{% else %}<|im_end|>{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}{% endif %}" > /tmp/agents/template.jinja
  python3 -c "
import json, random
r = random.Random(5)
with open('/tmp/agents/records.jsonl', 'w') as f:
    for i in range(64):
        f.write(json.dumps({'q': 'task %d: %s' % (i, ' '.join(r.choice(['alpha', 'beta', 'gamma', 'delta']) for _ in range(8))), 'turns': r.randint(4, 8)}) + '\\n')
"
  cat > /tmp/agents/env.py <<'PY'
import json, os, sys, urllib.request
rec = json.loads(sys.stdin.readline())
url = os.environ["LOCKSTEP_BASE_URL"] + "/chat/completions"
messages = [{"role": "user", "content": rec["q"]}]
score = 0
for turn in range(rec["turns"]):
    body = json.dumps({"messages": messages, "max_tokens": 64}).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=body, headers={"content-type": "application/json"}), timeout=600) as r:
        reply = json.load(r)["choices"][0]["message"]["content"]
    messages.append({"role": "assistant", "content": reply})
    messages.append({"role": "tool", "content": "observation %d: %d characters" % (turn, len(reply))})
    score += sum(c in "aeiou" for c in reply)
print(json.dumps({"reward": score / (64.0 * rec["turns"])}))
PY
  p=$(poll $O/agents06.mem); t=$(date +%s)
  timeout ${AGENTS_LIMIT:-560} /tmp/lockstep train configs/qwen3-0.6b.toml --set model.path=$ck --set task.name=environment --set task.path=/tmp/agents/records.jsonl \
    --set task.prompt_format=chat --set task.chat_template=/tmp/agents/template.jinja --set 'environment.command=python3 /tmp/agents/env.py' \
    --set environment.concurrency=256 --set environment.timeout_s=500 --set environment.save_trajectories=true --set train.prompts_per_step=32 --set train.group_size=8 \
    --set train.steps=${AGENTS_STEPS:-2} --set sampler.max_new_tokens=64 --set sampler.context=1024 --set log.runs_dir=/tmp/runs --set log.run_name=agents06 > $O/agents06.log 2>&1
  echo "agents 0.6B, 256 episodes of 4-8 turns: exit $? in $(( $(date +%s) - t )) s, peak $(sort -n $O/agents06.mem | tail -1) MiB"; kill $p
  grep -h "memory plan\|auto sizes\|error\|step " $O/agents06.log | head -8
  python3 -c "
import json
for l in open('/tmp/runs/agents06/metrics.jsonl'):
    m = json.loads(l); a = m['agreement']; t = m['timing']; e = m['episodes']
    print('step', m['step'], 'bit_equal', a['bit_equal_frac'], 'kl_k1', a['kl_k1'], 'tokens', a['tokens'], 'episodes', e['episodes'], 'turns', e['turns_mean'], e['turns_max'], 'sampled', e['sampled_tokens_mean'], 'episode_tokens', e['episode_tokens_mean'],
          'gen_s(episodes wall)', round(t['gen_s'], 2), 'engine launch+wait', round(t['gen_launch_s'] + t['gen_wait_s'], 2), 'logprob_s', round(t['logprob_s'], 2), 'update_s', round(t['update_s'], 2), 'step_s', round(m['step_s'], 2), 'program_s_mean', round(e['program_s_mean'], 2), 'reward', round(m['reward_mean'], 4))
"
  cp /tmp/runs/agents06/metrics.jsonl $O/agents06.metrics.jsonl; head -c 300 /tmp/runs/agents06/episodes.jsonl ;;
esac
done
