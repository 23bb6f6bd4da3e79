# session 17 visit 5: per-layer recomputation (train.recompute_layers) on the H200: the update bench with and
# without, a 0.6B GRPO step that must end in the same weights as without (1a187dc83a75df45, visit 1), and the 4B
# rung with 16,384-token micro-batches, which did not fit without (visit 3 ran out of memory at 8,192)
set -u
O=$OUT
for b in lockstep lockstep-battery; do gunzip -c .gpu/$b.gz > /tmp/$b && chmod +x /tmp/$b; done
timeout 150 /tmp/lockstep bench --preset qwen3-1.7b --dtype bf16 --concurrency none --trainer-only --trainer-batches 8 --trainer-len 2048 --trainer-recompute > $O/bench-recompute.md 2>&1; echo "bench exit $?"; grep "^|" $O/bench-recompute.md | tail -4
SCALE_SET="--set task.reward=char_f1 --set train.recompute_layers=true" O=$O SCALE_LIMIT=100 bash experiments/scale.sh qwen3-0.6b:16x1024:1 2>&1 | tail -1
SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=42000 --set sampler.max_batch=128 --set train.recompute_layers=true" O=$O SCALE_LIMIT=${LIMIT:-260} bash experiments/scale.sh qwen3-4b:128x2048:2:16384 2>&1 | tail -1
for f in $O/*.metrics.jsonl; do python3 -c "
import json,sys
for x in map(json.loads, open(sys.argv[1])):
    t=x['timing']; print(sys.argv[1].split('/')[-1], 'step', x.get('step'), 'fp', x.get('trainer_weights_fingerprint'), 'grad_norm', x.get('grad_norm'), 'bit_equal', x['agreement']['bit_equal_frac'], 'update_s', round(t['update_s'],1), 'logprob_s', round(t['logprob_s'],1), 'gen_s', round(t['gen_s'],1))" $f; done
grep -h "memory plan" $O/*.log | cut -c1-300
