#!/usr/bin/env python3
"""One decode step's matmuls by projection, from ncu CSVs of `lockstep bench` (one per tile
setting, `ncu -k regex:matmul --launch-skip 145 --launch-count 145 --metrics gpu__time_duration.sum
--csv`): GPU µs of qkv, o, gate/up and down averaged over the layers, lm_head, and the step's sum.

    python3 experiments/profile/ncu_decode_tiles.py LABEL=FILE.csv ...
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ncu_summary import timed_kernels  # noqa: E402

PROJECTIONS = ["qkv", "o", "gate/up", "down"]


def step_times(path):
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    kernels = list(timed_kernels(lines[start:]))  # (name, grid, seconds) in launch order
    times = [1e6 * seconds for _, _, seconds in kernels]
    if len(times) % 4 != 1:
        raise SystemExit(f"{path}: {len(times)} matmuls is not 4 a layer plus lm_head")
    layers = len(times) // 4
    per = {p: sum(times[4 * l + i] for l in range(layers)) / layers for i, p in enumerate(PROJECTIONS)}
    per["lm_head"] = times[-1]
    per["step"] = sum(times)
    per["grids"] = "/".join(kernels[i][1].strip("()").split(",")[0] for i in range(4))
    return per


def main():
    print("| tiles | " + " | ".join(f"{p} µs" for p in PROJECTIONS) + " | lm_head µs | step ms | grids (qkv/o/gate-up/down) |")
    print("|---" * (len(PROJECTIONS) + 4) + "|")
    for arg in sys.argv[1:]:
        label, path = arg.split("=", 1)
        try:
            t = step_times(path)
        except (OSError, StopIteration, ValueError, SystemExit) as e:
            print(f"| {label} | {e} |")
            continue
        cells = " | ".join(f"{t[p]:.1f}" for p in PROJECTIONS)
        print(f"| {label} | {cells} | {t['lm_head']:.1f} | {t['step'] / 1000:.3f} | {t['grids']} |")


if __name__ == "__main__":
    main()
