//! Backward of [`crate::ops::logits::logprob::token_logprobs`]: `d logprob_r / d logit_{r,i}` times the
//! incoming gradient `dl_r`, i.e. `(1[i = target_r] - softmax(z_r)_i) * inv_t_r * dl_r` with
//! `z = logits * inv_t` (T = 0 scored at T = 1), written in the logits' dtype. Under a
//! truncation the softmax is the kept set's (0 outside it), and a row whose target is outside
//! the set (logprob `NEG_BIG`) gets no gradient.
//!
//! Two launches: per row, the softmax max M and ln S from the forward's chunk statistics (the
//! forward's own fold, [`row_normaliser`]); then one pass over the logits, one unit per vector of
//! up to 16 bytes. The burn-op version it replaces (f32 cast, softmax, one-hot scatter and three
//! products over `[rows, vocab]` in f32) made about ten passes over a 600 MB tensor at Qwen3's
//! vocabulary, and burn's row reductions (one unit per row without autotune) walked each
//! 151936-long row alone. Only the forward is batch invariant by contract; this backward is
//! deterministic (no atomics, fixed folds).

use crate::ops::logits::rows::{inv_temperature, order_key, row_normaliser, scaled_by, ChunkStats};
use crate::ops::reduce::{cube_linear, NEG_BIG};
use crate::ops::{cube_count_for, storage, vector_width, ROW_BLOCK};
use burn::tensor::DType;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

const BLOCK: usize = 256;


/// Per row: M = the largest chunk max and ln S, S = sum_c s_c exp(m_c - M) (the forward's fold).
#[cube(launch)]
fn row_log_normaliser_kernel(chunk_max: &Tensor<f32>, chunk_sum: &Tensor<f32>, row_max: &mut Tensor<f32>, row_log_sum: &mut Tensor<f32>, rows_arg: u32, chunks_arg: u32, #[comptime] block: usize) {
    let row = cube_linear();
    if row < rows_arg as usize {
        let chunks = chunks_arg as usize;
        let mut shared = Shared::new_slice(block);
        let (max, sum) = row_normaliser(chunk_max, chunk_sum, row * chunks, chunks, &mut shared, block);
        if UNIT_POS_X == 0 {
            row_max[row] = max;
            row_log_sum[row] = sum.ln();
        }
    }
}

/// One unit per vector of `vs` logits of one row, lane by lane.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn logprob_grad_kernel<F: Float, N: Size, I: Int>(
    logits: &Tensor<Vector<F, N>>,
    targets: &Tensor<I>,
    temperatures: &Tensor<f32>,
    thresholds: &Tensor<u32>,
    logprobs: &Tensor<f32>,
    row_max: &Tensor<f32>,
    row_log_sum: &Tensor<f32>,
    dl: &Tensor<f32>,
    grad: &mut Tensor<Vector<F, N>>,
    rows_arg: u32,
    row_vecs_arg: u32,
    #[comptime] vs: usize,
    #[comptime] masked: bool,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let row_vecs = row_vecs_arg as usize;
    let i = cube_linear() * comptime!(BLOCK) + UNIT_POS_X as usize;
    if i < rows_arg as usize * row_vecs {
        let row = i / row_vecs;
        let first = (i % row_vecs) * vs;
        let inv_t = inv_temperature(temperatures[row]);
        let shift = row_max[row] + row_log_sum[row];
        let mut scale = inv_t * dl[row];
        let target = u32::cast_from(targets[row]) as usize;
        let mut threshold = 0u32;
        if comptime!(masked) {
            threshold = thresholds[row];
            // a target outside the kept set: the forward's logprob NEG_BIG, a constant
            if logprobs[row] == f32::new(NEG_BIG) {
                scale = 0.0f32;
            }
        }
        let x = logits[i];
        let mut out = Vector::<F, N>::new(F::from_int(0));
        #[unroll]
        for l in 0..vs {
            let z = scaled_by(f32::cast_from(x.extract(l)), inv_t);
            let mut p = (z - shift).exp();
            if comptime!(masked) {
                if order_key(z) < threshold {
                    p = 0.0f32;
                }
            }
            let mut g = 0.0f32 - p;
            if first + l == target {
                g = 1.0f32 - p;
            }
            out.insert(l, F::cast_from(g * scale));
        }
        grad[i] = out;
    }
}

/// The logits' gradient `[rows, vocab]` (logits' dtype) for incoming logprob gradients `dl`
/// `[rows]` (f32). `logits`, `targets` and `temperatures` are the forward's checked, contiguous
/// inputs and `stats` its chunk statistics.
/// `truncated`: a truncation's kept sets (thresholds) and the forward's logprobs (`None`: the
/// full distribution).
pub(crate) fn logprob_grad(logits: &CubeTensor, targets: &CubeTensor, temperatures: &CubeTensor, truncated: Option<(&CubeTensor, &CubeTensor)>, stats: &ChunkStats, dl: CubeTensor) -> CubeTensor {
    let (rows, vocab) = (logits.meta.shape()[0], logits.meta.shape()[1]);
    let client = logits.client.clone();
    let dl = burn_cubecl::kernel::into_contiguous(if dl.dtype == DType::F32 { dl } else { burn_cubecl::kernel::cast(dl, DType::F32) });
    let per_row = || empty_device_contiguous_dtype(client.clone(), logits.device.clone(), [rows].into(), DType::F32);
    let (row_max, row_log_sum) = (per_row(), per_row());
    row_log_normaliser_kernel::launch(
        &client,
        cube_count_for(rows, 1),
        CubeDim::new_1d(ROW_BLOCK as u32),
        stats.max.clone().into_tensor_arg(),
        stats.sum.clone().into_tensor_arg(),
        row_max.clone().into_tensor_arg(),
        row_log_sum.clone().into_tensor_arg(),
        rows as u32,
        stats.chunks as u32,
        ROW_BLOCK,
    );
    let vs = vector_width(logits.dtype, vocab);
    let grad = empty_device_contiguous_dtype(client.clone(), logits.device.clone(), [rows, vocab].into(), logits.dtype);
    let masked = truncated.is_some();
    // one-element stand-ins, never read by the unmasked kernel
    let stand_in = |dtype| empty_device_contiguous_dtype(client.clone(), logits.device.clone(), [1].into(), dtype);
    let (thresholds, logprobs) = match truncated {
        Some((t, lp)) => (t.clone(), lp.clone()),
        None => (stand_in(DType::U32), stand_in(DType::F32)),
    };
    logprob_grad_kernel::launch(
        &client,
        cube_count_for(rows * vocab / vs, BLOCK),
        CubeDim::new_1d(BLOCK as u32),
        vs,
        logits.clone().into_tensor_arg(),
        targets.clone().into_tensor_arg(),
        temperatures.clone().into_tensor_arg(),
        thresholds.into_tensor_arg(),
        logprobs.into_tensor_arg(),
        row_max.into_tensor_arg(),
        row_log_sum.into_tensor_arg(),
        dl.into_tensor_arg(),
        grad.clone().into_tensor_arg(),
        rows as u32,
        (vocab / vs) as u32,
        vs,
        masked,
        [storage(logits.dtype), storage(targets.dtype)],
    );
    grad
}
