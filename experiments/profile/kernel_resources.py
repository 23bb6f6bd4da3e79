#!/usr/bin/env python3
"""Registers, spills and stack of every kernel cubecl compiled in a run, as ptxas reports them.

cubecl's compilation logger at level "full" writes each kernel's CUDA C++ source; this script
compiles each source again the way cubecl does (NVRTC, compute_90), then runs `ptxas -arch=sm_90
-v` on the PTX: the numbers that set how many cubes fit on a multiprocessor, and whether local
arrays stayed in registers. Runs on the H200 machine (CUDA toolkit) or on any machine with the
NVRTC, runtime-header and ptxas wheels unpacked into one folder:

    pip download --no-deps nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12 -d W
    for w in W/*.whl; do python3 -m zipfile -e $w CUDA_DIR; done; chmod +x CUDA_DIR/nvidia/cuda_nvcc/bin/ptxas

    python3 experiments/profile/kernel_resources.py COMPILE_LOG [--match SUBSTRING] [--ptx DIR]
    (env CUDA_DIR: the unpacked wheels; default: the toolkit under /usr/local/cuda)
"""
import ctypes
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile


def toolchain():
    d = os.environ.get("CUDA_DIR")
    if d:
        return (os.path.join(d, "nvidia/cuda_nvrtc/lib/libnvrtc.so.12"), os.path.join(d, "nvidia/cuda_runtime/include"),
                os.path.join(d, "nvidia/cuda_nvcc/bin/ptxas"))
    libs = sorted(glob.glob("/usr/local/cuda/lib64/libnvrtc.so*")) + sorted(glob.glob("/usr/local/cuda/targets/*/lib/libnvrtc.so*"))
    if not libs:
        sys.exit("kernel_resources.py: no libnvrtc under /usr/local/cuda; set CUDA_DIR (see the docstring)")
    return libs[0], "/usr/local/cuda/include", shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"


def kernels(log):
    text = open(log, encoding="utf-8", errors="replace").read()
    for block in text.split("[START_KERNEL_COMPILATION]")[1:]:
        name = re.search(r"name: (\S+)", block)
        src = re.search(r"```cpp\n(.*?)```", block, re.S)
        if name and src:
            yield name.group(1).split("::")[-1].rstrip("<"), src.group(1)


def nvrtc_ptx(nvrtc, include, src):
    prog = ctypes.c_void_p()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"kernel.cu", 0, None, None) != 0:
        return None, "nvrtcCreateProgram failed"
    opts = [b"--gpu-architecture=compute_90", b"--std=c++17", b"-I" + include.encode()]
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        return None, log.value.decode(errors="replace")
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode(), ""


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: kernel_resources.py COMPILE_LOG [--match SUBSTRING] [--ptx DIR]")
    match = sys.argv[sys.argv.index("--match") + 1].lower() if "--match" in sys.argv else ""
    ptx_dir = sys.argv[sys.argv.index("--ptx") + 1] if "--ptx" in sys.argv else None
    lib, include, ptxas = toolchain()
    nvrtc = ctypes.CDLL(lib)
    print("| kernel | registers | stack bytes | spill stores | spill loads | barriers |")
    print("|---|---|---|---|---|---|")
    seen = set()
    with tempfile.TemporaryDirectory() as d:
        for i, (name, src) in enumerate(kernels(sys.argv[1])):
            if match not in name.lower() or src in seen:
                continue
            seen.add(src)
            ptx, err = nvrtc_ptx(nvrtc, include, src)
            if ptx is None:
                print(f"| {name} | NVRTC failed: {err.strip().splitlines()[0][:90] if err.strip() else '?'} | | | | |")
                continue
            path = os.path.join(d, f"k{i}.ptx")
            open(path, "w").write(ptx)
            if ptx_dir:
                os.makedirs(ptx_dir, exist_ok=True)
                open(os.path.join(ptx_dir, f"{name}-{i}.ptx"), "w").write(ptx)
            out = subprocess.run([ptxas, "-arch=sm_90", "-v", "-o", os.devnull, path], capture_output=True, text=True).stderr
            regs = re.search(r"Used (\d+) registers", out)
            stack = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", out)
            bars = re.search(r"used (\d+) barriers", out)
            g = lambda m, k: m.group(k) if m else "?"
            print(f"| {name} | {g(regs, 1)} | {g(stack, 1)} | {g(stack, 2)} | {g(stack, 3)} | {g(bars, 1)} |", flush=True)


if __name__ == "__main__":
    main()
