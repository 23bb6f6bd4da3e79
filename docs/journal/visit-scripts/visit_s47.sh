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
esac; done
