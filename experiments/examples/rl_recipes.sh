#!/usr/bin/env bash
# Issue 24's workloads at a real shape on one H200: a Qwen3-0.6B-shaped chat checkpoint (random
# weights, Qwen3's chat template, <|im_end|> as end of turn), a verl-layout parquet of GSM8K-style
# problems (experiments/fixtures/data, made by make_math_dataset.py), the math verifier or a user's Python
# reward, and each loss recipe of docs/tasks.md for a few steps with eval on the eval split.
# From the repo root on the GPU machine, after `bash experiments/visit/gpu_check.sh build` here and
# carrying .gpu/:
#   O=$OUT bash experiments/examples/rl_recipes.sh [RECIPE ...]     (default: all; RECIPE_STEPS=3)
# RECIPE: grpo-math grpo drgrpo dapo gspo. Prints one line per step: reward, bit_equal, KL,
# importance ratios (min/mean/max), clipped fraction, eval pass@1 / pass@k, step seconds.
set -uo pipefail
O="${O:-${OUT:-.gpu/out}}"
mkdir -p "$O"
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
ck=/tmp/checkpoints/qwen3-0.6b
chat=$ck-chat
if [ ! -f "$ck/config.json" ]; then
    python3 experiments/fixtures/make_real_shape.py qwen3-0.6b "$ck" > "$O/make-qwen3-0.6b.log" 2>&1 || { echo "make qwen3-0.6b failed"; tail -3 "$O/make-qwen3-0.6b.log"; exit 1; }
fi
python3 experiments/fixtures/make_chat_checkpoint.py "$ck" "$chat" || exit 1
steps=${RECIPE_STEPS:-3}
common=(--set "model.path=$chat" --set task.name=jsonl --set task.path=experiments/fixtures/data/gsm_style_train.parquet
    --set task.eval_path=experiments/fixtures/data/gsm_style_eval.parquet --set task.prompt_format=chat
    --set task.answer_key=reward_model.ground_truth --set "task.chat_args={ enable_thinking = false }"
    --set train.prompts_per_step=8 --set train.group_size=8 --set "train.steps=$steps" --set train.lr=1e-5
    --set sampler.max_new_tokens=512 --set sampler.context=1024 --set sampler.max_batch=64 --set sampler.kv_budget_mib=0
    --set train.micro_batch_tokens=16384 --set train.on_mismatch=stop --set train.final_checkpoint=false
    --set train.eval_every=2 --set train.eval_problems=16 --set train.eval_samples=4
    --set log.runs_dir=/tmp/runs --set log.tensorboard=false)
python_reward=(--set task.reward=command --set "task.reward_command=python3 experiments/examples/boxed_or_digits_reward.py")
for recipe in ${@:-grpo-math grpo drgrpo dapo gspo}; do
    case $recipe in
        grpo-math) extra=(--set task.reward=math) ;;
        grpo) extra=("${python_reward[@]}") ;;
        drgrpo) extra=("${python_reward[@]}" --set train.advantage=group_mean --set train.loss_aggregation=constant) ;;
        dapo) extra=("${python_reward[@]}" --set train.mini_batches=4 --set train.clip_high=0.28 --set train.loss_aggregation=token_mean
                     --set train.overlong_buffer=128 --set train.dynamic_sampling_rounds=3) ;;
        gspo) extra=("${python_reward[@]}" --set train.mini_batches=4 --set train.ratio_level=sequence) ;;
        *) echo "unknown recipe $recipe"; continue ;;
    esac
    rm -rf "/tmp/runs/$recipe"
    start=$(date +%s)
    timeout "${RECIPE_LIMIT:-170}" /tmp/lockstep train configs/qwen3-0.6b.toml "${common[@]}" "${extra[@]}" --set "log.run_name=$recipe" > "$O/$recipe.log" 2>&1
    rc=$?
    cp "/tmp/runs/$recipe/metrics.jsonl" "$O/$recipe.metrics.jsonl" 2>/dev/null
    echo "== $recipe: exit $rc, $(( $(date +%s) - start )) s"
    [ "$rc" = 0 ] || grep -v "^\s*$" "$O/$recipe.log" | tail -n 4
    python3 - "$O/$recipe.metrics.jsonl" <<'PY'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1])]
except OSError:
    rows = []
for x in rows:
    a, e = x["agreement"], x.get("eval") or {}
    ev = f" eval pass1 {e['pass1_greedy']:.3f} pass@k {e['pass_at_k']:.3f}" if e else ""
    ds = x.get("dynamic_sampling")
    ds = f" groups kept {ds['groups_kept']}/{ds['groups_sampled']}" if ds else ""
    print(f"step {x['step']} reward {x['reward_mean']:.4f} len {x['response_len_mean']:.0f} bit_equal {a['bit_equal_frac']:.4f} kl_k1 {a['kl_k1']:.2e} tokens {a['tokens']}"
          f" ratio {x['is_ratio_min']:.4f}/{x['is_ratio_mean']:.4f}/{x['is_ratio_max']:.4f} clipped {x['masked_frac']:.4f}{ds}{ev}"
          f" {x['step_s']:.1f} s fp {x['trainer_weights_fingerprint']}")
PY
done
