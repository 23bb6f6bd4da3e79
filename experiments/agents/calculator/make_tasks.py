#!/usr/bin/env python3
"""The calculator example's records (seeded, no download): products of two numbers that the model
cannot multiply in its head, each with a demo episode for the SFT warm start (ask the calculator,
read its result, answer it).

    python3 experiments/agents/calculator/make_tasks.py OUT.jsonl [--count 400] [--digits 2] [--seed 1]
"""
import argparse
import json
import random


def demo(a, b):
    return [
        {"role": "user", "content": f"{a}*{b}"},
        {"role": "assistant", "content": f"calc({a}*{b})"},
        {"role": "tool", "content": str(a * b)},
        {"role": "assistant", "content": f"answer {a * b}"},
    ]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--count", type=int, default=400)
    p.add_argument("--digits", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rng = random.Random(args.seed)
    low, high = 10 ** (args.digits - 1), 10**args.digits - 1
    with open(args.out, "w") as f:
        for _ in range(args.count):
            a, b = rng.randint(low, high), rng.randint(low, high)
            f.write(json.dumps({"a": a, "b": b, "demo": demo(a, b)}) + "\n")


if __name__ == "__main__":
    main()
