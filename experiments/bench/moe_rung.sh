#!/usr/bin/env bash
# GRPO on a mixture-of-experts shape at a real size (docs/moe.md): ROLLOUTS x NEW tokens a step,
# `MAX_STEPS` steps a call (default 1; a warm machine keeps /tmp/runs, RESUME=1 continues), with
# the step's bit_equal, KL, routing agreement, worst expert load and load-balancing loss, peak
# memory and the plan's line. MOE_SET passes more `--set`s (e.g. the ablation's fast arm:
# "--set ablation.sampler_kernels=fast --set ablation.correction=tis", or
# "--set train.router_aux_loss_coef=0.001", or LoRA on every expert: "--set lora.rank=16").
# From the repo root on the GPU machine with .gpu/ carried:
#   O=$OUT bash experiments/bench/moe_rung.sh qwen3-moe-1b 256 1024 [RUN_NAME]
# Makes the random checkpoint once (experiments/fixtures/make_real_shape.py).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
shape=${1:?usage: moe_rung.sh SHAPE ROLLOUTS NEW [RUN_NAME]}; rollouts=${2:-256}; new=${3:-1024}; run=${4:-moe-$shape}
ck=/tmp/checkpoints/$shape
[ -f $ck/config.json ] || python3 experiments/fixtures/make_real_shape.py $shape $ck > $O/make-$shape.log 2>&1 || { tail -3 $O/make-$shape.log; exit 1; }
p=$(poll $O/$run.mem)
trap 'kill $p 2>/dev/null' EXIT
timeout ${LIMIT:-570} /tmp/lockstep train configs/qwen3-0.6b.toml --set model.path=$ck --set task.path=$ck/task.jsonl --set task.reward=char_f1 \
  --set train.prompts_per_step=$(( rollouts / 8 )) --set train.group_size=8 --set sampler.max_new_tokens=$new --set sampler.context=$(( new + 64 )) \
  --set sampler.max_batch=$(( rollouts < 256 ? rollouts : 256 )) --set train.checkpoint_every=1 --set log.runs_dir=/tmp/runs --set log.run_name=$run \
  ${MOE_SET:-} --max-steps ${MAX_STEPS:-1} ${RESUME:+--resume} > $O/$run.log 2>&1
rc=$?
kill $p 2>/dev/null
echo "$run ($shape, $rollouts x $new): exit $rc, peak $(sort -n $O/$run.mem | tail -1) MiB"
grep -h "memory plan\|auto sizes\|error\|note" $O/$run.log | head -4
python3 - /tmp/runs/$run/metrics.jsonl <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line); moe = m.get("moe") or {}; t = m["timing"]
    print(f"step {m['step']}: bit_equal {m['agreement']['bit_equal_frac']:.4f} kl_k1 {m['agreement']['kl_k1']:.3e} "
          f"routing_agreement {moe.get('routing_agreement')} load_max_over_mean {moe.get('load_max_over_mean', 0):.2f} "
          f"load_balancing_loss {moe.get('load_balancing_loss', 0):.4f} step {m['step_s']:.1f} s (gen {t['gen_s']:.1f}, update {t['update_s']:.1f}, routing {moe.get('routing_s', 0):.1f}) "
          f"weights {m['trainer_weights_fingerprint']}")
PY
exit $rc
