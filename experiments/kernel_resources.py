#!/usr/bin/env python3
"""Registers, spills, stack and shared memory of every kernel cubecl compiled in a run.

cubecl's compilation logger at level "full" writes each kernel's CUDA C++ source; this script
compiles each one again with `nvcc -arch=sm_90 -Xptxas -v` (on the H200 machine, which has nvcc)
and prints what ptxas reports, one row per kernel: the numbers that set how many cubes fit on a
multiprocessor, and whether local arrays stayed in registers.

    python3 experiments/kernel_resources.py /tmp/compile.log [--match logprob]
"""
import os
import re
import subprocess
import sys
import tempfile


def kernels(log):
    text = open(log, encoding="utf-8", errors="replace").read()
    for block in text.split("[START_KERNEL_COMPILATION]")[1:]:
        name = re.search(r"name: (\S+)", block)
        src = re.search(r"```cpp\n(.*?)```", block, re.S)
        if name and src:
            yield name.group(1).split("::")[-1], src.group(1)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: kernel_resources.py COMPILE_LOG [--match SUBSTRING]")
    match = sys.argv[sys.argv.index("--match") + 1].lower() if "--match" in sys.argv else ""
    print("| kernel | registers | stack bytes | spill stores | spill loads | shared bytes (static) |")
    print("|---|---|---|---|---|---|")
    seen = set()
    with tempfile.TemporaryDirectory() as d:
        for i, (name, src) in enumerate(kernels(sys.argv[1])):
            if match not in name.lower() or src in seen:
                continue
            seen.add(src)
            path = os.path.join(d, f"k{i}.cu")
            open(path, "w").write(src)
            r = subprocess.run(["nvcc", "-arch=sm_90", "-Xptxas", "-v", "-cubin", "-o", os.devnull, path], capture_output=True, text=True)
            out = r.stdout + r.stderr
            if r.returncode != 0:
                print(f"| {name} | nvcc failed: {out.strip().splitlines()[-1][:80] if out.strip() else r.returncode} | | | | |")
                continue
            regs = re.search(r"Used (\d+) registers", out)
            stack = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", out)
            smem = re.search(r"(\d+) bytes smem", out)
            print(f"| {name} | {regs.group(1) if regs else '?'} | {stack.group(1) if stack else '?'} | {stack.group(2) if stack else '?'} | {stack.group(3) if stack else '?'} | {smem.group(1) if smem else 0} |", flush=True)


if __name__ == "__main__":
    main()
