# session 44: processed logprobs on CUDA after bc94f24 (the sampler takes a processed row's logprob
# from the trainer's own masked logprob kernels). Build here: `bash experiments/gpu_check.sh build`
# for .gpu/lockstep.gz, and the same in a worktree of 2bd23dc (before processed logprobs) copied to
# .gpu/old-lockstep.gz; carry both (a third binary does not fit the 64 MiB a call carries).
#   PART=processed  the engine checks in f32 and in bf16, each its own process (session 43's run of
#                   both in one process found one f32 sampler = trainer token 2 ulp apart, then the
#                   bf16 checks stopped on CUDA error 717); when the bf16 checks fail, the build
#                   before processed logprobs runs them too (a fault there predates the feature); then
#                   GRPO at the Qwen3-0.6B shape, 64 rollouts x 1024 tokens, 2 steps, micro-batches of
#                   16,384 tokens, top-p 0.95 / top-k 20 with processed logprobs: bit_equal, KL per step
set -u
O=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $O/gpu.txt
for part in ${PART:-processed}; do case $part in
processed)
  gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep
  [ -f .gpu/old-lockstep.gz ] && gunzip -c .gpu/old-lockstep.gz > /tmp/old-lockstep && chmod +x /tmp/old-lockstep
  for dt in f32 bf16; do
    timeout ${CHECK_LIMIT:-100} /tmp/lockstep check --preset small --dtypes $dt > $O/check-$dt.md 2>&1; rc=$?; echo "check $dt rc $rc"
    grep "^|" $O/check-$dt.md | grep -v "bit-identical\|---\|dtype" | head -8; tail -4 $O/check-$dt.md
    if [ $dt = bf16 ] && [ $rc != 0 ] && [ -x /tmp/old-lockstep ]; then
      timeout ${CHECK_LIMIT:-100} /tmp/old-lockstep check --preset small --dtypes bf16 > $O/check-bf16-old.md 2>&1; echo "old build check bf16 rc $?"; tail -4 $O/check-bf16-old.md
    fi
  done
  mkdir -p $O/scale
  SCALE_LIMIT=${SCALE_LIMIT:-220} SCALE_SET="--set sampler.top_p=0.95 --set sampler.top_k=20 --set sampler.logprobs_mode=processed_logprobs" \
    O=$O/scale bash experiments/scale.sh qwen3-0.6b:64x1024:2:16384
  tail -3 $O/scale/scale.md; tail -3 $O/scale/*.log
  grep -h '"bit_equal_frac"' /tmp/runs/qwen3-0.6b-64x1024-mb16384/metrics.jsonl | python3 -c "import sys, json; [print('step', m['step'], 'bit_equal', m['agreement']['bit_equal_frac'], 'kl_k1', m['agreement']['kl_k1'], 'tokens', m['agreement']['tokens']) for m in map(json.loads, sys.stdin)]"
  tar -czf $O/scale.tgz -C $O scale && rm -rf $O/scale ;;
esac; done
