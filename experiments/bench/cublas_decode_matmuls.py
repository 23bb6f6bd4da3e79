#!/usr/bin/env python3
"""cuBLAS (bf16 torch.mm, what a non-batch-invariant engine runs) at a real shape's decode
projections, to set beside `lockstep bench --tile-sweep` of the same visit: median µs a call and
TFLOP/s per projection and M, and the sum over one layer's projections.

    python3 experiments/bench/cublas_decode_matmuls.py qwen3-8b 256,1024
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_bench import time_cuda  # noqa: E402

SHAPES = {  # hidden, intermediate, q heads, kv heads, head_dim, vocab
    "qwen3-0.6b": (1024, 3072, 16, 8, 128, 151936),
    "qwen3-1.7b": (2048, 6144, 16, 8, 128, 151936),
    "qwen3-4b": (2560, 9728, 32, 8, 128, 151936),
    "qwen3-8b": (4096, 12288, 32, 8, 128, 151936),
}


def time_us(fn):
    return time_cuda(fn, inner=20) * 1e3  # ms -> µs


def main():
    shape, ms = sys.argv[1], [int(m) for m in sys.argv[2].split(",")]
    h, ffn, qh, kvh, hd, v = SHAPES[shape]
    proj = [("qkv (fused)", (qh + 2 * kvh) * hd, h), ("o_proj", h, qh * hd), ("gate/up (fused)", 2 * ffn, h), ("down_proj", h, ffn), ("lm_head", v, h)]
    print(f"## cuBLAS bf16 (torch.mm, x @ w.T), {shape}\n")
    print("| op | M x N x K | µs | TFLOP/s |")
    print("|---|---|---|---|")
    for m in ms:
        layer = 0.0
        for name, n, k in proj:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
            us = time_us(lambda: torch.mm(x, w.t()))
            if name != "lm_head":
                layer += us
            print(f"| {name} | {m}x{n}x{k} | {us:.1f} | {2 * m * n * k / us / 1e6:.0f} |")
        print(f"| one layer's projections | M {m} | {layer:.1f} | |")


if __name__ == "__main__":
    main()
