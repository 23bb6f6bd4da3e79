# session 30: decode graphs on CUDA after the engine kept its own stream, and the seed benchmark
# with graphs and with every request admitted at once.
#   PART=fix   the engine checks with LOCKSTEP_DECODE_GRAPHS=on (the tokio front's engine thread
#              had failed every capture: cross-stream bindings), then `lockstep sample` on the
#              embedded model launched / replayed / with every capture failed (both faults):
#              the outputs compared byte for byte
#   PART=wide  the seed benchmark (Qwen3-8B shape, 1000 x 100 greedy): matched at max_batch 256
#              and 1024, each launched and with graphs, and the fast arm, in one run
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
case ${PART:-fix} in
fix)
  LOCKSTEP_DECODE_GRAPHS=on timeout ${CHECK_LIMIT:-300} /tmp/lockstep check --preset small --dtypes f32,bf16 > $O/check-graphs.md 2>&1
  echo "check rc $?, failed captures warned: $(grep -c 'launched, not replayed' $O/check-graphs.md)"
  grep "^|" $O/check-graphs.md | grep -v "bit-identical\|passed" ; grep "replayed graphs" $O/check-graphs.md
  d=/tmp/s30; mkdir -p $d
  python3 -c "
for i in range(48): print('{\"prompt\": \"%d+%d=\"}' % (i * 7 % 10, i % 10))" > $d/prompts.jsonl
  run() { local out=$1; shift; (cd $d && env "$@" /tmp/lockstep sample --set sampler.input=prompts.jsonl --set sampler.output=$out \
      --set sampler.max_new_tokens=24 --set sampler.max_batch=8 --set log.progress=false > $out.log 2>&1; echo "$out rc $?: $(grep -o '[0-9]* engine steps ([0-9]* replayed as graphs)' $out.log | head -1), $(grep -c 'launched, not replayed' $out.log) failed captures"); }
  run launched.jsonl LOCKSTEP_DECODE_GRAPHS=off
  run replayed.jsonl LOCKSTEP_DECODE_GRAPHS=on
  run upload.jsonl LOCKSTEP_DECODE_GRAPHS=on LOCKSTEP_FAULT_GRAPH_CAPTURE=upload
  run cross.jsonl LOCKSTEP_DECODE_GRAPHS=on LOCKSTEP_FAULT_GRAPH_CAPTURE=cross-stream
  for f in replayed upload cross; do cmp -s $d/launched.jsonl $d/$f.jsonl && echo "$f = launched: byte-identical" || echo "$f = launched: DIFFERENT"; done
  grep -h "rror\|warning" $d/*.log | sort | uniq -c | head -8
  cp $d/*.log $O/ ;;
wide)
  SEED_ARMS="${SEED_ARMS:-matched-cold matched-warm wide-warm graphs-warm wide-graphs fast-warm}" O=$O/seed bash experiments/seed_bench.sh qwen3-8b ${SEED_N:-1000} 100 256 2>&1 | tail -12
  grep -h "steady state\|engine steps\|warning" $O/seed/seed-*.log | head -20 ;;
esac
# PART=rung: the 0.6B target rung's step 0 (session 23's settings: weights ef4829e7211e1545), launched
# (cold kernel cache), replayed as graphs, launched again (warm), each its own process
case ${PART:-fix} in
rung)
  for arm in off-cold on off-warm; do
    g=${arm%%-*}
    LOCKSTEP_DECODE_GRAPHS=$g SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=62000 --set sampler.max_batch=256 --set train.on_mismatch=stop" O=$O/$arm \
      SCALE_LIMIT=${RUNG_LIMIT:-190} bash experiments/scale.sh qwen3-0.6b:512x2048:1:16384 2>&1 | tail -1
    for f in $O/$arm/*.metrics.jsonl; do python3 -c "
import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]
for x in r: t=x.get('timing',{}); print(sys.argv[2], x.get('trainer_weights_fingerprint'), x.get('agreement',{}).get('bit_equal_frac'), {k: t.get(k) for k in ('gen_s','gen_engine_steps','gen_replayed_steps','gen_failed_captures','gen_launch_s','gen_wait_s','update_s')})" $f $arm; done
  done ;;
esac
# PART=pad (prepared, not run: the device time ran out): padded row counts on CUDA. The engine
# checks with LOCKSTEP_DECODE_GRAPH_PADDING=on, the ragged-tail bench with the three sets side by
# side, then the 0.6B rung's step 0 padded (must end with weights ef4829e7211e1545)
case ${PART:-fix} in
pad)
  LOCKSTEP_DECODE_GRAPH_PADDING=on timeout 120 /tmp/lockstep check --preset small --dtypes f32,bf16 > $O/check-pad.md 2>&1
  echo "check rc $?, failed captures warned: $(grep -c 'launched, not replayed' $O/check-pad.md)"; grep "^|" $O/check-pad.md | grep -v "bit-identical\|passed"
  timeout 200 /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency 64,256 --prompt-len 32 --new-tokens 512 --ragged-lengths \
      --kernels matched,graphs,graphs-padded --skip-ops --repeats 2 2>&1 | grep "^|\|engine steps\|rror\|warning"
  LOCKSTEP_DECODE_GRAPH_PADDING=on SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=62000 --set sampler.max_batch=256 --set train.on_mismatch=stop" O=$O/pad \
    SCALE_LIMIT=190 bash experiments/scale.sh qwen3-0.6b:512x2048:1:16384 2>&1 | tail -1
  grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"\|"gen_replayed_steps":[0-9]*\|"gen_s":[0-9.]*' $O/pad/*.metrics.jsonl ;;
esac
