#!/usr/bin/env python3
"""Sums cubecl's per-kernel profile tables (profiling logger level "basic": one table per device
sync) over a whole log, and prints the kernels by total GPU time as a markdown table.

    python3 experiments/profile/profile_summary.py /tmp/profile/profile.log [--top 25]
"""
import re
import sys
from collections import defaultdict

UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def seconds(text):
    m = re.fullmatch(r"([0-9.]+)(ns|µs|us|ms|s)", text.strip())
    return float(m.group(1)) * UNITS[m.group(2)] if m else None


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: profile_summary.py LOG [--top N]")
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    total, count = defaultdict(float), defaultdict(int)
    try:
        lines = open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines()
    except OSError as e:
        sys.exit(f"profile_summary.py: {sys.argv[1]}: {e.strerror}")
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("Name", "Total"):
            continue
        d = seconds(cells[1])
        if d is None or not cells[2].isdigit():
            continue
        # kernel names carry their generic arguments; group by the path before them
        name = cells[0].split("<")[0]
        total[name] += d
        count[name] += int(cells[2])
    grand = sum(total.values())
    if grand == 0:
        sys.exit(f"profile_summary.py: no profile tables in {sys.argv[1]}")
    print(f"| kernel | launches | GPU ms | share | µs per launch |\n|---|---|---|---|---|")
    for name, d in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        print(f"| {name} | {count[name]} | {d * 1e3:.2f} | {100 * d / grand:.1f}% | {1e6 * d / count[name]:.1f} |")
    print(f"| all {len(total)} kernels | {sum(count.values())} | {grand * 1e3:.2f} | 100% | |")


if __name__ == "__main__":
    main()
