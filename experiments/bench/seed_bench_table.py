#!/usr/bin/env python3
"""The table of experiments/bench/seed_bench.sh from its logs: per arm, steady-state seconds, whole-process
seconds, load seconds, tokens/s, and the ratio to the physical limit of the H200.

    python3 experiments/bench/seed_bench_table.py OUT_DIR CONFIG.json N M MAX_BATCH [WIDE]

"all N s" is the sampling time of all N requests (first engine step to last completion; with a
cold cache it includes compiling the kernels). The wide arm (max_batch WIDE) has one wave: its
all-N time over the one-wave limit is its pace.

The limit is the larger of the arithmetic (2 x matmul parameters x every prompt and new token, plus
attention's products, at 790 TFLOP/s, a dense bf16 rate both the H200 and the H100 sustain) and the
HBM traffic of decode (every step reads the weights once) at the card's measured copy rate: 4.3 TB/s
on the H200, 3.0 TB/s on the H100 (SEED_GPU, which seed_bench.sh sets from nvidia-smi, picks it;
any other card is taken at the H200's rate and the line says so)."""
import json
import os
import re
import sys

out, config_path, n, m, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
wide = int(sys.argv[6]) if len(sys.argv) > 6 else 1024
gpu = os.environ.get("SEED_GPU", "")
hbm = 3.0e12 if "H100" in gpu else 4.3e12
hbm_note = f"{hbm / 1e12:.1f} TB/s" + ("" if ("H100" in gpu or "H200" in gpu) else " (the H200's; card unknown)")
c = json.load(open(config_path))
h, L, inter, vocab = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
hd = c.get("head_dim") or h // c["num_attention_heads"]
qo, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
matmul_params = L * (h * (qo + 2 * kv) + qo * h + 3 * h * inter) + h * vocab
prompt = 32
tokens_all = n * (prompt + m)
# attention's QK^T and PV: per token 4 x heads x head_dim x (positions before it), summed
attn = L * 4 * c["num_attention_heads"] * hd * n * sum(range(prompt + m))
flop_s = (2 * matmul_params * tokens_all + attn) / 790e12
waves = -(-n // batch)
hbm_s = waves * m * 2 * matmul_params / hbm  # bf16 weights, read once a decode step
limit = max(flop_s, hbm_s)
wide_waves = -(-n // wide)
wide_limit = max(flop_s, wide_waves * m * 2 * matmul_params / hbm)

rows, steadies = [], {}
for arm, label in [("matched-cold", "lockstep matched, cold kernel cache"), ("matched-warm", "lockstep matched, warm kernel cache"),
                   ("coverage-warm", "lockstep matched, warm, LOCKSTEP_WGMMA_PICK=coverage (the earlier tile rule)"),
                   ("wide-warm", f"lockstep matched, warm, max_batch {wide} (all at once)"),
                   ("graphs-warm", "lockstep matched, warm, decode steps replayed as graphs"),
                   ("computerates-graphs", "lockstep matched, warm, graphs, LOCKSTEP_WGMMA_PICK=waves-compute-rates (the tile rule without the two-row preference)"),
                   ("wide-graphs", f"lockstep matched, warm, max_batch {wide}, decode steps replayed as graphs"),
                   ("fast-warm", "lockstep fast (not batch invariant), warm cache"), ("transformers", "transformers generate"),
                   ("torch-graphs", "torch reference, not batch invariant: cuBLAS, flash SDPA, compiled norms, every decode step a CUDA graph")]:
    try:
        text = open(f"{out}/seed-{arm}.log").read()
    except OSError:
        continue
    t = re.search(r"sample-timing (\{.*\})", text)
    whole = re.search(r"whole_process_s ([0-9.]+) rc (\d+)", text)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    if not t:
        rows.append(f"| {label} | failed (rc {whole.group(2) if whole else '?'}) | | | | | | | | |")
        continue
    t = json.loads(t.group(1))
    steady_tps = t["steady_tokens"] / t["steady_s"] if t["steady_s"] > 0 else float("nan")
    steps = t.get("steady_engine_steps", 0)
    host = f"{1e3 * t['steady_launch_s'] / steps:.2f} / {1e3 * t['steady_wait_s'] / steps:.2f}" if steps else "-"
    if arm in ("wide-warm", "wide-graphs") and t.get("all_engine_steps"):
        n_steps = t["all_engine_steps"]
        host = f"{1e3 * t['all_launch_s'] / n_steps:.2f} / {1e3 * t['all_wait_s'] / n_steps:.2f} (all steps)"
    if arm in ("wide-warm", "wide-graphs"):
        steady_tps = t["tokens"] / t["sample_s"] if t.get("sample_s") else float("nan")
        steady, pace = "- (one wave)", f"{t.get('sample_s', float('nan')) / wide_limit:.2f}x (all N)"
    else:
        steady, pace = f"{t['steady_s']:.2f}", f"{t['steady_s'] * waves / max(waves - 1, 1) / limit:.2f}x"
    whole_s = float(whole.group(1)) if whole else float("nan")
    peak = f"{int(rss.group(1)) / 1e6:.1f}" if rss else "-"
    steadies[arm] = t["steady_s"]
    rows.append(f"| {label} | {steady} | {steady_tps:,.0f} | {t.get('sample_s', float('nan')):.2f} | {whole_s:.1f} | {t['load_s']:.1f} | {t['first_wave_s']:.1f} | {pace} | {peak} | {host} |")
print(f"{n} prompts of {prompt} ids x {m} greedy new tokens, batches of {batch}, shape {config_path.split('/')[-2]}{', ' + gpu if gpu else ''}: "
      f"physical limit {limit:.2f} s ({flop_s:.2f} s of arithmetic at 790 TFLOP/s, {hbm_s:.2f} s of decode weight reads at {hbm_note})\n")
print("| arm | steady-state s (waves 2..) | steady tokens/s (wide: all N) | all N s | whole process s | load s | first wave s (incl. warm-up) | steady pace / limit | peak host GB | per engine step: host enqueue / device wait ms |")
print("|---|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
# the invariance tax against each not-invariant arm, steady state over steady state, same run
for fast in ("torch-graphs", "fast-warm"):
    if fast in steadies and steadies[fast] > 0:
        for arm in ("graphs-warm", "matched-warm"):
            if arm in steadies:
                print(f"\nmatched ({arm}) / {fast}, steady state: {steadies[arm] / steadies[fast]:.2f}x")
                break
        if "computerates-graphs" in steadies:
            print(f"matched (computerates-graphs) / {fast}, steady state: {steadies['computerates-graphs'] / steadies[fast]:.2f}x")
