#!/usr/bin/env bash
# Session 11's visits. Usage (on the H200, from the repo root): O=$OUT bash experiments/visit_s11.sh PART...
# .gpu/lockstep-before.gz is the binary of the code before the session's change, for A/B parts.
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
for bin in lockstep-battery lockstep lockstep-before; do
    [ -f .gpu/$bin.gz ] && { [ -x /tmp/$bin ] || { gunzip -c .gpu/$bin.gz > /tmp/$bin && chmod +x /tmp/$bin; }; }
done
for part in "$@"; do
    case "$part" in
    battery) OUT=$O/battery TOTAL_LIMIT=${BATTERY_LIMIT:-200} bash experiments/gpu_visit.sh battery > $O/battery.log 2>&1; tail -n 4 $O/battery.log ;;
    check) OUT=$O/check TOTAL_LIMIT=120 bash experiments/gpu_visit.sh check > $O/check.log 2>&1; tail -n 12 $O/check.log ;;
    repro) OUT=$O/repro TOTAL_LIMIT=170 bash experiments/gpu_visit.sh repro > $O/repro.log 2>&1; tail -n 5 $O/repro.log ;;
    sampler-ab)  # sampler tokens/s, the code before the change and after, alternating, same visit
        for round in 1 2; do
            for bin in lockstep-before lockstep; do
                echo "## $bin round $round: Qwen3-0.6B shape"
                timeout 120 /tmp/$bin bench --preset qwen3-0.6b --dtype bf16 --prompt-len 32 --new-tokens 32 --repeats 3 \
                    --kernels matched --concurrency ${QWEN_C:-1,16,64} --skip-ops 2>&1 | grep "^|\|pools" | tee -a $O/sampler-ab-$bin.md
                echo "## $bin round $round: small preset"
                timeout 60 /tmp/$bin bench --preset small --dtype bf16 --prompt-len 32 --new-tokens 32 --repeats 3 \
                    --kernels matched --concurrency ${SMALL_C:-1,8,64} --skip-ops 2>&1 | grep "^|\|pools" | tee -a $O/sampler-ab-$bin.md
            done
        done ;;
    overlap)  # the sampler with overlapped engine steps (matched) vs synchronous ones (sync), one run each shape
        timeout 200 /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --prompt-len 32 --new-tokens 32 --repeats 5 \
            --kernels matched,sync --concurrency ${QWEN_C:-1,16,64,256} --skip-ops 2>&1 | grep "^|\|engine steps" | tee $O/overlap-qwen.md
        timeout 100 /tmp/lockstep bench --preset small --dtype bf16 --prompt-len 32 --new-tokens 32 --repeats 5 \
            --kernels matched,sync --concurrency ${SMALL_C:-1,8,64,256} --skip-ops 2>&1 | grep "^|\|engine steps" | tee $O/overlap-small.md ;;
    trainer-ab)  # trainer step, before and after, alternating
        for round in 1 2; do
            for bin in lockstep-before lockstep; do
                echo "## $bin round $round"
                timeout 120 /tmp/$bin bench --preset qwen3-0.6b --dtype bf16 --concurrency none --trainer-only \
                    --trainer-batches 8,32 --repeats 5 2>&1 | grep "^| [0-9]\|pools" | tee -a $O/trainer-ab-$bin.md
            done
        done ;;
    host)  # host-thread profiles (needs .gpu/lockstep-profile.gz: a host-profile build with symbols)
        gunzip -c .gpu/lockstep-profile.gz > /tmp/lockstep-profile && chmod +x /tmp/lockstep-profile
        LOCKSTEP_HOST_PROFILE=$O/host-sampler.md timeout 150 /tmp/lockstep-profile bench --preset qwen3-0.6b --dtype bf16 \
            --prompt-len 32 --new-tokens 256 --repeats 3 --kernels matched --concurrency 1 --skip-ops 2>&1 | grep "^|\|pools"
        LOCKSTEP_HOST_PROFILE=$O/host-trainer.md timeout 150 /tmp/lockstep-profile bench --preset qwen3-0.6b --dtype bf16 \
            --concurrency none --trainer-only --trainer-batches 8 --repeats 5 2>&1 | grep "^|\|pools" ;;
    esac
done
