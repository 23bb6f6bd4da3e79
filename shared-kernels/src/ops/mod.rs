//! One op family per file, or per folder where a family has several kernels (`matmul/`,
//! `attention/`, `logits/`); `ablation/` holds the deliberately mismatched kernels, `probes/` the
//! device ceiling probes benchmarks use. Each file holds its `#[cube]` kernel(s) and the launcher that checks
//! shapes, allocates the output on the same device and launches with a cube shape that depends
//! only on the op's fixed configuration.

// families of several kernels are folders with one front door (`mod.rs`); single-file ops stay flat
pub mod ablation;
pub mod attention;
pub mod bias;
pub mod embedding;
pub mod fingerprint;
pub mod in_place;
pub mod kv_cache;
pub mod logits;
pub mod matmul;
pub mod pointwise;
pub mod probes;
pub mod ptx;
pub mod reduce;
pub mod rmsnorm;
pub mod rmsnorm_backward;
pub mod rmsnorm_math;
pub mod rmsnorm_planes;
pub mod rope;
pub mod swiglu_backward;
pub mod unfused;
pub mod weight_grad;

use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::cubecl::server::LaunchError;

/// Cube size of every row-reduction kernel (rmsnorm, logprob, sampling). Fixed for all shapes:
/// the reduction tree is part of the numerics, so it must never follow the batch size.
pub const ROW_BLOCK: usize = 128;
pub(crate) use crate::device::storage;

/// Cube count for `n` independent work items of `per_cube` items each, folded into 2-D so no
/// grid dimension exceeds the 65535 limit of some runtimes. Kernels recover the linear cube
/// index with [`ops::reduce::cube_linear`].
pub(crate) fn cube_count_for(n: usize, per_cube: usize) -> CubeCount {
    let cubes = n.div_ceil(per_cube).max(1) as u32;
    let x = cubes.min(65535);
    CubeCount::Static(x, cubes.div_ceil(x), 1)
}

/// Elements per vector load for `dtype` where the vector must divide `multiple_of`: 16 bytes
/// on CUDA (8 bf16, 4 f32), at most 4 lanes on wgpu (WGSL's widest vector), else the largest
/// power of two below that which divides. Kernels that use it compute lane by lane, so the
/// width changes how many bytes a load moves, never a result's bits.
pub(crate) fn vector_width(dtype: burn::tensor::DType, multiple_of: usize) -> usize {
    let widest = if crate::device::runtime_name() == "cuda" { (16 / dtype.size()).max(1) } else { 4 };
    let mut vs = widest;
    while vs > 1 && multiple_of % vs != 0 {
        vs /= 2;
    }
    vs
}

/// This process's kernel choice ([`crate::kernel_choice::KernelChoice::process`]), with every
/// benchmark tuning variable, parsed now: `lockstep` calls it before any work, so a typo in any
/// `LOCKSTEP_*` variable stops the run at its start with the variable named, on every device,
/// rather than at the first launch that would read it.
pub fn check_environment() -> Result<&'static crate::kernel_choice::KernelChoice, crate::KernelError> {
    crate::kernel_choice::KernelChoice::process()
}

#[allow(dead_code)]
pub(crate) type LaunchResult = Result<(), LaunchError>;
