#!/usr/bin/env bash
# Agent episodes at the Qwen3-0.6B shape (docs/agents.md): 256 episodes a step (32 records x 8) of
# 4-8 chat turns of 64 tokens through lockstep's per-episode OpenAI endpoint, 2 steps (AGENTS_STEPS):
# bit_equal, KL, episode means, step phases.
# From the repo root on the GPU machine, after `bash experiments/visit/gpu_check.sh build` here
# and carrying .gpu/: `O=$OUT bash experiments/bench/agents_bench.sh`. Makes the random checkpoint once.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
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
cp /tmp/runs/agents06/metrics.jsonl $O/agents06.metrics.jsonl; head -c 300 /tmp/runs/agents06/episodes.jsonl
