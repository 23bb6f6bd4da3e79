# session 32: the seed benchmark's decode attention at short contexts, issue 25's table, decode partials tried (parts launch, final, rung, halves, half; bulk prepared, not run).
#   PART=launch  the seed benchmark (8B, 1000 x 100, max_batch 256): cold and warm arms of this build,
#                then decode steps replayed with each LOCKSTEP_DECODE_LAUNCH (bit-neutral) side by side,
#                completions compared as bits; then ncu's GPU time of the decode partial and combine
#                kernels at 256 rows under each launch (1x1 = the previous auto here; auto now walks whole
#                rows with the combine in place), and the attention bench's launches at 128-4,096 keys
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
ck=/tmp/checkpoints/qwen3-8b
sample_arm() {  # name, then env assignments for the process
  local name=$1; shift
  local s=$(date +%s.%N)
  env LOCKSTEP_KERNEL_CACHE=/tmp/seed-kernel-cache "$@" /tmp/lockstep sample --set model.path=$ck --set model.dtype=bf16 \
    --set sampler.input=/tmp/seed-prompts.jsonl --set sampler.output=/tmp/seed-$name.jsonl --set sampler.max_new_tokens=100 \
    --set sampler.temperature=0 --set sampler.max_batch=${BATCH:-256} --set sampler.context=164 --set log.progress=false > $O/arm-$name.log 2>&1
  echo "$name rc $? whole $(python3 -c "print(round($(date +%s.%N) - $s, 2))") s: $(grep -o 'the rest [0-9.]* s' $O/arm-$name.log) | $(grep 'steady state,' $O/arm-$name.log | sed 's/  steady state, //')"
}
bits_vs() {  # reference jsonl, other jsonl
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
a = [json.loads(l) for l in open(sys.argv[1])]; b = [json.loads(l) for l in open(sys.argv[2])]
bits = lambda xs: [struct.pack("<f", x) for x in xs]
same = len(a) == len(b) and all(x["token_ids"] == y["token_ids"] and bits(x["logprobs"]) == bits(y["logprobs"]) for x, y in zip(a, b))
print(f"{sys.argv[2]}: {len(b)} completions, {'identical to' if same else 'DIFFERENT from'} {sys.argv[1]} (ids, tokens, logprob bits)")
PY
}
case ${PART:-launch} in
launch)
  SEED_ARMS="graphs-warm" O=$O/seed bash experiments/seed_bench.sh qwen3-8b 1000 100 256 2>&1 | tail -9
  for l in ${LAUNCHES:-1x1 auto 3x1 3x2+combine 1x1 auto}; do
    sample_arm graphs-$l-$RANDOM LOCKSTEP_DECODE_LAUNCH=$l
    bits_vs /tmp/seed-matched-cold.jsonl $(ls -t /tmp/seed-graphs-$l-*.jsonl | head -1)
  done
  for l in ${NCU_LAUNCHES:-1x1 auto 3x1}; do
    LOCKSTEP_DECODE_LAUNCH=$l timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum --csv -k regex:"mma_partial|split_combine" \
      /tmp/lockstep bench --preset qwen3-8b --dtype bf16 --concurrency 256 --prompt-len 32 --new-tokens ${NEW:-9} \
      --kernels matched --skip-ops --repeats 1 > $O/ncu-$l.csv 2> $O/ncu-$l.err; echo "ncu $l rc $?"
    python3 experiments/ncu_summary.py $O/ncu-$l.csv --grids --top 10 | tee $O/ncu-$l.md
  done
  timeout ${ATT_LIMIT:-200} /tmp/lockstep bench --preset qwen3-8b --dtype bf16 --concurrency none --no-burn --repeats 5 --attention-only > $O/attention.md 2>&1
  echo "attention bench rc $?"; grep "split_kv_tc\|DIFFER" $O/attention.md | head -60 ;;
esac
# PART=verify: every decode row combined in place (LOCKSTEP_DECODE_LAUNCH=64x2 makes every row with
# at most 64 splits whole): the battery (decode = prefill = trainer as bits) and the engine checks
case ${PART:-launch} in
verify)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  for l in ${VERIFY_LAUNCHES:-64x2}; do
    LOCKSTEP_DECODE_LAUNCH=$l timeout ${BATTERY_LIMIT:-260} /tmp/lockstep-battery --dtypes f32,bf16 > $O/battery-$l.md 2>&1; echo "battery $l rc $?: $(grep -c '| yes |' $O/battery-$l.md) rows identical, $(grep -ci '| no |' $O/battery-$l.md) not"
    grep -i "| no |\|^error\|panick" $O/battery-$l.md | head
    LOCKSTEP_DECODE_LAUNCH=$l timeout ${CHECK_LIMIT:-150} /tmp/lockstep check --preset small --dtypes f32,bf16 > $O/check-$l.md 2>&1; echo "check small $l rc $?"; grep "^|" $O/check-$l.md | grep -v "bit-identical\|passed\|---\|dtype"
  done ;;
esac
# PART=final: issue 25's table from one visit: the seed benchmark with every arm (matched launched and
# replayed, at max_batch 256 and 1024, the fast ablation arm, transformers generate), then the
# attention kernels at the 8B shape against torch's SDPA on the same shapes, then the prefill cube's
# warps (LOCKSTEP_FLASH_WARPS 4 and 8, a launch shape only) on the 1.7B update; outputs in one tarball
case ${PART:-launch} in
final)
  SEED_ARMS="${SEED_ARMS:-matched-cold matched-warm graphs-warm wide-warm wide-graphs fast-warm transformers}" O=$O/seed bash experiments/seed_bench.sh qwen3-8b 1000 100 256 2>&1 | tail -12
  timeout ${ATT_LIMIT:-200} /tmp/lockstep bench --preset qwen3-8b --dtype bf16 --concurrency none --no-burn --repeats 5 --attention-only --json $O/attention-8b.json > $O/attention-8b.md 2>&1; echo "attention bench rc $?"
  PYTHONUNBUFFERED=1 timeout 150 python3 experiments/torch_bench.py $O/attention-8b.json 2>&1 | grep -v Warning > $O/attention-torch.md; echo "torch rc $?"
  grep "^| attention" $O/attention-torch.md | grep -v "split_kv_tc [0-9]\|sequential\|\[split_kv\]" | head -40
  for w in ${WARPS:-4 8}; do
    LOCKSTEP_FLASH_WARPS=$w timeout 120 /tmp/lockstep bench --preset qwen3-1.7b --dtype bf16 --concurrency none --trainer-only --trainer-batches 4 --trainer-len 4096 > $O/update-warps$w.md 2>&1
    echo "warps $w rc $?: $(grep '^|' $O/update-warps$w.md | tail -1)"
  done
  tar -C $O -czf $O/final.tgz --exclude final.tgz . ;;
esac
# PART=rung: the attention inputs' plane kernel (session 31) at real scale: the battery's boundary rows
# (2^31 elements, 65,535 cubes, 8k prefixes) and the 0.6B 512 x 2048 rung's step 0 with session 23's
# settings (its weights after step 0: ef4829e7211e1545 in sessions 17-31)
case ${PART:-launch} in
rung)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${BATTERY_LIMIT:-200} /tmp/lockstep-battery --boundaries-only --dtypes bf16 > $O/boundaries.md 2>&1; echo "boundaries rc $?: $(grep -c '| yes |' $O/boundaries.md) rows identical, $(grep -ci '| no |' $O/boundaries.md) not"
  grep -i "| no |\|^error\|panick" $O/boundaries.md | head
  SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=62000 --set sampler.max_batch=256 --set train.on_mismatch=stop" O=$O/rung \
    SCALE_LIMIT=${RUNG_LIMIT:-300} bash experiments/scale.sh qwen3-0.6b:512x2048:1:16384 2>&1 | tail -2
  grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"\|"bit_equal_frac":[0-9.]*\|"gen_replayed_steps":[0-9]*\|"gen_engine_steps":[0-9]*\|"gen_failed_captures":[0-9]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*\|"kl_k1":[-0-9.e]*' $O/rung/*.metrics.jsonl
  tar -C $O -czf /tmp/rung.tgz . && mv /tmp/rung.tgz $O/rung.tgz ;;
esac
# PART=halves: the decode partials through two half-split stages (mma_decode_halves.rs): the attention
# bench's launches at the 0.6B heads, each compared with the 1x2 launch as bits; the battery's boundary
# rows and the 0.6B 512 x 2048 rung's step 0 with LOCKSTEP_DECODE_LAUNCH=8xh (weights must be
# ef4829e7211e1545; generation against v3's 56.9 s)
# (that build was not kept: later builds refuse `8xh`, docs/journal/decode-partials-tries.md)
case ${PART:-launch} in
halves)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${ATT_LIMIT:-150} /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --no-burn --repeats 5 --attention-only > $O/attention-0.6b.md 2>&1
  echo "attention bench rc $?"; grep "split_kv_tc\|DIFFER\|rror" $O/attention-0.6b.md | grep -v prefill | head -80
  LOCKSTEP_DECODE_LAUNCH=8xh timeout ${BATTERY_LIMIT:-150} /tmp/lockstep-battery --boundaries-only --dtypes bf16 > $O/boundaries-8xh.md 2>&1; echo "boundaries 8xh rc $?: $(grep -c '| yes |' $O/boundaries-8xh.md) rows identical, $(grep -ci '| no |' $O/boundaries-8xh.md) not"
  grep -i "| no |\|^error\|panick" $O/boundaries-8xh.md | head
  LOCKSTEP_DECODE_LAUNCH=8xh SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=62000 --set sampler.max_batch=256 --set train.on_mismatch=stop" O=$O/rung \
    SCALE_LIMIT=${RUNG_LIMIT:-200} bash experiments/scale.sh qwen3-0.6b:512x2048:1:16384 2>&1 | tail -2
  grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"\|"bit_equal_frac":[0-9.]*\|"gen_replayed_steps":[0-9]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*\|"kl_k1":[-0-9.e]*' $O/rung/*.metrics.jsonl
  tar -C $O -czf /tmp/halves.tgz . && mv /tmp/halves.tgz $O/halves.tgz ;;
esac
# PART=half: the decode partials through ONE half-split stage that also stages the queries (twice the
# cubes a multiprocessor; mma_decode_halves.rs): the attention bench's launches at the 0.6B heads against
# 1x2 as bits, the boundary rows with LOCKSTEP_DECODE_LAUNCH=8xh, then the 0.6B rung's step 0 with 8xh
# (first, cold kernel cache) and with the default launch (second): weights must be ef4829e7211e1545
# (that build was not kept either: later builds refuse `8xh`)
case ${PART:-launch} in
half)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${ATT_LIMIT:-150} /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --no-burn --repeats 5 --attention-only > $O/attention-0.6b.md 2>&1
  echo "attention bench rc $?"; grep "split_kv_tc\|DIFFER\|rror" $O/attention-0.6b.md | grep -v prefill | grep "x4096x\|128x1024\|256x1024\|DIFFER\|rror" | awk -F'|' '{print $2 $3 $4 $7}'
  LOCKSTEP_DECODE_LAUNCH=8xh timeout ${BATTERY_LIMIT:-150} /tmp/lockstep-battery --boundaries-only --dtypes bf16 > $O/boundaries-8xh.md 2>&1; echo "boundaries 8xh rc $?: $(grep -c '| yes |' $O/boundaries-8xh.md) rows identical, $(grep -ci '| no |' $O/boundaries-8xh.md) not"
  for l in ${RUNG_LAUNCHES:-8xh auto}; do
    LOCKSTEP_DECODE_LAUNCH=$l SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=62000 --set sampler.max_batch=256 --set train.on_mismatch=stop" O=$O/rung-$l \
      SCALE_LIMIT=${RUNG_LIMIT:-150} bash experiments/scale.sh qwen3-0.6b:512x2048:1:16384 2>&1 | tail -1
    grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"\|"bit_equal_frac":[0-9.]*\|"gen_s":[0-9.]*' $O/rung-$l/*.metrics.jsonl | tr '\n' ' '; echo
  done
  tar -C $O -czf /tmp/half.tgz . && mv /tmp/half.tgz $O/half.tgz ;;
esac
# PART=bulk (prepared for the next visit; session 32 had no device time left): the decode partials
# staged by Hopper bulk copies (mma_decode_bulk.rs, LOCKSTEP_DECODE_LAUNCH=SxB, never run yet): the
# attention bench's launches (the bulk rows must say `bits equal`), the boundary rows and the engine
# checks with 8xb, then the 0.6B rung's step 0 with 8xb and with the default (ef4829e7211e1545 both)
case ${PART:-launch} in
bulk)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${ATT_LIMIT:-150} /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --no-burn --repeats 5 --attention-only > $O/attention-0.6b.md 2>&1
  echo "attention bench rc $?"; grep "split_kv_tc\|DIFFER\|rror" $O/attention-0.6b.md | grep -v prefill | grep "x4096x\|x1024x\|DIFFER\|rror" | awk -F'|' '{print $2 $3 $4 $7}'
  LOCKSTEP_DECODE_LAUNCH=8xb timeout ${BATTERY_LIMIT:-150} /tmp/lockstep-battery --boundaries-only --dtypes bf16 > $O/boundaries-8xb.md 2>&1; echo "boundaries 8xb rc $?: $(grep -c '| yes |' $O/boundaries-8xb.md) rows identical, $(grep -ci '| no |' $O/boundaries-8xb.md) not"
  LOCKSTEP_DECODE_LAUNCH=8xb timeout ${CHECK_LIMIT:-150} /tmp/lockstep check --preset qwen3-0.6b --dtypes bf16 > $O/check-8xb.md 2>&1; echo "check 0.6b 8xb rc $?"; grep "^|" $O/check-8xb.md | grep -v "bit-identical\|passed\|---\|dtype"
  for l in ${RUNG_LAUNCHES:-auto 8xb}; do
    LOCKSTEP_DECODE_LAUNCH=$l SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=62000 --set sampler.max_batch=256 --set train.on_mismatch=stop" O=$O/rung-$l \
      SCALE_LIMIT=${RUNG_LIMIT:-150} bash experiments/scale.sh qwen3-0.6b:512x2048:1:16384 2>&1 | tail -1
    grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"\|"bit_equal_frac":[0-9.]*\|"gen_s":[0-9.]*' $O/rung-$l/*.metrics.jsonl | tr '\n' ' '; echo
  done
  tar -C $O -czf /tmp/bulk.tgz . && mv /tmp/bulk.tgz $O/bulk.tgz ;;
esac
