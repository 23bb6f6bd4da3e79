# session 17 visit 2: the 0.6B target rung, 512 x 2048, on the paged KV cache (256 requests at a time, a pool for 256
# full-length ones), the tensor-core attention backward and the warpgroup fold; 3 steps if the visit's limit allows
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=${KV:-62000} --set sampler.max_batch=${BATCH:-256}" O=$O SCALE_LIMIT=${LIMIT:-540} bash experiments/scale.sh ${RUNGS:-qwen3-0.6b:512x2048:3:16384} 2>&1 | tail -6
for f in $O/*.metrics.jsonl; do python3 -c "
import json,sys
for x in map(json.loads, open(sys.argv[1])):
    t=x['timing']; print(sys.argv[1].split('/')[-1], 'step', x.get('step'), 'fp', x.get('trainer_weights_fingerprint'), 'grad_norm', x.get('grad_norm'), 'bit_equal', x.get('agreement',{}).get('bit_equal_frac', x.get('bit_equal_frac')), {k: round(v,2) if isinstance(v,float) else v for k,v in t.items()})" $f; done
