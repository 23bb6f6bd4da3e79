"""One docs/scale.md row from a scale rung: NAME RC WALL_S MEM_FILE METRICS_JSONL HF_CONFIG [LORA_RANK].

With LORA_RANK (adapters on every projection, docs/lora.md) the update's FLOPs are the adapted
model's: forward and the activations' backward through the frozen weights (4 x their matmul
parameters a token) plus forward and backward of the adapters (6 x theirs)."""
import json
import os
import sys

name, rc, wall, mem_file, metrics, hf_config = sys.argv[1:7]
lora_rank = int(sys.argv[7]) if len(sys.argv) > 7 else 0
mem = [int(l) for l in open(mem_file) if l.strip().isdigit()] if os.path.exists(mem_file) else []
steps = [json.loads(l) for l in open(metrics)] if os.path.exists(metrics) else []
cfg = json.load(open(hf_config))
h, i, L, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
q, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
# parameters of the matmuls a token passes through (the head counted once, tied or not)
matmul_params = L * (h * (q + 2 * kv) * d + q * d * h + 3 * h * i) + h * v
# rank r on q, k, v, o, gate, up, down: r (in + out) each
adapter_params = lora_rank * L * (7 * h + 2 * q * d + 2 * kv * d + 3 * i)
flops_per_token = 4 * matmul_params + 6 * adapter_params if lora_rank else 6 * matmul_params


def fmt(x, p=2):
    return f"{x:.{p}f}"


# nvidia-smi samples MiB; the plan and docs/scale.md count GB (10^9 bytes)
peak_gb = max(mem, default=0) * 1048576 / 1e9


if not steps:
    print(f"| {name} | exit {rc}, {wall} s | - | - | - | {peak_gb:.1f} | - | - |")
    sys.exit(0)
bit = " ".join(f"{s['agreement']['bit_equal_frac']:.4f}" for s in steps)
kl = max(abs(s["agreement"]["kl_k1"]) for s in steps)
last = steps[-1]
t = last["timing"]
tokens = last["agreement"]["tokens"]
gen_tps = last["tokens_per_s"]
# update FLOPs: forward + backward of the scored rows = 6 x matmul params per token (attention's
# QK/PV products left out), over the logprob + update phases (the recompute is the forward)
rows = tokens  # completion tokens only (prompts add ~50 rows a sequence): an underestimate
update_s = max(t["logprob_s"] + t["update_s"], 1e-9)
mfu = flops_per_token * rows / update_s / 989e12
# with causal attention's QK/PV products (forward + backward: 6 L H Q T(T+1) a sequence),
# completion lengths only, every sequence at the mean length (a lower bound of sum T^2)
mean_len = max(last.get("response_len_mean", 0.0), 1.0)
attention = 6 * L * q * d * (rows / mean_len) * mean_len * (mean_len + 1)
mfu_attention = (flops_per_token * rows + attention) / update_s / 989e12
print(f"| {name} | exit {rc}, {len(steps)} steps, {wall} s | {bit} | {kl:.1e} | {fmt(last['step_s'], 1)} s: gen {fmt(t['gen_s'], 1)} / logprob {fmt(t['logprob_s'], 1)} / update {fmt(t['update_s'], 1)} / sync {fmt(t['sync_s'], 2)} "
      f"| {peak_gb:.1f} | {gen_tps:,.0f} | {100 * mfu:.1f}% ({100 * mfu_attention:.1f}% with attention) |")
