# session 26: the attention backward's kernels with register accumulators (key side) and
# double-buffered stages (both sides), on the H200 at real shapes.
#   PART=kernel   the battery's boundary rows (the backward against the f32 dense reference, a
#                 sequence alone = between neighbours), a 0.6B 16 x 1024 GRPO step against sessions
#                 16-25's weights (1a187dc83a75df45: the backward's bits unchanged), then the 1.7B
#                 update at the 1.7B rung's micro-batch (4 x 4,096) with the previous build
#                 (.gpu/lockstep-old.xz, bacd2c3) and this one, wall time and kernels by GPU time,
#                 and ptxas's registers and spills for this build's backward kernels
#   PART=kernel2  (ran on bd4f867 plus a heaviest-first order of the backward's tiles, not kept:
#                 951.5 ms there, 953.1 ms here) the 0.6B step's weights again, the 1.7B
#                 update (previous build, this build with a fresh kernel cache and its compile log,
#                 this build's kernels by GPU time, ptxas on its backward kernels), then the 1.7B
#                 256 x 4096 rung's step 0 (session 25's settings; weights 4ff415b8dedb1350 there)
#   PART=kernel3  (ran on a build with the key side's A fragments read per k chunk, not kept: still
#                 255 registers, more spills, 941.9 ms against 944.2) the 0.6B step's
#                 weights, then the 1.7B update on the previous build (kernel2's, .gpu/lockstep-prev.xz)
#                 and on this one (fresh kernel cache), ptxas on the backward kernels, kernels by GPU time
#   PART=rung4 STEPS4=N [RESUME=1] [FINAL=false]  the 4B 128 x 2048 full-parameter rung toward its 8 steps, in
#                 back-to-back calls of one warm machine (the checkpoint lives there only)
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
case ${PART:-kernel} in
kernel)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.gpu/lockstep-old.xz'), open('/tmp/lockstep-old', 'wb'))" && chmod +x /tmp/lockstep-old
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
  timeout 150 /tmp/lockstep-battery --boundaries-only --dtypes bf16 > $O/battery.md 2>&1; echo "battery exit $?"; grep -i "backward\|identical\|differ" $O/battery.md | tail -6
  SCALE_SET="--set task.reward=char_f1" SCALE_LIMIT=150 O=$O/grpo bash experiments/scale.sh qwen3-0.6b:16x1024:1 | tail -1
  python3 -c "import json,sys; [print({k: v for k, v in json.loads(l).items() if k in ('trainer_weights_fingerprint', 'grad_norm', 'step_s')}) for l in open(sys.argv[1])]" $O/grpo/*.metrics.jsonl
  for b in old new; do
    bin=/tmp/lockstep; [ $b = old ] && bin=/tmp/lockstep-old
    d=/tmp/prof-$b; rm -rf $d; mkdir -p $d
    echo "### $b: 1.7B update 4 x 4096, wall time"
    printf '[compilation.logger]\nlevel = "full"\nfile = "%s/compile.log"\n' "$d" > $d/cubecl.toml
    (cd $d && timeout 120 $bin bench --preset qwen3-1.7b --dtype bf16 --concurrency none --trainer-only --trainer-batches 4 --trainer-len 4096 --repeats 3 2>&1 | grep "^|\|rror")
    echo "### $b: kernels by GPU time"
    printf '[profiling.logger]\nlevel = "basic"\nfile = "%s/profile.log"\n' "$d" > $d/cubecl.toml
    (cd $d && timeout 120 $bin bench --preset qwen3-1.7b --dtype bf16 --concurrency none --trainer-only --trainer-batches 4 --trainer-len 4096 --repeats 1 2>&1 | grep "rror")
    python3 experiments/profile_summary.py $d/profile.log --top 8
    echo "### $b: registers"
    python3 experiments/kernel_resources.py $d/compile.log --match Backward 2>&1 | tail -6
  done 2>&1 | tee $O/update-ab.md ;;
kernel2)
  python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.gpu/lockstep-old.xz'), open('/tmp/lockstep-old', 'wb'))" && chmod +x /tmp/lockstep-old
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt
  SCALE_SET="--set task.reward=char_f1" SCALE_LIMIT=150 O=$O/grpo bash experiments/scale.sh qwen3-0.6b:16x1024:1 | tail -1
  python3 -c "import json,sys; [print({k: v for k, v in json.loads(l).items() if k in ('trainer_weights_fingerprint', 'grad_norm', 'step_s')}) for l in open(sys.argv[1])]" $O/grpo/*.metrics.jsonl
  b17=(bench --preset qwen3-1.7b --dtype bf16 --concurrency none --trainer-only --trainer-batches 4 --trainer-len 4096)
  {
    d=/tmp/k2; rm -rf $d; mkdir -p $d
    echo "### previous build: 1.7B update 4 x 4096"
    timeout 100 /tmp/lockstep-old "${b17[@]}" --repeats 3 2>&1 | grep "^| 4\|rror"
    echo "### this build (fresh kernel cache, compile log)"
    printf '[compilation.logger]\nlevel = "full"\nfile = "%s/compile.log"\n' "$d" > $d/cubecl.toml
    (cd $d && LOCKSTEP_KERNEL_CACHE=$d/cache timeout 100 /tmp/lockstep "${b17[@]}" --repeats 3 2>&1 | grep "^| 4\|rror")
    python3 experiments/kernel_resources.py $d/compile.log --match Backward 2>&1 | tail -4
    echo "### this build: kernels by GPU time"
    printf '[profiling.logger]\nlevel = "basic"\nfile = "%s/profile.log"\n' "$d" > $d/cubecl.toml
    (cd $d && timeout 100 /tmp/lockstep "${b17[@]}" --repeats 1 2>&1 | grep "rror")
    python3 experiments/profile_summary.py $d/profile.log --top 8
  } 2>&1 | tee $O/update-ab.md
  set_="--set task.reward=char_f1 --set sampler.kv_budget_mib=61500 --set train.final_checkpoint=false --set train.on_mismatch=stop"
  SCALE_SET="$set_" SCALE_ARGS="--max-steps 1" O=$O SCALE_LIMIT=${LIMIT:-300} bash experiments/scale.sh qwen3-1.7b:256x4096:8:16384 2>&1 | tail -1
  python3 -c "
import json,sys
for x in map(json.loads, open(sys.argv[1])):
    t=x['timing']; a=x['agreement']
    print('step', x['step'], 'fp', x['trainer_weights_fingerprint'], 'grad_norm', x['grad_norm'], 'bit_equal', a['bit_equal_frac'], 'kl_k1', a['kl_k1'], 'tokens', a['tokens'], 'gen', round(t['gen_s'],1), 'update', round(t['update_s'],1), 'step_s', round(x['step_s'],1))
" $O/qwen3-1.7b-256x4096-mb16384.metrics.jsonl ;;
kernel3)
  python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.gpu/lockstep-prev.xz'), open('/tmp/lockstep-prev', 'wb'))" && chmod +x /tmp/lockstep-prev
  SCALE_SET="--set task.reward=char_f1" SCALE_LIMIT=100 O=$O/grpo bash experiments/scale.sh qwen3-0.6b:16x1024:1 | tail -1
  python3 -c "import json,sys; [print({k: v for k, v in json.loads(l).items() if k in ('trainer_weights_fingerprint', 'grad_norm', 'step_s')}) for l in open(sys.argv[1])]" $O/grpo/*.metrics.jsonl
  b17=(bench --preset qwen3-1.7b --dtype bf16 --concurrency none --trainer-only --trainer-batches 4 --trainer-len 4096)
  {
    d=/tmp/k3; rm -rf $d; mkdir -p $d
    echo "### previous build: 1.7B update 4 x 4096"
    timeout 60 /tmp/lockstep-prev "${b17[@]}" --repeats 3 2>&1 | grep "^| 4\|rror"
    echo "### this build (fresh kernel cache, compile log)"
    printf '[compilation.logger]\nlevel = "full"\nfile = "%s/compile.log"\n' "$d" > $d/cubecl.toml
    (cd $d && LOCKSTEP_KERNEL_CACHE=$d/cache timeout 70 /tmp/lockstep "${b17[@]}" --repeats 3 2>&1 | grep "^| 4\|rror")
    python3 experiments/kernel_resources.py $d/compile.log --match Backward 2>&1 | tail -4
    echo "### this build: kernels by GPU time"
    printf '[profiling.logger]\nlevel = "basic"\nfile = "%s/profile.log"\n' "$d" > $d/cubecl.toml
    (cd $d && timeout 60 /tmp/lockstep "${b17[@]}" --repeats 1 2>&1 | grep "rror")
    python3 experiments/profile_summary.py $d/profile.log --top 6
  } 2>&1 | tee $O/update-ab.md ;;
rung4)
  set_="--set task.reward=char_f1 --set sampler.kv_budget_mib=42000 --set sampler.max_batch=128 --set train.recompute_layers=true --set train.on_mismatch=stop --set train.final_checkpoint=${FINAL:-true}"
  SCALE_SET="$set_" SCALE_ARGS="--max-steps ${STEPS4:-4}" SCALE_RESUME=${RESUME:-} O=$O SCALE_LIMIT=${LIMIT:-575} bash experiments/scale.sh qwen3-4b:128x2048:8:8192 2>&1 | tail -1
  grep "resuming\|checkpoint \|rror" $O/qwen3-4b-128x2048-mb8192.log | head -12
  python3 -c "
import json,sys
for x in map(json.loads, open(sys.argv[1])):
    t=x['timing']; a=x['agreement']
    print('step', x['step'], 'fp', x['trainer_weights_fingerprint'], 'sampler_fp', x['sampler_weights_fingerprint'], 'grad_norm', x['grad_norm'], 'bit_equal', a['bit_equal_frac'], 'kl_k1', a['kl_k1'], 'tokens', a['tokens'], 'gen', round(t['gen_s'],1), 'logprob', round(t['logprob_s'],1), 'update', round(t['update_s'],1), 'sync', round(t['sync_s'],2), 'step_s', round(x['step_s'],1))
" $O/qwen3-4b-128x2048-mb8192.metrics.jsonl
  echo "peak memory MiB: $(sort -n $O/qwen3-4b-128x2048-mb8192.mem | tail -1)" ;;
esac
