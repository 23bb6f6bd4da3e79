#!/usr/bin/env python3
"""Logprob parity with transformers at a real shape, for any family lockstep reads (Qwen3, Qwen2,
Llama with scaled RoPE, ...): `lockstep sample` greedy-decodes random prompts, then transformers
scores the same prompt + completion ids; prints the largest and mean |logprob difference| and how
many greedy tokens transformers would have picked differently. On the GPU machine, after
`bash experiments/visit/gpu_check.sh build` here:

    python3 experiments/bench/family_parity.py CHECKPOINT OUT_DIR [--dtype f32|bf16] [--prompts 8] [--new 64]

CHECKPOINT: an HF folder (experiments/fixtures/make_real_shape.py makes random ones of real shapes).
Both sides run in --dtype (f32 by default: the parity measure; bf16 differs by rounding).
--adapter DIR: a PEFT LoRA folder on top (lockstep's `lora.path`, PEFT's `PeftModel.from_pretrained`):
experiments/fixtures/make_peft_adapter.py makes a random one with PEFT, or a lockstep LoRA
checkpoint folder is one.
"""
import argparse
import json
import os
import random
import subprocess

import torch
from transformers import AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("checkpoint")
ap.add_argument("out")
ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
ap.add_argument("--prompts", type=int, default=8)
ap.add_argument("--new", type=int, default=64)
ap.add_argument("--max-prompt", type=int, default=200)
ap.add_argument("--lockstep", default="/tmp/lockstep")
ap.add_argument("--adapter", default="")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)

vocab = json.load(open(os.path.join(args.checkpoint, "config.json")))["vocab_size"]
rng = random.Random(20261205)
prompts = [[rng.randrange(min(1000, vocab // 2), min(vocab, 50000)) for _ in range(rng.randrange(16, args.max_prompt))] for _ in range(args.prompts)]
inp, outp = os.path.join(args.out, "prompts.jsonl"), os.path.join(args.out, "completions.jsonl")
with open(inp, "w") as f:
    for i, ids in enumerate(prompts):
        f.write(json.dumps({"id": str(i), "prompt_ids": ids}) + "\n")
longest = max(len(p) for p in prompts) + args.new
run = subprocess.run([args.lockstep, "sample", "--set", f"model.path={args.checkpoint}", "--set", f"model.dtype={args.dtype}",
                      "--set", f"sampler.input={inp}", "--set", f"sampler.output={outp}", "--set", "sampler.temperature=0",
                      "--set", f"sampler.max_new_tokens={args.new}", "--set", f"sampler.context={longest + 64}",
                      "--set", "log.progress=false"] + (["--set", f"lora.path={args.adapter}"] if args.adapter else []), capture_output=True, text=True)
open(os.path.join(args.out, "lockstep.log"), "w").write(run.stdout + run.stderr)
if run.returncode != 0:
    raise SystemExit(f"lockstep sample exited {run.returncode}: {run.stderr[-2000:]}")
done = {r["id"]: r for r in map(json.loads, open(outp))}

dtype = torch.float32 if args.dtype == "f32" else torch.bfloat16
device = "cuda" if torch.cuda.is_available() else "cpu"
model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=dtype, attn_implementation="eager").to(device).eval()
if args.adapter:
    from peft import PeftModel
    model = PeftModel.from_pretrained(model, args.adapter, torch_dtype=dtype).to(device).eval()
worst, total, count, flips = 0.0, 0.0, 0, 0
for i, ids in enumerate(prompts):
    r = done[str(i)]
    assert "error" not in r, r
    comp, lps = r["token_ids"], r["logprobs"]
    seq = torch.tensor([ids + comp], device=device)
    with torch.no_grad():
        logits = model(seq).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    for k, (tok, lp) in enumerate(zip(comp, lps)):
        row = logp[len(ids) + k - 1]
        d = abs(row[tok].item() - lp)
        worst, total, count = max(worst, d), total + d, count + 1
        flips += int(row.argmax().item() != tok)
summary = {"checkpoint": args.checkpoint, "dtype": args.dtype, "prompts": len(prompts), "tokens": count,
           "adapter": args.adapter or None, "max_abs_dlogprob": worst, "mean_abs_dlogprob": total / max(count, 1), "greedy_tokens_transformers_picks_differently": flips,
           "architecture": json.load(open(os.path.join(args.checkpoint, "config.json")))["architectures"][0]}
print(json.dumps(summary))
json.dump(summary, open(os.path.join(args.out, "parity.json"), "w"))
