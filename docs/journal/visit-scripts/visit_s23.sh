# session 23: the decode attention's partial kernel (61-63% of a GRPO step is generation, and at
# long contexts the decode step is mostly this kernel).
#   PART=decode-profile  its CUDA source and SASS as cubecl compiles it, and ncu's counters on it
#                        at 16 and 64 rows x 4096 keys (bench --attention-only, Qwen3-0.6B heads)
#   PART=decode-ab       the partial kernel's launches (LOCKSTEP_DECODE_LAUNCH) side by side with their
#                        output bits, the battery's boundary rows, the engine checks, and a 0.6B
#                        16 x 1024 GRPO step under the old launch (1x2) and the automatic one
#   PART=rung17          the 1.7B 256 x 4096 target rung, one step (LAUNCH=1x2 for the old decode launch)
#   PART=seed            issue 25's benchmark on this build (matched cold and warm, transformers)
#   PART=nccl            data parallel's NCCL path on one GPU: a 0.6B 16 x 1024 step as rank 0 of a group of 1
#                        (RANK etc. set) against sessions 16-23's weights, then `--gpus 2` on this
#                        one-GPU machine (rank 1 has no device: every rank's failure in bounded time)
#   PART=rungs           step 0 of the 0.6B 512 x 2048 and 4B 128 x 2048 target rungs (sessions 20-21's settings)
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
b=(/tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --no-burn)
case ${PART:-decode-profile} in
decode-profile)
  d=/tmp/resources; rm -rf $d; mkdir -p $d
  printf '[compilation.logger]\nlevel = "full"\nfile = "%s/compile.log"\n' "$d" > $d/cubecl.toml
  (cd $d && timeout 120 "${b[@]}" --repeats 3 --attention-only 2>&1 | grep "^|" | tee $O/attention.md)
  python3 experiments/kernel_resources.py $d/compile.log --match mma_partial --ptx $d/ptx 2>&1 | tail -5
  python3 - $d/compile.log $O <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read()
for block in text.split("[START_KERNEL_COMPILATION]")[1:]:
    name = re.search(r"name: (\S+)", block); src = re.search(r"```cpp\n(.*?)```", block, re.S)
    if name and src and "mma_partial" in name.group(1):
        open(sys.argv[2] + "/mma_partial.cu", "w").write(src.group(1)); break
PY
  for p in $d/ptx/*mma_partial*; do
    ptxas -arch=sm_90 -v $p -o /tmp/mp.cubin 2>&1 | tail -3
    cuobjdump -sass /tmp/mp.cubin > $O/mma_partial.sass
    echo "SASS instructions: $(grep -c '/\*[0-9a-f]\{4\}\*/' $O/mma_partial.sass)"
    break
  done
  timeout 200 python3 experiments/ncu_bounds.py --regex "mma_partial|split_combine" --count 12 -- "${b[@]}" --repeats 1 --single-call --attention-only 2>&1 | tee $O/bounds.md | grep "^|" | head -20
  timeout 150 ncu --clock-control none --kernel-name regex:mma_partial --launch-skip 8 --launch-count 1 --section InstructionStats \
    --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis --section SchedulerStats --page details "${b[@]}" --repeats 1 --single-call --attention-only > $O/ncu-details.txt 2>&1
  grep -v "^==PROF==" $O/ncu-details.txt | tail -80 ;;
decode-ab)
  timeout 240 "${b[@]}" --repeats 5 --attention-only 2>&1 | grep "^|" | grep -v prefill | tee $O/decode-launch.md
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout 150 /tmp/lockstep-battery --boundaries-only --dtypes bf16 > $O/battery.md 2>&1; echo "battery exit $?"; grep -i "identical\|differ\|rows" $O/battery.md | tail -4
  timeout 120 /tmp/lockstep check --preset small --dtypes bf16 > $O/check.md 2>&1; echo "check exit $?"; tail -4 $O/check.md
  for launch in 1x2 auto; do
    LOCKSTEP_DECODE_LAUNCH=$launch SCALE_SET="--set task.reward=char_f1" SCALE_LIMIT=150 O=$O/grpo-$launch bash experiments/scale.sh qwen3-0.6b:16x1024:1 | tail -1
    python3 -c "import json,sys; [print('$launch', {k: v for k, v in json.loads(l).items() if any(w in k for w in ('finger', 'bit_equal', 'grad_norm', 'gen_s', 'time'))}) for l in open(sys.argv[1])]" $O/grpo-$launch/*.metrics.jsonl
  done ;;
rung17)
  LOCKSTEP_DECODE_LAUNCH=${LAUNCH:-auto} SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=61500 ${EXTRA_SET:-}" O=$O/rung17-${LAUNCH:-auto} \
    SCALE_LIMIT=${LIMIT:-530} bash experiments/scale.sh ${RUNGS:-qwen3-1.7b:256x4096:1:16384} 2>&1 | tail -6
  for f in $O/rung17-*/*.metrics.jsonl; do python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(sys.argv[1].split('/')[-1], [x.get('trainer_weights_fingerprint') for x in r], [x.get('grad_norm') for x in r])" $f; done ;;
nccl)
  # libnccl.so.2 from torch's nvidia-nccl wheel, linked under the name lockstep loads
  mkdir -p /tmp/ncclib; ln -sf "$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))')" /tmp/ncclib/libnccl.so
  ls -la /tmp/ncclib; export LD_LIBRARY_PATH=/tmp/ncclib:${LD_LIBRARY_PATH:-}
  RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 SCALE_SET="--set task.reward=char_f1 --set train.on_mismatch=stop" SCALE_LIMIT=200 \
    O=$O/nccl bash experiments/scale.sh qwen3-0.6b:16x1024:1:4096 | tail -1
  python3 -c "import json,sys; [print({k: v for k, v in json.loads(l).items() if 'finger' in k or k in ('grad_norm',)}) for l in open(sys.argv[1])]" $O/nccl/*.metrics.jsonl
  grep -i "nccl\|rank\|error" $O/nccl/*.log | head -5
  t=$(date +%s); LOCKSTEP_COLLECTIVE_TIMEOUT_S=20 timeout 120 /tmp/lockstep train --gpus 2 --set train.steps=1 --set log.progress=false --set log.runs_dir=/tmp/runs-gpus > $O/gpus2.log 2>&1
  echo "--gpus 2 on one GPU: exit $? after $(( $(date +%s) - t )) s"; grep -v "^\s*$" $O/gpus2.log | tail -6 ;;
seed)
  SEED_ARMS="matched-cold matched-warm transformers" O=$O/seed bash experiments/seed_bench.sh 2>&1 | tail -8 ;;
rungs)
  SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=62000 --set sampler.max_batch=256 --set train.on_mismatch=stop" O=$O/rungs \
    SCALE_LIMIT=240 bash experiments/scale.sh qwen3-0.6b:512x2048:1:16384 2>&1 | tail -3
  SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=42000 --set sampler.max_batch=128 --set train.recompute_layers=true --set train.on_mismatch=stop" O=$O/rungs \
    SCALE_LIMIT=300 bash experiments/scale.sh qwen3-4b:128x2048:1:8192 2>&1 | tail -3
  for f in $O/rungs/*.metrics.jsonl; do python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(sys.argv[1].split('/')[-1], [x.get('trainer_weights_fingerprint') for x in r], [x.get('grad_norm') for x in r])" $f; done ;;
esac
