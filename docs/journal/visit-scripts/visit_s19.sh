# session 19 visit: the ops-folders redesign (issue 23), the mapped loader and streamed saves (issue 25), the
# resume loader and the scoring pass folded into the update (issue 24) must keep every bit.
# .gpu/base/ holds main's binary from before all of them (d25c84c), .gpu/ the new ones.
#   PART=core  0.6B 512 x 2048 (on_mismatch=stop: no scoring pass): step 0 + checkpoint, then a resumed
#              process runs step 1; weights against session 17's; engine checks; a 0.6B `lockstep sample`
#              with the old and the new binary (output hashed)
#   PART=more  the battery's size-boundary rows (f32, bf16), the GPU quickstart against session 18's
#              metrics, issue 25's benchmark (loads timed; the fast arm left out unless SEED_ARMS names it)
set -u
O=$OUT
for b in lockstep lockstep-battery; do gunzip -c .gpu/$b.gz > /tmp/$b && chmod +x /tmp/$b; done
[ -f .gpu/base/lockstep.xz ] && { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" .gpu/base/lockstep.xz /tmp/lockstep-base && chmod +x /tmp/lockstep-base; }
part=${PART:-core}
fps() { python3 -c "
import json,sys
for f in sys.argv[1:]:
    for x in map(json.loads, open(f)):
        t=x['timing']; print(f.split('/')[-1], 'step', x.get('step'), 'fp', x.get('trainer_weights_fingerprint'), 'grad_norm', x.get('grad_norm'), 'bit_equal', x['agreement']['bit_equal_frac'], 'tokens', x['agreement']['tokens'], 'entropy', x.get('entropy'), 'gen', round(t['gen_s'],1), 'logprob', round(t['logprob_s'],1), 'update', round(t['update_s'],1))" "$@"; }
if [ "$part" = core ]; then
  # session 17 ran this rung for 3 steps: weights after step 0 ef4829e7211e1545, after step 1 735502562a50689a
  set_="--set task.reward=char_f1 --set sampler.kv_budget_mib=62000 --set sampler.max_batch=256 --set train.final_checkpoint=true --set train.on_mismatch=stop"
  SCALE_SET="$set_" SCALE_ARGS="--max-steps 1" O=$O SCALE_LIMIT=250 bash experiments/scale.sh qwen3-0.6b:512x2048:3:16384 2>&1 | tail -1
  cp $O/qwen3-0.6b-512x2048-mb16384.log $O/first.log; grep "checkpoint " $O/first.log | tail -2
  SCALE_SET="$set_" SCALE_ARGS="--max-steps 1" SCALE_RESUME=1 O=$O SCALE_LIMIT=220 bash experiments/scale.sh qwen3-0.6b:512x2048:3:16384 2>&1 | tail -1
  grep "resuming\|checkpoint " $O/qwen3-0.6b-512x2048-mb16384.log | head -3
  fps $O/qwen3-0.6b-512x2048-mb16384.metrics.jsonl; echo "session 17: step 0 ef4829e7211e1545 0.13986294950252248, step 1 735502562a50689a 0.15623350056318563"
  timeout 90 /tmp/lockstep check --preset small --dtypes bf16 > $O/check.log 2>&1; echo "check exit $?"; tail -1 $O/check.log
  ck=/tmp/checkpoints/qwen3-0.6b
  python3 -c "
import json,random
r=random.Random(7)
for i in range(64): print(json.dumps({'id':i,'prompt_ids':[r.randrange(300,151900) for _ in range(r.randrange(8,200))]}))" > /tmp/p.jsonl
  for b in lockstep-base lockstep; do
    timeout 60 /tmp/$b sample --set model.path=$ck --set model.dtype=bf16 --set sampler.input=/tmp/p.jsonl --set sampler.output=/tmp/s-$b.jsonl --set sampler.max_new_tokens=64 --set sampler.temperature=1 --set sampler.max_batch=64 --set sampler.context=320 --set log.progress=false > $O/sample-$b.log 2>&1; echo "sample $b exit $? sha256 $(sha256sum /tmp/s-$b.jsonl | cut -c1-16) lines $(wc -l < /tmp/s-$b.jsonl)"; grep -o '"load_s":[0-9.]*' $O/sample-$b.log
  done
fi
if [ "$part" = more ]; then
  timeout 150 /tmp/lockstep-battery --boundaries-only --dtypes f32,bf16 > $O/boundaries.md 2>&1; echo "boundaries exit $?"; echo "rows yes $(grep -c '| yes' $O/boundaries.md) no $(grep -c '| no' $O/boundaries.md)"; grep "| no" $O/boundaries.md | head -3
  timeout 120 /tmp/lockstep train configs/quickstart.toml --set log.runs_dir=/tmp/runs --set log.run_name=qs --set log.tensorboard=false > $O/quickstart.log 2>&1; echo "quickstart exit $?"; tail -2 $O/quickstart.log
  cp /tmp/runs/qs/metrics.jsonl $O/quickstart.metrics.jsonl 2>/dev/null
  tar -xJOf docs/gpu-runs/2026-12-02-s18.tar.xz 2026-12-02-s18/v2/quickstart.metrics.jsonl > /tmp/qs18.jsonl
  python3 - $O/quickstart.metrics.jsonl /tmp/qs18.jsonl <<'PY'
import json,sys
keep=lambda r: {k: v for k, v in r.items() if k not in ('timing', 'step_s', 'tokens_per_s')}
a=[keep(json.loads(l)) for l in open(sys.argv[1])]; b=[keep(json.loads(l)) for l in open(sys.argv[2])]
print('quickstart vs session 18:', len(a), 'steps; every logged field but timings', 'EQUAL' if a == b else 'DIFFER', '; last fingerprint', a[-1].get('trainer_weights_fingerprint') if a else None)
PY
  SEED_ARMS="${SEED_ARMS:-matched-cold matched-warm transformers}" O=$O bash experiments/seed_bench.sh qwen3-8b 1000 100 256 2>&1 | tail -8
fi
