#!/usr/bin/env python3
"""The fast reference arm of experiments/bench/seed_bench.sh: the seed benchmark as a tuned, not batch
invariant stack would run it on this GPU, to measure lockstep's invariance tax against a fast arm
that is not bound by host launches, and to bound what the steady state can reach here.

    python3 experiments/bench/seed_bench_torch_graphs.py CHECKPOINT PROMPTS.jsonl M MAX_BATCH OUT.jsonl

What it is: Qwen3's forward written out in torch (the checkpoint loaded by transformers, its
weights taken over), q/k/v and gate/up fused into one matmul each as vLLM fuses them, cuBLAS for
every matmul, SDPA (flash) for attention, norms, RoPE, SwiGLU and the greedy pick with its logprob
(max, then log-sum-exp over the vocabulary) compiled by torch.compile into Triton kernels (vLLM's
fused custom ops play that part), and every decode step captured as a CUDA
graph, one per (batch, position), replayed back to back with no host work between steps: the
sampled token feeds the next step on the device, greedy, exactly M tokens (no stop checks). So it
is optimistic beside any serving engine: the prompts of a wave are all 32 tokens, so a step's
rows share one position and attention reads exactly the keys there are (no paging, no padding).

Before timing, it checks its forward against transformers' in f32 on a few prompts: its logit
error must be within twice transformers' own bf16 error, so the arm is Qwen3 and not a faster
wrong model.

With TORCH_ARM_PROFILE=on (seed_bench.sh sets it) it also prints, after the timed waves, the GPU
time a decode step takes by kernel kind (torch.profiler over 10 replays from step
TORCH_ARM_PROFILE_FROM, default M / 2; 1 profiles positions 32-41, where lockstep's ncu run looks).
With TORCH_ARM_NCU=on the same 10 replays run between cudaProfilerStart and Stop, so that
`ncu --profile-from-start off` times those steps' kernels with the same tool as lockstep's.

Prints `sample-timing {json}` with the fields `lockstep sample` prints (load_s, first_wave_s,
steady_s, steady_tokens, tokens, sample_s); first_wave_s includes the compilation and the graphs'
capture for every wave size. Writes OUT.jsonl with each prompt's token ids and f32 logprobs."""
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

ck, prompts_path, m, batch, out_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
prompts = [json.loads(line)["prompt_ids"] for line in open(prompts_path)]
plen = len(prompts[0])
assert all(len(p) == plen for p in prompts), "every prompt must have the same length (one position a step)"
# SEED_TORCH_DEVICE=cpu (with TORCH_ARM_COMPILE=off) runs only the check against transformers
dev = torch.device(os.environ.get("SEED_TORCH_DEVICE", "cuda"))
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True  # cuBLAS's default, stated

t0 = time.perf_counter()
hf = AutoModelForCausalLM.from_pretrained(ck, dtype=torch.bfloat16, device_map=dev.type).eval()
torch.cuda.synchronize() if dev.type == "cuda" else None
load_s = time.perf_counter() - t0
cfg = hf.config
rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
if cfg.model_type != "qwen3" or rope.get("rope_type", "default") != "default":
    sys.exit(f"{ck}: the torch reference arm writes out Qwen3's forward with plain RoPE; this checkpoint is model_type {cfg.model_type!r}, RoPE type {rope.get('rope_type')!r}")
H, KV, hd, hidden = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
G, eps, L, ctx = H // KV, cfg.rms_norm_eps, cfg.num_hidden_layers, plen + m

layers = []
for layer in hf.model.layers:
    a, f = layer.self_attn, layer.mlp
    layers.append(dict(
        qkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous(),
        o=a.o_proj.weight, gu=torch.cat([f.gate_proj.weight, f.up_proj.weight]).contiguous(), down=f.down_proj.weight,
        n1=layer.input_layernorm.weight, n2=layer.post_attention_layernorm.weight, qn=a.q_norm.weight, kn=a.k_norm.weight))
embed, final_norm, lm_head = hf.model.embed_tokens.weight, hf.model.norm.weight, hf.lm_head.weight
inv = 1.0 / rope.get("rope_theta", getattr(cfg, "rope_theta", None)) ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd)
ang = torch.outer(torch.arange(ctx, device=dev, dtype=torch.float32), inv)
ang = torch.cat([ang, ang], dim=-1)
COS, SIN = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)


def rms(x, w):  # transformers' Qwen3RMSNorm
    v = x.float()
    v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    return w * v.to(x.dtype)


def add_rms(x, res, w):
    res = x + res
    return rms(res, w), res


def rot(x, cos, sin):
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def qk_prep(qkv, qn, kn, cos, sin):  # qkv [N, (H + 2 KV) hd]; cos/sin [N, hd]
    n = qkv.shape[0]
    q, k, v = qkv.split([H * hd, KV * hd, KV * hd], dim=-1)
    q = rot(rms(q.view(n, H, hd), qn), cos[:, None], sin[:, None])
    k = rot(rms(k.view(n, KV, hd), kn), cos[:, None], sin[:, None])
    return q, k, v.view(n, KV, hd)


def swiglu(gu):
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


def greedy(logits):  # [b, vocab] -> the largest logit's id and its f32 logprob (max, then log-sum-exp)
    x = logits.float()
    top, best = x.max(dim=-1)
    return best, top - (top + torch.log(torch.exp(x - top[:, None]).sum(dim=-1)))


compiled = os.environ.get("TORCH_ARM_COMPILE", "on") != "off"
if compiled:
    # one compilation per shape (prefill and decode rows of each wave size, contiguous or not)
    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.recompile_limit = 64
    try:
        rms_c, add_rms_c, qk_prep_c, swiglu_c, greedy_c = (torch.compile(f, dynamic=False) for f in (rms, add_rms, qk_prep, swiglu, greedy))
        with torch.no_grad():  # compile now, so a failure falls back before anything is timed
            x = torch.randn(4, hidden, device=dev, dtype=torch.bfloat16)
            rms_c(x, final_norm), add_rms_c(x, x, final_norm), swiglu_c(torch.randn(4, 8, device=dev, dtype=torch.bfloat16)), greedy_c(x)
            qk_prep_c(torch.randn(4, (H + 2 * KV) * hd, device=dev, dtype=torch.bfloat16), layers[0]["qn"], layers[0]["kn"], COS[:4], SIN[:4])
        rms, add_rms, qk_prep, swiglu, greedy = rms_c, add_rms_c, qk_prep_c, swiglu_c, greedy_c
    except Exception as e:  # noqa: BLE001 - the eager ops are the fallback, and the log says so
        compiled = False
        print(f"torch.compile failed, eager ops: {e}", file=sys.stderr)

KC = torch.empty(L, batch, KV, ctx, hd, device=dev, dtype=torch.bfloat16)
VC = torch.empty_like(KC)


def forward(ids, b, t, start):
    """ids [b * t] at positions start..start + t of rows 0..b: logits of each row's last position."""
    n = b * t
    pos = torch.arange(start, start + t, device=dev).repeat(b) if t > 1 else None
    cos, sin = (COS[pos], SIN[pos]) if t > 1 else (COS[start].expand(n, hd), SIN[start].expand(n, hd))
    h = embed[ids]
    x, res = rms(h, layers[0]["n1"]), h
    for i, w in enumerate(layers):
        q, k, v = qk_prep(x @ w["qkv"].t(), w["qn"], w["kn"], cos, sin)
        if t > 1:  # prefill: causal over the prompt, grouped query heads
            k4, v4 = k.view(b, t, KV, hd).transpose(1, 2), v.view(b, t, KV, hd).transpose(1, 2)
            KC[i, :b, :, start:start + t], VC[i, :b, :, start:start + t] = k4, v4
            o = F.scaled_dot_product_attention(q.view(b, t, H, hd).transpose(1, 2), k4, v4, is_causal=True, enable_gqa=True)
            o = o.transpose(1, 2).reshape(n, H * hd)
        else:  # decode: a KV head's G query heads as G query rows over its keys
            KC[i, :b, :, start], VC[i, :b, :, start] = k, v
            o = F.scaled_dot_product_attention(q.view(b, KV, G, hd), KC[i, :b, :, :start + 1], VC[i, :b, :, :start + 1])
            o = o.reshape(n, H * hd)
        x, res = add_rms(o @ w["o"].t(), res, w["n2"])
        x, res = add_rms(swiglu(x @ w["gu"].t()) @ w["down"].t(), res, layers[i + 1]["n1"] if i + 1 < L else final_norm)
    if t > 1:
        x = x.view(b, t, hidden)[:, -1]
    return x @ lm_head.t()


def pick(logits, toks, lps, col):
    best, lp = greedy(logits)
    toks[:, col] = best
    lps[:, col] = lp


# the forward is Qwen3 and as accurate as transformers' own in bf16: both against transformers in
# f32 on 4 prompts (the same bf16 weights, widened exactly, and back)
with torch.no_grad():
    probe = torch.tensor(prompts[:4], device=dev)
    ref = hf(probe).logits[:, -1].float()
    mine = forward(probe.flatten(), 4, plen, 0).float()
    hf.float()
    exact = hf(probe).logits[:, -1].float()
    hf.to(torch.bfloat16)
    err_mine, err_hf = (mine - exact).abs().max().item(), (ref - exact).abs().max().item()
    agree, agree_hf = ((exact.argmax(-1) == x.argmax(-1)).float().mean().item() for x in (mine, ref))
print(f"check against transformers in f32: max |logit error| {err_mine:.4g}, argmax agreement {agree:.2f} (transformers bf16: {err_hf:.4g}, {agree_hf:.2f}; max |logit| {exact.abs().max().item():.4g})", file=sys.stderr)
if not (err_mine <= 2 * err_hf + 1e-3):
    sys.exit(f"the torch arm's forward is less accurate than transformers' bf16 (max error {err_mine} against {err_hf}): not timing a wrong model")
if dev.type != "cuda":
    sys.exit(0)

sizes = sorted({min(batch, len(prompts) - i) for i in range(0, len(prompts), batch)})
toks = {b: torch.zeros(b, m, device=dev, dtype=torch.long) for b in sizes}
lps = {b: torch.zeros(b, m, device=dev, dtype=torch.float32) for b in sizes}
ids_in = {b: torch.zeros(b * plen, device=dev, dtype=torch.long) for b in sizes}
graphs = {}
pool = torch.cuda.graph_pool_handle()


def decode_step(b, col):  # token col - 1 in, token col out, at position plen + col - 1
    pick(forward(toks[b][:, col - 1], b, 1, plen + col - 1), toks[b], lps[b], col)


start = time.perf_counter()
with torch.no_grad():
    # warm-up and capture for every wave size: each step's graph writes only the static buffers
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for b in sizes:
            pick(forward(ids_in[b], b, plen, 0), toks[b], lps[b], 0)
            for col in range(1, m):
                decode_step(b, col)
    torch.cuda.current_stream().wait_stream(side)
    for b in sizes:
        for col in range(1, m):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                decode_step(b, col)
            graphs[b, col] = g
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - start
    first_wave_s, tokens, steady_tokens, results = None, 0, 0, []
    for i in range(0, len(prompts), batch):
        wave = prompts[i:i + batch]
        b = len(wave)
        ids_in[b].copy_(torch.tensor(wave, dtype=torch.long).flatten())
        pick(forward(ids_in[b], b, plen, 0), toks[b], lps[b], 0)
        for col in range(1, m):
            graphs[b, col].replay()
        results.append((toks[b].cpu(), lps[b].cpu()))  # waits for the wave
        tokens += b * m
        if first_wave_s is None:
            first_wave_s = time.perf_counter() - start
        else:
            steady_tokens += b * m
total_s = time.perf_counter() - start
def replay_window():
    """Replays 10 decode steps of the largest wave from step TORCH_ARM_PROFILE_FROM (1..m-10) and
    waits for them; returns (rows, first position) for the report. After timing: no number moves."""
    b = sizes[-1]
    first = min(max(int(os.environ.get("TORCH_ARM_PROFILE_FROM", m // 2)), 1), m - 10)
    for col in range(first, first + 10):
        graphs[b, col].replay()
    torch.cuda.synchronize()
    return b, plen + first - 1


def profile_decode_steps():
    """GPU time by kernel kind of the window's 10 replayed decode steps."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        b, at = replay_window()
    kinds = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            n = e.name.lower()
            # attention first: flash kernels' names carry cutlass types too
            kind = "attention (SDPA)" if ("flash" in n or "attention" in n or "fmha" in n) else "matmul (cuBLAS)" if ("gemm" in n or "cutlass" in n or "sm90" in n or "nvjet" in n) else "compiled (Triton)" if n.startswith("triton") else "other: " + e.name[:60]
            t, c = kinds.get(kind, (0.0, 0))
            kinds[kind] = (t + e.device_time_total, c + 1)
    print(f"profile of 10 replayed decode steps at {b} rows, positions {at}..{at + 9}: GPU time a step by kernel kind", file=sys.stderr)
    for kind, (t, c) in sorted(kinds.items(), key=lambda kv: -kv[1][0]):
        print(f"  {kind}: {t / 10 / 1e3:.3f} ms, {c / 10:.0f} kernels", file=sys.stderr)
    print(f"  total: {sum(t for t, _ in kinds.values()) / 10 / 1e3:.3f} ms, {sum(c for _, c in kinds.values()) / 10:.0f} kernels", file=sys.stderr)


def ncu_window():
    """The same 10 replayed steps between cudaProfilerStart and Stop, for `ncu --profile-from-start off`
    (TORCH_ARM_NCU=on): ncu then times exactly these steps' kernels, as it times lockstep's."""
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    b, at = replay_window()
    torch.cuda.profiler.stop()
    print(f"ncu window: 10 replayed decode steps at {b} rows, positions {at}..{at + 9}", file=sys.stderr)


if os.environ.get("TORCH_ARM_NCU") == "on":
    ncu_window()
if os.environ.get("TORCH_ARM_PROFILE") == "on":
    try:
        profile_decode_steps()
    except Exception as e:  # noqa: BLE001 - the profile is extra: the timings stand without it
        print(f"profile failed: {e}", file=sys.stderr)
with open(out_path + ".tmp", "w") as f:
    k = 0
    for t, lp in results:
        for r in range(t.shape[0]):
            f.write(json.dumps({"id": k, "token_ids": t[r].tolist(), "logprobs": lp[r].tolist()}) + "\n")
            k += 1
os.replace(out_path + ".tmp", out_path)
print(f"compiled ops: {compiled}; graphs captured for wave sizes {sizes} in {capture_s:.2f} s", file=sys.stderr)
print("sample-timing " + json.dumps({"load_s": load_s, "first_wave_s": first_wave_s, "steady_s": total_s - first_wave_s, "steady_tokens": steady_tokens, "tokens": tokens, "sample_s": total_s, "capture_s": capture_s, "compiled": compiled}))
