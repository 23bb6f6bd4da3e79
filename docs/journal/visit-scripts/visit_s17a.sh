# session 17 visit 1: the paged KV cache on the H200 (engine checks in bf16; a 0.6B GRPO step with the
# default pool and with a budget that forces preemption: session 16's full cache gave 1a187dc83a75df45),
# the boundary rows, and the device-thread failpoint on CUDA
set -u
O=$OUT
for b in lockstep lockstep-battery; do gunzip -c .gpu/$b.gz > /tmp/$b && chmod +x /tmp/$b; done
timeout ${CHECK_LIMIT:-100} /tmp/lockstep check --preset small --dtypes bf16 > $O/check.md 2>&1; echo "check exit $?"; grep -v "^\s*$" $O/check.md | tail -14
(cd /tmp && LOCKSTEP_FAULT_DEVICE_PANIC=rmsnorm timeout 60 /tmp/lockstep train --set log.run_name=dp --set train.sft_steps=0 --set log.runs_dir=/tmp/runs > $O/device_panic.log 2>&1; echo "device-thread failpoint exit $?"); grep -i "error" $O/device_panic.log | tail -2
SCALE_SET="--set task.reward=char_f1" O=$O SCALE_LIMIT=${LIMIT:-100} bash experiments/scale.sh qwen3-0.6b:16x1024:1 2>&1 | tail -1
mv $O/qwen3-0.6b-16x1024.metrics.jsonl $O/full-pool.metrics.jsonl; mv $O/qwen3-0.6b-16x1024.log $O/full-pool.log
SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=1100" O=$O SCALE_LIMIT=${LIMIT:-100} bash experiments/scale.sh qwen3-0.6b:16x1024:1 2>&1 | tail -1
for f in $O/*.metrics.jsonl; do python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(sys.argv[1].split('/')[-1], [x.get('trainer_weights_fingerprint') for x in r], [x.get('grad_norm') for x in r], 'preempted', [x['timing'].get('gen_preempted') for x in r])" $f; done
timeout ${BOUNDARY_LIMIT:-150} /tmp/lockstep-battery --boundaries-only --dtypes bf16 > $O/boundaries.md 2>&1; echo "boundaries exit $?"; grep -c "| yes" $O/boundaries.md; grep "| no" $O/boundaries.md | head -3
