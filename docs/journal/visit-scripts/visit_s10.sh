#!/usr/bin/env bash
# Session 10's visits: the persistent warp-specialized wgmma schedule against the synced one,
# one visit's numbers side by side. Usage (on the H200, from the repo root): O=$OUT bash experiments/visit_s10.sh PART...
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
M="${M_LIST:-256,1024,4096}"
for bin in lockstep-battery lockstep; do
    [ -x /tmp/$bin ] || { gunzip -c .gpu/$bin.gz > /tmp/$bin && chmod +x /tmp/$bin; }
done
for part in "$@"; do
    case "$part" in
    battery) OUT=$O/battery TOTAL_LIMIT=${BATTERY_LIMIT:-200} bash experiments/gpu_visit.sh battery > $O/battery.log 2>&1; tail -n 4 $O/battery.log ;;
    check) OUT=$O/check TOTAL_LIMIT=120 bash experiments/gpu_visit.sh check > $O/check.log 2>&1; tail -n 12 $O/check.log ;;
    repro) OUT=$O/repro TOTAL_LIMIT=170 bash experiments/gpu_visit.sh repro > $O/repro.log 2>&1; tail -n 5 $O/repro.log ;;
    matmul)  # persistent (default) with torch on the same shapes, then synced, then persistent again
        OUT=$O/persistent KERNELS_LIMIT=120 TORCH_LIMIT=90 TOTAL_LIMIT=220 KERNELS_ARGS="--matmul-only --matmul-m $M --no-burn" \
            bash experiments/gpu_visit.sh kernels torch > $O/persistent.log 2>&1
        grep "^|" $O/persistent.log | head -40
        for s in synced persistent; do
            echo "## LOCKSTEP_WGMMA_SCHEDULE=$s"
            LOCKSTEP_WGMMA_SCHEDULE=$s timeout 100 /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --repeats 5 \
                --matmul-only --matmul-m $M --no-burn 2>&1 | grep "^|" | tee $O/matmul-$s.md
        done ;;
    source)  # cubecl's CUDA source of the wgmma kernels (ptxas register counts here and on the CPU machine)
        d=/tmp/src; rm -rf $d; mkdir -p $d
        printf '[compilation.logger]\nlevel = "full"\nfile = "%s/compile.log"\n' "$d" > $d/cubecl.toml
        (cd $d && timeout 60 /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --repeats 1 --single-call --no-burn --matmul-only --matmul-m 4096 > /dev/null 2>&1)
        gzip -c $d/compile.log > $O/compile.log.gz; ls -la $O/compile.log.gz
        ;;
    bounds)  # ncu on one call of each wgmma matmul and of torch's on the same shapes
        OUT=$O/bounds BOUNDS_PARTS="matmul torch" BOUNDS_REGEX="${BOUNDS_REGEX:-wgmma}" BOUNDS_M="${BOUNDS_M:-1024,4096}" TOTAL_LIMIT=240 \
            bash experiments/gpu_visit.sh bounds > $O/bounds.log 2>&1; grep -v "^==" $O/bounds.log | tail -n 40 ;;
    tiles)  # the default schedule under each WGMMA_SWEEP tile shape
        for t in ${WGMMA_SWEEP:-2/256/4 2/256/3 2/128/4 2/128/6 1/128/6 1/256/4}; do
            echo "## LOCKSTEP_WGMMA_TILES=$t"
            LOCKSTEP_WGMMA_TILES=$t timeout 60 /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --repeats 5 \
                --matmul-only --matmul-m ${SWEEP_M:-1024,4096} --no-burn 2>&1 | grep "^| matmul" | tee -a $O/tiles.md
        done ;;
    kernels)  # every kernel row (matmul, memory-bound, attention), the trainer step and MFU, torch on the same shapes
        OUT=$O/kernels KERNELS_LIMIT=240 TORCH_LIMIT=120 TOTAL_LIMIT=380 bash experiments/gpu_visit.sh kernels torch > $O/kernels.log 2>&1
        grep "^|" $O/kernels.log | tail -n 60 ;;
    ncu-ab)  # GPU time (ncu, one call each) of the wgmma kernels under each NCU_AB setting, same visit
        b=(/tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --repeats 1 --single-call --no-burn --matmul-only --matmul-m ${BOUNDS_M:-1024,4096})
        for setting in ${NCU_AB:-LOCKSTEP_WGMMA_SCHEDULE=synced LOCKSTEP_WGMMA_TILES=2/64/8 LOCKSTEP_WGMMA_TILES=2/128/4 LOCKSTEP_WGMMA_TILES=1/128/6}; do
            echo "### $setting"
            env ${setting//,/ } timeout 90 python3 experiments/ncu_bounds.py --regex wgmma --count 40 -- "${b[@]}" 2>&1 | grep "^|" | cut -c1-400
        done 2>&1 | tee $O/ncu-ab.md ;;
    esac
done
