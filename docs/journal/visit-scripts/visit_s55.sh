#!/usr/bin/env bash
# Session 55's device visit. From the repo root on the GPU machine with .gpu/ carried (a build of
# the session's commit), `O=$OUT PART="..." bash docs/journal/visit-scripts/visit_s55.sh`.
#   moe       engine checks at qwen3-moe-1b in bf16, then issue 65's GRPO rung step 0 (256 x 1024)
#   same      issue 62 (and the compact attention partials): scale.sh's 0.6B 512 x 2048 rung
#             step 0 (docs/scale.md: weights 213f61dac13d4868 from the builds of a130335 and
#             d7bb290) and the engine checks at qwen3-0.6b in bf16
#   battery   the GPU battery; moecheck / moe1b: the two halves of `moe`
#   moefast / moeaux / a3b   the MoE rungs still to run (64 x 512: the fast arm's routing
#             agreement; the load-balancing loss with LoRA on the experts; 30B-A3B sampling)
#   arms      issue 67: the mismatch each sampler arm gives at the Qwen3-0.6B shape in bf16
#             (64 x 512, 1 step each: matched, fast, split_k)
#   serve     issue 63: the serve benchmark's per-level table at the 0.6B shape
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
mkdir -p "$O"
source experiments/bench/gpu_env.sh
ck=/tmp/checkpoints/qwen3-0.6b
zero6() { [ -f $ck/config.json ] || python3 experiments/fixtures/make_real_shape.py qwen3-0.6b $ck > $O/make-0.6b.log 2>&1; }
row() {  # run folder -> one line a step
  python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1] + "/metrics.jsonl"):
    m = json.loads(line); a = m["agreement"]
    print(f"  step {m['step']}: bit_equal {a['bit_equal_frac']:.4f} kl_k1 {a['kl_k1']:.3e} |dlogp| mean {a['logprob_abs_diff_mean']:.3e} max {a['logprob_abs_diff_max']:.3e} "
          f"reward {m.get('reward_mean', float('nan')):.4f} loss {m.get('loss', float('nan')):.6e} len {m.get('response_len_mean', 0):.1f} step {m['step_s']:.1f} s weights {m['trainer_weights_fingerprint']}")
PY
}
for part in ${PART:-moe}; do
case "$part" in
moe)
  timeout 170 /tmp/lockstep check --preset qwen3-moe-1b --dtypes bf16 2>&1 | tail -16
  O=$O LIMIT=${LIMIT:-360} bash experiments/bench/moe_rung.sh qwen3-moe-1b 256 1024 moe1b ;;
same)
  # the rung docs/scale.md reports 213f61dac13d4868 for after step 0 (builds a130335 and d7bb290)
  O=$O SCALE_SET="--set task.reward=char_f1 --set train.on_mismatch=stop" SCALE_ARGS="--max-steps 1" SCALE_LIMIT=260 \
    bash experiments/bench/scale.sh qwen3-0.6b:512x2048:1; tail -2 $O/scale.md
  grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"' /tmp/runs/qwen3-0.6b-512x2048/metrics.jsonl 2>/dev/null || find /tmp -name metrics.jsonl -path "*512x2048*" -exec grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"' {} +
  timeout 120 /tmp/lockstep check --preset qwen3-0.6b --dtypes bf16 2>&1 | tail -14 ;;
battery)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/battery && chmod +x /tmp/battery
  timeout ${BATTERY_LIMIT:-240} /tmp/battery > $O/battery.md 2>&1; echo "battery: exit $?"; tail -3 $O/battery.md ;;
moecheck)
  timeout 170 /tmp/lockstep check --preset qwen3-moe-1b --dtypes bf16 2>&1 | tail -16 ;;
moe1b)
  O=$O LIMIT=${LIMIT:-360} bash experiments/bench/moe_rung.sh qwen3-moe-1b 256 1024 moe1b ;;
moefast)  # the ablation's fast sampler at the MoE shape: routing_agreement below 1 is the point
  O=$O LIMIT=${LIMIT:-300} MOE_SET="--set ablation.sampler_kernels=fast --set ablation.correction=tis" bash experiments/bench/moe_rung.sh qwen3-moe-1b 64 512 moe1b-fast ;;
moeaux)   # the load-balancing loss and LoRA r16 on every expert, on CUDA
  O=$O LIMIT=${LIMIT:-300} MOE_SET="--set train.router_aux_loss_coef=0.001 --set lora.rank=16 --set train.lr=1e-5" bash experiments/bench/moe_rung.sh qwen3-moe-1b 64 512 moe1b-aux-lora ;;
a3b)      # Qwen3-30B-A3B's shape (61 GB of bf16 weights): lockstep sample beside transformers' generate
  PART=a3b O=$O bash docs/journal/visit-scripts/visit_s54.sh ;;
arms)
  # bf16 (f32 at this shape runs lockstep's scalar matmul: one 64 x 512 step took over 115 s);
  # the bf16_logits arm needs an f32 model, so it is measured on the CPU and small shapes only
  zero6
  for k in matched fast split_k; do
    rm -rf /tmp/arms/$k
    timeout 150 /tmp/lockstep train configs/qwen3-0.6b.toml --set model.path=$ck --set task.path=$ck/task.jsonl \
      --set train.prompts_per_step=8 --set train.group_size=8 --set sampler.max_new_tokens=512 --set sampler.context=576 --set sampler.max_batch=64 \
      --set train.steps=1 --set ablation.sampler_kernels=$k --set ablation.correction=$([ $k = matched ] && echo none || echo tis) \
      --set log.runs_dir=/tmp/arms --set log.run_name=$k > $O/arm-$k.log 2>&1
    echo "$k: exit $?"; row /tmp/arms/$k; cp /tmp/arms/$k/metrics.jsonl $O/arm-$k-metrics.jsonl 2>/dev/null
  done ;;
serve)
  O=$O/serve06 bash experiments/bench/serve_bench.sh qwen3-0.6b 0 128 1000 2>&1 | tail -9 ;;
esac
done
