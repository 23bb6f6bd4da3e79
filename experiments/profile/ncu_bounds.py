#!/usr/bin/env python3
"""What bounds each kernel: Nsight Compute's counters for every launch of a command, one table.

    python3 experiments/profile/ncu_bounds.py --regex 'tc_|skinny' --count 40 -- /tmp/lockstep bench ... --single-call

Runs `ncu --clock-control none` (the clocks are left alone, as the machine's notes ask) with the
SpeedOfLight, Occupancy, LaunchStats, WarpStateStats and ComputeWorkloadAnalysis sections on the
launches whose kernel name matches --regex (at most --count of them), and prints per launch: the
duration, SM and memory throughput as % of peak, DRAM throughput, the busiest pipe (tensor or
other), registers, achieved occupancy, and the three largest warp stall reasons (cycles per
issued instruction). A kernel near 100% of one throughput is bound by it; one low on every
throughput is latency-bound, and the stalls say on what (barrier = syncs, long_scoreboard =
global memory, short_scoreboard / mio_throttle = shared memory, math_pipe_throttle = a pipe).

    python3 experiments/profile/ncu_bounds.py --sum [--regex R] [--count N] -- COMMAND ...

--sum collects only each launch's GPU duration (one replay per launch, so whole training steps
fit) and prints the GPU time per kernel, summed over the run, largest first, with the total: set
beside the command's own wall time, it says how much of a step the GPU is busy.
"""
import csv
import io
import re
import subprocess
import sys

PIPE_NAME = r"^sm__(inst_executed_)?pipe_|_cycles_active.*|\.avg.*"
STALL_NAME = r".*issue_stalled_|_per_.*|\.ratio"
SECTIONS = ["SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "ComputeWorkloadAnalysis"]


def num(text):
    try:
        return float(text.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def short(name):
    name = re.sub(r"\(.*", "", name)
    return name if len(name) <= 60 else name[:57] + "..."


def main():
    args = sys.argv[1:]
    if "--" not in args:
        sys.exit("usage: ncu_bounds.py --regex R [--count N] -- COMMAND ...")
    cmd = args[args.index("--") + 1:]
    opts = args[: args.index("--")]
    regex = opts[opts.index("--regex") + 1] if "--regex" in opts else "."
    count = opts[opts.index("--count") + 1] if "--count" in opts else "50"
    summing = "--sum" in opts
    ncu = ["ncu", "--clock-control", "none", "--csv", "--page", "raw", "--kernel-name", f"regex:{regex}", "--launch-count", count]
    if summing:
        ncu += ["--metrics", "gpu__time_duration.sum"]
    else:
        for s in SECTIONS:
            ncu += ["--section", s]
    r = subprocess.run(ncu + cmd, capture_output=True, text=True)
    if summing:
        # the command's own output (its wall times) first
        print("\n".join(l for l in r.stdout.splitlines() if l.startswith("|") or l.startswith("bench")))
    lines = r.stdout.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print(f"ncu_bounds.py: no profile rows (ncu exit {r.returncode}); its last lines:")
        print("\n".join((r.stdout + r.stderr).strip().splitlines()[-15:]))
        sys.exit(1)
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    head, body = rows[0], rows[2:]  # rows[1] holds the units
    col = {h: i for i, h in enumerate(head)}

    def get(row, *names):
        for n in names:
            if n in col and num(row[col[n]]) is not None:
                return num(row[col[n]])
        return None

    if summing:
        return print_sums(head, rows[1], body, col)
    stall_cols = [h for h in head if "issue_stalled_" in h and h.endswith(".ratio") and "not_issued" not in h]
    # per-pipe utilisation averaged over the SMs (the .max / .sum variants are not % of one pipe)
    pipe_cols = [h for h in head if (h.startswith("sm__inst_executed_pipe_") or h.startswith("sm__pipe_")) and h.endswith(".avg.pct_of_peak_sustained_active")]
    print("| kernel | grid x block | regs | µs | SM % | memory % | DRAM % | busiest pipe % | occupancy % | top stalls (cycles per issue) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in body:
        name = short(row[col.get("Kernel Name", 0)])
        grid = row[col["Grid Size"]] if "Grid Size" in col else row[col.get("launch__grid_size", 0)]
        block = row[col["Block Size"]] if "Block Size" in col else row[col.get("launch__block_size", 0)]
        us = get(row, "gpu__time_duration.sum")
        unit = rows[1][col["gpu__time_duration.sum"]] if "gpu__time_duration.sum" in col else ""
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit.strip())
        if us is not None:
            us = us * scale if scale is not None else us * 1e-3  # ncu's default unit is ns
        sm = get(row, "sm__throughput.avg.pct_of_peak_sustained_elapsed")
        mem = get(row, "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed")
        dram = get(row, "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "dram__throughput.avg.pct_of_peak_sustained_elapsed")
        regs = get(row, "launch__registers_per_thread")
        occ = get(row, "sm__warps_active.avg.pct_of_peak_sustained_active")
        pipes = sorted(((num(row[col[h]]) or 0.0, h) for h in pipe_cols if "pct" in h), reverse=True)
        pipe = "-"
        if pipes:
            pipe_name = re.sub(PIPE_NAME, "", pipes[0][1])
            pipe = f"{pipes[0][0]:.0f} ({pipe_name})"
        stalls = sorted(((num(row[col[h]]) or 0.0, h) for h in stall_cols), reverse=True)[:3]
        stall_txt = ", ".join(f"{re.sub(STALL_NAME, '', h)} {v:.1f}" for v, h in stalls)
        f = lambda v, d=0: "-" if v is None else f"{v:.{d}f}"
        print(f"| {name} | {grid} x {block} | {f(regs)} | {f(us, 1)} | {f(sm)} | {f(mem)} | {f(dram)} | {pipe} | {f(occ)} | {stall_txt} |", flush=True)


def print_sums(head, units, body, col):
    i = col["gpu__time_duration.sum"]
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(units[i].strip(), 1e-3)
    total, count = {}, {}
    for row in body:
        name = re.sub(r"_[0-9a-f]{8}$", "", short(row[col.get("Kernel Name", 0)]))
        us = (num(row[i]) or 0.0) * scale
        total[name] = total.get(name, 0.0) + us
        count[name] = count.get(name, 0) + 1
    grand = sum(total.values())
    print(f"\n| kernel | launches | GPU ms | share | µs per launch |\n|---|---|---|---|---|")
    for name, us in sorted(total.items(), key=lambda kv: -kv[1])[:30]:
        print(f"| {name} | {count[name]} | {us / 1e3:.2f} | {100 * us / grand:.1f}% | {us / count[name]:.1f} |")
    print(f"| all {len(total)} kernels | {sum(count.values())} | {grand / 1e3:.2f} | 100% | {grand / max(1, sum(count.values())):.1f} |")


if __name__ == "__main__":
    main()
