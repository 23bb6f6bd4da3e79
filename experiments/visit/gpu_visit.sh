#!/usr/bin/env bash
# Measurements for one H200 visit, run there from the repo root after
# `bash experiments/visit/gpu_check.sh build` here. Parts run in the order given; each has its own
# time limit, cut to what is left of TOTAL_LIMIT (default 570 s, under the device tool's 600),
# so one slow part cannot lose the others' output. Results are packed into $OUT/visit.tgz (the
# device tool returns at most 8 files).
#
#   bash experiments/visit/gpu_visit.sh battery check sampler kernels torch sampler-fast
#   bash experiments/visit/gpu_visit.sh battery-full check quickstart   # a change that must keep every bit
#   bash experiments/visit/gpu_visit.sh train ablation
#   bash experiments/visit/gpu_visit.sh repro repro-autotune   # run-to-run and resume, as bits
#   bash experiments/visit/gpu_visit.sh train-kernels          # GRPO step time under tc / hybrid / pipelined
#   bash experiments/visit/gpu_visit.sh compile-log            # kernel compilations in a short GRPO run, tc vs pipelined
#   bash experiments/visit/gpu_visit.sh profile                # per-kernel GPU time: trainer step and sampler decode
#   UPDATE_SHAPES="qwen3-1.7b:8x2048" bash experiments/visit/gpu_visit.sh profile-update   # the GRPO update's kernels by GPU time, per shape:sequences x tokens
#                                                      (cubecl's profiler lists lockstep's kernels only, not burn's: ncu for the whole, as gpu-time or visit_s34.sh PART=ncuall)
#   bash experiments/visit/gpu_visit.sh memory               # memory-bound kernels only (norms, pointwise, rope, logprob) with torch beside them
#   bash experiments/visit/gpu_visit.sh bounds               # ncu: what bounds each kernel (BOUNDS_PARTS="matmul pipelined memory attention torch")
#   bash experiments/visit/gpu_visit.sh gpu-time             # ncu: GPU time per kernel of a trainer step and a sampler run vs wall time
#   bash experiments/visit/gpu_visit.sh resources            # ptxas registers/spills of the memory-bound kernels
#   bash experiments/visit/gpu_visit.sh attention            # attention kernels only (decode, prefill) with torch SDPA beside them
#   bash experiments/visit/gpu_visit.sh attention-ab           # split-KV vs sequential attention: trainer step, long-context sampler
#   TC_SWEEP="4/2/2/2 2/2/4/4" bash experiments/visit/gpu_visit.sh tc-sweep   # tc tile shapes (TC_SWEEP_KERNEL=tc-async: the asynchronous-copy tiles, shapes may end /k_steps/stages)
#   SKINNY_SWEEP="8/8/1 16/8/1" bash experiments/visit/gpu_visit.sh skinny-sweep   # decode matmul launch shapes
#   MATMUL_SWEEP="cfg1 cfg2" bash experiments/visit/gpu_visit.sh matmul-sweep   # pipelined configurations
#   bash experiments/visit/gpu_visit.sh train+ablation         # parts joined by + run at once
#
# Env: TRAIN_ARGS, ABLATION_ARGS add arguments; <PART>_LIMIT overrides a part's limit (s);
# LOCKSTEP_MATMUL / LOCKSTEP_ATTENTION pass through to every lockstep process (docs/config.md).
set -uo pipefail
dest="${OUT:-.gpu/out}"
out=/tmp/visit-out
rm -rf "$out" && mkdir -p "$out" "$dest"
end=$((SECONDS + ${TOTAL_LIMIT:-570}))
limit() { local left=$((end - SECONDS)); echo $(( $1 < left ? $1 : left )); }
for bin in lockstep-battery lockstep; do
    gunzip -c .gpu/$bin.gz > /tmp/$bin && chmod +x /tmp/$bin
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
part_train() {  # the H200 config; metrics are written every step, so a cut run keeps its curves
    timeout "$(limit "${TRAIN_LIMIT:-500}")" /tmp/lockstep train configs/h200.toml --set log.runs_dir=/tmp/runs ${TRAIN_ARGS:-} > "$out/train.log" 2>&1
    tail -n 25 "$out/train.log"
    cp /tmp/runs/h200/metrics.jsonl "$out/train-metrics.jsonl" 2>/dev/null
    /tmp/lockstep report /tmp/runs/h200 --out "$out/train-report" 2>&1 | tail -n 5
}
part_ablation() {  # the matrix on the H200 config: ABLATION_KERNELS x corrections x ABLATION_SEEDS, ABLATION_JOBS cells at once
    LOCKSTEP=/tmp/lockstep timeout "$(limit "${ABLATION_LIMIT:-500}")" bash experiments/examples/ablation.sh --config configs/h200.toml \
        --seeds "${ABLATION_SEEDS:-0}" --jobs "${ABLATION_JOBS:-8}" --kernels "${ABLATION_KERNELS:-matched fast split_k}" --out /tmp/abl -- ${ABLATION_ARGS:-} > "$out/ablation.log" 2>&1
    tail -n 12 "$out/ablation.log"
    /tmp/lockstep report /tmp/abl/runs/*/ --out "$out/ablation" 2>&1 | tail -n 22
    # per-cell metrics and logs travel too, so plots can be redrawn here (the GPU machine has no
    # fonts) and failed cells read in full
    for d in /tmp/abl/runs/*/; do
        name=$(basename "$d"); mkdir -p "$out/ablation-runs/$name"
        cp "$d/metrics.jsonl" "$out/ablation-runs/$name/" 2>/dev/null
        cp "/tmp/abl/runs/$name.log" "$out/ablation-runs/$name/train.log" 2>/dev/null
    done
}
part_repro() {  # does GPU training repeat bit for bit? two concurrent runs, and one resumed from a checkpoint
    local bin="${1:-/tmp/lockstep}" tag="${2:-}"
    local dir=/tmp/repro$tag
    local args=(--set train.sft_steps=60 --set train.steps=8 --set train.checkpoint_every=4 --set log.runs_dir=$dir ${REPRO_ARGS:-})
    rm -rf "$dir"
    timeout "$(limit "${REPRO_LIMIT:-150}")" bash -c "
        '$bin' train configs/h200.toml ${args[*]} --set log.run_name=a > $out/repro$tag-a.log 2>&1 &
        '$bin' train configs/h200.toml ${args[*]} --set log.run_name=b > $out/repro$tag-b.log 2>&1 &
        { '$bin' train configs/h200.toml ${args[*]} --set log.run_name=c --max-steps 4 && \
          '$bin' train configs/h200.toml ${args[*]} --set log.run_name=c --resume; } > $out/repro$tag-c.log 2>&1 &
        wait"
    echo "| runs ($bin) | steps | result |"
    echo "|---|---|---|"
    python3 experiments/bench/compare_runs.py $dir/a $dir/b --label "a vs b (same config, at the same time)"
    python3 experiments/bench/compare_runs.py $dir/a $dir/c --label "a vs c (c stopped at step 4, resumed)"
    for r in a b c; do mkdir -p "$out/repro$tag-runs/$r"; cp $dir/$r/metrics.jsonl "$out/repro$tag-runs/$r/" 2>/dev/null; done
}
# one table row per run: steps after the first, mean step s, mean rollout tokens/s, last weight fingerprint
run_summary() {
    python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][1:]; print(f'| {sys.argv[2]} | {len(r)} | {sum(x[\"step_s\"] for x in r)/max(len(r),1):.3f} | {sum(x[\"tokens_per_s\"] for x in r)/max(len(r),1):.0f} | {(r[-1].get(\"trainer_weights_fingerprint\") or r[-1].get(\"trainer_weights_sha256\", \"-\")) if r else \"-\"} |')" "$1" "$2" 2>&1
}
bench_common=(--preset small --dtype bf16 --prompt-len 32 --new-tokens 32 --repeats 5)
run_part() {
    case "$1" in
    battery)  # lockstep kernels, bf16 (tensor cores) at the large shapes, with matmul accuracy
        timeout "$(limit "${BATTERY_LIMIT:-150}")" /tmp/lockstep-battery --large --dtypes bf16 2>&1 | tee "$out/battery.md" ;;
    battery-full)  # every battery row, f32 and bf16, large shapes (the count docs/gpu-battery.md quotes)
        timeout "$(limit "${BATTERY_LIMIT:-400}")" /tmp/lockstep-battery --large --dtypes f32,bf16 2>&1 | tee "$out/battery-full.md"
        echo "rows bit-identical: $(grep -c '| yes' "$out/battery-full.md"), differing: $(grep -c '| NO' "$out/battery-full.md")" ;;
    quickstart)  # the GPU quickstart against session 18's metrics (every logged field but timings)
        timeout "$(limit "${QUICKSTART_LIMIT:-120}")" /tmp/lockstep train configs/quickstart.toml --set log.runs_dir=/tmp/runs --set log.run_name=qs --set log.tensorboard=false > "$out/quickstart.log" 2>&1
        cp /tmp/runs/qs/metrics.jsonl "$out/quickstart.metrics.jsonl" 2>/dev/null
        tar -xJOf docs/gpu-runs/2026-12-02-s18.tar.xz 2026-12-02-s18/v2/quickstart.metrics.jsonl > /tmp/qs18.jsonl
        python3 -c "
import json,sys
keep=lambda r: {k: v for k, v in r.items() if k not in ('timing', 'step_s', 'tokens_per_s')}
a=[keep(json.loads(l)) for l in open(sys.argv[1])]; b=[keep(json.loads(l)) for l in open(sys.argv[2])]
print('quickstart vs session 18:', len(a), 'steps;', 'EQUAL' if a == b else 'DIFFER', 'in every logged field but timings; last fingerprint', a[-1].get('trainer_weights_fingerprint') if a else None)" "$out/quickstart.metrics.jsonl" /tmp/qs18.jsonl 2>&1 | tee "$out/quickstart.md" ;;
    check)    # the sampler engine's invariance checks (the CI tests' code), bf16
        timeout "$(limit "${CHECK_LIMIT:-90}")" /tmp/lockstep check --preset small --dtypes bf16 2>&1 | tee "$out/check.md" ;;
    check-fast)  # the same checks with burn's default ops in the sampler (expected to fail)
        timeout "$(limit "${CHECK_LIMIT:-90}")" /tmp/lockstep check --preset small --dtypes bf16 --fast 2>&1 | tee "$out/check-fast.md" ;;
    repro) part_repro 2>&1 | tee "$out/repro.md" ;;
    repro-autotune)  # the same with burn's autotuned ops (needs .gpu/lockstep-autotune.gz)
        gunzip -c .gpu/lockstep-autotune.gz > /tmp/lockstep-autotune && chmod +x /tmp/lockstep-autotune
        part_repro /tmp/lockstep-autotune -autotune 2>&1 | tee "$out/repro-autotune.md" ;;
    generate)  # transformers generate on the bench model alone (no kernel table)
        PYTHONUNBUFFERED=1 timeout "$(limit "${TORCH_LIMIT:-120}")" python3 experiments/bench/torch_bench.py none \
            --model /tmp/bench-model --concurrency 1,8,64,256 2>&1 | grep -v Warning | tee "$out/generate.md" ;;
    sampler)  # sampler tokens/s, lockstep kernels; saves the model for transformers (afresh: bench refuses to overwrite a checkpoint)
        rm -rf /tmp/bench-model
        timeout "$(limit "${SAMPLER_LIMIT:-60}")" /tmp/lockstep bench "${bench_common[@]}" --kernels ${SAMPLER_KERNELS:-matched} --skip-ops \
            --save-model /tmp/bench-model 2>&1 | tee "$out/sampler.md" ;;
    sampler-fusion)  # the decode path on fused launches vs unfused (same kernels, same bits), small preset
        timeout "$(limit "${SAMPLER_LIMIT:-90}")" /tmp/lockstep bench "${bench_common[@]}" --kernels matched,unfused --skip-ops 2>&1 | tee "$out/sampler-fusion.md" ;;
    sampler-qwen)  # the same at Qwen3-0.6B's shape (28 layers, vocab 151936), random weights
        timeout "$(limit "${SAMPLER_QWEN_LIMIT:-150}")" /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --prompt-len 32 --new-tokens 32 --repeats 5 \
            --kernels matched,unfused --concurrency ${SAMPLER_QWEN_CONCURRENCY:-1,16,64,256} --skip-ops 2>&1 | tee "$out/sampler-qwen.md" ;;
    sampler-fast)  # the same engine on burn's defaults (autotune warm-up is slow at every new shape)
        timeout "$(limit "${SAMPLER_FAST_LIMIT:-150}")" /tmp/lockstep bench "${bench_common[@]}" --kernels fast --skip-ops 2>&1 | tee "$out/sampler-fast.md" ;;
    kernels)  # each kernel vs burn's default at Qwen3-0.6B's shapes, trainer step and MFU
        timeout "$(limit "${KERNELS_LIMIT:-200}")" /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --repeats 5 \
            --json "$out/kernels.json" ${KERNELS_ARGS:-} 2>&1 | tee "$out/kernels.md" ;;
    attention)  # attention rows only (decode and prefill, every kernel incl. split_kv_tc) and torch SDPA on them
        timeout "$(limit "${KERNELS_LIMIT:-150}")" /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --repeats 5 \
            --attention-only --json "$out/attention.json" 2>&1 | tee "$out/attention.md"
        PYTHONUNBUFFERED=1 timeout "$(limit "${TORCH_LIMIT:-120}")" python3 experiments/bench/torch_bench.py "$out/attention.json" 2>&1 | grep -v Warning | tee "$out/attention-torch.md" ;;
    matmul-autotune)  # the matmul rows with burn's autotuned matmul (cubek's per-shape selector) as the burn column, and torch on them
        gunzip -c .gpu/lockstep-autotune.gz > /tmp/lockstep-autotune && chmod +x /tmp/lockstep-autotune
        timeout "$(limit "${KERNELS_LIMIT:-150}")" /tmp/lockstep-autotune bench --preset qwen3-0.6b --dtype bf16 --concurrency none --repeats 5 \
            --matmul-only --matmul-m ${AUTOTUNE_M:-256,4096} --json "$out/matmul-autotune.json" 2>&1 | tee "$out/matmul-autotune.md"
        PYTHONUNBUFFERED=1 timeout "$(limit "${TORCH_LIMIT:-120}")" python3 experiments/bench/torch_bench.py "$out/matmul-autotune.json" 2>&1 | grep -v Warning | tee "$out/matmul-autotune-torch.md" ;;
    memory)   # the memory-bound rows alone (streaming read, norms, pointwise, rope, logprob) and torch's
        timeout "$(limit "${MEMORY_LIMIT:-90}")" /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --repeats 5 \
            --memory-only --json "$out/memory.json" 2>&1 | tee "$out/memory.md"
        PYTHONUNBUFFERED=1 timeout "$(limit "${TORCH_LIMIT:-120}")" python3 experiments/bench/torch_bench.py "$out/memory.json" 2>&1 | grep -v Warning | tee "$out/memory-torch.md" ;;
    resources)  # registers / spills / stack of the memory-bound kernels: ptxas on cubecl's logged CUDA sources (ncu readings: the bounds part)
        local dir=/tmp/resources; rm -rf "$dir"; mkdir -p "$dir"
        printf '[compilation.logger]\nlevel = "full"\nfile = "%s/compile.log"\n' "$dir" > "$dir/cubecl.toml"
        (cd "$dir" && timeout "$(limit "${RESOURCES_LIMIT:-60}")" /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --repeats 1 \
            --single-call --no-burn --memory-only --matmul-m ${RESOURCES_M:-1024} 2>&1 | grep "^|")
        python3 experiments/profile/kernel_resources.py "$dir/compile.log" 2>&1 | tee "$out/resources.md" ;;
    bounds)   # Nsight Compute on one call of each kernel: what bounds lockstep's kernels and torch's on the same shapes
        local b=(/tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --repeats 1 --single-call --no-burn)
        {
            for what in ${BOUNDS_PARTS:-matmul pipelined memory attention torch}; do
                echo; echo "### $what"
                case $what in
                matmul) timeout "$(limit 150)" python3 experiments/profile/ncu_bounds.py --regex "${BOUNDS_REGEX:-matmul_tc|matmul_skinny|mma_peak}" --count 40 -- "${b[@]}" --matmul-only --matmul-m ${BOUNDS_M:-1,64,4096} ;;
                pipelined) LOCKSTEP_MATMUL=pipelined timeout "$(limit 120)" python3 experiments/profile/ncu_bounds.py --regex "matmul_entry" --count 20 -- "${b[@]}" --matmul-only --matmul-m 4096 ;;
                memory) timeout "$(limit 150)" python3 experiments/profile/ncu_bounds.py --regex "hbm_read|rmsnorm|add_kernel|swiglu|rope|logprob" --count 40 -- "${b[@]}" --memory-only --matmul-m 1,1024 ;;
                attention) timeout "$(limit 150)" python3 experiments/profile/ncu_bounds.py --regex "${ATT_REGEX:-tc_partial|tc_flash|mma_flash|mma_partial|split_combine}" --count 30 -- "${b[@]}" --attention-only --json /tmp/bounds-attention.json ;;
                torch)
                    "${b[@]}" --matmul-only --matmul-m ${BOUNDS_M:-1,64,4096} --json /tmp/bounds-matmul.json > /dev/null 2>&1
                    for j in /tmp/bounds-matmul.json /tmp/bounds-attention.json; do
                        [ -f $j ] && timeout "$(limit 120)" python3 experiments/profile/ncu_bounds.py --regex "gemm|nvjet|xmma|cutlass|flash|fmha|attention" --count 30 -- python3 experiments/bench/torch_bench.py $j --once
                    done ;;
                esac
            done
        } 2>&1 | tee "$out/bounds.md" ;;
    gpu-time)  # ncu: GPU time per kernel of one trainer step (8 x 128 tokens) and of a short sampler run, beside their wall time
        {
            local tb=${GPU_TIME_BATCH:-8} nt=${GPU_TIME_NEW:-8}
            echo "### trainer step, $tb sequences x 128 tokens: wall time without ncu, then the GPU time of one step under ncu"
            timeout "$(limit 60)" /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --trainer-only --repeats 5 --trainer-batches $tb 2>&1 | grep "^|"
            timeout "$(limit "${GPU_TIME_LIMIT:-240}")" python3 experiments/profile/ncu_bounds.py --sum --count 100000 -- /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 \
                --concurrency none --trainer-only --repeats 1 --single-call --trainer-batches $tb
            echo; echo "### sampler, 1 request, 32-token prompt, $nt new tokens: wall time without ncu, then GPU time under ncu (warm-up round + 1 round)"
            timeout "$(limit 60)" /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --prompt-len 32 --new-tokens $nt --repeats 5 --kernels matched --concurrency 1 --skip-ops 2>&1 | grep "^|\|median"
            timeout "$(limit "${GPU_TIME_LIMIT:-240}")" python3 experiments/profile/ncu_bounds.py --sum --count 100000 -- /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 \
                --prompt-len 32 --new-tokens $nt --repeats 1 --kernels matched --concurrency 1 --skip-ops
        } 2>&1 | tee "$out/gpu-time.md" ;;
    torch)    # torch on the same kernel shapes; transformers generate on the sampler's model
        PYTHONUNBUFFERED=1 timeout "$(limit "${TORCH_LIMIT:-120}")" python3 experiments/bench/torch_bench.py "$out/kernels.json" \
            --model /tmp/bench-model --concurrency 1,8,64,256 2>&1 | grep -v Warning | tee "$out/torch.md" ;;
    tc-sweep)  # the tc tiles (TC_SWEEP_KERNEL: tc-tiles, or tc-async) under each TC_SWEEP warps_m/warps_n/frags_m/frags_n[/k_steps[/stages]] shape, rows at M = 256, 1024, 4096
        for c in ${TC_SWEEP:-4/2/2/2}; do
            echo "### LOCKSTEP_MATMUL=${TC_SWEEP_KERNEL:-tc-tiles} LOCKSTEP_TC_TILES=$c"
            LOCKSTEP_MATMUL=${TC_SWEEP_KERNEL:-tc-tiles} LOCKSTEP_TC_TILES=$c timeout "$(limit "${SWEEP_LIMIT:-40}")" /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 \
                --concurrency none --no-burn --matmul-only --matmul-m ${TC_SWEEP_M:-256,1024,4096} --repeats 5 2>&1 | grep -E "^\| (matmul|mma)|error"
        done 2>&1 | tee "$out/tc-sweep.md" ;;
    skinny-sweep)  # the decode matmul (tc at M <= 64) under each SKINNY_SWEEP group/wide/narrow shape, M = 1, 16, 64
        for c in ${SKINNY_SWEEP:-8/8/1}; do
            echo "### LOCKSTEP_SKINNY=$c"
            LOCKSTEP_SKINNY=$c timeout "$(limit "${SWEEP_LIMIT:-40}")" /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 \
                --concurrency none --no-burn --matmul-only --matmul-m 1,16,64 --repeats 5 2>&1 | grep -E "^\| (matmul|hbm)|error"
        done 2>&1 | tee "$out/skinny-sweep.md" ;;
    matmul-sweep)  # the pipelined matmul under each MATMUL_SWEEP config (used for every M), matmul rows only
        for c in ${MATMUL_SWEEP:-double/cmma/16x16x16/2x8x2/4x1x1}; do
            echo "### $c"
            LOCKSTEP_PIPELINED_LARGE=$c timeout "$(limit "${SWEEP_LIMIT:-40}")" /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 \
                --concurrency none --no-burn --matmul-only --repeats 5 2>&1 | grep -E "^\| matmul|error"
        done 2>&1 | tee "$out/matmul-sweep.md" ;;
    train-kernels)  # GRPO step time per matmul kernel choice on configs/h200.toml (the bits are the same)
        for k in ${TRAIN_KERNELS:-tc hybrid pipelined}; do
            rm -rf /tmp/runs-$k
            LOCKSTEP_MATMUL=$k timeout "$(limit "${TRAIN_KERNEL_LIMIT:-90}")" /tmp/lockstep train configs/h200.toml \
                --set log.runs_dir=/tmp/runs-$k --set train.sft_steps=50 --set train.steps=8 --set train.checkpoint_every=0 \
                > "$out/train-$k.log" 2>&1
            run_summary /tmp/runs-$k/h200/metrics.jsonl "$k"
        done 2>&1 | tee "$out/train-kernels.md" ;;
    train-fusion)  # GRPO on configs/h200.toml with the sampler's fused decode launches on and off (same bits, so the same weights)
        for f in on off; do
            rm -rf /tmp/runs-fusion-$f
            LOCKSTEP_DECODE_FUSION=$f timeout "$(limit "${TRAIN_KERNEL_LIMIT:-90}")" /tmp/lockstep train configs/h200.toml \
                --set log.runs_dir=/tmp/runs-fusion-$f --set train.sft_steps=50 --set train.steps=${TRAIN_FUSION_STEPS:-8} --set train.checkpoint_every=0 \
                > "$out/train-fusion-$f.log" 2>&1
            tail -n 3 "$out/train-fusion-$f.log"
            run_summary /tmp/runs-fusion-$f/h200/metrics.jsonl "fusion $f"
        done 2>&1 | tee "$out/train-fusion.md" ;;
    profile)  # per-kernel GPU time (cubecl's profiler times every launch) of the trainer step and of sampler decode, Qwen3-0.6B shape
        local dir=/tmp/profile; rm -rf "$dir"; mkdir -p "$dir"
        for what in trainer decode; do
            mkdir -p "$dir/$what"
            printf '[profiling.logger]\nlevel = "basic"\nfile = "%s/profile.log"\n' "$dir/$what" > "$dir/$what/cubecl.toml"
        done
        {
            if [[ " ${PROFILE_PARTS:-trainer decode} " == *" trainer "* ]]; then
                echo "### trainer step (8 and 32 sequences x 128 tokens), kernels by GPU time"
                (cd "$dir/trainer" && timeout "$(limit "${PROFILE_LIMIT:-120}")" /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --trainer-only --repeats 2 2>&1 | grep "^|")
                python3 experiments/profile/profile_summary.py "$dir/trainer/profile.log" --top 30
            fi
            if [[ " ${PROFILE_PARTS:-trainer decode} " == *" decode "* ]]; then
                echo; echo "### sampler (prompt ${PROFILE_PROMPT:-32}, ${PROFILE_NEW:-32} new tokens, concurrency ${PROFILE_CONCURRENCY:-1,64}), kernels by GPU time"
                (cd "$dir/decode" && timeout "$(limit "${PROFILE_LIMIT:-120}")" /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --prompt-len ${PROFILE_PROMPT:-32} --new-tokens ${PROFILE_NEW:-32} --repeats 1 \
                    --kernels matched --concurrency ${PROFILE_CONCURRENCY:-1,64} --skip-ops 2>&1 | grep "^|\|^bench")
                python3 experiments/profile/profile_summary.py "$dir/decode/profile.log" --top 30
            fi
        } 2>&1 | tee "$out/profile.md" ;;
    profile-update)  # the GRPO update path (folded weight gradients) at real shapes and lengths: wall time, then kernels by GPU time
        for spec in ${UPDATE_SHAPES:-qwen3-1.7b:8x2048 qwen3-0.6b:1x8192}; do
            local shape=${spec%%:*} size=${spec#*:}
            local batch=${size%x*} len=${size#*x}
            local dir=/tmp/profile-update/$shape-$size; rm -rf "$dir"; mkdir -p "$dir"
            printf '[profiling.logger]\nlevel = "basic"\nfile = "%s/profile.log"\n' "$dir" > "$dir/cubecl.toml"
            echo "### update $shape $batch x $len: wall time (no profiler), then per kernel (profiler on)"
            timeout "$(limit "${UPDATE_LIMIT:-150}")" /tmp/lockstep bench --preset "$shape" --dtype bf16 --concurrency none --trainer-only --trainer-batches "$batch" --trainer-len "$len" --repeats 2 2>&1 | grep "^|\|rror"
            (cd "$dir" && timeout "$(limit "${UPDATE_LIMIT:-150}")" /tmp/lockstep bench --preset "$shape" --dtype bf16 --concurrency none --trainer-only --trainer-batches "$batch" --trainer-len "$len" --repeats 1 2>&1 | grep "rror")
            python3 experiments/profile/profile_summary.py "$dir/profile.log" --top 30
        done 2>&1 | tee "$out/profile-update.md" ;;
    attention-ab)  # default split-KV attention vs the sequential kernel: trainer step, and the sampler at a long context (Qwen3-0.6B shape)
        for a in ${AB_KERNELS:-split_kv sequential}; do
            echo "### LOCKSTEP_ATTENTION=$a"
            [ "${AB_TRAINER:-1}" = 1 ] && LOCKSTEP_ATTENTION=$a timeout "$(limit "${AB_LIMIT:-100}")" /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --trainer-only --repeats 5 2>&1 | grep "^|"
            LOCKSTEP_ATTENTION=$a timeout "$(limit "${AB_LIMIT:-100}")" /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --prompt-len ${AB_PROMPT:-1024} --new-tokens ${AB_NEW:-128} \
                --repeats 3 --kernels matched --concurrency ${AB_CONCURRENCY:-1,16,64} --skip-ops 2>&1 | grep "^|\|error"
        done 2>&1 | tee "$out/attention-ab.md" ;;
    compile-log)  # kernel compilations during a short GRPO run per matmul kernel (cubecl's basic compile log)
        for k in ${TRAIN_KERNELS:-tc pipelined}; do
            local dir=/tmp/compile-$k; rm -rf "$dir"; mkdir -p "$dir"
            printf '[compilation.logger]\nlevel = "basic"\nfile = "%s/compile.log"\n' "$dir" > "$dir/cubecl.toml"
            (cd "$dir" && LOCKSTEP_MATMUL=$k timeout "$(limit "${COMPILE_LOG_LIMIT:-90}")" /tmp/lockstep train "$OLDPWD/configs/h200.toml" \
                --set log.runs_dir="$dir/runs" --set train.sft_steps=${COMPILE_LOG_SFT:-20} --set train.steps=${COMPILE_LOG_STEPS:-4} \
                --set train.checkpoint_every=0 2>&1 | while IFS= read -r line; do
                    # each progress line with the number of kernels compiled so far
                    echo "[$(grep -c 'Compiling kernel' compile.log 2>/dev/null) compiled] $line"
                done > "$out/compile-$k-train.log")
            echo "### $k: $(grep -c 'Compiling kernel' "$dir/compile.log" 2>/dev/null) compilations; step_s per step, compilations so far at each step:"
            grep -o '^\[[0-9]* compiled\] step *[0-9]*.* [0-9.]*s$' "$out/compile-$k-train.log" | sed -E 's/^\[([0-9]+) compiled\] step +([0-9]+).* ([0-9.]+s)$/\2:\3(\1)/' | tr '\n' ' '; echo
            python3 -c "import json,sys; print(' '.join(f'{json.loads(l)[\"step_s\"]:.2f}' for l in open(sys.argv[1])))" "$dir/runs/h200/metrics.jsonl" 2>&1
            grep -o 'Compiling kernel.*' "$dir/compile.log" 2>/dev/null | sort | uniq -c | sort -rn | head -n 15
            cp "$dir/compile.log" "$out/compile-$k.log" 2>/dev/null
        done 2>&1 | tee "$out/compile-log.md" ;;
    train) part_train ;;
    ablation) part_ablation ;;
    parity)
        timeout "$(limit 120)" python3 shared-kernels/tests/fixtures/make_tiny_qwen3.py "$out/tiny-qwen3" 2>&1 | tail -3 ;;
    *) echo "unknown part $1" ;;
    esac
}
# "a+b" runs parts a and b at once on the one GPU (each is launch-bound); their step times then
# include the sharing
for part in "$@"; do
    echo "== $part ($(date +%T), $((end - SECONDS)) s left)"
    [ $((end - SECONDS)) -lt 10 ] && { echo "no time left"; continue; }
    for p in ${part//+/ }; do run_part "$p" & done
    wait
done
echo "== done ($(date +%T))"
tar czf "$dest/visit.tgz" -C "$out" .
ls -la "$dest"
