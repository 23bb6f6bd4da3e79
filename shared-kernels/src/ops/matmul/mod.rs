//! y[M,N] = x[M,K] @ W, with W as stored in a checkpoint: `[N,K]` (HF `nn.Linear`) or `[K,N]`.
//!
//! Batch invariance: one fixed tile shape for every M, no split-K, and each output element is a
//! single f32 accumulator walking k = 0..K in order. M only decides how many tiles launch.
//!
//! bf16/f16 operands run on tensor cores where the device has them: on the H200 (CUDA compute
//! capability 9.x) the warpgroup `wgmma` kernels ([`crate::ops::matmul::wgmma`]) by default, on other
//! CUDA devices the cmma tiles ([`crate::ops::matmul::tc`]); `LOCKSTEP_MATMUL` picks another variant
//! for comparisons (all compute the same bits),
//! with the same rules: one tile and instruction shape for every M, k in order. Which kernel runs
//! depends only on the dtype, the device and that variable, never on M, so the sampler and the
//! trainer on one device always share it. `LOCKSTEP_MATMUL=scalar` forces the scalar kernel
//! (for benchmarks and bisecting).
//!
//! One file past 400 lines: the front door of the matmul family (the scalar kernel, the choice
//! of variant per device and dtype, the shape guards, the backward's two products), kept in
//! one place so what runs for a given shape is read in one sitting.

pub mod layout;
pub mod pipelined;
pub mod skinny;
pub mod tc;
pub mod tc_async;
pub mod tc_fragments;
pub mod wgmma;
pub mod wgmma_fragments;
pub mod wgmma_persistent;
pub mod wgmma_tiles;

use crate::ops::storage;
use burn_cubecl::tensor::CubeTensor;
use crate::bridge::{dims, float_in, float_out, same_device};
use crate::autodiff::{cube, from_tracked, inner, plain, tracked, tracked_in};
use crate::ops::matmul::tc::Pipeline;
use crate::{ensure, KernelError};
use burn::tensor::Tensor as BTensor;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

pub use layout::WeightLayout;

/// Output tile edge: a cube computes TILE x TILE outputs, one per unit.
pub const TILE: usize = 16;

#[cube(launch)]
fn matmul_kernel<F: Float>(
    x: &Tensor<F>,
    w: &Tensor<F>,
    y: &mut Tensor<F>,
    m_arg: u32,
    n_arg: u32,
    k_arg: u32,
    #[comptime] w_out_in: bool,
    #[define(F)] _dtype: ElemType,
) {
    let m = m_arg as usize;
    let n = n_arg as usize;
    let k = k_arg as usize;
    let row = CUBE_POS_Y as usize * comptime!(TILE) + UNIT_POS_Y as usize;
    let col = CUBE_POS_X as usize * comptime!(TILE) + UNIT_POS_X as usize;
    if row < m && col < n {
        let mut acc = 0.0f32;
        let x_base = row * k;
        if w_out_in {
            let w_base = col * k;
            for i in 0..k {
                acc += f32::cast_from(x[x_base + i]) * f32::cast_from(w[w_base + i]);
            }
        } else {
            for i in 0..k {
                acc += f32::cast_from(x[x_base + i]) * f32::cast_from(w[i * n + col]);
            }
        }
        y[row * n + col] = F::cast_from(acc);
    }
}

/// `x[M,K] @ W` where `layout` says how `w` is stored. Output has x's dtype; accumulation is f32.
pub fn matmul(x: BTensor<2>, w: BTensor<2>, layout: WeightLayout) -> Result<BTensor<2>, KernelError> {
    if !x.is_autodiff() {
        return matmul_plain(x, w, layout);
    }
    let (xa, wa) = (tracked_in("matmul", "x", x)?, tracked_in("matmul", "w", w)?);
    let (xp, wp) = (plain::<2>(inner(&xa)), plain::<2>(inner(&wa)));
    let y = matmul_plain(xp.clone(), wp.clone(), layout)?;
    let w_id = wa.id().value;
    // a frozen weight (LoRA's base) gets no gradient: only the input's is computed
    let w_frozen = !wa.is_tracked();
    Ok(from_tracked(tracked([&xa, &wa], cube(y), move |dy| {
        let dy = plain::<2>(dy);
        if w_frozen {
            return [Some(cube(matmul_input_grad(dy, wp, layout))), None];
        }
        if crate::grad_fold::folds(w_id) {
            let dx = matmul_input_grad(dy.clone(), wp, layout);
            crate::grad_fold::fold_into(w_id, crate::grad_fold::FoldUse::Linear, |acc| fold_weight_grad(acc, dy, xp, layout));
            return [Some(cube(dx)), None];
        }
        let (dx, dw) = matmul_backward(dy, xp, wp, layout);
        [Some(cube(dx)), Some(cube(dw))]
    })))
}

/// `dy @ W` (as `layout` stores W): the input gradient of `y = x @ W` alone, on lockstep's
/// batch-invariant kernels on every runtime (burn's CPU matmul may pick its tiles by M, and a
/// folded weight gradient needs each row's input gradient independent of the micro-batch).
pub(crate) fn matmul_input_grad(dy: BTensor<2>, wp: BTensor<2>, layout: WeightLayout) -> BTensor<2> {
    let dx = match layout {
        WeightLayout::OutIn => matmul_plain(dy, wp, WeightLayout::InOut),
        WeightLayout::InOut => matmul_plain(dy, wp, WeightLayout::OutIn),
    };
    dx.expect("matmul backward: shapes checked in forward")
}

/// The weight gradient of `y = x @ W` folded into `acc` ([`crate::grad_fold`]), in W's layout.
pub(crate) fn fold_weight_grad(acc: Option<CubeTensor>, dy: BTensor<2>, xp: BTensor<2>, layout: WeightLayout) -> CubeTensor {
    let folded = match layout {
        WeightLayout::OutIn => crate::ops::weight_grad::fold_matmul(acc, dy, xp),
        WeightLayout::InOut => crate::ops::weight_grad::fold_matmul(acc, xp, dy),
    };
    folded.expect("matmul backward: shapes checked in forward")
}

/// The input and weight gradients `(dy @ W, dyᵀ @ x)` of `y = x @ W` (as `layout` stores W):
/// on lockstep's kernels on CUDA, burn's matmul elsewhere ([`backward_on_lockstep`]).
pub(crate) fn matmul_backward(dy: BTensor<2>, xp: BTensor<2>, wp: BTensor<2>, layout: WeightLayout) -> (BTensor<2>, BTensor<2>) {
    let (dx, dw) = if backward_on_lockstep() {
        match layout {
            WeightLayout::OutIn => (matmul_plain(dy.clone(), wp, WeightLayout::InOut), matmul_transposed_x(dy, xp, WeightLayout::InOut)),
            WeightLayout::InOut => (matmul_plain(dy.clone(), wp, WeightLayout::OutIn), matmul_transposed_x(xp, dy, WeightLayout::InOut)),
        }
    } else {
        match layout {
            WeightLayout::OutIn => (Ok(dy.clone().matmul(wp)), Ok(dy.transpose().matmul(xp))),
            WeightLayout::InOut => (Ok(dy.clone().matmul(wp.transpose())), Ok(xp.transpose().matmul(dy))),
        }
    };
    (dx.expect("matmul backward: shapes checked in forward"), dw.expect("matmul backward: shapes checked in forward"))
}

/// `xtᵀ @ W` for `xt` stored `[K, M]`: a weight gradient (`dyᵀ @ x`, `xᵀ @ dy`). Where the
/// warpgroup tiles run (an MN-major A) or `tc`/`tc-async` runs the asynchronous tiles (a
/// column-major A stage), xᵀ is read in place instead of after a transposing copy of `xt` (8% of
/// a 32 x 128 Qwen3-0.6B step's GPU time on the H200, docs/perf.md); everywhere else the copy is
/// made. The same values reach the same `mma`s either way, so the bits do not depend on which
/// path ran (battery: `xᵀ in place = transposed copy` under both).
pub(crate) fn matmul_transposed_x(xt: BTensor<2>, w: BTensor<2>, layout: WeightLayout) -> Result<BTensor<2>, KernelError> {
    matmul_transposed_x_with(None, xt, w, layout)
}

/// [`matmul_transposed_x`] under `kernel` (`None`: this process's), for the battery.
pub fn matmul_transposed_x_with(kernel: Option<MatmulKernel>, xt: BTensor<2>, w: BTensor<2>, layout: WeightLayout) -> Result<BTensor<2>, KernelError> {
    const OP: &str = "matmul";
    let xc = float_in(OP, "x", xt.clone())?;
    let wc = float_in(OP, "w", w.clone())?;
    let (m, k, n) = checked_dims_of(OP, &xc, true, &wc, layout)?;
    let kernel = match kernel {
        Some(k) => k,
        None => matmul_kernel_for(&xc.client, xc.dtype)?,
    };
    // where the warpgroup tiles or the asynchronous tiles run (hybrid keeps the copy)
    match route(kernel, layout, m, k, n) {
        Route::Warpgroup if crate::ops::matmul::wgmma::wgmma_fits(layout, true, (m, k, n)) => {
            let dtype = xc.dtype;
            return Ok(float_out(crate::ops::matmul::wgmma::matmul_wgmma(xc, wc, layout, true, (m, k, n), dtype)?));
        }
        Route::Tiles(Pipeline::AsyncCopies) if kernel != MatmulKernel::Hybrid && crate::ops::matmul::tc::transposed_x_fits(layout, (m, k, n)) => {
            return Ok(float_out(crate::ops::matmul::tc::matmul_tensor_core(xc, wc, layout, (m, k, n), Pipeline::AsyncCopies, true)?));
        }
        _ => {}
    }
    matmul_with(Some(kernel), xt.transpose(), w, layout)
}

/// `x @ W` on the warpgroup kernel at every M (no decode kernel), output in `out` (x's dtype,
/// or f32 to compare accumulators as bits), under `schedule` and `tiles` where given (else this
/// process's): the battery's handle.
pub fn matmul_warpgroup(
    x: BTensor<2>,
    w: BTensor<2>,
    layout: WeightLayout,
    out: burn::tensor::DType,
    schedule: Option<crate::ops::matmul::wgmma::WgmmaSchedule>,
    tiles: Option<crate::ops::matmul::wgmma::WgmmaTiles>,
) -> Result<BTensor<2>, KernelError> {
    const OP: &str = "matmul";
    let xc = float_in(OP, "x", x)?;
    let wc = float_in(OP, "w", w)?;
    let dims = checked_dims(OP, &xc, &wc, layout)?;
    Ok(float_out(crate::ops::matmul::wgmma::matmul_wgmma_scheduled(schedule, tiles, xc, wc, layout, false, dims, out, None)?))
}

/// `x @ W[N,K]ᵀ` as one plain chain of cmma steps per 16x16 block, f32 out: the bits the
/// warpgroup kernel's accumulators must equal (M, N, K multiples of 16).
pub fn matmul_cmma_chain_f32(x: BTensor<2>, w: BTensor<2>) -> Result<BTensor<2>, KernelError> {
    const OP: &str = "matmul";
    let xc = float_in(OP, "x", x)?;
    let wc = float_in(OP, "w", w)?;
    let dims = checked_dims(OP, &xc, &wc, WeightLayout::OutIn)?;
    Ok(float_out(crate::ops::matmul::wgmma::matmul_cmma_chain_f32(xc, wc, dims)?))
}

/// Whether `device` runs the warpgroup kernel (CUDA compute capability 9.x).
pub fn wgmma_on(device: &burn::tensor::Device) -> Result<bool, KernelError> {
    Ok(crate::ops::matmul::wgmma::wgmma_available(&client_on(device)?))
}

/// `device`'s cubecl client, found through a one-element f32 tensor (so asking about bf16 on a
/// device without bf16 is safe).
fn client_on(device: &burn::tensor::Device) -> Result<burn_cubecl::cubecl::client::Client, KernelError> {
    Ok(float_in("matmul", "probe", BTensor::<1>::zeros([1], device))?.client)
}

/// The backward's matmuls run on lockstep's kernels on CUDA: burn's autotuner there benchmarks
/// every new token count (the batch's shape changes each step; measured on the H200: 100 SFT
/// steps did not finish in 180 s) and could pick other kernels after a restart. On the CPU runtime burn's tiled
/// matmul is deterministic and faster than the scalar kernel, so it stays.
fn backward_on_lockstep() -> bool {
    crate::device::runtime_name() == "cuda"
}


pub use crate::kernel_choice::MatmulKernel;

/// Outputs with at least this many elements run the asynchronous-copy tiles under `tc` and
/// `hybrid`; smaller ones the register-prefetch tiles. Their 128x128 cubes are too few to fill
/// the H200 below about a million outputs (crossover measured there, docs/perf.md). Scheduling
/// only: both run the same `mma` sequence (battery: `tc-async = tc-tiles`).
pub const ASYNC_MIN_OUTPUTS: usize = 1 << 20;

/// Which kernel `kernel` runs for `x[M,K] @ W[K,N]`: the one place the shape rules of
/// [`matmul_with`] live (the weight-gradient path asks it too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Scalar,
    /// The decode kernel ([`crate::ops::matmul::skinny`]).
    Skinny,
    /// cubek's double-buffered kernel ([`crate::ops::matmul::pipelined`]).
    Pipelined,
    /// lockstep's tiles, fed as the pipeline says ([`crate::ops::matmul::tc`]).
    Tiles(Pipeline),
    /// The warpgroup tiles ([`crate::ops::matmul::wgmma`]).
    Warpgroup,
}

pub(crate) fn route(kernel: MatmulKernel, layout: WeightLayout, m: usize, k: usize, n: usize) -> Route {
    let skinny = crate::ops::matmul::skinny::skinny_applies(m, k, n);
    let by_size = if m * n >= ASYNC_MIN_OUTPUTS { Pipeline::AsyncCopies } else { Pipeline::RegisterPrefetch };
    match kernel {
        MatmulKernel::Scalar => Route::Scalar,
        MatmulKernel::TensorCore | MatmulKernel::Hybrid | MatmulKernel::Warpgroup if skinny => Route::Skinny,
        MatmulKernel::Warpgroup if crate::ops::matmul::wgmma::wgmma_fits(layout, false, (m, k, n)) => Route::Warpgroup,
        MatmulKernel::Pipelined => Route::Pipelined,
        MatmulKernel::Hybrid if m * n >= HYBRID_LARGE_OUTPUT || n >= HYBRID_WIDE_N => Route::Pipelined,
        MatmulKernel::Hybrid | MatmulKernel::TensorCore | MatmulKernel::Warpgroup => Route::Tiles(by_size),
        MatmulKernel::TensorCoreAsync => Route::Tiles(Pipeline::AsyncCopies),
        MatmulKernel::TensorCoreTiles => Route::Tiles(Pipeline::RegisterPrefetch),
    }
}

/// Weights at least this wide run the pipelined kernel at every M under [`MatmulKernel::Hybrid`].
pub const HYBRID_WIDE_N: usize = 16384;
/// Outputs with at least this many elements run the pipelined kernel under [`MatmulKernel::Hybrid`].
pub const HYBRID_LARGE_OUTPUT: usize = 3 << 20;

/// The process's `LOCKSTEP_MATMUL` ([`crate::kernel_choice::KernelChoice`]); `None`: the device's default.
fn requested_kernel() -> Result<Option<MatmulKernel>, KernelError> {
    Ok(crate::kernel_choice::KernelChoice::current()?.matmul)
}

/// The kernel `matmul` runs for `dtype` on this device: the requested tensor-core kernel for
/// bf16/f16 where the device has tensor cores, else the scalar kernel. An unknown
/// `LOCKSTEP_MATMUL` is an error naming it.
pub fn matmul_kernel_for(client: &burn_cubecl::cubecl::client::Client, dtype: burn::tensor::DType) -> Result<MatmulKernel, KernelError> {
    // unset: wgmma where the device has it, else tc
    Ok(match requested_kernel()?.unwrap_or(MatmulKernel::Warpgroup) {
        // wgmma where the device has it, tc's kernels (the same bits) on other tensor-core GPUs
        MatmulKernel::Warpgroup if crate::ops::matmul::tc::tensor_cores_available_for(client, dtype) => {
            if crate::ops::matmul::wgmma::wgmma_available(client) { MatmulKernel::Warpgroup } else { MatmulKernel::TensorCore }
        }
        k @ (MatmulKernel::TensorCore | MatmulKernel::TensorCoreTiles | MatmulKernel::TensorCoreAsync | MatmulKernel::Pipelined | MatmulKernel::Hybrid) if crate::ops::matmul::tc::tensor_cores_available_for(client, dtype) => k,
        _ => MatmulKernel::Scalar,
    })
}

/// [`matmul_kernel_for`] on a burn device.
pub fn matmul_kernel_on(device: &burn::tensor::Device, dtype: burn::tensor::DType) -> Result<MatmulKernel, KernelError> {
    matmul_kernel_for(&client_on(device)?, dtype)
}

/// "f32 scalar, bf16 pipelined": which kernel each dtype runs on `device`, for report headers.
pub fn matmul_kernels_summary(device: &burn::tensor::Device) -> String {
    use burn::tensor::DType;
    [DType::F32, DType::BF16]
        .iter()
        .map(|&d| format!("{d:?} {}", matmul_kernel_on(device, d).map_or("unavailable", |k| k.name())))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `(M, K, N)` of `x @ W` once device, inner dimensions, dtypes and non-emptiness check out;
/// shared by every matmul kernel (the scalar one, tensor cores, the ablation's split-K).
pub(crate) fn checked_dims(op: &'static str, x: &CubeTensor, w: &CubeTensor, layout: WeightLayout) -> Result<(usize, usize, usize), KernelError> {
    checked_dims_of(op, x, false, w, layout)
}

/// [`checked_dims`] where `x` may be given transposed, stored `[K, M]`.
fn checked_dims_of(op: &'static str, x: &CubeTensor, x_transposed: bool, w: &CubeTensor, layout: WeightLayout) -> Result<(usize, usize, usize), KernelError> {
    same_device(op, x, w, "w")?;
    let (xd, wd) = (dims(x), dims(w));
    let (m, k) = if x_transposed { (xd[1], xd[0]) } else { (xd[0], xd[1]) };
    let (wk, n) = match layout {
        WeightLayout::OutIn => (wd[1], wd[0]),
        WeightLayout::InOut => (wd[0], wd[1]),
    };
    ensure!(wk == k, op, "x is {xd:?} but w ({layout:?}) is {wd:?}: inner dimensions {k} and {wk} differ");
    ensure!(x.dtype == w.dtype, op, "x is {:?} but w is {:?}", x.dtype, w.dtype);
    ensure!(m > 0 && n > 0 && k > 0, op, "empty operand: x {xd:?}, w {wd:?}");
    crate::bridge::check_index_range(op, "y", &[m, n], m.saturating_mul(n))?;
    Ok((m, k, n))
}

fn matmul_plain(x: BTensor<2>, w: BTensor<2>, layout: WeightLayout) -> Result<BTensor<2>, KernelError> {
    matmul_with(None, x, w, layout)
}

/// [`matmul`] (untracked) on a named kernel instead of the process's choice, for benchmarks that
/// compare kernels in one run. A tensor-core kernel on a device or dtype without them is an error.
pub fn matmul_with(kernel: Option<MatmulKernel>, x: BTensor<2>, w: BTensor<2>, layout: WeightLayout) -> Result<BTensor<2>, KernelError> {
    const OP: &str = "matmul";
    let x = float_in(OP, "x", x)?;
    let w = float_in(OP, "w", w)?;
    let (m, k, n) = checked_dims(OP, &x, &w, layout)?;
    let kernel = match kernel {
        // the process's choice already checked the device
        None => matmul_kernel_for(&x.client, x.dtype)?,
        Some(k) => {
            let has_them = k == MatmulKernel::Scalar || crate::ops::matmul::tc::tensor_cores_available_for(&x.client, x.dtype);
            ensure!(has_them, OP, "the {} kernel needs tensor cores for {:?} on this device", k.name(), x.dtype);
            ensure!(k != MatmulKernel::Warpgroup || crate::ops::matmul::wgmma::wgmma_available(&x.client), OP, "the wgmma kernel needs a CUDA device of compute capability 9.x");
            k
        }
    };
    match route(kernel, layout, m, k, n) {
        Route::Skinny => return Ok(float_out(crate::ops::matmul::skinny::matmul_skinny(x, w, layout, (m, k, n))?)),
        Route::Pipelined => return Ok(float_out(crate::ops::matmul::pipelined::matmul_pipelined(x, w, layout, (m, k, n))?)),
        Route::Warpgroup => {
            let dtype = x.dtype;
            return Ok(float_out(crate::ops::matmul::wgmma::matmul_wgmma(x, w, layout, false, (m, k, n), dtype)?));
        }
        Route::Tiles(pipeline) => return Ok(float_out(crate::ops::matmul::tc::matmul_tensor_core(x, w, layout, (m, k, n), pipeline, false)?)),
        Route::Scalar => {}
    }
    let y = empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), [m, n].into(), x.dtype);
    let count = CubeCount::Static(n.div_ceil(TILE) as u32, m.div_ceil(TILE) as u32, 1);
    matmul_kernel::launch(
        &x.client,
        count,
        CubeDim::new_2d(TILE as u32, TILE as u32),
        x.clone().into_tensor_arg(),
        w.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        m as u32,
        n as u32,
        k as u32,
        layout == WeightLayout::OutIn,
        storage(x.dtype),
    );
    Ok(float_out(y))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_follows_the_documented_shape_rules() {
        use MatmulKernel::*;
        use Pipeline::*;
        use WeightLayout::*;
        // decode: the lm_head at one row takes the decode kernel under tc and hybrid
        assert_eq!(route(TensorCore, OutIn, 1, 1024, 151936), Route::Skinny);
        assert_eq!(route(Hybrid, OutIn, 1, 1024, 151936), Route::Skinny);
        // tiles: register prefetch under 2^20 outputs, asynchronous copies from there
        assert_eq!(route(TensorCore, OutIn, 256, 1024, 1024), Route::Tiles(RegisterPrefetch));
        assert_eq!(route(TensorCore, OutIn, 1024, 1024, 1024), Route::Tiles(AsyncCopies));
        assert_eq!(route(TensorCore, OutIn, 4096, 1024, 3072), Route::Tiles(AsyncCopies));
        // hybrid: pipelined for large outputs and wide weights, tc's tiles between
        assert_eq!(route(Hybrid, OutIn, 4096, 1024, 3072), Route::Pipelined);
        assert_eq!(route(Hybrid, OutIn, 256, 1024, 151936), Route::Pipelined);
        assert_eq!(route(Hybrid, OutIn, 1024, 1024, 1024), Route::Tiles(AsyncCopies));
        // the comparison kernels ignore the size rules
        assert_eq!(route(TensorCoreTiles, OutIn, 4096, 1024, 3072), Route::Tiles(RegisterPrefetch));
        assert_eq!(route(TensorCoreAsync, OutIn, 1, 1024, 151936), Route::Tiles(AsyncCopies));
        assert_eq!(route(Pipelined, OutIn, 1, 1024, 1024), Route::Pipelined);
        assert_eq!(route(Scalar, OutIn, 4096, 1024, 3072), Route::Scalar);
        // wgmma: the decode kernel where tc runs it, else warpgroup tiles where the row strides
        // are whole 16 bytes, tc's tiles otherwise
        assert_eq!(route(Warpgroup, OutIn, 1, 1024, 151936), Route::Skinny);
        assert_eq!(route(Warpgroup, OutIn, 256, 1024, 1024), Route::Warpgroup);
        assert_eq!(route(Warpgroup, OutIn, 1024, 1024, 1024), Route::Warpgroup);
        assert_eq!(route(Warpgroup, InOut, 4096, 1024, 3072), Route::Warpgroup);
        assert_eq!(route(Warpgroup, InOut, 4096, 1024, 3071), Route::Tiles(AsyncCopies));
        assert_eq!(route(Warpgroup, OutIn, 100, 1020, 64), Route::Tiles(RegisterPrefetch));
    }
}
