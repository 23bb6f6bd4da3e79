# session 46: issue 25's seed benchmark with every arm on whatever card comes (its H200 run with the
# torch reference has never happened), the one-tool split of its decode step, and the truncation
# kernel's 16-deep loads (48e9f95, reverted unmeasured in session 45) against HEAD's 4-deep ones.
# Carries .gpu/head.gz (HEAD's build) and .gpu/deep16.gz (HEAD + the 16-deep loads).
#   PART=seed     visit_s42.sh's PART=seed (every arm of experiments/seed_bench.sh) with HEAD's build
#   PART=ncupair  visit_s42.sh's PART=ncupair (both decode steps under ncu, caches kept), HEAD's build
#   PART=deep16   visit_s45.sh's PART=fast: bench full / +topp / +processed sampling by the 16-deep
#                 build and HEAD's side by side, and `lockstep sample` by both (outputs equal as bytes)
#   PART=grpo     visit_s45.sh's PART=grpo: GRPO 0.6B 64 x 1024 top-p 0.95 / top-k 20 processed,
#                 HEAD's build then the 16-deep one (generation time, bit_equal)
#   PART=deep16bytes  (v3) `lockstep sample` top-k 20 / top-p 0.95 processed by both builds (the line
#                 PART=deep16 printed for it was cut from the call's output), then PART=grpo
#   PART=sampleprof  ncu's detail sections (speed of light, occupancy, warp stalls, memory) of the
#                 greedy sampling kernel at 256 rows x 151,936 (session 42's ncu: 188.6 us a launch
#                 for 78 MB of logits, 12% of the H100's bandwidth) and of the add + RMSNorm kernel
#   PART=tilesweep  one 256-row decode step's matmuls at the 8B shape under ncu (caches kept) for
#                 each LOCKSTEP_WGMMA_TILES setting (scheduling only: the same bits), beside cuBLAS
#                 at the same projections (experiments/cublas_decode_matmuls.py)
set -u
O=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $O/gpu.txt
unpack() { gunzip -c .gpu/$1.gz > $2 && chmod +x $2; }
for part in ${PART:-seed}; do mkdir -p $O/$part; case $part in
seed|ncupair)
  unpack head /tmp/lockstep
  OUT=$O/$part PART=$part bash docs/journal/visit-scripts/visit_s42.sh ;;
deep16|grpo)
  unpack deep16 /tmp/lockstep; cp .gpu/head.gz .gpu/before.gz; rm -f /tmp/lockstep-before
  sub=$part; [ $part = deep16 ] && sub=fast
  OUT=$O/$part PART=$sub bash docs/journal/visit-scripts/visit_s45.sh ;;
deep16bytes)
  unpack deep16 /tmp/lockstep; unpack head /tmp/lockstep-before
  ck=/tmp/checkpoints/qwen3-0.6b
  [ -f $ck/config.json ] || python3 experiments/make_real_shape.py qwen3-0.6b $ck > $O/make.log 2>&1
  python3 -c "import json,random; r=random.Random(45); [print(json.dumps({'id': i, 'prompt_ids': [r.randrange(300, 151900) for _ in range(32)]})) for i in range(64)]" > /tmp/p45.jsonl
  for b in lockstep lockstep-before; do
    timeout 100 /tmp/$b sample --set model.path=$ck --set model.dtype=bf16 --set sampler.input=/tmp/p45.jsonl --set sampler.output=/tmp/out-$b.jsonl \
      --set sampler.max_new_tokens=256 --set sampler.max_batch=64 --set sampler.context=320 --set log.progress=false \
      --set sampler.top_k=20 --set sampler.top_p=0.95 --set sampler.logprobs_mode=processed_logprobs > $O/$part/s-$b.log 2>&1; echo "$b rc $?"
  done
  cmp /tmp/out-lockstep.jsonl /tmp/out-lockstep-before.jsonl && echo "topk20/topp0.95 processed: equal as bytes ($(wc -l < /tmp/out-lockstep.jsonl) lines)"
  cp .gpu/head.gz .gpu/before.gz
  OUT=$O/$part PART=grpo bash docs/journal/visit-scripts/visit_s45.sh 2>&1 | tail -4 ;;
sampleprof)
  unpack head /tmp/lockstep
  for k in sample_partials add_rmsnorm; do
    timeout 200 ncu --clock-control none -k regex:$k --launch-skip 4 --launch-count 2 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
      /tmp/lockstep bench --preset qwen3-8b --dtype bf16 --concurrency 256 --prompt-len 32 --new-tokens 9 \
      --kernels matched --skip-ops --repeats 1 > $O/$part/ncu-$k.txt 2> $O/$part/ncu-$k.err; echo "ncu $k rc $?"
    grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Stall|Waves Per SM|Grid Size|L2 Hit|L1/TEX Hit" $O/$part/ncu-$k.txt | head -40
  done ;;
tilesweep)
  unpack head /tmp/lockstep
  args=""
  for t in rule ${TILES:-2/256/4 1/256/5 2/128/7 1/128/8 2/128/3 2/64/8 1/64/6 1/64/4}; do
    f=$O/$part/ncu-${t//\//-}.csv; env=""; [ $t = rule ] || env="LOCKSTEP_WGMMA_TILES=$t"
    env $env timeout 120 ncu --cache-control none --clock-control none -k regex:matmul --launch-skip 145 --launch-count 145 \
      --metrics gpu__time_duration.sum --csv /tmp/lockstep bench --preset qwen3-8b --dtype bf16 --concurrency 256 \
      --prompt-len 32 --new-tokens 3 --kernels matched --skip-ops --repeats 1 > $f 2> $f.err || echo "$t rc $?"
    args="$args $t=$f"
  done
  python3 experiments/ncu_decode_tiles.py $args | tee $O/$part/tiles.md
  python3 experiments/cublas_decode_matmuls.py qwen3-8b 256 | tee $O/$part/cublas.md ;;
esac; done
