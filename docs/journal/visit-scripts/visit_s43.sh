# session 43: processed logprobs (sampler.logprobs_mode = "processed_logprobs") on CUDA, at a real
# shape. Build here first (`bash experiments/gpu_check.sh build`), carry .gpu/lockstep.gz and
# .gpu/lockstep-battery.gz (with the repository, both fit the 64 MiB a call carries; a third
# binary does not). Run once in session 43 on an H100 with build ea4722c (raw output lost with
# that session's machine, not archived): the battery passed, the f32 engine checks found one
# sampler = trainer token 2 ulp apart, the bf16 ones stopped on a device fault, and the rung ran
# out of memory without micro-batches.
#   PART=processed  the kernel battery in bf16 (its sampling rows mix raw and processed logprobs,
#                   batch sizes 1..pool), the engine checks in f32 and bf16 (random requests draw
#                   raw or processed logprobs; sampler = trainer as bits), then GRPO at the Qwen3-0.6B
#                   shape, 64 rollouts x 1024 tokens, 2 steps (micro-batches of 16,384 tokens: the
#                   whole batch in one pass ran out of an H100's 80 GB), with Qwen3's generation_config
#                   sampling (top-p 0.95, top-k 20) and processed logprobs: bit_equal and KL per step
#   issue 25's runs are visit_s42.sh's PART=seed (the fused torch reference) and PART=ncupair
set -u
O=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $O/gpu.txt
for part in ${PART:-processed}; do case $part in
processed)
  for bin in lockstep-battery lockstep; do [ -x /tmp/$bin ] || { gunzip -c .gpu/$bin.gz > /tmp/$bin && chmod +x /tmp/$bin; }; done
  timeout 150 /tmp/lockstep-battery --dtypes bf16 > $O/battery.md 2>&1; echo "battery rc $?"
  grep -i "sample\|passed\|fail" $O/battery.md | tail -6
  timeout 120 /tmp/lockstep check --preset small --dtypes f32,bf16 > $O/check.md 2>&1; echo "check rc $?"
  tail -12 $O/check.md
  mkdir -p $O/scale
  SCALE_LIMIT=240 SCALE_SET="--set sampler.top_p=0.95 --set sampler.top_k=20 --set sampler.logprobs_mode=processed_logprobs" \
    O=$O/scale bash experiments/scale.sh qwen3-0.6b:64x1024:2:16384
  tail -3 $O/scale/scale.md
  grep -h '"bit_equal_frac"' /tmp/runs/qwen3-0.6b-64x1024-mb16384/metrics.jsonl | python3 -c "import sys, json; [print('step', m['step'], 'bit_equal', m['agreement']['bit_equal_frac'], 'kl_k1', m['agreement']['kl_k1'], 'tokens', m['agreement']['tokens']) for m in map(json.loads, sys.stdin)]"
  tar -czf $O/scale.tgz -C $O scale && rm -rf $O/scale ;;
esac; done
