#!/usr/bin/env bash
# Session 57's device visit. From the repo root on the GPU machine with .gpu/ carried (a build of
# the session's commit), `O=$OUT PART="..." bash docs/journal/visit-scripts/visit_s57.sh`.
#   defaults17a  issue 60: the 1.7B 256 x 4096 rung with the defaults (recomputation and sizes
#                auto), step 0, checkpoint kept for the next call
#   defaults17b  the same run resumed for steps 1 and 2 (no checkpoint after them: the call's
#                time; --allow-config-change records the one changed key)
#   serve        issue 63: serve's per-level table with the engine's tokens a step and ms a step
#                beside `lockstep sample`'s, the clients in 8 and in 16 processes
#   serve2       the same with the HTTP front on 2 threads (serve.workers=2, the old default)
#   moe256 / moehost / a3b   issue 65: the 256 x 1024 rung (MAX_STEPS a call, RESUME=1), lockstep
#                sample's host view at the MoE shape (what bounds decode), 30B-A3B beside transformers
#   h200         issue 60's 141 GB column: configs/qwen3-4b.toml (refused on an 80 GB card) and
#                the 0.6B rung as written, sizes auto, 2 and 1 steps
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
mkdir -p "$O"
source experiments/bench/gpu_env.sh
plan() { grep -h "memory plan\|auto sizes\|recompute" "$1" | head -3 | cut -c1-700; }
r17() {  # $1 steps, $2 extra --set pairs, $3 resume (1 or empty), $4 time limit
  O=$O SCALE_TAG=defaults SCALE_SET="--set task.reward=char_f1 --set train.on_mismatch=stop --set train.keep_checkpoints=1 $2" SCALE_ARGS="--max-steps $1 ${5:-}" \
    SCALE_RESUME=$3 SCALE_LIMIT=$4 bash experiments/bench/scale.sh qwen3-1.7b:256x4096:3
  plan $O/qwen3-1.7b-256x4096-defaults.log
}
for part in ${PART:-defaults17a}; do
case "$part" in
defaults17a)
  r17 1 "--set train.checkpoint_every=1" "" ${LIMIT17:-400} ;;
defaults17b)
  r17 2 "--set train.checkpoint_every=0" 1 ${LIMIT17:-560} --allow-config-change ;;
serve)
  O=$O/serve06 SERVE_CLIENTS=${SERVE_CLIENTS:-64,256} SERVE_BENCH_ARGS="--processes 8,16" bash experiments/bench/serve_bench.sh qwen3-0.6b 0 128 1000 2>&1 | tail -14 ;;
serve2)   # the HTTP front on 2 threads, as before serve.workers: the A/B of the threads alone
  O=$O/serve06-w2 SERVE_CLIENTS=${SERVE_CLIENTS:-64,256} SERVE_SET="--set serve.workers=2" SERVE_BENCH_ARGS="--processes 8" bash experiments/bench/serve_bench.sh qwen3-0.6b 0 128 0 2>&1 | tail -8 ;;
h200)
  O=$O SCALE_SET="--set task.reward=char_f1 --set train.on_mismatch=stop" SCALE_ARGS="--max-steps 2" SCALE_LIMIT=330 \
    bash experiments/bench/scale.sh qwen3-4b:128x2048:2
  plan $O/qwen3-4b-128x2048.log
  O=$O SCALE_SET="--set task.reward=char_f1 --set train.on_mismatch=stop" SCALE_ARGS="--max-steps 1" SCALE_LIMIT=200 \
    bash experiments/bench/scale.sh qwen3-0.6b:512x2048:1
  plan $O/qwen3-0.6b-512x2048.log ;;
moe256)   # issue 65's rung: qwen3-moe-1b 256 x 1024, MAX_STEPS a call (RESUME=1 continues; checkpoints ~18 GB)
  O=$O LIMIT=${LIMIT:-570} MAX_STEPS=${MAX_STEPS:-1} RESUME=${RESUME:-} MOE_SET="--set train.keep_checkpoints=1 --set train.final_checkpoint=false" \
    bash experiments/bench/moe_rung.sh qwen3-moe-1b 256 1024 moe1b-256 ;;
moehost)  # what bounds MoE decode: lockstep sample's host view (launch vs wait) at qwen3-moe-1b, 256 x 128
  ck=/tmp/checkpoints/qwen3-moe-1b
  [ -f $ck/config.json ] || python3 experiments/fixtures/make_real_shape.py qwen3-moe-1b $ck > $O/make-moe1b.log 2>&1
  python3 -c "import json, random; r = random.Random(7); [print(json.dumps({'id': i, 'prompt_ids': [r.randrange(300, 151000) for _ in range(32)]})) for i in range(512)]" > /tmp/moe.jsonl
  timeout ${LIMIT:-200} /tmp/lockstep sample --set model.path=$ck --set model.dtype=bf16 --set sampler.input=/tmp/moe.jsonl --set sampler.output=/tmp/moe-out.jsonl \
    --set sampler.temperature=0 --set sampler.max_new_tokens=128 --set sampler.context=192 --set sampler.max_batch=256 --set log.progress=false > $O/moehost.log 2>&1
  echo "lockstep sample 512 x 128 at qwen3-moe-1b: exit $?"; grep -h "sampled\|host\|sample-timing" $O/moehost.log | head -6 ;;
a3b)      # 30B-A3B's sampler beside transformers (the checkpoint is 61 GB of a 64 GB disk: run alone)
  ck=/tmp/checkpoints/qwen3-30b-a3b
  [ -f $ck/config.json ] || python3 experiments/fixtures/make_real_shape.py qwen3-30b-a3b $ck > $O/make-a3b.log 2>&1 || { tail -3 $O/make-a3b.log; exit 1; }
  python3 -c "import json, random; r = random.Random(7); [print(json.dumps({'id': i, 'prompt_ids': [r.randrange(300, 151000) for _ in range(32)]})) for i in range(1000)]" > /tmp/a3b.jsonl
  p=$(poll $O/a3b.mem)
  timeout ${LIMIT:-300} /tmp/lockstep sample --set model.path=$ck --set model.dtype=bf16 --set sampler.input=/tmp/a3b.jsonl --set sampler.output=/tmp/a3b-out.jsonl \
    --set sampler.temperature=0 --set sampler.max_new_tokens=100 --set sampler.context=160 --set sampler.max_batch=256 --set log.progress=false > $O/a3b.log 2>&1
  echo "lockstep sample 1000 x 100 at 30B-A3B: exit $?, peak $(sort -n $O/a3b.mem | tail -1) MiB"; kill $p
  grep -h "memory plan\|sampled\|sample-timing" $O/a3b.log | head -4
  timeout ${HF_LIMIT:-240} python3 experiments/bench/seed_bench_hf.py $ck /tmp/a3b.jsonl 100 256 2>&1 | grep sample-timing | sed 's/^/transformers generate: /' ;;
esac
done
