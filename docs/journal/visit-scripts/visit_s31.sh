# session 31: padded graph row counts on CUDA, and where an 8B decode step's GPU time goes.
#   PART=pad   the engine checks with LOCKSTEP_DECODE_GRAPH_PADDING=on, then the ragged-tail bench
#              (0.6B, answers over [256, 512] tokens) with launched, replayed and padded side by side
#   PART=ncu   ncu's GPU time of every kernel of the 8B decode bench (launched) at 256 and 1024
#              requests x (32 + NEW tokens), summed per kernel and per grid
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
case ${PART:-pad} in
pad)
  LOCKSTEP_DECODE_GRAPH_PADDING=on timeout 120 /tmp/lockstep check --preset small --dtypes f32,bf16 > $O/check-pad.md 2>&1
  echo "check rc $?, failed captures warned: $(grep -c 'launched, not replayed' $O/check-pad.md)"; grep "^|" $O/check-pad.md | grep -v "bit-identical\|passed"; grep "replayed graphs" $O/check-pad.md
  timeout 240 /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency 64,256 --prompt-len 32 --new-tokens 512 --ragged-lengths \
      --kernels matched,graphs,graphs-padded --skip-ops --repeats 2 2>&1 | tee $O/ragged.md | grep "^|\|engine steps\|rror\|warning" ;;
ncu)
  for c in ${NCU_CONC:-256 1024}; do
    timeout ${NCU_LIMIT:-200} ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      /tmp/lockstep bench --preset qwen3-8b --dtype bf16 --concurrency $c --prompt-len 32 --new-tokens ${NEW:-9} \
      --kernels matched --skip-ops --repeats 1 > $O/ncu-$c.csv 2> $O/ncu-$c.err; echo "ncu $c rc $?"
    tail -3 $O/ncu-$c.err
    python3 experiments/ncu_summary.py $O/ncu-$c.csv --top 25 | tee $O/ncu-$c.md
    python3 experiments/ncu_summary.py $O/ncu-$c.csv --grids --top 40 > $O/ncu-$c-grids.md
    xz -9 $O/ncu-$c.csv
  done ;;
esac
# PART=front: the f32 tokio front check failed with padding on (v1); the checks with padding
# on and off over several seeds, each line the failing rows (none: passed). BIN=other binary
# (v3: one built with the stand-ins repeating the last row, to see the graph check fail)
case ${PART:-pad} in
front)
  for pad in ${PADS:-on off}; do for seed in ${SEEDS:-1 2 3}; do
    s=$(date +%s); LOCKSTEP_DECODE_GRAPH_PADDING=$pad timeout ${CHECK_LIMIT:-120} ${BIN:-/tmp/lockstep} check --preset ${PRESET:-small} --dtypes ${DTYPES:-f32} --seed $seed > $O/check-$pad-$seed${TAG:-}.md 2>&1; rc=$?
    echo "${TAG:-}padding $pad seed $seed: rc $rc in $(( $(date +%s) - s )) s; $(grep '^|' $O/check-$pad-$seed${TAG:-}.md | grep -v 'bit-identical\|passed\|---\|dtype' | cut -c1-400 || true)"
  done; done ;;
esac
# PART=padrung: the 0.6B rung's step 0 with padded row counts (session 23's settings: its weights
# after step 0 are ef4829e7211e1545 launched and replayed, session 30)
case ${PART:-pad} in
padrung)
  LOCKSTEP_DECODE_GRAPH_PADDING=on SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=62000 --set sampler.max_batch=256 --set train.on_mismatch=stop" O=$O/pad \
    SCALE_LIMIT=${RUNG_LIMIT:-200} bash experiments/scale.sh qwen3-0.6b:512x2048:1:16384 2>&1 | tail -1
  grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"\|"bit_equal_frac":[0-9.]*\|"gen_replayed_steps":[0-9]*\|"gen_engine_steps":[0-9]*\|"gen_failed_captures":[0-9]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*' $O/pad/*.metrics.jsonl ;;
esac
# PART=inputs: the attention inputs on one plane a head (CUDA): the battery (its model contract
# now has heads of 128, where the plane kernel runs), the engine checks at the 0.6B shape, then
# ncu of the 8B decode step at 256 requests (compare attention_inputs with PART=ncu's 13.6 µs)
case ${PART:-pad} in
inputs)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${BATTERY_LIMIT:-240} /tmp/lockstep-battery --dtypes f32,bf16 > $O/battery.md 2>&1; echo "battery rc $?: $(grep -c '| yes |' $O/battery.md) rows identical, $(grep -ci '| no |' $O/battery.md) not"
  grep "heads of 128" $O/battery.md | head -16; grep -i "| no |\|^error" $O/battery.md | head
  timeout ${CHECK_LIMIT:-150} /tmp/lockstep check --preset qwen3-0.6b --dtypes bf16 > $O/check-0.6b.md 2>&1; echo "check 0.6b rc $?"; grep "^|" $O/check-0.6b.md | grep -v "bit-identical\|passed\|---\|dtype"
  NCU_CONC=256 NCU_LIMIT=${NCU_LIMIT:-150} PART=ncu bash docs/journal/visit-scripts/visit_s31.sh | grep "attention_inputs\|all\|rc" ;;
esac
# PART=seed: the seed benchmark with this session's build (padded graphs by default, attention
# inputs on one plane a head): launched cold and warm, replayed warm; completions compared as bits
case ${PART:-pad} in
seed)
  SEED_ARMS="${SEED_ARMS:-matched-cold matched-warm graphs-warm}" O=$O/seed bash experiments/seed_bench.sh qwen3-8b ${SEED_N:-1000} 100 256 2>&1 | tail -10
  grep -h "steady state\|engine steps" $O/seed/seed-*.log | head -8 ;;
esac
