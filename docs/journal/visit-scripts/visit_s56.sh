#!/usr/bin/env bash
# Session 56's device visit. From the repo root on the GPU machine with .gpu/ carried (a build of
# the session's commit), `O=$OUT PART="..." bash docs/journal/visit-scripts/visit_s56.sh`.
#   auto17     issue 60: the 1.7B 256 x 4096 rung with the defaults (no size key), step 0 with the
#              kernel cache warmed first by a 64 x 512 step of the same shape
#   recompute17  the same rung with `train.recompute_layers = true` (sizes auto): the contender
#              the plan's line names (more requests in flight, one more forward in the update)
#   serve      issue 63: the serve benchmark's per-level table at the 0.6B shape
#   moeab      issue 65: qwen3-moe-1b 64 x 512 step 0 by .gpu-head/lockstep.gz (the session's start) and by .gpu/lockstep.gz
#              (the MoE block's launches), weights compared
#   moefast / moeaux   the ablation's fast arm at the MoE shape; the load-balancing loss with LoRA r16
# Left for the next visit (same script):
#   defaults17 the 1.7B rung with the defaults as they are now (recomputation auto: the plan should
#              print the recompute17 run's sizes), 2 steps a call, RESUME=1 for the next call
#   moewarm    the MoE A/B again with each binary's kernels compiled first (its own 64 x 128 step)
#   sample8b   experiments/bench/sample_8b.sh (the 8B config's auto pool after the compact partials)
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
mkdir -p "$O"
source experiments/bench/gpu_env.sh
# no checkpoints from the MoE rungs (about 18 GB each at 1.3B with AdamW; the disk is 64 GB)
nock="--set train.checkpoint_every=0 --set train.final_checkpoint=false"
plan() { grep -h "memory plan\|auto sizes\|recompute" "$1" | head -3 | cut -c1-600; }
r17() {  # $1 tag, $2 extra --set pairs
  O=$O SCALE_TAG=$1 SCALE_SET="--set task.reward=char_f1 --set train.on_mismatch=stop $2" SCALE_ARGS="--max-steps 1" SCALE_LIMIT=${LIMIT17:-330} \
    bash experiments/bench/scale.sh qwen3-1.7b:256x4096:1
  plan $O/qwen3-1.7b-256x4096-$1.log
}
for part in ${PART:-auto17}; do
case "$part" in
auto17)
  O=$O SCALE_TAG=warm SCALE_SET="--set task.reward=char_f1" SCALE_ARGS="--max-steps 1" SCALE_LIMIT=150 bash experiments/bench/scale.sh qwen3-1.7b:64x512:1
  r17 auto "" ;;
recompute17)
  r17 recompute "--set train.recompute_layers=true" ;;
serve)
  O=$O/serve06 bash experiments/bench/serve_bench.sh qwen3-0.6b 0 128 1000 2>&1 | tail -9 ;;
moeab)
  gunzip -c .gpu-head/lockstep.gz > /tmp/lockstep-head && chmod +x /tmp/lockstep-head
  gunzip -c .gpu/lockstep.gz > /tmp/lockstep-new && chmod +x /tmp/lockstep-new
  for b in head new; do
    cp /tmp/lockstep-$b /tmp/lockstep
    O=$O LIMIT=${LIMIT:-200} MOE_SET="$nock" bash experiments/bench/moe_rung.sh qwen3-moe-1b 64 512 moe1b-$b
  done
  cp /tmp/lockstep-new /tmp/lockstep ;;
defaults17)
  O=$O SCALE_TAG=defaults SCALE_SET="--set task.reward=char_f1 --set train.on_mismatch=stop --set train.checkpoint_every=1 --set train.keep_checkpoints=1" SCALE_ARGS="--max-steps ${STEPS17:-2}" \
    SCALE_RESUME=${RESUME:-} SCALE_LIMIT=${LIMIT17:-560} bash experiments/bench/scale.sh qwen3-1.7b:256x4096:3
  plan $O/qwen3-1.7b-256x4096-defaults.log ;;
moewarm)
  gunzip -c .gpu-head/lockstep.gz > /tmp/lockstep-head && chmod +x /tmp/lockstep-head
  gunzip -c .gpu/lockstep.gz > /tmp/lockstep-new && chmod +x /tmp/lockstep-new
  for b in head new; do
    cp /tmp/lockstep-$b /tmp/lockstep
    O=$O LIMIT=150 MOE_SET="$nock" bash experiments/bench/moe_rung.sh qwen3-moe-1b 64 128 moe1b-warm-$b > /dev/null
    O=$O LIMIT=${LIMIT:-200} MOE_SET="$nock" bash experiments/bench/moe_rung.sh qwen3-moe-1b 64 512 moe1b-$b-warm
  done
  cp /tmp/lockstep-new /tmp/lockstep ;;
sample8b)
  O=$O bash experiments/bench/sample_8b.sh ;;
moefast)  # the ablation's fast sampler at the MoE shape: routing_agreement below 1 is the point
  O=$O LIMIT=${LIMIT:-200} MOE_SET="$nock --set ablation.sampler_kernels=fast --set ablation.correction=tis" bash experiments/bench/moe_rung.sh qwen3-moe-1b 64 512 moe1b-fast ;;
moeaux)   # the load-balancing loss and LoRA r16 on every expert, on CUDA
  O=$O LIMIT=${LIMIT:-200} MOE_SET="$nock --set train.router_aux_loss_coef=0.001 --set lora.rank=16 --set train.lr=1e-5" bash experiments/bench/moe_rung.sh qwen3-moe-1b 64 512 moe1b-aux-lora ;;
esac
done
