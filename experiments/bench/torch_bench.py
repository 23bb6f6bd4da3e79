#!/usr/bin/env python3
"""torch / transformers side of `lockstep bench`, run in the same GPU visit.

    lockstep bench --preset P --dtype bf16 --json /tmp/k.json --save-model /tmp/bench-model ...
    python3 experiments/bench/torch_bench.py /tmp/k.json --model /tmp/bench-model --concurrency 1,8,64,256

1. For every kernel row lockstep timed (op, M, N, K), times torch's op on the same shapes
   (bf16 torch.mm = cuBLAS; HF-style rmsnorm; float log_softmax + gather) and prints one table
   with lockstep, burn and torch side by side, lockstep/torch ratios and lockstep's fraction of the
   H200's HBM roofline (4.8 TB/s) for memory-bound shapes.
2. transformers' `generate` on the bench model (the same weights lockstep sampled from), sampling
   at temperature 1 with exactly `new_tokens` new tokens, tokens/s per concurrency.
"""
import argparse
import os
import json
import statistics
import time

import torch

HBM_BYTES_PER_S = 4.8e12


ONCE = False  # --once: each op runs once (for kernel profilers), its time that one call's


def time_cuda(fn, repeats=7, inner=10):
    if ONCE:
        repeats, inner = 1, 1
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / inner)
    return statistics.median(samples)


def kernels(path):
    doc = json.load(open(path))
    dtype = torch.bfloat16 if doc["dtype"] == "BF16" else torch.float32
    print(f"## kernels: lockstep vs burn default vs torch ({doc['preset']}, {doc['dtype']}; median ms per call)\n")
    print("| op | M x N x K | lockstep ms | burn ms | torch ms | lockstep / torch | burn / torch | lockstep TFLOP/s | lockstep % of HBM roofline |")
    print("|---|---|---|---|---|---|---|---|---|")
    dev = "cuda"
    for row in doc["kernels"]:
        op, m, n, k = row["op"], row["m"], row["n"], row["k"]
        if op.startswith("matmul"):
            x = torch.randn(m, k, device=dev, dtype=dtype)
            w = torch.randn(n, k, device=dev, dtype=dtype) * 0.02
            t = time_cuda(lambda: torch.mm(x, w.t()))
        elif op.startswith("hbm read"):
            # torch's own streaming read of the same bytes: a sum over the weight
            w = torch.randn(n, k, device=dev, dtype=dtype)
            t = time_cuda(lambda: w.sum(dtype=torch.float32))
        elif op == "rmsnorm":
            x = torch.randn(m, n, device=dev, dtype=dtype)
            g = torch.rand(n, device=dev, dtype=dtype) + 0.5

            def rms():
                h = x.float()
                h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
                return g * h.to(dtype)

            t = time_cuda(rms)
        elif op == "add_rmsnorm":
            a_ = torch.randn(m, n, device=dev, dtype=dtype)
            b_ = torch.randn(m, n, device=dev, dtype=dtype)
            g = torch.rand(n, device=dev, dtype=dtype) + 0.5

            def add_rms():
                s = a_ + b_
                h = s.float()
                h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
                return s, g * h.to(dtype)

            t = time_cuda(add_rms)
        elif op == "add":
            a_ = torch.randn(m, n, device=dev, dtype=dtype)
            b_ = torch.randn(m, n, device=dev, dtype=dtype)
            t = time_cuda(lambda: a_ + b_)
        elif op == "swiglu":
            # HF's Qwen3 MLP: act_fn(gate) * up in the model dtype
            g_ = torch.randn(m, n, device=dev, dtype=dtype)
            u_ = torch.randn(m, n, device=dev, dtype=dtype)
            t = time_cuda(lambda: torch.nn.functional.silu(g_) * u_)
        elif op == "rope":
            # HF's apply_rotary_pos_emb on [rows, heads, head_dim] with per-row cos/sin
            x = torch.randn(m, n, k, device=dev, dtype=dtype)
            ang = torch.rand(m, 1, k, device=dev, dtype=torch.float32) * 6.28
            cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)

            def rot():
                x1, x2 = x[..., : k // 2], x[..., k // 2 :]
                return x * cos + torch.cat((-x2, x1), dim=-1) * sin

            t = time_cuda(rot)
        elif op == "logprob":
            logits = torch.randn(m, n, device=dev, dtype=dtype)
            targets = torch.arange(m, device=dev).remainder(n)
            t = time_cuda(lambda: torch.log_softmax(logits.float(), -1).gather(1, targets[:, None]))
        elif op.startswith("attention decode"):
            # m sequences, one query row each, n keys of head_dim k (SDPA picks flash/efficient kernels)
            qh, kvh = doc["q_heads"], doc["kv_heads"]
            q = torch.randn(m, qh, 1, k, device=dev, dtype=dtype)
            kk = torch.randn(m, kvh, n, k, device=dev, dtype=dtype)
            vv = torch.randn(m, kvh, n, k, device=dev, dtype=dtype)
            t = time_cuda(lambda: torch.nn.functional.scaled_dot_product_attention(q, kk, vv, enable_gqa=True))
        elif op.startswith("attention prefill"):
            # m whole sequences of n tokens, causal, head_dim k
            qh, kvh = doc["q_heads"], doc["kv_heads"]
            q = torch.randn(m, qh, n, k, device=dev, dtype=dtype)
            kk = torch.randn(m, kvh, n, k, device=dev, dtype=dtype)
            vv = torch.randn(m, kvh, n, k, device=dev, dtype=dtype)
            t = time_cuda(lambda: torch.nn.functional.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=True))
        else:
            continue
        a, b = row["lockstep_ms"], row["burn_ms"] if row["burn_ms"] is not None else float("nan")
        tflops = row["flops"] / (a * 1e-3) / 1e12 if row["flops"] else 0.0
        roof = row["bytes"] / HBM_BYTES_PER_S / (a * 1e-3) * 100
        print(f"| {op} | {m}x{n}x{k} | {a:.4f} | {b:.4f} | {t:.4f} | {a / t:.2f} | {b / t:.2f} | {tflops:.1f} | {roof:.1f}% |")


def generate(model_dir, concurrency, prompt_len, new_tokens):
    import os

    from transformers import AutoModelForCausalLM

    cfg_path = os.path.join(model_dir, "config.json")
    cfg = json.load(open(cfg_path))
    if "model_type" not in cfg:  # lockstep's saved config names the architecture only
        cfg["model_type"] = "qwen3"
        json.dump(cfg, open(cfg_path, "w"))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    vocab = model.config.vocab_size
    print(f"\n## transformers generate (same weights, bf16, sampling T=1, {prompt_len}-token prompts, {new_tokens} new tokens)\n")
    print("| concurrency | transformers tok/s |")
    print("|---|---|")
    for c in concurrency:
        ids = (torch.arange(c * prompt_len, device="cuda").reshape(c, prompt_len) * 7) % vocab
        kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0)
        with torch.no_grad():
            model.generate(ids, **kwargs)
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = model.generate(ids, **kwargs)
            torch.cuda.synchronize()
            secs = time.perf_counter() - t
        generated = (out.shape[1] - prompt_len) * c
        print(f"| {c} | {generated / secs:.1f} |", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kernels_json")
    p.add_argument("--model")
    p.add_argument("--concurrency", default="1,8,64,256")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--once", action="store_true", help="each op once (for ncu), not timed in repeats")
    a = p.parse_args()
    global ONCE
    ONCE = a.once
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name()}\n")
    if os.path.exists(a.kernels_json):
        kernels(a.kernels_json)
    if a.model and not os.path.exists(os.path.join(a.model, "config.json")):
        print(f"(no model saved at {a.model}: run the sampler part first for transformers generate)")
    elif a.model:
        generate(a.model, [int(c) for c in a.concurrency.split(",")], a.prompt_len, a.new_tokens)


if __name__ == "__main__":
    main()
