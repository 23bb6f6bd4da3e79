#!/usr/bin/env python3
"""transformers' arm of experiments/bench/seed_bench.sh: the same checkpoint and prompts, greedy `generate`
of exactly M new tokens in batches of MAX_BATCH (every prompt has the same length: no padding).

    python3 experiments/bench/seed_bench_hf.py CHECKPOINT PROMPTS.jsonl M MAX_BATCH

Prints `sample-timing {json}` with the same fields `lockstep sample` prints (load_s, first_wave_s,
steady_s, steady_tokens, tokens)."""
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM

ck, prompts_path, m, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
prompts = [json.loads(line)["prompt_ids"] for line in open(prompts_path)]
t0 = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained(ck, dtype=torch.bfloat16, device_map="cuda")
model.eval()
torch.cuda.synchronize()
load_s = time.perf_counter() - t0
start = time.perf_counter()
first_wave_s, tokens, steady_tokens = None, 0, 0
with torch.no_grad():
    for i in range(0, len(prompts), batch):
        ids = torch.tensor(prompts[i:i + batch], device="cuda")
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=m, min_new_tokens=m, pad_token_id=0)
        torch.cuda.synchronize()
        new = (out.shape[1] - ids.shape[1]) * ids.shape[0]
        tokens += new
        if first_wave_s is None:
            first_wave_s = time.perf_counter() - start
        else:
            steady_tokens += new
total_s = time.perf_counter() - start
print("sample-timing " + json.dumps({"load_s": load_s, "first_wave_s": first_wave_s, "steady_s": total_s - first_wave_s, "steady_tokens": steady_tokens, "tokens": tokens, "sample_s": total_s}))
