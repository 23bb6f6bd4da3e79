#!/usr/bin/env bash
# Stop-and-resume identity at a real shape, on the GPU machine (after experiments/bench/scale.sh made
# the checkpoint, or it is made here):
#   O=$OUT bash experiments/bench/resume_check.sh SHAPE:ROLLOUTSxNEW:STEPS[:MICRO] [REFERENCE_METRICS]
# Runs STEPS steps stopped after STEPS/2 (--max-steps) and resumed, then compares every logged
# field but wall-clock times with REFERENCE_METRICS (an uninterrupted run's metrics.jsonl, e.g.
# from scale.sh with the same rung and SCALE_SET), or with an uninterrupted run made here.
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
mkdir -p "$O"
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
IFS=: read -r shape size steps micro <<< "$1"
reference="${2:-}"
rollouts=${size%x*}; new=${size#*x}
ck=/tmp/checkpoints/$shape
[ -f "$ck/config.json" ] || python3 experiments/fixtures/make_real_shape.py "$shape" "$ck" > "$O/make-$shape.log" 2>&1
group=16; [ "$rollouts" -lt 16 ] && group=$rollouts
args=(train "configs/$shape.toml" --set "model.path=$ck" --set "task.path=$ck/task.jsonl"
    --set "train.prompts_per_step=$(( rollouts / group ))" --set "train.group_size=$group" --set "train.steps=$steps"
    --set "sampler.max_new_tokens=$new" --set "sampler.context=$(( new + 64 ))" --set "sampler.max_batch=$rollouts"
    --set "train.micro_batch_tokens=${micro:-0}" --set "train.on_mismatch=warn" --set "log.runs_dir=/tmp/runs" --set log.tensorboard=false
    --set "train.checkpoint_every=1" ${SCALE_SET:-})
name="$shape-${rollouts}x$new${micro:+-mb$micro}"
if [ -z "$reference" ]; then
    rm -rf "/tmp/runs/$name-whole"
    /tmp/lockstep "${args[@]}" --set "log.run_name=$name-whole" > "$O/$name-whole.log" 2>&1 || { echo "uninterrupted run failed"; tail -3 "$O/$name-whole.log"; exit 1; }
    reference="/tmp/runs/$name-whole/metrics.jsonl"
fi
rm -rf "/tmp/runs/$name-resumed"
/tmp/lockstep "${args[@]}" --set "log.run_name=$name-resumed" --max-steps $(( steps / 2 )) > "$O/$name-first.log" 2>&1 || { echo "first half failed"; tail -3 "$O/$name-first.log"; exit 1; }
/tmp/lockstep "${args[@]}" --set "log.run_name=$name-resumed" --resume > "$O/$name-resumed.log" 2>&1 || { echo "resume failed"; tail -3 "$O/$name-resumed.log"; exit 1; }
cp "/tmp/runs/$name-resumed/metrics.jsonl" "$O/$name-resumed.metrics.jsonl"
python3 - "$reference" "/tmp/runs/$name-resumed/metrics.jsonl" <<'EOF'
import json, sys
def load(p):
    out = []
    for line in open(p):
        m = json.loads(line)
        for k in ("step_s", "tokens_per_s", "timing"):
            m.pop(k, None)
        out.append(m)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
same = a == b
print(f"resume check: {len(b)} steps, {'identical to' if same else 'DIFFERENT from'} the uninterrupted run in every logged field but times; last fingerprint {b[-1]['trainer_weights_fingerprint']}")
if not same:
    for x, y in zip(a, b):
        diff = [k for k in x if x[k] != y.get(k)]
        if diff:
            print(f"  step {x['step']}: {diff}")
sys.exit(0 if same else 1)
EOF
