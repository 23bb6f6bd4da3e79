#!/usr/bin/env bash
# Session 12's visits. Usage (on the H200, from the repo root): O=$OUT bash experiments/visit_s12.sh PART...
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
for bin in lockstep-battery lockstep; do
    [ -f .gpu/$bin.gz ] && { [ -x /tmp/$bin ] || { gunzip -c .gpu/$bin.gz > /tmp/$bin && chmod +x /tmp/$bin; }; }
done
for part in "$@"; do
    case "$part" in
    battery) OUT=$O/battery TOTAL_LIMIT=${BATTERY_LIMIT:-200} bash experiments/gpu_visit.sh battery > $O/battery.log 2>&1; tail -n 4 $O/battery.log
        tar xzOf $O/battery/visit.tgz battery.md 2>/dev/null | grep "kernels)\|checks bit-identical\|| no |" | head -20 ;;
    check) OUT=$O/check TOTAL_LIMIT=120 bash experiments/gpu_visit.sh check > $O/check.log 2>&1; tail -n 12 $O/check.log ;;
    repro) OUT=$O/repro TOTAL_LIMIT=170 bash experiments/gpu_visit.sh repro > $O/repro.log 2>&1; tail -n 5 $O/repro.log ;;
    attention-ab)  # attention rows with each kernel set (LOCKSTEP_ATTENTION_TC), then torch's SDPA on the same shapes
        for kernels in cmma mma; do
            echo "## tensor-core attention kernels: $kernels"
            LOCKSTEP_ATTENTION_TC=$kernels timeout ${ATT_LIMIT:-120} /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none \
                --repeats 5 --attention-only --json $O/attention-$kernels.json 2>&1 | grep "^|\|rror" | tee $O/attention-$kernels.md
        done
        PYTHONUNBUFFERED=1 timeout 120 python3 experiments/torch_bench.py $O/attention-mma.json 2>&1 | grep -v Warning | tee $O/attention-torch.md ;;
    train) OUT=$O/train TOTAL_LIMIT=200 bash experiments/gpu_visit.sh train > $O/train.log 2>&1; tail -n 6 $O/train.log ;;
    trainer-ab)  # trainer step with each kernel set, alternating
        for round in 1 2; do
            for kernels in cmma mma; do
                echo "## kernels $kernels round $round"
                LOCKSTEP_ATTENTION_TC=$kernels timeout 120 /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --trainer-only \
                    --trainer-batches 8,32 --repeats 5 2>&1 | grep "^| [0-9]" | tee -a $O/trainer-ab-$kernels.md
            done
        done ;;
    bounds)  # ncu on one call of each register-fragment attention kernel
        LOCKSTEP_ATTENTION_TC=mma OUT=$O/bounds TOTAL_LIMIT=150 BOUNDS_PARTS=attention ATT_REGEX="mma_flash|mma_partial" bash experiments/gpu_visit.sh bounds > $O/bounds.log 2>&1
        grep "^|" $O/bounds.log | head -40 ;;
    esac
done
