# session 16 visit 1: the wgmma fold with its accumulators loaded straight from global memory, against the cmma chain
set -u
O=$OUT
gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep
bench() { timeout $1 /tmp/lockstep bench --preset $2 --dtype bf16 --concurrency none --trainer-only --trainer-batches $3 --trainer-len $4 --repeats 2 > $O/bench-$2-$3x$4-$5.log 2>&1; echo "$5: $(grep '^| [0-9]' $O/bench-$2-$3x$4-$5.log | tail -1) $(grep -m1 -o 'rror.*' $O/bench-$2-$3x$4-$5.log | cut -c1-200)"; }
echo "## update bench (step ms = forward + backward with folded weight gradients)"
LOCKSTEP_FOLD_KERNEL=wgmma bench 60 qwen3-1.7b 8 2048 wgmma-fold
LOCKSTEP_FOLD_KERNEL=cmma bench 60 qwen3-1.7b 8 2048 cmma-fold
LOCKSTEP_FOLD_KERNEL=wgmma bench 45 qwen3-0.6b 16 1024 wgmma-fold
LOCKSTEP_FOLD_KERNEL=cmma bench 45 qwen3-0.6b 16 1024 cmma-fold
echo "## battery boundaries (bf16), wgmma fold"
LOCKSTEP_FOLD_KERNEL=wgmma timeout 150 /tmp/lockstep-battery --boundaries-only --dtypes bf16 > $O/boundaries.log 2>&1; echo "battery exit $?"
grep "^|" $O/boundaries.log | tail -14; grep -m3 -i "error\|panic" $O/boundaries.log | cut -c1-300
echo "## micro-batch invariance, 0.6B 16x1024, 1 step, wgmma fold (session 15: 64001ed9dbaa8f0a)"
LOCKSTEP_FOLD_KERNEL=wgmma SCALE_SET="--set task.reward=char_f1" O=$O SCALE_LIMIT=75 bash experiments/scale.sh qwen3-0.6b:16x1024:1 qwen3-0.6b:16x1024:1:4096 2>&1 | tail -3
for f in $O/qwen3-0.6b-16x1024*.metrics.jsonl; do python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print(sys.argv[1].split('/')[-1], [x.get('trainer_weights_fingerprint') for x in r], [x.get('grad_norm') for x in r])" $f; done
