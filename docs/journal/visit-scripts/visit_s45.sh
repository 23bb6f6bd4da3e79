# session 45: processed logprobs on CUDA (visit_s44.sh's PART=processed, never run) and what the
# truncation kernel (top-k / top-p by 32-step bisection, one 128-unit cube a row) costs a decode step.
#   PART=trunc  `lockstep bench` at the Qwen3-0.6B shape, 64 and 256 requests x 128 new tokens:
#               full-vocabulary sampling beside top-p 0.95 / top-k 20 (raw and processed logprobs),
#               decode steps replayed as graphs, in one process
#   PART=battery  the battery (.gpu/lockstep-battery.gz), bf16 and f32: its new row, the fast
#               thresholds = the definition's
#   PART=fast   after the fast truncation kernel (8 + 8 passes instead of 64, same thresholds):
#               the same bench with the new build and the one before it (.gpu/before.gz)
#               side by side, and `lockstep sample` at the Qwen3-0.6B shape by both builds (64
#               prompts x 256 tokens; top-k 20 / top-p 0.95 processed, top-p 0.9 alone raw): the
#               output files must be equal as bytes (tokens and logprob bits)
#   PART=grpo   GRPO at the Qwen3-0.6B shape, 64 x 1024, 1 step, top-p 0.95 / top-k 20 with
#               processed logprobs, by the build before (.gpu/before.gz) and this one: the step's
#               generation time and bit_equal
#   PART=processed  visit_s44.sh's part: engine checks per dtype, then GRPO 0.6B 64 x 1024 with
#               top-p 0.95 / top-k 20 and processed logprobs (bit_equal and KL per step)
set -u
O=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $O/gpu.txt
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
for part in ${PART:-trunc processed}; do case $part in
trunc)
  timeout ${TRUNC_LIMIT:-200} /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency ${CONC:-64,256} --prompt-len 32 --new-tokens 128 \
    --kernels graphs-padded,graphs-padded+topp,graphs-padded+processed --skip-ops --repeats 2 > $O/trunc.md 2> $O/trunc.err; echo "trunc rc $?"
  cat $O/trunc.md; grep "engine steps\|rror\|panic" $O/trunc.err | head -12 ;;
battery)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${BATTERY_LIMIT:-200} /tmp/lockstep-battery --dtypes bf16,f32 > $O/battery.md 2> $O/battery.err; echo "battery rc $?"
  grep "thresholds\|sample" $O/battery.md | head; echo "rows not identical: $(grep -c '| no |' $O/battery.md)"; tail -2 $O/battery.err ;;
fast)
  gunzip -c .gpu/before.gz > /tmp/lockstep-before && chmod +x /tmp/lockstep-before
  for b in lockstep lockstep-before; do
    timeout 100 /tmp/$b bench --preset qwen3-0.6b --dtype bf16 --concurrency 64,256 --prompt-len 32 --new-tokens 128 \
      --kernels graphs-padded,graphs-padded+topp,graphs-padded+processed --skip-ops --repeats 2 > $O/trunc-$b.md 2> $O/trunc-$b.err; echo "$b bench rc $?"
    grep "^| [0-9]" $O/trunc-$b.md
  done
  ck=/tmp/checkpoints/qwen3-0.6b
  [ -f $ck/config.json ] || python3 experiments/make_real_shape.py qwen3-0.6b $ck > $O/make.log 2>&1
  python3 -c "import json,random; r=random.Random(45); [print(json.dumps({'id': i, 'prompt_ids': [r.randrange(300, 151900) for _ in range(32)]})) for i in range(64)]" > /tmp/p45.jsonl
  for mode in "top_k=20 top_p=0.95 logprobs_mode=processed_logprobs" "top_k=0 top_p=0.9 logprobs_mode=raw_logprobs"; do
    sets=""; for kv in $mode; do sets="$sets --set sampler.$kv"; done
    for b in lockstep lockstep-before; do
      /usr/bin/time -f "$b %e s" timeout 100 /tmp/$b sample --set model.path=$ck --set model.dtype=bf16 --set sampler.input=/tmp/p45.jsonl \
        --set sampler.output=/tmp/out-$b.jsonl --set sampler.max_new_tokens=256 --set sampler.max_batch=64 --set sampler.context=320 \
        --set log.progress=false $sets > $O/sample-$b.log 2>&1 || tail -3 $O/sample-$b.log
      tail -1 $O/sample-$b.log
    done
    cmp /tmp/out-lockstep.jsonl /tmp/out-lockstep-before.jsonl && echo "sample ($mode): outputs equal as bytes ($(wc -l < /tmp/out-lockstep.jsonl) lines)"
  done ;;
grpo)
  [ -x /tmp/lockstep-before ] || { gunzip -c .gpu/before.gz > /tmp/lockstep-before && chmod +x /tmp/lockstep-before; }
  cp /tmp/lockstep /tmp/lockstep-new
  for b in lockstep-before lockstep-new; do
    cp /tmp/$b /tmp/lockstep; mkdir -p $O/grpo-$b
    SCALE_LIMIT=150 SCALE_SET="--set sampler.top_p=0.95 --set sampler.top_k=20 --set sampler.logprobs_mode=processed_logprobs" \
      O=$O/grpo-$b bash experiments/scale.sh qwen3-0.6b:64x1024:1:16384 | sed "s/^/$b /"
  done
  cp /tmp/lockstep-new /tmp/lockstep ;;
processed)
  O=$O PART=processed bash docs/journal/visit-scripts/visit_s44.sh ;;
esac; done
