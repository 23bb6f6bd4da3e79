//! What `lockstep bench` is asked to time ([`BenchOptions`], from the CLI's flags) and the timing
//! helpers every table shares: a device sync and the median of repeats.

use burn::tensor::{DType, Device};

pub struct BenchOptions {
    pub preset: String,
    pub concurrency: Vec<usize>,
    pub prompt_len: usize,
    pub new_tokens: usize,
    /// Request lengths spread over [new_tokens / 2, new_tokens] (a shrinking tail).
    pub ragged_lengths: bool,
    pub repeats: usize,
    pub dtype: DType,
    /// Sampler kernel sets to time: "matched", "sync", "graphs", "graphs-padded", "unfused", "fast",
    /// "split_k", each optionally suffixed "+topp" or "+processed" (top-p 0.95 / top-k 20 sampling).
    pub kernels: Vec<String>,
    /// Skip the per-kernel table.
    pub skip_ops: bool,
    /// Kernel table without burn's column (its autotuner spends minutes on new shapes on CUDA).
    pub no_burn: bool,
    /// Kernel table: only the default matmul kernel's rows.
    pub matmul_only: bool,
    /// Kernel table: every warpgroup matmul tile at the preset's projection shapes.
    pub tile_sweep: bool,
    /// Skip the kernel table: only the trainer step.
    pub trainer_only: bool,
    pub attention_only: bool,
    /// Kernel table: only the memory-bound rows.
    pub memory_only: bool,
    /// Kernel table: each op called once (for kernel profilers such as ncu).
    pub single_call: bool,
    /// Trainer step at these batch sizes (empty: 8 and 32 sequences).
    pub trainer_batches: Vec<usize>,
    /// Tokens per trainer-step sequence (0: 128).
    pub trainer_len: usize,
    /// Trainer step with and without per-layer recomputation, side by side.
    pub trainer_recompute: bool,
    /// Matmul rows at these M only (empty: the default sizes).
    pub matmul_m: Vec<usize>,
    /// Also write the kernel timings as JSON (read by experiments/bench/torch_bench.py).
    pub json: Option<std::path::PathBuf>,
    /// Also save the bench model in HF layout (for transformers' generate on the same weights).
    pub save_model: Option<std::path::PathBuf>,
    /// With `save_model`: time loading that checkpoint (or the one already in that folder) by
    /// each path, then stop.
    pub load_bench: bool,
}

/// Waits for the device's queued work (every timing ends with it).
pub(crate) fn sync(device: &Device) {
    let _ = device.sync();
}

/// The median of `xs` (each table's number of repeats).
pub(crate) fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}
