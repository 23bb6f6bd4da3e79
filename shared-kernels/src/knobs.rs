//! Every `LOCKSTEP_*` environment variable, declared once: its values, default, kind and
//! effect. The only reader of them is [`var`] (a test scans the sources for any other), and
//! the environment table of docs/config.md is [`markdown_table`] (a test fails when they drift).
//! Kernel choices pick between kernels that are each batch invariant; a process's sampler and
//! trainer share the choice, so the contract holds under any setting.

use crate::kernel_choice::{AttentionKernel, MatmulKernel, NormPlanes, TcKernels};

/// What a variable is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnobKind {
    /// Which kernel runs (each batch invariant; some give other bits).
    KernelChoice,
    /// A launch shape or schedule for benchmark sweeps: never changes a bit.
    Tuning,
    /// Diagnostics: profiles, extra synchronisation.
    Diagnostic,
    /// Where compiled artefacts are kept between processes: never changes a bit.
    Cache,
    /// Fault injection and seeds for the test suites.
    Test,
    /// A secret kept out of config files (which runs copy into their folders).
    Credential,
}

impl KnobKind {
    pub fn name(self) -> &'static str {
        match self {
            KnobKind::KernelChoice => "kernel choice",
            KnobKind::Tuning => "benchmark tuning",
            KnobKind::Diagnostic => "diagnostic",
            KnobKind::Cache => "compilation cache",
            KnobKind::Test => "tests",
            KnobKind::Credential => "credential",
        }
    }
}

/// What a variable accepts: a kernel choice's values (spelled once, with the choice:
/// `kernel_choice/values.rs`), optionally after `auto`, or a description.
#[derive(Clone, Copy, Debug)]
pub enum Values {
    Choices(&'static [&'static str]),
    AutoOr(&'static [&'static str]),
    Text(&'static str),
}

impl Values {
    /// As docs/config.md's table shows it.
    pub fn render(&self) -> String {
        let listed = |v: &[&str]| v.iter().map(|x| format!("`{x}`")).collect::<Vec<_>>().join(", ");
        match self {
            Values::Choices(v) => listed(v),
            Values::AutoOr(v) => listed(&[&["auto"][..], v].concat()),
            Values::Text(t) => t.to_string(),
        }
    }
}

/// One environment variable.
#[derive(Clone, Copy, Debug)]
pub struct Knob {
    pub name: &'static str,
    pub values: Values,
    pub default: &'static str,
    pub kind: KnobKind,
    pub effect: &'static str,
}

/// Every `LOCKSTEP_*` variable lockstep reads, in the order docs/config.md lists them.
pub const KNOBS: &[Knob] = &[
    Knob {
        name: "LOCKSTEP_MATMUL",
        values: Values::Choices(MatmulKernel::VALUES),
        default: "`wgmma` on CUDA compute capability 9.x (H100/H200), else `tc` where the device has bf16/f16 tensor cores, else `scalar`",
        kind: KnobKind::KernelChoice,
        effect: "bf16/f16 matmul kernel; `wgmma` runs `tc`'s decode kernel at decode sizes and the warpgroup tiles (`wgmma` + the Tensor Memory Accelerator) everywhere else that every row stride is a whole 16 bytes, `tc`'s tiles otherwise; `tc` runs the decode kernel at decode sizes, 128×128 tiles fed by asynchronous copies (`cp.async`) for outputs of at least 2^20 elements and 128×64 register-prefetch tiles between; `tc-tiles` the register-prefetch tiles at every M, `tc-async` the asynchronous tiles at every M; `wgmma`, `tc`, `tc-tiles`, `tc-async`, `pipelined` and `hybrid` give the same bits (battery: `wgmma = tc-tiles`, `f32 accumulators: wgmma = cmma chain`, `tc = pipelined`, `tc = tc-tiles`, `tc-async = tc-tiles`); `scalar` has other bits; `wgmma` asked for on a device without it runs `tc`",
    },
    Knob {
        name: "LOCKSTEP_TC_TILES",
        values: Values::Text("`warps_m/warps_n/frags_m/frags_n[/k_steps[/stages]]`, e.g. `4/4/2/2` or `2/2/4/4/4/2`"),
        default: "register-prefetch tiles `4/2/2/2/2` (128×64 tile, 8 planes, k stage 32); asynchronous tiles `2/2/4/4/4/2` (128×128, 4 planes of 64×64, k stage 64, 2 shared-memory slots)",
        kind: KnobKind::Tuning,
        effect: "the tc tiles' cube shape, k stage depth (16 × k_steps) and the asynchronous kernel's slots (benchmark sweeps, `gpu_visit.sh tc-sweep`, `TC_SWEEP_KERNEL=tc-async`); one value sets both kernels; same bits for every shape; a shape over 16 planes, 16 fragments per plane, 48 KiB of shared memory for one stage or 96 KiB for all slots is an error naming the variable",
    },
    Knob {
        name: "LOCKSTEP_WGMMA_TILES",
        values: Values::Text("`wg_m/bn/stages`, e.g. `2/256/4`"),
        default: "by the output's size under `LOCKSTEP_WGMMA_PICK`",
        kind: KnobKind::Tuning,
        effect: "the warpgroup tiles' shape for every launch (benchmark sweeps); wg_m 1, 2 or 4, bn 64, 128 or 256 (the copy engine's boxes are powers of two: a 192-row box hung the kernel on the H200), stages 2-8, at most 224 KiB of shared memory, else an error naming the variable; same bits for every shape",
    },
    Knob {
        name: "LOCKSTEP_WGMMA_PICK",
        values: Values::Text("`waves`, `waves-compute-rates`, `coverage`"),
        default: "`waves`",
        kind: KnobKind::Tuning,
        effect: "how the warpgroup tiles are picked by output size (same-run comparisons): `waves` weighs `2/256/4`, `1/256/5`, `2/128/7`, `1/128/8`, `2/64/8` and `1/64/6` by the tiles the busiest SM runs (ceil(tiles / SMs)) over each tile's measured throughput and takes the fastest, preferring `2/128/7` over `1/256/5` where two 128-row tiles cover the output (129-256 rows); `waves-compute-rates` is the same rule without that preference; `coverage` takes the largest of `2/256/4`, `2/128/3`, `2/64/8` whose cubes fill 7/8 of the SMs, else `1/64/4`; a weight-gradient fold takes only tiles that divide its output; same bits (battery: each tile shape `= tc-tiles`); anything else is an error naming the variable; timings in docs/perf.md",
    },
    Knob {
        name: "LOCKSTEP_WGMMA_SCHEDULE",
        values: Values::Text("`persistent`, `synced`"),
        default: "`persistent`",
        kind: KnobKind::Tuning,
        effect: "how the warpgroup kernel walks its tiles (benchmark comparisons): `persistent` launches as many cubes as the SMs hold at once, each walking several tiles, with a producer warp that stages k-tiles as soon as the consumers release a slot (full/empty mbarriers, no cube-wide sync); `synced` is one cube per tile with a cube-wide sync per k-tile; same bits (battery: each tile shape and schedule `= tc-tiles`); anything else is an error naming the variable",
    },
    Knob {
        name: "LOCKSTEP_ATTENTION_TC",
        values: Values::Choices(TcKernels::VALUES),
        default: "`mma`",
        kind: KnobKind::KernelChoice,
        effect: "which kernels run the tensor-core attention (`split_kv_tc`) on CUDA: `mma` = `mma.sync` fragments in registers (prefill tiles: 64 queries per cube, `ops/attention/prefill/mma_flash.rs`; decode rows: one warp per 16 queries, `ops/attention/decode/mma_decode.rs`), `cmma` = the kernels through shared memory (`ops/attention/prefill/cmma_flash.rs`, `ops/attention/decode/cmma.rs`); same bits (battery: each set's prefill tiles and rows alone = the other's rows alone), so it changes time only; off CUDA the `cmma` set runs whatever the value; anything else is an error naming the variable",
    },
    Knob {
        name: "LOCKSTEP_FLASH_WARPS",
        values: Values::Text("`4`, `8`"),
        default: "`4`",
        kind: KnobKind::Tuning,
        effect: "warps per prefill cube of the `mma` attention kernels (16 queries each: 64 or 128 queries share a staged split); a launch shape only, same bits (the battery with 8); anything else is an error naming the variable; timings in docs/perf.md",
    },
    Knob {
        name: "LOCKSTEP_DECODE_LAUNCH",
        values: Values::Text("`auto`, `SxK` (S = 1-64 splits per cube, K = 1 or 2 stages or `n`, e.g. `8x1`)"),
        default: "`auto`",
        kind: KnobKind::Tuning,
        effect: "launch of the `mma` decode attention's partial kernel: consecutive 64-key splits per cube and whether K and V share one shared-memory stage (1) or have one each, refilled as soon as read (2), or the one-stage kernel with the queries on the `mma`'s narrow side (`n`, at most 8 query heads a KV head, an error past that); `auto` takes `n` where the heads fit (else one stage) and 1-8 splits a cube by the launch's size; a launch shape only, same bits (each split's partial is the same arithmetic wherever it runs); anything else is an error naming the variable",
    },
    Knob {
        name: "LOCKSTEP_COLLECTIVE_TIMEOUT_S",
        values: Values::Text("seconds > 0"),
        default: "`600`",
        kind: KnobKind::Diagnostic,
        effect: "data parallel: how long a collective (and the rendezvous at start) waits for the other ranks before failing with an error naming it, so a rank that died or hung stops the run in bounded time (docs/distributed.md); never changes a bit; anything else is an error naming the variable",
    },
    Knob {
        name: "LOCKSTEP_ATTENTION_BACKWARD",
        values: Values::Text("`tensor_cores`, `per_sequence`"),
        default: "`tensor_cores`",
        kind: KnobKind::KernelChoice,
        effect: "the training path's attention backward on CUDA in bf16/f16 with head_dim 64 or 128: `tensor_cores` = flash-attention-2-style tiles on `mma.sync` fragments, every sequence in one launch set, memory linear in the tokens (`ops/attention/backward/mma_backward.rs`); `per_sequence` = the earlier paths (dense burn ops per sequence up to 2^29 scores, CUDA-core kernels past it), for comparisons. Different bits from each other; each sequence's gradients depend on that sequence alone under both; anything else is an error naming the variable. Elsewhere (f32, other runtimes) the per-sequence paths run",
    },
    Knob {
        name: "LOCKSTEP_BACKWARD_STATS",
        values: Values::Text("`forward`, `recompute`"),
        default: "`forward`",
        kind: KnobKind::KernelChoice,
        effect: "where the tensor-core attention backward gets each query's softmax statistics (running max and sum over its keys): `forward` = the training forward's flash kernel folds them in its first pass over the keys, with the backward's own functions on the same score fragments (`ops/attention/common/online_stats.rs`), and the backward's query kernel skips that pass; `recompute` = the query kernel's own pass. The same bits either way (the battery's `backward statistics from the forward = recomputed` rows); anything else is an error naming the variable; timings in docs/scale.md",
    },
    Knob {
        name: "LOCKSTEP_BACKWARD_MATH",
        values: Values::Text("`fast`, `exact`"),
        default: "`fast`",
        kind: KnobKind::KernelChoice,
        effect: "the tensor-core attention backward's probabilities p = e^(s - m) / l: `fast` = `2^(x log2 e)` on the multi-function unit (`ex2.approx`, ~2 ulp) times the row's reciprocal of l, `exact` = the accurate `exp` and an IEEE division per score. The two give other gradient bits (so other weights after a step; never another logprob bit, the forward is untouched), the same invariances (each score's arithmetic is its own) and the same worst error against the f32 reference (the battery). A run records the value (`environment.resolved.json`) and a resume under the other is refused; the rungs' weights after step 0 under each are in docs/scale.md; anything else is an error naming the variable",
    },
    Knob {
        name: "LOCKSTEP_FOLD_KERNEL",
        values: Values::Text("`wgmma`, `cmma`"),
        default: "`wgmma`",
        kind: KnobKind::KernelChoice,
        effect: "the folded weight gradients' tensor-core kernel on CUDA in bf16/f16: `wgmma` = the persistent warpgroup matmul with its accumulators loaded from the f32 accumulator, where its tiles divide the gradient (else `cmma`); `cmma` = one plane per 16 x 16 accumulator block chaining 16-token steps (slower); same bits either way; anything else is an error naming the variable",
    },
    Knob {
        name: "LOCKSTEP_HOST_PROFILE",
        values: Values::Text("a file path"),
        default: "unset",
        kind: KnobKind::Diagnostic,
        effect: "`lockstep bench` built with `--features trainer/host-profile` (and symbols: `CARGO_PROFILE_GPU_STRIP=false`) samples every host thread at ~5 kHz and writes, per thread, the functions most often on the stack and on its top; ignored by binaries without the feature",
    },
    Knob {
        name: "LOCKSTEP_SKINNY",
        values: Values::Text("`group/wide/narrow/staged` or `.../direct`, e.g. `8/4/1/staged`"),
        default: "`8/4/1/staged`",
        kind: KnobKind::Tuning,
        effect: "the decode matmul's launch shape (benchmark sweeps, `gpu_visit.sh skinny-sweep`): k-steps requested before the first multiply (1-32), planes per cube for N ≥ 8192 and below (1-8), wide weights through coalesced slabs or direct fragment loads; the k order, and so the bits, is the same for all; a shape that needs more than 48 KiB of shared memory is an error naming it",
    },
    Knob {
        name: "LOCKSTEP_PIPELINED_LARGE",
        values: Values::Text("`algo/kind/TMxTNxTK/PMxPNxPK/SMxSNx1`, e.g. `tma/cmma/16x16x16/2x8x2/4x1x1`"),
        default: "see `ops/matmul/pipelined.rs`",
        kind: KnobKind::Tuning,
        effect: "the pipelined kernel's configurations for M > 32 / M <= 32 (benchmark sweeps); pairs that would change the arithmetic between them are refused",
    },
    Knob {
        name: "LOCKSTEP_PIPELINED_SMALL",
        values: Values::Text("`algo/kind/TMxTNxTK/PMxPNxPK/SMxSNx1`, e.g. `tma/cmma/16x16x16/2x8x2/4x1x1`"),
        default: "see `ops/matmul/pipelined.rs`",
        kind: KnobKind::Tuning,
        effect: "the pipelined kernel's configurations for M > 32 / M <= 32 (benchmark sweeps); pairs that would change the arithmetic between them are refused",
    },
    Knob {
        name: "LOCKSTEP_ATTENTION",
        values: Values::AutoOr(AttentionKernel::VALUES),
        default: "`auto`",
        kind: KnobKind::KernelChoice,
        effect: "attention kernel. `auto`: `split_kv_tc` where CUDA tensor cores run the dtype (bf16/f16) and head_dim is 32, 64, 96 or 128, else `split_kv` (a function of device, dtype and head size, so sampler and trainer always agree). `split_kv_tc` = 64-key splits with QK^T and PV on tensor cores (decode: one cube per row, KV head and split, then a fixed-order combine; prefill tiles of 2+ rows of a sequence: one cube walks all splits, same bits); asking for it where it cannot run is an error naming the variable. `split_kv` = the same splits on CUDA cores (on caches of at most 64 positions it runs the sequential kernel, which gives the same bits there); `sequential` = one cube per (row, head) walking the splits. The kernels give different bits from each other: a process uses one for sampler and trainer alike",
    },
    Knob {
        name: "LOCKSTEP_DECODE_FUSION",
        values: Values::Text("`on`, `off`"),
        default: "`on`",
        kind: KnobKind::KernelChoice,
        effect: "the sampler's forward on fused launches (q/k/v and gate/up projections as one matmul each, norm + RoPE + cache write as one kernel, residual add + rmsnorm as one): 9 launches per layer instead of 19, the same bits (model contract)",
    },
    Knob {
        name: "LOCKSTEP_DECODE_GRAPHS",
        values: Values::Text("`on`, `off`"),
        default: "`on`",
        kind: KnobKind::KernelChoice,
        effect: "the sampler replays a step whose rows are all sampled (decode steps) as a captured graph of its launches, one per row count (up to 4 kept), instead of enqueueing every launch; the same bits (engine check `replayed graphs = launched steps`). Matched kernels only (the ablation's sets launch). Timings in docs/sampler.md",
    },
    Knob {
        name: "LOCKSTEP_DECODE_GRAPH_PADDING",
        values: Values::Text("`on`, `off`"),
        default: "`on`",
        kind: KnobKind::Tuning,
        effect: "replayed decode steps padded to 1, 2, 4, then multiples of 8 rows (never past `sampler.max_batch`) by stand-in rows repeating real rows in turn, so a batch shrinking through a tail of answers ending one by one stays on one graph for up to 8 steps; the same bits (batch invariance; engine checks). Timings in docs/sampler.md",
    },
    Knob {
        name: "LOCKSTEP_NORM_PLANES",
        values: Values::Choices(NormPlanes::VALUES),
        default: "`on`",
        kind: KnobKind::KernelChoice,
        effect: "rmsnorm and its backward over rows of 128 values (Qwen3's per-head q/k norms, sampler and trainer alike) with one plane a row (`ops/rmsnorm_planes.rs`: the cube kernels' tree on the plane's lanes) instead of one 128-unit cube a row; the same bits (CI on lavapipe's planes: `rmsnorm on planes = one cube a row`, the backward = its op chain; on CUDA the battery's rows in every batch size and across element 2^31). `on` uses them where plane operations are advertised (CUDA; lavapipe keeps the cube kernels), `force` also where planes of one size shuffle without that (CI's lavapipe: the end-to-end test that training on them changes no bit), `off` never; timings in docs/kernels.md",
    },
    Knob {
        name: "LOCKSTEP_KERNEL_CACHE",
        values: Values::Text("a directory, or `off`"),
        default: "`$XDG_CACHE_HOME/lockstep/kernels`, else `~/.cache/lockstep/kernels`",
        kind: KnobKind::Cache,
        effect: "where CUDA builds keep the kernels NVRTC compiled (cubecl's compilation cache), so a later process skips compiling them; an entry is keyed by the kernel's identity and compile-time settings, the binary's build id, the GPU architecture and the backend, so a hit is the PTX this binary would compile and never changes a bit (`experiments/bench/seed_bench.sh` compares a cold and a warm run's logprobs as bits); `off` compiles every kernel afresh; ignored off CUDA",
    },
    Knob {
        name: "LOCKSTEP_NVRTC_PCH",
        values: Values::Text("`on`, `off`"),
        default: "`on`",
        kind: KnobKind::Cache,
        effect: "CUDA builds compile each kernel with its `#include` block moved first and NVRTC's automatic precompiled headers (`-pch`, NVRTC 12.8 and later; cubecl-cuda patch `shared-kernels/patches/cubecl-cuda/src/includes_first.rs`), so a process parses each set of headers once instead of once a kernel (`cuda/barrier` and `cooperative_groups`: most of a TMA matmul kernel's compile). The PTX is the same but for line numbers (`experiments/profile/nvrtc_timing.py` compares every kernel of a run); a compile that fails this way is retried as cubecl wrote it. Only the first process on a machine compiles (`LOCKSTEP_KERNEL_CACHE`); `off` compiles as cubecl writes",
    },
    Knob {
        name: "LOCKSTEP_DEBUG_SYNC",
        values: Values::Text("any value"),
        default: "unset",
        kind: KnobKind::Diagnostic,
        effect: "synchronise the device after every cache write (rules out ordering between launches; slow)",
    },
    Knob {
        name: "LOCKSTEP_FAULT_GRAPH_CAPTURE",
        values: Values::Text("`upload` (fails a wgpu capture; CUDA records it as a copy), `cross-stream` (fails a CUDA capture)"),
        default: "unset",
        kind: KnobKind::Test,
        effect: "fault injection for the sampler's engine tests: inside every graph capture window an upload, or a launch binding another thread's buffer, which fails the capture, to show the engine then launches those steps with the same bits",
    },
    Knob {
        name: "LOCKSTEP_FAULT_PANIC",
        values: Values::Text("an op name, e.g. `rmsnorm`"),
        default: "unset",
        kind: KnobKind::Test,
        effect: "fault injection for `trainer/tests/faults.rs`: a panic when that op is entered, to show it reaches the user as an error naming the launch",
    },
    Knob {
        name: "LOCKSTEP_FAULT_DEVICE_PANIC",
        values: Values::Text("an op name, e.g. `rmsnorm`"),
        default: "unset",
        kind: KnobKind::Test,
        effect: "fault injection for `trainer/tests/faults.rs`: a task that panics is queued on cubecl's device thread when that op is entered, to show the run stops there",
    },
    Knob {
        name: "LOCKSTEP_FAULT_COMPILE",
        values: Values::Text("any value"),
        default: "unset",
        kind: KnobKind::Test,
        effect: "fault injection for `trainer/tests/faults.rs`: `lockstep` logs the warning cubecl logs for a kernel that failed to compile, to show the run stops at once",
    },
    Knob {
        name: "LOCKSTEP_FAULT_SAMPLER_LOGPROB",
        values: Values::Text("a GRPO step number"),
        default: "unset",
        kind: KnobKind::Test,
        effect: "fault injection for `trainer/tests/faults.rs`: at that step the first completion's first sampled logprob has its lowest bit flipped before the trainer sees it, to show a one-bit sampler/trainer difference stops the run (with and without micro-batches)",
    },
    Knob {
        name: "LOCKSTEP_FAKE_DEVICE_MEMORY",
        values: Values::Text("`FREE` or `FREE/TOTAL`, in bytes"),
        default: "unset (the device's own figures)",
        kind: KnobKind::Test,
        effect: "the device memory the memory plan sizes `\"auto\"` keys against and checks a run with, for tests of the sizing and its refusals on a CPU runtime; changes no bit (the sizes it picks do not)",
    },
    Knob {
        name: "LOCKSTEP_FAULT_OOM",
        values: Values::Text("`PHASE:STEP`, PHASE one of `sample`, `score`, `update`; or `engine`"),
        default: "unset",
        kind: KnobKind::Test,
        effect: "fault injection for `trainer/tests/memory_sizing.rs`: that GRPO step's phase fails as cubecl reports a device allocation that did not fit, to show the run names it as out of device memory with the keys to change, saves the state before the step, and resumes bit-identically; `engine`: every step of the sampler's engine fails so (`lockstep sample` names it with the sampler's keys)",
    },
    Knob {
        name: "LOCKSTEP_API_KEY",
        values: Values::Text("any text"),
        default: "unset",
        kind: KnobKind::Credential,
        effect: "the API key `lockstep serve` requires (`Authorization: Bearer <key>`, compared in constant time) when `serve.api_key` is empty, so the key need not be written in a config file or on a command line; `serve.api_key` wins when both are set",
    },
    Knob {
        name: "LOCKSTEP_TEST_SEED",
        values: Values::Text("a u64"),
        default: "a fresh seed, printed",
        kind: KnobKind::Test,
        effect: "the seed of the randomised tests and the battery (rerun a failure with the seed it printed)",
    },
];

/// The value of the registered variable `name` (`None`: unset or not unicode). Reading a name
/// not in [`KNOBS`] is a bug: it panics in debug builds and tests.
pub fn var(name: &str) -> Option<String> {
    debug_assert!(KNOBS.iter().any(|k| k.name == name), "{name} is not declared in shared_kernels::knobs::KNOBS");
    std::env::var(name).ok()
}

/// Whether the registered variable `name` is set (to anything).
pub fn is_set(name: &str) -> bool {
    debug_assert!(KNOBS.iter().any(|k| k.name == name), "{name} is not declared in shared_kernels::knobs::KNOBS");
    std::env::var_os(name).is_some()
}

/// The environment table of docs/config.md.
pub fn markdown_table() -> String {
    let mut s = String::from("| variable | values | default | kind | effect |\n|---|---|---|---|---|\n");
    for k in KNOBS {
        s += &format!("| `{}` | {} | {} | {} | {} |\n", k.name, k.values.render(), k.default, k.kind.name(), k.effect);
    }
    s
}

/// Variables lockstep sets for the programs it starts and never reads itself: an agent
/// environment's session (`trainer/src/agents/environment.rs`, docs/agents.md).
pub const SET_FOR_CHILD_PROGRAMS: [&str; 4] = ["LOCKSTEP_BASE_URL", "LOCKSTEP_SESSION", "LOCKSTEP_MODEL", "LOCKSTEP_RECORD_LINE"];

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
    }

    #[test]
    fn docs_config_holds_the_generated_table() {
        let doc = std::fs::read_to_string(workspace().join("docs/config.md")).expect("docs/config.md");
        let (begin, end) = ("<!-- knobs: generated by shared_kernels::knobs::markdown_table -->\n", "<!-- knobs end -->");
        let start = doc.find(begin).expect("docs/config.md has the knobs begin marker") + begin.len();
        let stop = doc[start..].find(end).expect("docs/config.md has the knobs end marker") + start;
        assert_eq!(&doc[start..stop], markdown_table(), "docs/config.md's environment table differs from shared_kernels::knobs::KNOBS: paste markdown_table()'s output between the markers");
    }

    #[test]
    fn every_variable_is_read_through_the_registry_and_declared() {
        let mut offenders = Vec::new();
        let mut read = std::collections::BTreeSet::new();
        for krate in ["shared-kernels/src", "sampler/src", "trainer/src"] {
            for (path, text) in crate::layout_check::rust_sources(&workspace().join(krate)) {
                if path.ends_with("knobs.rs") {
                    continue;
                }
                for pattern in ["env::var(\"LOCKSTEP_", "env::var_os(\"LOCKSTEP_"] {
                    if text.contains(pattern) {
                        offenders.push(path.display().to_string());
                    }
                }
                // every quoted variable name: reads, errors that name it, tests
                for (i, _) in text.match_indices("\"LOCKSTEP_") {
                    let name: String = text[i + 1..].chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect();
                    if text[i + 1 + name.len()..].starts_with('"') {
                        read.insert(name);
                    }
                }
            }
        }
        assert!(offenders.is_empty(), "LOCKSTEP_* read outside shared_kernels::knobs: {offenders:?}");
        for name in &read {
            assert!(KNOBS.iter().any(|k| k.name == name) || SET_FOR_CHILD_PROGRAMS.contains(&name.as_str()), "{name} is named in the sources but not declared in KNOBS (or in SET_FOR_CHILD_PROGRAMS, if lockstep only sets it for a program it starts)");
        }
        assert!(read.len() >= 10, "the scan found only {read:?}: it would prove nothing");
    }
}
