# session 16 visit 3: the paged KV cache on the H200: a 0.6B GRPO step with a KV budget that forces preemption
# (same rollouts and weights as visit 1-2's full cache: fingerprint 1a187dc83a75df45), then the engine checks
set -u
O=$OUT
gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep
SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=1100" O=$O SCALE_LIMIT=${LIMIT:-100} bash experiments/scale.sh qwen3-0.6b:16x1024:1 2>&1 | tail -2
for f in $O/*.metrics.jsonl; do python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(sys.argv[1].split('/')[-1], [x.get('trainer_weights_fingerprint') for x in r], [x.get('grad_norm') for x in r], 'preempted', [x['timing'].get('gen_preempted') for x in r])" $f; done
timeout ${CHECK_LIMIT:-60} /tmp/lockstep check --preset small --dtypes bf16 > $O/check.md 2>&1; echo "check exit $?"; grep -i "paged\|fail\|passed\|shared prompt" $O/check.md | head -8
