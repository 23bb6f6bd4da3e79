#!/usr/bin/env bash
# Session 49's device visit (issue 60, memory sizing on an 80 GB H100): from the repo root on the
# GPU machine with .gpu/ carried, `O=$OUT PART=... bash docs/journal/visit-scripts/visit_s49.sh`.
#   refuse4b  full-parameter 4B 128 x 2048 with the shipped config: refused before loading (exit 2)
#   small     0.6B 64 x 1024, 2 steps, defaults only (auto sizes): weights vs the hand-sized runs'
#   rung06    0.6B 512 x 2048, STEPS steps (1), defaults only
#   rung17    1.7B 256 x 4096, STEPS steps (1), defaults only
#   hand06    0.6B 512 x 2048 hand-sized (MICRO tokens, KV MiB) for the step-time comparison
#   sample8b  `lockstep sample configs/qwen3-8b.toml` (64 prompts x 128 tokens, a 20,000 MiB pool) with
#             this build and .gpu/lockstep-old.gz (before the engine took the only copy of the
#             weights): peak memory of each and the two outputs compared byte for byte
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
mkdir -p "$O"
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee -a "$O/gpu.txt"
fields='"step":[0-9]*\|"bit_equal_frac":[0-9.e-]*\|"kl_k1":[0-9.e-]*\|"trainer_weights_fingerprint":"[0-9a-f]*"\|"step_s":[0-9.]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*\|"gen_preempted":[0-9]*'
defaults="--set task.reward=char_f1 --set train.on_mismatch=stop"
rung() { # NAME RUNG [extra SCALE_SET]
  local name=$1 r=$2; shift 2
  SCALE_SET="$defaults $*" SCALE_ARGS="--max-steps ${STEPS:-1}" O=$O/$name SCALE_LIMIT=${RUNG_LIMIT:-540} bash experiments/scale.sh "$r" 2>&1 | tail -1
  grep -h "memory plan\|auto sizes\|out of device memory\|error" $O/$name/*.log | head -6
  grep -o "$fields" $O/$name/*.metrics.jsonl | tr '\n' ' '; echo
  echo "peak memory MiB: $(sort -n $O/$name/*.mem | tail -1)"
}
for part in ${PART:-small}; do
case "$part" in
refuse4b)
  mkdir -p /tmp/ck4b
  python3 - <<'PY'
import json
json.dump({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728,
  "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
  "max_position_embeddings": 40960, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}, open("/tmp/ck4b/config.json", "w"))
PY
  echo '{"prompt": "1+1=", "answer": "2"}' > /tmp/ck4b/task.jsonl
  start=$(date +%s.%N)
  /tmp/lockstep train configs/qwen3-4b.toml --set model.path=/tmp/ck4b --set task.path=/tmp/ck4b/task.jsonl --set log.runs_dir=/tmp/runs > $O/refuse4b.log 2>&1
  echo "4B 128 x 2048 on this card: exit $? after $(echo "$(date +%s.%N) - $start" | bc) s"; cat $O/refuse4b.log ;;
small) STEPS=2 rung small qwen3-0.6b:64x1024 ;;
rung06) rung rung06 qwen3-0.6b:512x2048 --set sampler.max_batch=${MAX_BATCH:-512} ;;
rung17) rung rung17 qwen3-1.7b:256x4096 ;;
sample8b)
  ck=/tmp/checkpoints/qwen3-8b
  [ -f $ck/config.json ] || python3 experiments/make_real_shape.py qwen3-8b $ck > $O/make-8b.log 2>&1 || { tail -3 $O/make-8b.log; exit 1; }
  head -64 $ck/task.jsonl > /tmp/p8b.jsonl
  gunzip -c .gpu/lockstep-old.gz > /tmp/lockstep-old && chmod +x /tmp/lockstep-old
  for bin in lockstep-old lockstep; do
    ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.2; done ) > $O/$bin-8b.mem 2>/dev/null &
    poll=$!
    timeout 240 /tmp/$bin sample configs/qwen3-8b.toml --set model.path=$ck --set sampler.input=/tmp/p8b.jsonl --set sampler.output=/tmp/$bin-8b.jsonl \
      --set sampler.max_new_tokens=128 --set sampler.max_batch=64 --set sampler.kv_budget_mib=20000 > $O/$bin-8b.log 2>&1
    echo "$bin: exit $?, peak $(sort -n $O/$bin-8b.mem | tail -1) MiB"; kill $poll
    grep -h "memory plan\|sampled" $O/$bin-8b.log | head -3
  done
  cmp /tmp/lockstep-old-8b.jsonl /tmp/lockstep-8b.jsonl && echo "outputs identical byte for byte ($(wc -l < /tmp/lockstep-8b.jsonl) completions)" ;;
hand06) SCALE_KV_MIB=${KV:-30000} rung hand06 qwen3-0.6b:512x2048:1:${MICRO:-16384} --set sampler.max_batch=${MAX_BATCH:-512} ;;
esac
done
