# session 18 visit 1: the fixed per-layer recomputation (first pass on untracked weights) on the H200:
# the update bench with and without (live bytes after the forward), 0.6B 8 x 8,192 in one recomputed pass
# (out of memory without, session 17 v7), and the 4B rung with 8,192-token micro-batches for 2 steps
# (step 1 ran out of memory without, session 17 v3)
set -u
O=$OUT
for b in lockstep lockstep-battery; do gunzip -c .gpu/$b.gz > /tmp/$b && chmod +x /tmp/$b; done
part=${PART:-all}
if [ "$part" = all ] || [ "$part" = a ]; then
timeout 170 /tmp/lockstep bench --preset qwen3-1.7b --dtype bf16 --concurrency none --trainer-only --trainer-batches 8 --trainer-len 2048 --trainer-recompute > $O/bench-recompute.md 2>&1; echo "bench exit $?"; grep "^|" $O/bench-recompute.md | tail -4
SCALE_SET="--set task.reward=char_f1 --set train.recompute_layers=true" O=$O SCALE_LIMIT=${LIMIT_A:-330} bash experiments/scale.sh qwen3-0.6b:8x8192:1 2>&1 | tail -3
fi
if [ "$part" = all ] || [ "$part" = b ]; then
SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=42000 --set sampler.max_batch=128 --set train.recompute_layers=true" O=$O SCALE_LIMIT=${LIMIT_B:-420} bash experiments/scale.sh qwen3-4b:128x2048:2:8192 2>&1 | tail -3
fi
for f in $O/*.metrics.jsonl; do python3 -c "
import json,sys
for x in map(json.loads, open(sys.argv[1])):
    t=x['timing']; print(sys.argv[1].split('/')[-1], 'step', x.get('step'), 'fp', x.get('trainer_weights_fingerprint'), 'grad_norm', x.get('grad_norm'), 'bit_equal', x['agreement']['bit_equal_frac'], 'update_s', round(t['update_s'],1), 'logprob_s', round(t['logprob_s'],1), 'gen_s', round(t['gen_s'],1))" $f; done
grep -h "memory plan" $O/*.log | cut -c1-300
# part c: the bits a refactor must keep (issue 23): the quickstart's metrics and weight fingerprints, the
# engine checks, and a 0.6B `lockstep sample` output (token ids and logprobs) hashed
if [ "$part" = c ]; then
timeout 300 /tmp/lockstep train configs/quickstart.toml --set log.runs_dir=/tmp/runs --set log.run_name=qs --set log.tensorboard=false > $O/quickstart.log 2>&1; echo "quickstart exit $?"; tail -3 $O/quickstart.log
cp /tmp/runs/qs/metrics.jsonl $O/quickstart.metrics.jsonl 2>/dev/null
python3 -c "
import json,hashlib
rows=[json.loads(l) for l in open('$O/quickstart.metrics.jsonl')]
fps=[r.get('trainer_weights_fingerprint') for r in rows]
print('quickstart steps', len(rows), 'last fingerprint', fps[-1], 'all-fingerprints sha', hashlib.sha256(' '.join(map(str,fps)).encode()).hexdigest()[:16], 'rewards sha', hashlib.sha256(json.dumps([r.get('reward') for r in rows]).encode()).hexdigest()[:16])"
timeout 200 /tmp/lockstep check --preset small --dtypes bf16 > $O/check.log 2>&1; echo "check exit $?"; tail -4 $O/check.log
ck=/tmp/checkpoints/qwen3-0.6b
[ -f $ck/config.json ] || python3 experiments/make_real_shape.py qwen3-0.6b $ck > $O/make-0.6b.log 2>&1
python3 -c "
import json,random
r=random.Random(7)
for i in range(64): print(json.dumps({'id':i,'prompt_ids':[r.randrange(300,151900) for _ in range(r.randrange(8,200))]}))" > /tmp/p.jsonl
timeout 200 /tmp/lockstep sample --set model.path=$ck --set model.dtype=bf16 --set sampler.input=/tmp/p.jsonl --set sampler.output=/tmp/s.jsonl --set sampler.max_new_tokens=64 --set sampler.temperature=1 --set sampler.max_batch=64 --set sampler.context=320 --set log.progress=false > $O/sample06.log 2>&1; echo "sample exit $?"; tail -2 $O/sample06.log
echo "sample 0.6B sha256 $(sha256sum /tmp/s.jsonl | cut -c1-16)"
fi
