//! The kept set of a truncated distribution (top-k, then top-p), per row: the smallest order
//! key ([`order_key`]) of the tokens `softmax(logits / T)` keeps, so a token is kept iff its
//! scaled logit's key is at least the row's threshold (0: every token). The sampler draws from
//! that set; with processed logprobs (vLLM's `processed_logprobs`) the sampler's logprob and the
//! trainer's are taken under it, renormalised, and both find it with this one kernel on logits
//! that are equal as bits, so the sets are the same.
//!
//! Thresholds are found by bisection over the order-preserving u32 image of the scaled logits;
//! each step counts (top-k) or sums (top-p) with the fixed tree. Tokens tied at the top-k
//! boundary are all kept. T = 0 (greedy, scored at T = 1) keeps every token.

use crate::ops::logits::rows::{inv_temperature, order_key, row_max, scaled_logit};
use crate::ops::reduce::{cube_linear, tree_count, tree_sum};
use crate::ops::{cube_count_for, storage, ROW_BLOCK};
use crate::autodiff::untracked;
use crate::bridge::{dims, float_in, int_in, same_device};
use crate::{ensure, KernelError};
use burn::tensor::{DType, Int as BInt, Tensor as BTensor};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

/// Rows that truncate (top-k or top-p): the smallest order key of the row's allowed set, found
/// by bisection with the fixed trees; one cube per row. Rows that do not truncate get 0 (all
/// tokens allowed). Launched only when some row of the batch truncates.
#[cube(launch)]
fn truncation_kernel<F: Float, I: Int>(
    logits: &Tensor<F>,
    temperatures: &Tensor<f32>,
    top_ks: &Tensor<I>,
    top_ps: &Tensor<f32>,
    thresholds: &mut Tensor<u32>,
    rows_arg: u32,
    vocab_arg: u32,
    #[comptime] block: usize,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let rows = rows_arg as usize;
    let vocab = vocab_arg as usize;
    let row = cube_linear();
    if row < rows {
        let unit = UNIT_POS_X as usize;
        let base = row * vocab;
        let temperature = temperatures[row];
        let inv_t = inv_temperature(temperature);
        let mut shared = Shared::new_slice(block);
        let mut counts = Shared::<[u32]>::new_slice(block);
        let max = row_max(logits, base, vocab, inv_t, &mut shared, block);
        let mut threshold = 0u32;
        if temperature > 0.0f32 {
            // top-k: the largest key t with count(key >= t) >= k
            let k = u32::cast_from(top_ks[row]);
            if k > 0u32 && (k as usize) < vocab {
                let mut lo = 0u32;
                let mut hi = 0xffff_ffffu32;
                for _ in 0..32u32 {
                    let mid = lo + (hi - lo) / 2u32 + (hi - lo) % 2u32;
                    let mut local = 0u32;
                    let mut i = unit;
                    while i < vocab {
                        if order_key(scaled_logit(logits, base + i, inv_t)) >= mid {
                            local += 1u32;
                        }
                        i += block;
                    }
                    let count = tree_count(&mut counts, local, block);
                    if lo < hi {
                        if count >= k {
                            lo = mid;
                        } else {
                            hi = mid - 1u32;
                        }
                    }
                }
                threshold = lo;
            }
            // top-p over the survivors: the largest key t whose head holds >= p of their mass
            let p = top_ps[row];
            if p < 1.0f32 {
                let mut local_all = 0.0f32;
                let mut i = unit;
                while i < vocab {
                    let z = scaled_logit(logits, base + i, inv_t);
                    if order_key(z) >= threshold {
                        local_all += (z - max).exp();
                    }
                    i += block;
                }
                let target = tree_sum(&mut shared, local_all, block) * p;
                let mut lo = threshold;
                let mut hi = 0xffff_ffffu32;
                for _ in 0..32u32 {
                    let mid = lo + (hi - lo) / 2u32 + (hi - lo) % 2u32;
                    let mut local = 0.0f32;
                    let mut i = unit;
                    while i < vocab {
                        let z = scaled_logit(logits, base + i, inv_t);
                        if order_key(z) >= mid {
                            local += (z - max).exp();
                        }
                        i += block;
                    }
                    let mass = tree_sum(&mut shared, local, block);
                    if lo < hi {
                        if mass >= target {
                            lo = mid;
                        } else {
                            hi = mid - 1u32;
                        }
                    }
                }
                threshold = lo;
            }
        }

        if unit == 0 {
            thresholds[row] = threshold;
        }
    }
}

/// The per-row thresholds of `logits` [rows, vocab] (checked, contiguous device tensors of one
/// device; `temps`, `top_ks`, `top_ps` one per row), as a u32 tensor [rows].
pub(crate) fn launch_thresholds(logits: &CubeTensor, temps: &CubeTensor, top_ks: &CubeTensor, top_ps: &CubeTensor) -> CubeTensor {
    let (rows, vocab) = (logits.meta.shape()[0], logits.meta.shape()[1]);
    let client = logits.client.clone();
    let thresholds = empty_device_contiguous_dtype(client.clone(), logits.device.clone(), [rows].into(), DType::U32);
    truncation_kernel::launch(
        &client,
        cube_count_for(rows, 1),
        CubeDim::new_1d(ROW_BLOCK as u32),
        logits.clone().into_tensor_arg(),
        temps.clone().into_tensor_arg(),
        top_ks.clone().into_tensor_arg(),
        top_ps.clone().into_tensor_arg(),
        thresholds.clone().into_tensor_arg(),
        rows as u32,
        vocab as u32,
        ROW_BLOCK,
        [storage(logits.dtype), storage(top_ks.dtype)],
    );
    thresholds
}

/// Top-k and top-p per row, for logprobs taken under the truncated distribution (the trainer's
/// side of processed logprobs). `top_k` 0 and `top_p` 1 keep every token.
#[derive(Clone, Debug)]
pub struct Truncation {
    pub top_k: BTensor<1, BInt>,
    pub top_p: BTensor<1>,
}

/// Whether top-k / top-p at `temperature` drop any token of a `vocab`-token vocabulary: the
/// one definition the sampler (whether the truncation kernel runs) and the trainer (whether
/// its logprobs are masked) share. Greedy (T = 0) keeps every token: it is scored at T = 1.
pub fn truncates(temperature: f32, top_k: u32, top_p: f32, vocab: usize) -> bool {
    temperature > 0.0 && ((top_k > 0 && (top_k as usize) < vocab) || top_p < 1.0)
}

impl Truncation {
    /// One setting for all `rows` rows; `None` when it keeps every token ([`truncates`]), so
    /// nothing needs masking.
    pub fn uniform(temperature: f32, top_k: u32, top_p: f32, rows: usize, vocab: usize, device: &burn::tensor::Device) -> Option<Truncation> {
        truncates(temperature, top_k, top_p, vocab).then(|| Truncation {
            top_k: BTensor::from_data(burn::tensor::TensorData::new(vec![top_k as i64; rows], [rows]), device),
            top_p: BTensor::from_data(burn::tensor::TensorData::new(vec![top_p; rows], [rows]), device),
        })
    }

    /// Rows `range` of it (a chunk of the LM head's rows).
    pub fn slice(&self, range: std::ops::Range<usize>) -> Truncation {
        Truncation { top_k: self.top_k.clone().slice([range.clone()]), top_p: self.top_p.clone().slice([range]) }
    }

    /// The thresholds of `logits` (checked by the caller) at `temps`, for op `op`.
    pub(crate) fn thresholds(&self, op: &'static str, logits: &CubeTensor, temps: &CubeTensor) -> Result<CubeTensor, KernelError> {
        // made on an autodiff device where the logits are tracked: plain values, no gradient
        let top_ks = int_in(op, "top_k", untracked(self.top_k.clone()))?;
        let top_ps = float_in(op, "top_p", untracked(self.top_p.clone()))?;
        let rows = logits.meta.shape()[0];
        same_device(op, logits, &top_ks, "top_k")?;
        same_device(op, logits, &top_ps, "top_p")?;
        ensure!(dims(&top_ks) == [rows] && dims(&top_ps) == [rows], op, "logits have {rows} rows but top_k is {:?} and top_p {:?}", dims(&top_ks), dims(&top_ps));
        ensure!(top_ks.dtype.size() >= 4, op, "the device's int dtype {:?} cannot hold top_k", top_ks.dtype);
        ensure!(top_ps.dtype == DType::F32, op, "top_p must be f32, got {:?}", top_ps.dtype);
        Ok(launch_thresholds(logits, temps, &top_ks, &top_ps))
    }
}
