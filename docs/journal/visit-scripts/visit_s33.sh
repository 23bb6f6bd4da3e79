# session 33: the first run of the decode partials staged by Hopper bulk copies (mma_decode_bulk.rs,
# LOCKSTEP_DECODE_LAUNCH=SxB), prepared in session 32 as visit_s32.sh's PART=bulk, split in two calls.
#   PART=bulk1  the attention bench's launches at the 0.6B heads (bulk rows must say `bits equal`
#               against the 1x2 launch), the battery's boundary rows and the engine checks with 8xb
#   PART=bulk2  the 0.6B rung's step 0 (512 x 2048) with the default launch and with 8xb
#               (weights ef4829e7211e1545 both; gen_s side by side). Not run: bulk1 showed 0-2%.
#   PART=narrow1 the decode partials with the queries on the mma's narrow side
#               (mma_decode_narrow.rs, LOCKSTEP_DECODE_LAUNCH=Sxn): the attention bench's launches
#               at the 0.6B heads (2 a KV head) and the 8B heads (4), bits against 1x2; boundary
#               rows and engine checks with 4xn
#   PART=narrow2 the bench's launches again with the narrow kernel's cubes also ordered with a
#               row's KV heads side by side (Sxh), both head layouts (no gain: Sxh not kept)
#   PART=final  the narrow kernel as the automatic launch: the whole battery (f32, bf16), then the
#               0.6B rung's step 0 (512 x 2048; weights ef4829e7211e1545 expected, gen_s)
#   PART=seed   the seed benchmark (8B, 1000 x 100): cold, then replayed warm
#   PART=spread the 0.6B 128 x 1024 rung three times in a row on a fresh machine (the kernel
#               cache cold, then warm): does the update's time spread come from compilation?
#   PART=e2e    end-to-end decode at the 1.7B shape, 256 requests x 64 + 1,024 tokens, with the
#               narrow kernel (auto) and the 16-row one (4x1), one process each, auto twice
#   PART=layout the attention bench (0.6B heads) of the final build: the launches' bits, and decode
#               with each KV head's keys contiguous beside the interleaved cache
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
case ${PART:-bulk1} in
bulk1)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${ATT_LIMIT:-150} /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --no-burn --repeats 5 --attention-only > $O/attention-0.6b.md 2>&1
  echo "attention bench rc $?"; grep "split_kv_tc" $O/attention-0.6b.md | grep -v prefill | awk -F'|' '{print $2 $3 $4}'; grep -i "error\|panic" $O/attention-0.6b.md | head -5
  LOCKSTEP_DECODE_LAUNCH=8xb timeout ${BATTERY_LIMIT:-120} /tmp/lockstep-battery --boundaries-only --dtypes bf16 > $O/boundaries-8xb.md 2>&1; echo "boundaries 8xb rc $?: $(grep -c '| yes |' $O/boundaries-8xb.md) rows identical, $(grep -ci '| no |' $O/boundaries-8xb.md) not"
  LOCKSTEP_DECODE_LAUNCH=8xb timeout ${CHECK_LIMIT:-150} /tmp/lockstep check --preset qwen3-0.6b --dtypes bf16 > $O/check-8xb.md 2>&1; echo "check 0.6b 8xb rc $?"; grep "^|" $O/check-8xb.md | grep -v "bit-identical\|passed\|---\|dtype" | head -20; tail -3 $O/check-8xb.md
  tar -C $O -czf /tmp/bulk1.tgz . && mv /tmp/bulk1.tgz $O/bulk1.tgz ;;
bulk2)
  for l in ${RUNG_LAUNCHES:-auto 8xb}; do
    LOCKSTEP_DECODE_LAUNCH=$l SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=62000 --set sampler.max_batch=256 --set train.on_mismatch=stop" O=$O/rung-$l \
      SCALE_LIMIT=${RUNG_LIMIT:-160} bash experiments/scale.sh qwen3-0.6b:512x2048:1:16384 2>&1 | tail -1
    grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"\|"bit_equal_frac":[0-9.]*\|"gen_s":[0-9.]*' $O/rung-$l/*.metrics.jsonl | tr '\n' ' '; echo
  done
  tar -C $O -czf /tmp/bulk2.tgz . && mv /tmp/bulk2.tgz $O/bulk2.tgz ;;
narrow1)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  for p in qwen3-0.6b qwen3-8b; do
    timeout ${ATT_LIMIT:-150} /tmp/lockstep bench --preset $p --dtype bf16 --concurrency none --no-burn --repeats 5 --attention-only > $O/attention-$p.md 2>&1
    echo "attention bench $p rc $?"; grep "split_kv_tc" $O/attention-$p.md | grep -v prefill | grep "x1\]\|xn\|DIFFER\|x4096\|\[split_kv_tc\]" | awk -F'|' '{print $2 $3 $4}'; grep -i "error\|panic" $O/attention-$p.md | head -5
  done
  LOCKSTEP_DECODE_LAUNCH=4xn timeout ${BATTERY_LIMIT:-120} /tmp/lockstep-battery --boundaries-only --dtypes bf16 > $O/boundaries-4xn.md 2>&1; echo "boundaries 4xn rc $?: $(grep -c '| yes |' $O/boundaries-4xn.md) rows identical, $(grep -ci '| no |' $O/boundaries-4xn.md) not"
  LOCKSTEP_DECODE_LAUNCH=4xn timeout ${CHECK_LIMIT:-150} /tmp/lockstep check --preset qwen3-0.6b --dtypes bf16 > $O/check-4xn.md 2>&1; echo "check 0.6b 4xn rc $?"; grep "^|" $O/check-4xn.md | grep -v "bit-identical\|passed\|---\|dtype" | head -20; tail -2 $O/check-4xn.md
  tar -C $O -czf /tmp/narrow1.tgz . && mv /tmp/narrow1.tgz $O/narrow1.tgz ;;
narrow2)
  for p in qwen3-0.6b qwen3-8b; do
    timeout ${ATT_LIMIT:-150} /tmp/lockstep bench --preset $p --dtype bf16 --concurrency none --no-burn --repeats 5 --attention-only > $O/attention-$p.md 2>&1
    echo "attention bench $p rc $?"; grep "split_kv_tc" $O/attention-$p.md | grep -v prefill | grep -v "128x128" | awk -F'|' '{print $2 $3 $4}'; grep -i "error\|panic" $O/attention-$p.md | head -5
  done
  tar -C $O -czf /tmp/narrow2.tgz . && mv /tmp/narrow2.tgz $O/narrow2.tgz ;;
final)
  gunzip -c .gpu/lockstep-battery.gz > /tmp/lockstep-battery && chmod +x /tmp/lockstep-battery
  timeout ${BATTERY_LIMIT:-240} /tmp/lockstep-battery --dtypes f32,bf16 > $O/battery.md 2>&1; echo "battery rc $?: $(grep -c '| yes |' $O/battery.md) rows identical, $(grep -ci '| no |' $O/battery.md) not"
  SCALE_SET="--set task.reward=char_f1 --set sampler.kv_budget_mib=62000 --set sampler.max_batch=256 --set train.on_mismatch=stop" O=$O/rung \
    SCALE_LIMIT=${RUNG_LIMIT:-170} bash experiments/scale.sh qwen3-0.6b:512x2048:1:16384 2>&1 | tail -1
  grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"\|"bit_equal_frac":[0-9.]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*' $O/rung/*.metrics.jsonl | tr '\n' ' '; echo
  tar -C $O -czf /tmp/final.tgz . && mv /tmp/final.tgz $O/final.tgz ;;
seed)
  SEED_ARMS="${SEED_ARMS:-matched-cold graphs-warm}" O=$O/seed bash experiments/seed_bench.sh qwen3-8b 1000 100 256 2>&1 | tail -9
  tar -C $O -czf /tmp/seed.tgz . && mv /tmp/seed.tgz $O/seed.tgz ;;
layout)
  timeout ${ATT_LIMIT:-150} /tmp/lockstep bench --preset qwen3-0.6b --dtype bf16 --concurrency none --no-burn --repeats 5 --attention-only > $O/attention-layout.md 2>&1
  echo "attention bench rc $?"; grep "split_kv_tc" $O/attention-layout.md | grep -v prefill | grep "contiguous\|DIFFER\|4x1\|xn\|\[split_kv_tc\]" | grep -v "128x128" | awk -F'|' '{print $2 $3 $4}'; grep -ci "bits equal" $O/attention-layout.md
  tar -C $O -czf /tmp/layout.tgz . && mv /tmp/layout.tgz $O/layout.tgz ;;
spread)
  for i in 1 2 3; do
    SCALE_SET="--set task.reward=char_f1 --set train.on_mismatch=stop" O=$O/spread-$i SCALE_LIMIT=${RUNG_LIMIT:-90} bash experiments/scale.sh qwen3-0.6b:128x1024:1:16384 2>&1 | tail -1
    grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"\|"gen_s":[0-9.]*\|"update_s":[0-9.]*' $O/spread-$i/*.metrics.jsonl | tr '\n' ' '; echo
    ls ~/.cache/lockstep/kernels 2>/dev/null | wc -l
  done
  tar -C $O -czf /tmp/spread.tgz . && mv /tmp/spread.tgz $O/spread.tgz ;;
e2e)
  for l in auto 4x1 auto; do
    LOCKSTEP_DECODE_LAUNCH=$l timeout ${E2E_LIMIT:-75} /tmp/lockstep bench --preset qwen3-1.7b --dtype bf16 --concurrency 256 --prompt-len 64 --new-tokens 1024 \
      --kernels matched --skip-ops --repeats 1 > $O/e2e-$l-$RANDOM.log 2>&1; echo "$l rc $?: $(grep -h 'median' $(ls -t $O/e2e-$l-*.log | head -1))"
  done
  tar -C $O -czf /tmp/e2e.tgz . && mv /tmp/e2e.tgz $O/e2e.tgz ;;
esac
