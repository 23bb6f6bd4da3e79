//! The kept set of a truncated distribution (top-k, then top-p), per row: the smallest order
//! key ([`order_key`](super::rows::order_key)) of the tokens `softmax(logits / T)` keeps, so a token is kept iff its
//! scaled logit's key is at least the row's threshold (0: every token). The sampler draws from
//! that set; with processed logprobs (vLLM's `processed_logprobs`) the sampler's logprob and the
//! trainer's are taken under it, renormalised, and both find it with this one kernel on logits
//! that are equal as bits, so the sets are the same.
//!
//! Thresholds are defined by bisection over the order-preserving u32 image of the scaled
//! logits, each step counting (top-k) or summing (top-p) with the fixed tree
//! ([`super::truncation_definition`]); [`super::truncation_kernel`] takes the same steps from
//! the same sums in far fewer passes over the row. Tokens tied at the top-k boundary are all
//! kept. T = 0 (greedy, scored at T = 1) keeps every token.

use crate::ops::logits::truncation_kernel::truncation_kernel;
use crate::ops::{cube_count_for, storage, ROW_BLOCK};
use crate::autodiff::untracked;
use crate::bridge::{dims, float_in, int_in, int_out, same_device};
use crate::ops::logits::truncation_definition::definition_kernel;
use crate::{ensure, KernelError};
use burn::tensor::{DType, Int as BInt, Tensor as BTensor};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

/// Which kernel finds the thresholds: the fast one every caller uses, or the definition
/// ([`super::truncation_definition`]) it is checked against as bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThresholdKernel {
    Fast,
    Definition,
}

/// The per-row thresholds of `logits` [rows, vocab] (checked, contiguous device tensors of one
/// device; `temps`, `top_ks`, `top_ps` one per row), as a u32 tensor [rows].
pub(crate) fn launch_thresholds(logits: &CubeTensor, temps: &CubeTensor, top_ks: &CubeTensor, top_ps: &CubeTensor) -> CubeTensor {
    launch_thresholds_by(logits, temps, top_ks, top_ps, ThresholdKernel::Fast)
}

fn launch_thresholds_by(logits: &CubeTensor, temps: &CubeTensor, top_ks: &CubeTensor, top_ps: &CubeTensor, kernel: ThresholdKernel) -> CubeTensor {
    let (rows, vocab) = (logits.meta.shape()[0], logits.meta.shape()[1]);
    let client = logits.client.clone();
    let thresholds = empty_device_contiguous_dtype(client.clone(), logits.device.clone(), [rows].into(), DType::U32);
    let (count, dim) = (cube_count_for(rows, 1), CubeDim::new_1d(ROW_BLOCK as u32));
    let args = (logits.clone().into_tensor_arg(), temps.clone().into_tensor_arg(), top_ks.clone().into_tensor_arg(), top_ps.clone().into_tensor_arg(), thresholds.clone().into_tensor_arg());
    let dtypes = [storage(logits.dtype), storage(top_ks.dtype)];
    match kernel {
        ThresholdKernel::Fast => truncation_kernel::launch(&client, count, dim, args.0, args.1, args.2, args.3, args.4, rows as u32, vocab as u32, ROW_BLOCK, dtypes),
        ThresholdKernel::Definition => definition_kernel::launch(&client, count, dim, args.0, args.1, args.2, args.3, args.4, rows as u32, vocab as u32, ROW_BLOCK, dtypes),
    }
    thresholds
}

/// Each row's threshold (the smallest order key of its kept set; 0: every token kept) for
/// `logits` [rows, vocab] at `temperatures` [rows] under `truncation`, by `kernel`, read back:
/// for the tests and the battery that hold the fast kernel to the definition.
pub fn row_thresholds(logits: BTensor<2>, temperatures: BTensor<1>, truncation: &Truncation, kernel: ThresholdKernel) -> Result<Vec<u32>, KernelError> {
    const OP: &str = "row_thresholds";
    let logits = float_in(OP, "logits", logits)?;
    let temps = float_in(OP, "temperatures", temperatures)?;
    same_device(OP, &logits, &temps, "temperatures")?;
    let rows = logits.meta.shape()[0];
    ensure!(dims(&temps) == [rows], OP, "logits have {rows} rows but temperatures are {:?}", dims(&temps));
    let thresholds = truncation.thresholds_by(OP, &logits, &temps, kernel)?;
    let data = int_out::<1>(thresholds).into_data();
    data.convert::<u32>().try_to_vec::<u32>().map_err(|e| KernelError::new(OP, format!("reading the thresholds back: {e:?}")))
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
        self.thresholds_by(op, logits, temps, ThresholdKernel::Fast)
    }

    fn thresholds_by(&self, op: &'static str, logits: &CubeTensor, temps: &CubeTensor, kernel: ThresholdKernel) -> Result<CubeTensor, KernelError> {
        // made on an autodiff device where the logits are tracked: plain values, no gradient
        let top_ks = int_in(op, "top_k", untracked(self.top_k.clone()))?;
        let top_ps = float_in(op, "top_p", untracked(self.top_p.clone()))?;
        let rows = logits.meta.shape()[0];
        same_device(op, logits, &top_ks, "top_k")?;
        same_device(op, logits, &top_ps, "top_p")?;
        ensure!(dims(&top_ks) == [rows] && dims(&top_ps) == [rows], op, "logits have {rows} rows but top_k is {:?} and top_p {:?}", dims(&top_ks), dims(&top_ps));
        ensure!(top_ks.dtype.size() >= 4, op, "the device's int dtype {:?} cannot hold top_k", top_ks.dtype);
        ensure!(top_ps.dtype == DType::F32, op, "top_p must be f32, got {:?}", top_ps.dtype);
        Ok(launch_thresholds_by(logits, temps, &top_ks, &top_ps, kernel))
    }
}
