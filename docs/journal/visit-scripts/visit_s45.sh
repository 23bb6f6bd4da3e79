# session 45: processed logprobs on CUDA (visit_s44.sh's PART=processed, never run) and what the
# truncation kernel (top-k / top-p by 32-step bisection, one 128-unit cube a row) costs a decode step.
#   PART=trunc  `lockstep bench` at the Qwen3-0.6B shape, 64 and 256 requests x 128 new tokens:
#               full-vocabulary sampling beside top-p 0.95 / top-k 20 (raw and processed logprobs),
#               decode steps replayed as graphs, in one process
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
processed)
  O=$O PART=processed bash docs/journal/visit-scripts/visit_s44.sh ;;
esac; done
