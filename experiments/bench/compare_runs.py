#!/usr/bin/env python3
"""Do two lockstep runs repeat bit for bit? Compares RUN_A/metrics.jsonl with RUN_B/metrics.jsonl
step by step on every field both log except wall-clock ones (step_s, tokens_per_s, timing.*); fields
only one run logs (a metric renamed between versions) are named in the result. Floats are compared
as written (serde_json writes the shortest text that round-trips, so equal text = equal bits);
the per-step weight fingerprints (hashes in older runs) cover every parameter.

    python3 experiments/bench/compare_runs.py RUN_A RUN_B [--label NAME]

Prints one markdown row and exits 1 when the runs differ or a file is missing."""
import json
import sys
from pathlib import Path

WALL_CLOCK = {"step_s", "tokens_per_s"}


def flatten(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from flatten(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], obj


def load(run):
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        sys.exit(f"{path}: no such file (did the run start?)")
    rows = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                m = json.loads(line, parse_float=str)  # keep the text: equal text = equal bits
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON ({e})")
            rows[m["step"]] = {k: v for k, v in flatten(m) if k not in WALL_CLOCK and not k.startswith("timing.")}
    return rows


def main():
    args = sys.argv[1:]
    label = None
    if "--label" in args:
        i = args.index("--label")
        label = args[i + 1]
        del args[i : i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    a, b = load(args[0]), load(args[1])
    label = label or f"{args[0]} vs {args[1]}"
    steps = sorted(set(a) | set(b))
    first_diff = None
    one_sided = set()  # fields one run logs and the other does not (a renamed metric)
    for s in steps:
        if s not in a or s not in b:
            first_diff = (s, "step missing in " + ("A" if s not in a else "B"), "", "")
            break
        one_sided |= set(a[s]) ^ set(b[s])
        keys = [k for k in a[s] if k in b[s] and a[s][k] != b[s][k]]
        if keys:
            k = keys[0]
            first_diff = (s, f"{k} (+{len(keys) - 1} more)", a[s][k], b[s].get(k))
            break
    if first_diff is None and not one_sided:
        print(f"| {label} | {len(steps)} | identical (all fields but wall clock, weight hashes included) |")
        return 0
    if first_diff is None:
        print(f"| {label} | {len(steps)} | identical in every field both log (but wall clock); logged by one run only, not compared: {', '.join(sorted(one_sided))} |")
        return 0
    s, what, va, vb = first_diff
    print(f"| {label} | {len(steps)} | differ from step {s}: {what}: {va} vs {vb} |")
    return 1


if __name__ == "__main__":
    sys.exit(main())
