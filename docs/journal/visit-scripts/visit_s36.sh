# session 36 (no device lent): what the next visit runs, on the build of session 36's HEAD.
# First visit_s35.sh's parts (battery, battery-planes, boundaries, planes, profile, rung17, rung4:
# any PART not below is passed to it), then the model families added in session 36:
#   PART=families-parity  random-weight checkpoints of Qwen2.5-1.5B's shape (q/k/v biases) and
#                 Llama-3.2-1B's (llama3 RoPE scaling, head_dim 64, vocab 128256), made with
#                 transformers; `lockstep sample` greedy vs transformers' logprobs of the same ids,
#                 f32 (experiments/family_parity.py), Qwen3-0.6B as the control
#   PART=families-rungs   one GRPO step of each at 64 x 1024 (bf16, micro-batches of 16,384 tokens,
#                 on_mismatch = stop): bit_equal 1.0000 and KL 0 expected, with step time and memory
# In 30 device-minutes, in this order: battery (the bias add row and the model contract with biases
# and Llama 3.1 RoPE are in it), families-parity, families-rungs, planes, rung17, then boundaries,
# battery-planes, profile, rung4.
set -u
O=$OUT
[ -x /tmp/lockstep ] || { gunzip -c .gpu/lockstep.gz > /tmp/lockstep && chmod +x /tmp/lockstep; }
make_shape() { [ -f /tmp/checkpoints/$1/config.json ] || python3 experiments/make_real_shape.py "$1" /tmp/checkpoints/$1 > $O/make-$1.log 2>&1 || tail -3 $O/make-$1.log; }
case ${PART:-families-parity} in
families-parity)
  for shape in qwen2.5-1.5b llama-3.2-1b qwen3-0.6b; do
    make_shape $shape
    timeout ${PARITY_LIMIT:-150} python3 experiments/family_parity.py /tmp/checkpoints/$shape $O/parity-$shape --prompts 8 --new 64 2>&1 | tail -1
  done
  tar -C $O -czf /tmp/families-parity.tgz . && mv /tmp/families-parity.tgz $O/families-parity.tgz ;;
families-rungs)
  for shape in qwen2.5-1.5b llama-3.2-1b; do make_shape $shape; done
  SCALE_SET="--set task.reward=char_f1 --set train.on_mismatch=stop" O=$O/families SCALE_LIMIT=${RUNG_LIMIT:-200} \
    bash experiments/scale.sh qwen2.5-1.5b:64x1024:1:16384 llama-3.2-1b:64x1024:1:16384 2>&1 | tail -2
  grep -o '"trainer_weights_fingerprint":"[0-9a-f]*"\|"bit_equal_frac":[0-9.]*\|"gen_s":[0-9.]*\|"update_s":[0-9.]*' $O/families/*.metrics.jsonl | tr '\n' ' '; echo
  tar -C $O -czf /tmp/families-rungs.tgz . && mv /tmp/families-rungs.tgz $O/families-rungs.tgz ;;
*)
  bash docs/journal/visit-scripts/visit_s35.sh ;;
esac
