# session 48: issue 25's seed benchmark with every arm from one visit (its H200 run in session 47
# left transformers out), then where a cold process's compile time goes. Carries .gpu/lockstep.gz.
#   PART=seed     experiments/seed_bench.sh with every default arm, first on a fresh machine (its
#                 cold arm must find the driver's JIT cache empty too)
#   PART=compile  one cold `lockstep sample` of the same workload with cubecl logging every kernel's
#                 CUDA C++ and dumping its PTX (CUDA_CACHE_DISABLE=1: the driver's cache stays as
#                 it was), then experiments/nvrtc_timing.py on those sources: NVRTC serial, with
#                 -pch / --minimal, in parallel, the driver's JIT; whether each option's PTX is the
#                 same bytes; and whether the script's PTX equals what cubecl loaded (it cannot
#                 say: CUBECL_CUDA_DUMP_PTX names files by the id's last 180 characters, and 31
#                 kernels made 18 files)
# After the cubecl-cuda patch (includes first + NVRTC's -pch, LOCKSTEP_NVRTC_PCH):
#   PART=pchab    the same cold run twice in one binary, LOCKSTEP_NVRTC_PCH=off then on, each with
#                 an empty kernel cache and the driver's JIT cache off (both pay the same JIT):
#                 first-wave and whole-process seconds, and their completions compared as bits
#   PART=pchclean a cold `lockstep sample` at the Qwen3-0.6B shape killed (-9) once NVRTC's
#                 precompiled-header folder exists, then a second cold run to the end: the killed
#                 process's folder must be gone after it, and the second's own too
set -u
O=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $O/gpu.txt
gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep
repo=$PWD
for part in ${PART:-seed compile}; do mkdir -p $O/$part; case $part in
seed)
  O=$O/seed bash experiments/seed_bench.sh 2>&1 | tail -32
  (cd $O && tar -czf seed.tgz seed && rm -rf seed) ;;
compile)
  ck=/tmp/checkpoints/qwen3-8b
  [ -f $ck/config.json ] || python3 experiments/make_real_shape.py qwen3-8b $ck > $O/$part/make.log 2>&1
  [ -f /tmp/seed-prompts.jsonl ] || python3 -c "import json,random; r=random.Random(20261202); [print(json.dumps({'id': i, 'prompt_ids': [r.randrange(300, 151933) for _ in range(32)]})) for i in range(1000)]" > /tmp/seed-prompts.jsonl
  w=/tmp/compile-log; rm -rf $w /tmp/ptx-dump /tmp/log-cache; mkdir -p $w
  printf '[compilation.logger]\nlevel = "full"\nfile = "%s/kernels.log"\nappend = false\n' $w > $w/cubecl.toml
  start=$(date +%s.%N)
  (cd $w && CUDA_CACHE_DISABLE=1 CUBECL_CUDA_DUMP_PTX=/tmp/ptx-dump LOCKSTEP_KERNEL_CACHE=/tmp/log-cache LOCKSTEP_DECODE_GRAPHS=off \
    /tmp/lockstep sample --set model.path=$ck --set model.dtype=bf16 --set sampler.input=/tmp/seed-prompts.jsonl \
    --set sampler.output=$w/out.jsonl --set sampler.max_new_tokens=100 --set sampler.temperature=0 --set sampler.max_batch=256 \
    --set sampler.context=164 --set log.progress=false > $O/$part/sample.log 2>&1); echo "logged cold run rc $? in $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
  grep -c START_KERNEL_COMPILATION $w/kernels.log; ls /tmp/ptx-dump | wc -l; tail -4 $O/$part/sample.log
  timeout ${NVRTC_LIMIT:-300} python3 $repo/experiments/nvrtc_timing.py $w/kernels.log 16 > $O/$part/nvrtc.md 2> $O/$part/nvrtc-ptx.txt; echo "nvrtc_timing rc $?"
  cat $O/$part/nvrtc.md
  (cd /tmp/ptx-dump && for f in *.ptx; do sha256sum < "$f" | cut -d' ' -f1; done) | sort > $O/$part/dumped-ptx.txt
  grep -v PTX $O/$part/nvrtc-ptx.txt | sort > /tmp/script-ptx.txt
  echo "PTX cubecl loaded = the script's baseline: $(cmp -s /tmp/script-ptx.txt $O/$part/dumped-ptx.txt && echo yes || echo NO) ($(wc -l < $O/$part/dumped-ptx.txt) dumped, $(wc -l < /tmp/script-ptx.txt) from the script)"
  xz -9 -c $w/kernels.log > $O/$part/kernels.log.xz ;;
pchab)
  ck=/tmp/checkpoints/qwen3-8b
  [ -f $ck/config.json ] || python3 experiments/make_real_shape.py qwen3-8b $ck > $O/$part/make.log 2>&1
  [ -f /tmp/seed-prompts.jsonl ] || python3 -c "import json,random; r=random.Random(20261202); [print(json.dumps({'id': i, 'prompt_ids': [r.randrange(300, 151933) for _ in range(32)]})) for i in range(1000)]" > /tmp/seed-prompts.jsonl
  for pch in off on off on; do
    rm -rf /tmp/ab-cache; start=$(date +%s.%N)
    CUDA_CACHE_DISABLE=1 LOCKSTEP_NVRTC_PCH=$pch LOCKSTEP_KERNEL_CACHE=/tmp/ab-cache LOCKSTEP_DECODE_GRAPHS=off \
      /tmp/lockstep sample --set model.path=$ck --set model.dtype=bf16 --set sampler.input=/tmp/seed-prompts.jsonl \
      --set sampler.output=/tmp/ab-$pch.jsonl --set sampler.max_new_tokens=100 --set sampler.temperature=0 --set sampler.max_batch=256 \
      --set sampler.context=164 --set log.progress=false > $O/$part/pch-$pch.log 2>&1
    echo "LOCKSTEP_NVRTC_PCH=$pch rc $? whole process $(python3 -c "print(round($(date +%s.%N) - $start, 2))") s; $(grep -o 'first 256 completions.*took [0-9.]* s' $O/$part/pch-$pch.log)"
  done
  python3 - /tmp/ab-off.jsonl /tmp/ab-on.jsonl <<'PY'
import json, struct, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
bits = lambda xs: [struct.pack("<f", x) for x in xs]
same = len(a) == len(b) and all(x["token_ids"] == y["token_ids"] and bits(x["logprobs"]) == bits(y["logprobs"]) for x, y in zip(a, b))
print(f"LOCKSTEP_NVRTC_PCH off vs on: {'identical' if same else 'DIFFERENT'} token ids and logprob bits over {len(a)} completions")
PY
  ;;
pchclean)
  ck=/tmp/checkpoints/qwen3-0.6b
  [ -f $ck/config.json ] || python3 experiments/make_real_shape.py qwen3-0.6b $ck > $O/$part/make.log 2>&1
  python3 -c "import json,random; r=random.Random(7); [print(json.dumps({'id': i, 'prompt_ids': [r.randrange(300, 151933) for _ in range(32)]})) for i in range(64)]" > /tmp/pc-prompts.jsonl
  args="sample --set model.path=$ck --set model.dtype=bf16 --set sampler.input=/tmp/pc-prompts.jsonl --set sampler.output=/tmp/pc-out.jsonl \
    --set sampler.max_new_tokens=32 --set sampler.context=96 --set sampler.temperature=0 --set log.progress=false"
  rm -rf /tmp/pc-cache1 /tmp/pc-cache2 /tmp/__nvrtc_auto_pch_*
  LOCKSTEP_KERNEL_CACHE=/tmp/pc-cache1 /tmp/lockstep $args > $O/$part/killed.log 2>&1 & pid=$!  # $! is lockstep itself
  for i in $(seq 1 300); do ls -d /tmp/__nvrtc_auto_pch_${pid}_* > /dev/null 2>&1 && break; sleep 0.05; done
  sleep 0.5; kill -9 $pid; wait $pid 2>/dev/null
  echo "after kill -9 of $pid:"; du -sh /tmp/__nvrtc_auto_pch_* 2>&1
  LOCKSTEP_KERNEL_CACHE=/tmp/pc-cache2 /tmp/lockstep $args > $O/$part/second.log 2>&1; echo "second cold run rc $?"; tail -2 $O/$part/second.log
  echo "after it: $(ls -d /tmp/__nvrtc_auto_pch_* 2>/dev/null | wc -l) folders left" ;;
esac; done
