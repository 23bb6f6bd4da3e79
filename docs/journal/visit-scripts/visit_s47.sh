# session 47 (prepared in session 46): issue 25's seed benchmark with every arm and the tile rule
# A/B in the same run, on whatever card comes (its H200 run with the torch reference has never
# happened). Carries .gpu/lockstep.gz (HEAD's build) and, for PART=battery, .gpu/lockstep-battery.gz.
#   PART=seed       experiments/seed_bench.sh, every default arm plus computerates-graphs (the
#                   graphs arm under the tile rule of sessions 28-45: 1/256/5 where the current
#                   rule takes 2/128/7 at 129-256 rows); the two graphs arms' completions must be
#                   equal as bits (seed-cache-bits.txt)
#   PART=tilesweep  visit_s46.sh's: one decode step's matmuls per tile setting under ncu, beside
#                   cuBLAS (what the rule picks on this card)
#   PART=ncutorch   the torch reference's 10 replayed decode steps at 256 rows under ncu with the caches
#                   kept (visit_s42.sh's ncupair half that timed out at 240 s in sessions 43 and 46:
#                   its compile and capture run under ncu too), with 540 s; its own call
#   PART=battery    the battery, bf16 and f32 (every weighed tile = tc-tiles)
# Added in session 47, after PART=battery on an H100 found the row `sampled logprob = trainer's
# token_logprobs` differing in 8 of 257 rows (4.8e-7) in bf16 and f32:
#   PART=contract   the battery (with the rows' detail on stderr) and the engine checks, f32 and
#                   bf16 each in its own process
#   PART=temperature GRPO at the Qwen3-0.6B shape, 64 x 1024, at temperature 0.7 (every earlier
#                   GPU rung ran at T = 1, where the scaled logit is exact), raw logprobs, then
#                   top-p 0.95 / top-k 20 with processed logprobs
set -u
O=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $O/gpu.txt
gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep
for part in ${PART:-seed}; do mkdir -p $O/$part; case $part in
seed)
  SEED_ARMS="${SEED_ARMS:-matched-cold matched-warm graphs-warm computerates-graphs fast-warm transformers torch-graphs}" \
    O=$O/seed bash experiments/seed_bench.sh 2>&1 | tail -32
  (cd $O && tar -czf seed.tgz seed && rm -rf seed) ;;
tilesweep)
  cp .gpu/lockstep.gz .gpu/head.gz
  OUT=$O PART=tilesweep bash docs/journal/visit-scripts/visit_s46.sh 2>&1 | tail -20
  (cd $O && tar -czf tilesweep.tgz tilesweep && rm -rf tilesweep) ;;
ncutorch)
  ck=/tmp/checkpoints/qwen3-8b
  [ -f $ck/config.json ] || python3 experiments/make_real_shape.py qwen3-8b $ck > $O/make.log 2>&1
  python3 -c "import json,random; r=random.Random(20261202); [print(json.dumps({'id': i, 'prompt_ids': [r.randrange(300, 151933) for _ in range(32)]})) for i in range(256)]" > /tmp/p.jsonl
  TORCH_ARM_NCU=on TORCH_ARM_PROFILE_FROM=1 timeout ${NCU_LIMIT:-540} ncu --profile-from-start off --cache-control none --clock-control none \
    --metrics gpu__time_duration.sum --csv python3 experiments/seed_bench_torch_graphs.py $ck /tmp/p.jsonl 20 256 /tmp/t.jsonl \
    > $O/$part/ncu-torch.csv 2> $O/$part/ncu-torch.err; echo "ncu torch rc $?"
  python3 experiments/ncu_summary.py $O/$part/ncu-torch.csv --steps 10 --top 20 | tee $O/$part/ncu-torch.md
  xz -9 $O/$part/ncu-torch.csv ;;
battery)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${BATTERY_LIMIT:-300} /tmp/lockstep-battery --dtypes bf16,f32 > $O/battery/battery.md 2> $O/battery/battery.err; echo "battery rc $?"
  echo "rows not identical: $(grep -c '| no |' $O/battery/battery.md)"; grep -i "wgmma\|tiles" $O/battery/battery.md | head -20 ;;
contract)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${BATTERY_LIMIT:-240} /tmp/lockstep-battery --dtypes bf16,f32 > $O/$part/battery.md 2> $O/$part/battery.err; echo "battery rc $?"
  tail -1 $O/$part/battery.md; grep "| NO |\|| no |" $O/$part/battery.md; grep "sampler\|kept set" $O/$part/battery.err | head -20
  for dt in f32 bf16; do
    timeout ${CHECK_LIMIT:-100} /tmp/lockstep check --preset small --dtypes $dt > $O/$part/check-$dt.md 2>&1; echo "check $dt rc $?"; tail -3 $O/$part/check-$dt.md
  done ;;
temperature)
  for arm in raw processed; do
    set_=""; [ $arm = processed ] && set_="--set sampler.top_p=0.95 --set sampler.top_k=20 --set sampler.logprobs_mode=processed_logprobs"
    rm -rf /tmp/runs/qwen3-0.6b-64x1024-mb16384; mkdir -p $O/$part/$arm
    SCALE_LIMIT=${SCALE_LIMIT:-200} SCALE_SET="--set sampler.temperature=0.7 $set_" O=$O/$part/$arm bash experiments/scale.sh qwen3-0.6b:64x1024:2:16384 > $O/$part/$arm/stdout.txt 2>&1
    echo "$arm:"; tail -2 $O/$part/$arm/scale.md
    grep -h '"bit_equal_frac"' /tmp/runs/qwen3-0.6b-64x1024-mb16384/metrics.jsonl | python3 -c "import sys, json; [print('step', m['step'], 'bit_equal', m['agreement']['bit_equal_frac'], 'kl_k1', m['agreement']['kl_k1'], 'tokens', m['agreement']['tokens']) for m in map(json.loads, sys.stdin)]"
    cp /tmp/runs/qwen3-0.6b-64x1024-mb16384/metrics.jsonl $O/$part/$arm/ 2>/dev/null
  done
  (cd $O && tar -czf temperature.tgz temperature && rm -rf temperature) ;;
esac; done
