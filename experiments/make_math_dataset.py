#!/usr/bin/env python3
"""Writes a GSM8K-style math dataset in verl's parquet layout (train and eval splits), for RL
runs on real-shape checkpoints without a download (experiments/rl_recipes.sh):

    pip install pyarrow
    python3 experiments/make_math_dataset.py experiments/data

Each row: `prompt` = [{"role": "user", "content": "<two-step word problem> Put the final answer in
\\boxed{}."}], `reward_model` = {"style": "rule", "ground_truth": "<number>"}, plus verl's
`data_source`, `ability` and `extra_info` columns. Deterministic (seeded), so the files are
reproducible byte for byte with the same pyarrow.
"""
import os
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq

NAMES = ["Tom", "Ana", "Li", "Sam", "Maya", "Omar", "Eva", "Raj"]
ITEMS = ["apples", "pencils", "books", "stamps", "marbles", "cookies"]


def problem(rng):
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(2, 40), rng.randint(2, 12), rng.randint(1, 30)
    kind = rng.randrange(3)
    if kind == 0:
        text = f"{name} has {a} {item}. {name} buys {b} boxes with {c} {item} in each box. How many {item} does {name} have now?"
        answer = a + b * c
    elif kind == 1:
        total = a * b
        text = f"{name} packs {total} {item} into {b} equal bags and then gives away {min(c, a)} {item} from one bag. How many {item} are left in that bag?"
        answer = a - min(c, a)
    else:
        price = rng.choice(["0.50", "1.25", "2.75", "3.5"])
        text = f"One of {name}'s {item} costs ${price}. How much do {b} of them cost, in dollars?"
        answer = float(price) * b
    if isinstance(answer, float):
        answer = f"{answer:.2f}".rstrip("0").rstrip(".")
    return text + " Put the final answer in \\boxed{}.", str(answer)


def table(rows, split):
    return pa.table({
        "data_source": ["lockstep/gsm_style"] * len(rows),
        "prompt": [[{"role": "user", "content": q}] for q, _ in rows],
        "ability": ["math"] * len(rows),
        "reward_model": [{"style": "rule", "ground_truth": a} for _, a in rows],
        "extra_info": [{"split": split, "index": i} for i in range(len(rows))],
    })


out = sys.argv[1] if len(sys.argv) > 1 else "experiments/data"
os.makedirs(out, exist_ok=True)
rng = random.Random(20261203)
for split, n in [("train", 1024), ("eval", 128)]:
    rows = [problem(rng) for _ in range(n)]
    pq.write_table(table(rows, split), os.path.join(out, f"gsm_style_{split}.parquet"), compression="snappy")
    print(split, n, rows[0])
