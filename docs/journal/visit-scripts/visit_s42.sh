# session 42: the seed benchmark with a fast arm that no host launch bounds (issue 25).
#   PART=seed   experiments/seed_bench.sh with SEED_ARMS (default: matched cold and warm, the
#               graphs arm, lockstep's fast ablation, transformers, and the torch reference arm:
#               cuBLAS, flash SDPA, compiled norms, every decode step a CUDA graph), which also
#               prints its decode step's GPU time by kernel kind (torch.profiler)
#   PART=torchprofile  the reference arm alone on N prompts (one wave), for its decode step's profile
#               (TORCH_ARM_PROFILE_FROM=1: positions 32-41, where PART=ncu looks at lockstep)
#   PART=ncupair  both decode steps under ncu with the caches kept (not yet run: session 43's)
#   PART=ncu    lockstep's decode step at 256 rows by kernel on the same card (session 31's
#               PART=ncu at 256 rows): ncu's GPU time of 9 new tokens' steps
set -u
O=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $O/gpu.txt
for part in ${PART:-seed}; do case $part in
seed)
  mkdir -p $O/seed
  SEED_ARMS="${SEED_ARMS:-matched-cold matched-warm graphs-warm fast-warm transformers torch-graphs}" O=$O/seed bash experiments/seed_bench.sh 2>&1 | tail -30
  grep -h "check against\|compiled ops\|torch.compile failed\|Error\|error\|profile of\|^  " $O/seed/seed-torch-graphs.log | head -24
  tar -czf $O/seed.tgz -C $O seed && rm -rf $O/seed ;;
torchprofile)  # the reference arm alone on one wave of N (default 256), for its decode step's profile
  ck=/tmp/checkpoints/qwen3-8b
  [ -f $ck/config.json ] || python3 experiments/make_real_shape.py qwen3-8b $ck > $O/make.log 2>&1
  python3 -c "import json,random; r=random.Random(20261202); [print(json.dumps({'id': i, 'prompt_ids': [r.randrange(300, 151933) for _ in range(32)]})) for i in range(${N:-256})]" > /tmp/p.jsonl
  PYTHONUNBUFFERED=1 TORCH_ARM_PROFILE=on python3 experiments/seed_bench_torch_graphs.py $ck /tmp/p.jsonl 100 256 /tmp/t.jsonl 2>&1 | grep -v "Loading\|Writing" | tail -20 ;;
ncupair)  # both steps under one tool: ncu with the caches kept (as in a run), lockstep's bench and the
  # reference's 10 replayed steps at positions 32-41 (TORCH_ARM_NCU); per step: lockstep's split at its sampling, the reference's over its 10
  [ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
  ck=/tmp/checkpoints/qwen3-8b
  [ -f $ck/config.json ] || python3 experiments/make_real_shape.py qwen3-8b $ck > $O/make.log 2>&1
  python3 -c "import json,random; r=random.Random(20261202); [print(json.dumps({'id': i, 'prompt_ids': [r.randrange(300, 151933) for _ in range(32)]})) for i in range(256)]" > /tmp/p.jsonl
  flags="--cache-control none --clock-control none --metrics gpu__time_duration.sum --csv"
  timeout 240 ncu $flags /tmp/lockstep bench --preset qwen3-8b --dtype bf16 --concurrency 256 --prompt-len 32 --new-tokens 9 \
    --kernels matched --skip-ops --repeats 1 > $O/ncu-lockstep.csv 2> $O/ncu-lockstep.err; echo "ncu lockstep rc $?"
  TORCH_ARM_NCU=on TORCH_ARM_PROFILE_FROM=1 timeout 240 ncu --profile-from-start off $flags \
    python3 experiments/seed_bench_torch_graphs.py $ck /tmp/p.jsonl 20 256 /tmp/t.jsonl > $O/ncu-torch.csv 2> $O/ncu-torch.err; echo "ncu torch rc $?"
  python3 experiments/ncu_summary.py $O/ncu-torch.csv --steps 10 --top 20 | tee $O/ncu-torch.md
  python3 experiments/ncu_summary.py $O/ncu-lockstep.csv --per-step sample_combine | tee $O/ncu-lockstep.md
  xz -9 $O/ncu-lockstep.csv $O/ncu-torch.csv ;;
ncu)
  [ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
  timeout ${NCU_LIMIT:-240} ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    /tmp/lockstep bench --preset qwen3-8b --dtype bf16 --concurrency 256 --prompt-len 32 --new-tokens ${NEW:-9} \
    --kernels matched --skip-ops --repeats 1 > $O/ncu-256.csv 2> $O/ncu-256.err; echo "ncu rc $?"
  tail -3 $O/ncu-256.err
  python3 experiments/ncu_summary.py $O/ncu-256.csv --top 25 | tee $O/ncu-256.md
  xz -9 $O/ncu-256.csv ;;
esac; done
