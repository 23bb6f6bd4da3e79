#!/usr/bin/env python3
"""Sums an ncu CSV of `gpu__time_duration.sum` per kernel (and per grid, with --grids), as a
markdown table by total GPU time.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv PROGRAM > k.csv
    python3 experiments/profile/ncu_summary.py k.csv [--grids] [--top 30] [--steps N]

--steps N divides the totals by N (per decode step, when the program ran N of them).
--per-step KERNEL prints instead one line per step, a step ending after each launch of KERNEL
(lockstep's engine steps end in `sample_combine`): its kernels, GPU ms, and ms by kind.
"""
import csv
import sys
from collections import defaultdict

UNITS = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0, "ns": 1e-9, "us": 1e-6, "ms": 1e-3}


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit("usage: ncu_summary.py CSV [--grids] [--top N] [--steps N] [--per-step KERNEL]")
    top = int(args[args.index("--top") + 1]) if "--top" in args else 30
    steps = float(args[args.index("--steps") + 1]) if "--steps" in args else 1.0
    grids = "--grids" in args
    try:
        text = open(args[0], encoding="utf-8", errors="replace").read().splitlines()
    except OSError as e:
        sys.exit(f"ncu_summary.py: {args[0]}: {e.strerror}")
    start = next((i for i, l in enumerate(text) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"ncu_summary.py: no ncu CSV header in {args[0]}")
    if "--per-step" in args:
        per_step(text[start:], args[args.index("--per-step") + 1])
        return
    total, count = defaultdict(float), defaultdict(int)
    for name, grid, d in timed_kernels(text[start:]):
        key = (name, grid) if grids else (name, "")
        total[key] += d
        count[key] += 1
    grand = sum(total.values())
    if grand == 0:
        sys.exit(f"ncu_summary.py: no gpu__time_duration rows in {args[0]}")
    print(f"| kernel | grid | launches | GPU ms{' per step' if steps != 1 else ''} | share | µs per launch |\n|---|---|---|---|---|---|")
    for (name, grid), d in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        print(f"| {name} | {grid} | {count[(name, grid)]} | {d * 1e3 / steps:.3f} | {100 * d / grand:.1f}% | {1e6 * d / count[(name, grid)]:.1f} |")
    print(f"| all | | {sum(count.values())} | {grand * 1e3 / steps:.3f} | 100% | |")


def timed_kernels(lines):
    """(kernel name without its template arguments, grid, seconds) of each timed launch, in order."""
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            d = float(row["Metric Value"].replace(",", "")) * UNITS.get(row.get("Metric Unit", "ns"), 1e-9)
        except ValueError:
            continue
        yield row["Kernel Name"].split("<")[0].split("(")[0], row.get("Grid Size", ""), d


def kind(name):
    """lockstep's kernels by what they do (the names cubecl gives them)."""
    if name.startswith("matmul"):
        return "matmul"
    if name.startswith("mma_") or name.startswith("split_combine"):
        return "attention"
    if "rmsnorm" in name:
        return "norm"
    return name.split("_kernel")[0]


def per_step(lines, end):
    steps = [[]]
    for name, _, d in timed_kernels(lines):
        steps[-1].append((name, d))
        if name.startswith(end):
            steps.append([])
    print("| step | kernels | GPU ms | ms by kind |\n|---|---|---|---|")
    for i, step in enumerate(s for s in steps if s):
        kinds = defaultdict(float)
        for name, d in step:
            kinds[kind(name)] += d
        parts = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
        print(f"| {i} | {len(step)} | {sum(d for _, d in step) * 1e3:.3f} | {parts} |")


if __name__ == "__main__":
    main()
