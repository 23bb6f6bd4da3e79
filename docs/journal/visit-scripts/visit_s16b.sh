# session 16 visit 2: the 1.7B target rung, 256 x 4096, one step, KV cache held to two waves of 128
set -u
O=$OUT
gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep
SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=61500 ${EXTRA_SET:-}" O=$O SCALE_LIMIT=${LIMIT:-530} bash experiments/scale.sh ${RUNGS:-qwen3-1.7b:256x4096:1:16384} 2>&1 | tail -6
for f in $O/*.metrics.jsonl; do python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(sys.argv[1].split('/')[-1], [x.get('trainer_weights_fingerprint') for x in r], [x.get('grad_norm') for x in r])" $f; done
for f in $O/*.log; do grep -v "^\s*$" $f | grep -i "step \|phase\|gen\b" | tail -4; done
