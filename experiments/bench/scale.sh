#!/usr/bin/env bash
# Scale rungs on one H200 (docs/scale.md). From the repo root on the GPU machine, after
# `bash experiments/visit/gpu_check.sh build` here and carrying .gpu/:
#   O=$OUT bash experiments/bench/scale.sh SHAPE:ROLLOUTSxNEW[:STEPS[:MICRO_TOKENS]] ...
# e.g. `qwen3-0.6b:16x1024:2` or `qwen3-0.6b:512x2048:1:16384` (train.micro_batch_tokens; left
# out: "auto", sized from the card's free memory).
# Makes SHAPE's random checkpoint once (experiments/fixtures/make_real_shape.py),
# runs `lockstep train configs/SHAPE.toml` (configs/qwen3-1.7b.toml for a shape without its own:
# the other families' shapes, whose settings below override it) with prompts_per_step = ROLLOUTS / 16 (group 16, or
# ROLLOUTS when smaller) and max_new_tokens = NEW, samples GPU memory every 0.2 s, and appends one
# markdown row per rung to $O/scale.md (summarised from the run's metrics.jsonl by scale_row.py).
# The KV pool is "auto" (sized from the card's free memory) unless SCALE_KV_MIB sets it (0: every
# rollout at full length).
# SCALE_LIMIT (s, default 280) bounds a rung; SCALE_SET adds --set pairs to every rung, SCALE_ARGS other
# arguments (`--max-steps 1`); SCALE_RESUME=1 continues the rung's run (`--resume`) instead of starting it afresh;
# SCALE_TAG names the run apart from another of the same rung (e.g. `recompute`, with SCALE_SET's keys).
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
mkdir -p "$O"
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
for rung in "$@"; do
    IFS=: read -r shape size steps micro <<< "$rung"
    rollouts=${size%x*}; new=${size#*x}; steps=${steps:-2}
    ck=/tmp/checkpoints/$shape
    if [ ! -f "$ck/config.json" ]; then
        python3 experiments/fixtures/make_real_shape.py "$shape" "$ck" > "$O/make-$shape.log" 2>&1 || { echo "make $shape failed"; tail -3 "$O/make-$shape.log"; continue; }
    fi
    group=16; [ "$rollouts" -lt 16 ] && group=$rollouts
    prompts=$(( rollouts / group ))
    name="$shape-${rollouts}x$new${micro:+-mb$micro}${SCALE_TAG:+-$SCALE_TAG}"
    resume=""
    if [ -n "${SCALE_RESUME:-}" ]; then resume=--resume; else rm -rf "/tmp/runs/$name"; fi
    ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.2; done ) > "$O/$name.mem" 2>/dev/null &
    poll=$!
    start=$(date +%s)
    config=configs/$shape.toml; [ -f "$config" ] || config=configs/qwen3-1.7b.toml
    timeout "${SCALE_LIMIT:-280}" /tmp/lockstep train "$config" --set "model.path=$ck" --set "task.path=$ck/task.jsonl" \
        --set "train.prompts_per_step=$prompts" --set "train.group_size=$group" --set "train.steps=$steps" \
        --set "sampler.max_new_tokens=$new" --set "sampler.context=$(( new + 64 ))" --set "sampler.max_batch=$rollouts" --set "sampler.kv_budget_mib=${SCALE_KV_MIB:-auto}" \
        --set "train.micro_batch_tokens=${micro:-auto}" --set "train.on_mismatch=warn" --set train.final_checkpoint=false --set "log.runs_dir=/tmp/runs" --set "log.run_name=$name" --set log.tensorboard=false ${SCALE_SET:-} ${SCALE_ARGS:-} $resume \
        > "$O/$name.log" 2>&1
    rc=$?
    kill $poll 2>/dev/null
    wall=$(( $(date +%s) - start ))
    cp "/tmp/runs/$name/metrics.jsonl" "$O/$name.metrics.jsonl" 2>/dev/null
    python3 experiments/bench/scale_row.py "$name" "$rc" "$wall" "$O/$name.mem" "/tmp/runs/$name/metrics.jsonl" "$ck/config.json" | tee -a "$O/scale.md"
    [ "$rc" = 0 ] || grep -v "^\s*$" "$O/$name.log" | grep -iv "warn.*differ" | tail -n 4
done
