"""Where a cold process's kernel compilation goes (issue 25: whole process <= 20 s from an empty
kernel cache). Reads the CUDA C++ sources cubecl logged in one `lockstep sample` run (cubecl.toml
`[compilation.logger] level = "full"`), recompiles each with NVRTC exactly as cubecl-cuda does
(same options), then with candidate options and in parallel, and loads each PTX with the driver
(its JIT to machine code), and prints one table: seconds serial and in parallel, and whether each
option set's PTX equals the baseline's byte for byte (an option that changes a byte is out: the
bits are the contract).

    python3 experiments/profile/nvrtc_timing.py KERNEL_LOG [THREADS]      # on the GPU machine
    NVRTC_TIMING_CPU=1 CUDA_PATH=... python3 experiments/profile/nvrtc_timing.py KERNEL_LOG   # no GPU:
        # NVRTC alone (pip's nvidia-cuda-nvrtc/-runtime/-cccl/-crt of the GPU machine's version,
        # their include/ as CUDA_PATH/include, LD_LIBRARY_PATH at their lib/), no driver JIT

The row "includes first + -pch" is lockstep's cubecl-cuda patch (shared-kernels/patches/
cubecl-cuda/src/includes_first.rs, ported below): its PTX must equal the baseline's once the
line-number directives (.loc, .file) and comments are set aside.
"""
import ctypes
import hashlib
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

os.environ["CUDA_CACHE_DISABLE"] = "1"  # time the driver's JIT, not its disk cache

def sources(log_path):
    text = open(log_path, encoding="utf-8", errors="replace").read()
    out = []
    for block in text.split("[START_KERNEL_COMPILATION]")[1:]:
        body = block.split("source:\n```", 1)[1]
        body = body.split("\n", 1)[1]
        out.append(body.rsplit("\n```\n[END_KERNEL_COMPILATION]", 1)[0])
    return out

cuda = os.environ.get("CUDA_PATH", "/usr/local/cuda")
def load_lib(names):
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    sys.exit(f"none of {names} loads")
nvrtc = load_lib([f"{cuda}/lib64/libnvrtc.so", "libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"])
libcuda = None if os.environ.get("NVRTC_TIMING_CPU") == "1" else load_lib(["libcuda.so.1", "libcuda.so"])

cpu_only = os.environ.get("NVRTC_TIMING_CPU") == "1"
cap = "9.0" if cpu_only else subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True).stdout.split()[0]
sm = cap.replace(".", "")
arch = f"--gpu-architecture=sm_{sm}a" if int(sm) >= 90 else f"--gpu-architecture=sm_{sm}"
base_opts = [arch, f"--include-path={cuda}/include", "-lineinfo"]
if os.path.isdir(f"{cuda}/include/cccl"):
    base_opts.append(f"--include-path={cuda}/include/cccl")

def includes_first(source):
    """The cubecl-cuda patch's transform (includes_first.rs): the one block of #include lines
    moved to the top, or None where that is not a plain move."""
    lines = source.split("\n")
    inc = lambda l: l.lstrip().startswith("#include")
    start = next((i for i, l in enumerate(lines) if inc(l)), None)
    if start is None or start == 0 or any(l.lstrip().startswith("#") for l in lines[:start]):
        return None
    end = start
    while end < len(lines) and inc(lines[end]):
        end += 1
    if any(inc(l) for l in lines[end:]):
        return None
    return "\n".join(lines[start:end] + lines[:start] + lines[end:])

def without_line_info(ptx):
    return b"\n".join(l for l in ptx.rstrip(b"\0").split(b"\n") if not l.lstrip().startswith((b".loc", b".file", b"//")))

def compile_one(src, opts):
    prog = ctypes.c_void_p()
    rc = nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), None, 0, None, None)
    assert rc == 0, f"create {rc}"
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    start = time.perf_counter()
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    spent = time.perf_counter() - start
    if rc != 0:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
        return spent, None, log.value.decode(errors="replace")[:400]
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return spent, ptx.raw, None

def run(srcs, opts, threads):
    start = time.perf_counter()
    if threads == 1:
        results = [compile_one(s, opts) for s in srcs]
    else:
        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(lambda s: compile_one(s, opts), srcs))
    return time.perf_counter() - start, results

def main():
    srcs = sources(sys.argv[1])
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count()
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    print(f"{len(srcs)} kernels logged; NVRTC {major.value}.{minor.value}; options {' '.join(base_opts)}; {threads} threads\n")
    print("| options | threads | wall s | sum of compiles s | slowest s | PTX = baseline | failed |")
    print("|---|---|---|---|---|---|---|")
    wall, base = run(srcs, base_opts, 1)
    baseline = [r[1] for r in base]
    def row(label, opts, n, wall, results):
        same = sum(r[1] is not None and r[1] == b for r, b in zip(results, baseline))
        failed = [r[2] for r in results if r[1] is None]
        print(f"| {label} | {n} | {wall:.2f} | {sum(r[0] for r in results):.2f} | {max(r[0] for r in results):.2f} | {same}/{len(srcs)} | {len(failed)} |")
        for f in failed[:2]:
            print(f"    failed: {f!r}")
    row("cubecl's (baseline)", base_opts, 1, wall, base)
    for label, extra in [("+ -pch", ["-pch"]), ("+ --minimal", ["--minimal"])]:
        wall, res = run(srcs, base_opts + extra, 1)
        row(label, base_opts + extra, 1, wall, res)
    # the patch: the include block first and -pch where it moves, cubecl's compile elsewhere
    start = time.perf_counter()
    patched = []
    for src in srcs:
        moved = includes_first(src)
        patched.append(compile_one(moved, base_opts + ["-pch"]) if moved is not None else compile_one(src, base_opts))
    wall = time.perf_counter() - start
    moved = sum(includes_first(src) is not None for src in srcs)
    same = sum(p[1] is not None and b is not None and without_line_info(p[1]) == without_line_info(b) for p, b in zip(patched, baseline))
    print(f"| includes first + -pch (lockstep's patch; {moved} sources moved) | 1 | {wall:.2f} | {sum(r[0] for r in patched):.2f} | {max(r[0] for r in patched):.2f} | {same}/{len(srcs)} but for line numbers | {sum(r[1] is None for r in patched)} |")
    wall, res = run(srcs, base_opts, threads)
    row("cubecl's", base_opts, threads, wall, res)
    wall, res = run(srcs, base_opts + ["-pch"], threads)
    row("+ -pch", base_opts + ["-pch"], threads, wall, res)
    # the ten slowest kernels and what they include
    order = sorted(range(len(srcs)), key=lambda i: -base[i][0])
    print("\nslowest under cubecl's options (serial):")
    for i in order[:10]:
        incs = [l.split()[1] for l in srcs[i].splitlines() if l.startswith("#include")]
        print(f"  {base[i][0]:.3f} s  {len(srcs[i])} chars  includes {' '.join(incs)}")
    if libcuda is None:
        return
    # the driver's JIT of each PTX to machine code (what cuModuleLoadData costs with no disk cache)
    assert libcuda.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    libcuda.cuDeviceGet(ctypes.byref(dev), 0)
    assert libcuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    def jit(ptx):
        libcuda.cuCtxSetCurrent(ctx)
        module = ctypes.c_void_p()
        start = time.perf_counter()
        rc = libcuda.cuModuleLoadData(ctypes.byref(module), ptx)
        spent = time.perf_counter() - start
        if rc == 0:
            libcuda.cuModuleUnload(module)
        return spent, rc
    ptxs = [p for p in baseline if p is not None]
    start = time.perf_counter()
    serial = [jit(p) for p in ptxs]
    jit_serial = time.perf_counter() - start
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(jit, ptxs))
    jit_parallel = time.perf_counter() - start
    print(f"\ndriver JIT (cuModuleLoadData, CUDA_CACHE_DISABLE=1) of {len(ptxs)} PTX: serial {jit_serial:.2f} s (failed {sum(rc != 0 for _, rc in serial)}), {threads} threads {jit_parallel:.2f} s")
    print("PTX sha256 of the baseline, sorted:", file=sys.stderr)
    for p in sorted(hashlib.sha256(p.rstrip(b"\0")).hexdigest() for p in ptxs):
        print(p, file=sys.stderr)

main()
