//! Token logprobs and entropy: `log_softmax(logits / T)[target]` and `-sum p log p`, per row.
//!
//! This is THE definition of a token's logprob in lockstep, used by the trainer and returned by
//! the sampler: the temperature-scaled distribution over the full vocabulary, before any
//! top-k/top-p truncation (the same choice slime makes; vLLM's `raw_logprobs`). Temperature 0
//! means greedy decoding; its logprob is taken at T = 1. With a [`Truncation`] (processed
//! logprobs, vLLM's `processed_logprobs`) the distribution is the truncated one renormalised:
//! only the kept set ([`crate::ops::logits::truncation`]) enters the chunk statistics, and a
//! target outside it has logprob `NEG_BIG` and no gradient.
//!
//! Batch invariance: the row is cut into chunks of `VOCAB_CHUNK` logits from token 0 (the cut
//! depends on the vocabulary only). Pass 1, one cube of `ROW_BLOCK` units per (row, chunk):
//! each unit loads its strided slice into registers and folds it sequentially, then a fixed
//! tree gives the chunk's max m_c,
//! `s_c = sum exp(z - m_c)` and `d_c = sum exp(z - m_c)(z - m_c)`. Pass 2, one cube per row:
//! M = max m_c, `S = sum_c s_c exp(m_c - M)` folded in chunk order per unit then the same tree;
//! logprob = z_target - M - ln S. Many cubes per row keep a 151936-token row from waiting on one
//! cube (one cube per row took 4.4-5x torch's time at M <= 16).

use crate::ops::reduce::{cube_linear, tree_sum, NEG_BIG};
use crate::ops::{cube_count_for, storage, ROW_BLOCK};

use crate::bridge::{dims, float_in, float_out, int_in, same_device};
use crate::ops::logits::logprob_grad::logprob_grad;
pub use crate::ops::logits::rows::VOCAB_CHUNK;
use crate::ops::logits::rows::{scaled_logit, chunk_span, chunk_stats, inv_temperature, load_chunk, order_key, row_normaliser, ChunkStats};
use crate::ops::logits::truncation::Truncation;
use crate::autodiff::{from_tracked, inner, plain, tracked, tracked_in, untracked};
use crate::{ensure, KernelError};
use burn::tensor::{Int as BInt, Tensor as BTensor};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

/// Per-row outputs, f32 whatever the logits dtype.
#[derive(Debug)]
pub struct TokenLogprobs {
    /// `log_softmax(logits / T)[target]`, [rows].
    pub logprobs: BTensor<1>,
    /// Entropy of `softmax(logits / T)`, [rows].
    pub entropy: BTensor<1>,
}

#[cube(launch)]
fn logprob_partials_kernel<F: Float>(
    logits: &Tensor<F>,
    temperatures: &Tensor<f32>,
    thresholds: &Tensor<u32>,
    chunk_max: &mut Tensor<f32>,
    chunk_sum: &mut Tensor<f32>,
    chunk_dot: &mut Tensor<f32>,
    rows_arg: u32,
    vocab_arg: u32,
    chunks_arg: u32,
    #[comptime] block: usize,
    #[comptime] chunk_len: usize,
    #[comptime] masked: bool,
    #[define(F)] _d: ElemType,
) {
    let (vocab, chunks) = (vocab_arg as usize, chunks_arg as usize);
    let slot = cube_linear();
    if slot < rows_arg as usize * chunks {
        let row = slot / chunks;
        let (base, len) = chunk_span(row, slot % chunks, vocab, chunk_len);
        let inv_t = inv_temperature(temperatures[row]);
        let mut shared = Shared::new_slice(block);
        let mut vals = Array::<f32>::new(comptime!(chunk_len / block));
        load_chunk(logits, &mut vals, base, len, inv_t, block, comptime!(chunk_len / block));
        let mut threshold = 0u32;
        if comptime!(masked) {
            threshold = thresholds[row];
        }
        let (max, sum, dot) = chunk_stats(&vals, len, threshold, &mut shared, block, comptime!(chunk_len / block), true, masked);
        if UNIT_POS_X == 0 {
            chunk_max[slot] = max;
            chunk_sum[slot] = sum;
            chunk_dot[slot] = dot;
        }
    }
}

/// Pass 2: one cube per row folds the row's chunks in a fixed order into the logprob of its
/// target and the entropy: `sum_c w_c (d_c + (m_c - M) s_c)` with `w_c = exp(m_c - M)` is the
/// row's `sum exp(z - M)(z - M)`.
#[cube(launch)]
fn logprob_combine_kernel<F: Float, I: Int>(
    logits: &Tensor<F>,
    targets: &Tensor<I>,
    temperatures: &Tensor<f32>,
    thresholds: &Tensor<u32>,
    chunk_max: &Tensor<f32>,
    chunk_sum: &Tensor<f32>,
    chunk_dot: &Tensor<f32>,
    logprobs: &mut Tensor<f32>,
    entropy: &mut Tensor<f32>,
    rows_arg: u32,
    vocab_arg: u32,
    chunks_arg: u32,
    #[comptime] block: usize,
    #[comptime] masked: bool,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let (vocab, chunks) = (vocab_arg as usize, chunks_arg as usize);
    let row = cube_linear();
    if row < rows_arg as usize {
        let first = row * chunks;
        let inv_t = inv_temperature(temperatures[row]);
        let mut shared = Shared::new_slice(block);
        let (max, sum) = row_normaliser(chunk_max, chunk_sum, first, chunks, &mut shared, block);
        let mut local_dot = 0.0f32;
        let mut c = UNIT_POS_X as usize;
        while c < chunks {
            let shift = chunk_max[first + c] - max;
            local_dot += shift.exp() * (chunk_dot[first + c] + shift * chunk_sum[first + c]);
            c += block;
        }
        let dot = tree_sum(&mut shared, local_dot, block);
        if UNIT_POS_X == 0 {
            let log_sum = sum.ln();
            let target = u32::cast_from(targets[row]) as usize;
            if target < vocab {
                let z = scaled_logit(logits, row * vocab + target, inv_t);
                logprobs[row] = z - max - log_sum;
                if comptime!(masked) {
                    // outside the kept set: probability 0 under the truncated distribution
                    if order_key(z) < thresholds[row] {
                        logprobs[row] = f32::new(NEG_BIG);
                    }
                }
            } else {
                logprobs[row] = f32::new(NEG_BIG); // callers validate ids on the host; never read OOB
            }
            entropy[row] = log_sum - dot / sum;
        }
    }
}

/// Logprob of `targets[r]` and entropy for each row of `logits` [rows, vocab], at
/// `temperatures[r]` (a tensor of f32, one per row; 0 = greedy, scored at T = 1).
pub fn token_logprobs(logits: BTensor<2>, targets: BTensor<1, BInt>, temperatures: BTensor<1>) -> Result<TokenLogprobs, KernelError> {
    truncated_token_logprobs(logits, targets, temperatures, None)
}

/// [`token_logprobs`] under the distribution `truncation` keeps, renormalised (processed
/// logprobs; `None`: the full distribution, the same bits as [`token_logprobs`]).
pub fn truncated_token_logprobs(
    logits: BTensor<2>,
    targets: BTensor<1, BInt>,
    temperatures: BTensor<1>,
    truncation: Option<&Truncation>,
) -> Result<TokenLogprobs, KernelError> {
    if !logits.is_autodiff() {
        let inputs = Inputs::checked(logits, targets, temperatures, truncation)?;
        let (lp, ent, _) = inputs.launch();
        return Ok(TokenLogprobs { logprobs: float_out(lp), entropy: float_out(ent) });
    }
    let la = tracked_in("token_logprobs", "logits", logits)?;
    let inputs = Inputs::checked(plain::<2>(inner(&la)), untracked(targets), untracked(temperatures), truncation)?;
    let (lp, ent, stats) = inputs.launch();
    // the entropy output is a metric and carries no gradient
    let kept = inputs.thresholds.clone().map(|t| (t, lp.clone()));
    let logprobs = from_tracked(tracked([&la], lp, move |dl| [Some(logprob_grad(&inputs.logits, &inputs.targets, &inputs.temps, kept.as_ref().map(|(t, lp)| (t, lp)), &stats, dl))]));
    Ok(TokenLogprobs { logprobs, entropy: float_out(ent) })
}

/// The gradient of [`truncated_token_logprobs`]' logprobs w.r.t. `logits` for incoming
/// gradients `dl` [rows] (untracked tensors): the chunk statistics (and kept sets) recomputed
/// (the forward's bits), then [`logprob_grad`]. For callers that recompute logits in their
/// backward instead of keeping them.
pub(crate) fn token_logprobs_grad(logits: BTensor<2>, targets: BTensor<1, BInt>, temperatures: BTensor<1>, truncation: Option<&Truncation>, dl: BTensor<1>) -> Result<BTensor<2>, KernelError> {
    let inputs = Inputs::checked(logits, targets, temperatures, truncation)?;
    let (lp, _, stats) = inputs.launch();
    let dl = float_in("token_logprobs", "dl", dl)?;
    Ok(float_out(logprob_grad(&inputs.logits, &inputs.targets, &inputs.temps, inputs.thresholds.as_ref().map(|t| (t, &lp)), &stats, dl)))
}

/// The logprobs of `targets` under the kept sets `thresholds` (the sampler's processed rows):
/// the kernels [`truncated_token_logprobs`] launches, on the sampler's checked device tensors.
pub(crate) fn kept_set_logprobs(logits: &CubeTensor, targets: &CubeTensor, temps: &CubeTensor, thresholds: CubeTensor) -> CubeTensor {
    let (rows, vocab) = (logits.meta.shape()[0], logits.meta.shape()[1]);
    let inputs = Inputs { logits: logits.clone(), targets: targets.clone(), temps: temps.clone(), thresholds: Some(thresholds), rows, vocab };
    inputs.launch().0
}

/// The op's inputs, checked and contiguous, with the kept sets' thresholds of a truncation.
struct Inputs {
    logits: CubeTensor,
    targets: CubeTensor,
    temps: CubeTensor,
    thresholds: Option<CubeTensor>,
    rows: usize,
    vocab: usize,
}

impl Inputs {
    fn checked(logits: BTensor<2>, targets: BTensor<1, BInt>, temperatures: BTensor<1>, truncation: Option<&Truncation>) -> Result<Self, KernelError> {
        const OP: &str = "token_logprobs";
        let logits = float_in(OP, "logits", logits)?;
        let targets = int_in(OP, "targets", targets)?;
        let temps = float_in(OP, "temperatures", temperatures)?;
        same_device(OP, &logits, &targets, "targets")?;
        same_device(OP, &logits, &temps, "temperatures")?;
        let ld = dims(&logits);
        let (rows, vocab) = (ld[0], ld[1]);
        ensure!(rows > 0 && vocab > 0, OP, "empty logits {ld:?}");
        ensure!(dims(&targets) == [rows], OP, "logits have {rows} rows but targets is {:?}", dims(&targets));
        ensure!(dims(&temps) == [rows], OP, "logits have {rows} rows but temperatures is {:?}", dims(&temps));
        ensure!(temps.dtype == burn::tensor::DType::F32, OP, "temperatures must be f32, got {:?}", temps.dtype);
        ensure!(rows * vocab <= u32::MAX as usize, OP, "logits [{rows}, {vocab}] exceed the u32 index range");
        let thresholds = truncation.map(|t| t.thresholds(OP, &logits, &temps)).transpose()?;
        Ok(Self { logits, targets, temps, thresholds, rows, vocab })
    }

    /// The thresholds, or a one-element stand-in that unmasked kernels never read.
    fn threshold_arg(&self) -> CubeTensor {
        self.thresholds.clone().unwrap_or_else(|| empty_device_contiguous_dtype(self.logits.client.clone(), self.logits.device.clone(), [1].into(), burn::tensor::DType::U32))
    }

    /// Pass 1 and pass 2: (logprobs, entropy, the chunk statistics the backward reuses).
    fn launch(&self) -> (CubeTensor, CubeTensor, ChunkStats) {
        let (thresholds, masked) = (self.threshold_arg(), self.thresholds.is_some());
        let Self { logits, targets, temps, rows, vocab, .. } = self;
        let (rows, vocab) = (*rows, *vocab);
        let client = logits.client.clone();
        let out = |n| empty_device_contiguous_dtype(client.clone(), logits.device.clone(), [n].into(), burn::tensor::DType::F32);
        let (chunk_max, chunk_sum, chunk_dot, chunks) = launch_partials(logits, temps, &thresholds, masked);
        let (lp, ent) = (out(rows), out(rows));
        logprob_combine_kernel::launch(
            &client,
            cube_count_for(rows, 1),
            CubeDim::new_1d(ROW_BLOCK as u32),
            logits.clone().into_tensor_arg(),
            targets.clone().into_tensor_arg(),
            temps.clone().into_tensor_arg(),
            thresholds.into_tensor_arg(),
            chunk_max.clone().into_tensor_arg(),
            chunk_sum.clone().into_tensor_arg(),
            chunk_dot.into_tensor_arg(),
            lp.clone().into_tensor_arg(),
            ent.clone().into_tensor_arg(),
            rows as u32,
            vocab as u32,
            chunks as u32,
            ROW_BLOCK,
            masked,
            [storage(logits.dtype), storage(targets.dtype)],
        );
        (lp, ent, ChunkStats { max: chunk_max, sum: chunk_sum, chunks })
    }
}

/// Pass 1 of the logprob: per (row, chunk) the max, `sum exp(z - m)` and `sum exp(z - m)(z - m)`
/// of the scaled logits (only the kept set's with `masked`): (max, sum, dot, chunks a row).
fn launch_partials(logits: &CubeTensor, temps: &CubeTensor, thresholds: &CubeTensor, masked: bool) -> (CubeTensor, CubeTensor, CubeTensor, usize) {
    let ld = dims(logits);
    let (rows, vocab) = (ld[0], ld[1]);
    let client = logits.client.clone();
    let out = |n| empty_device_contiguous_dtype(client.clone(), logits.device.clone(), [n].into(), burn::tensor::DType::F32);
    let chunks = vocab.div_ceil(VOCAB_CHUNK);
    let (chunk_max, chunk_sum, chunk_dot) = (out(rows * chunks), out(rows * chunks), out(rows * chunks));
    logprob_partials_kernel::launch(
        &client,
        cube_count_for(rows * chunks, 1),
        CubeDim::new_1d(ROW_BLOCK as u32),
        logits.clone().into_tensor_arg(),
        temps.clone().into_tensor_arg(),
        thresholds.clone().into_tensor_arg(),
        chunk_max.clone().into_tensor_arg(),
        chunk_sum.clone().into_tensor_arg(),
        chunk_dot.clone().into_tensor_arg(),
        rows as u32,
        vocab as u32,
        chunks as u32,
        ROW_BLOCK,
        VOCAB_CHUNK,
        masked,
        storage(logits.dtype),
    );
    (chunk_max, chunk_sum, chunk_dot, chunks)
}

/// The full distribution's chunk statistics of `logits` [rows, vocab] at `temps` [rows] (f32):
/// the logprob's own pass 1, so a row's normaliser from them is the logprob's bits.
pub(crate) fn full_chunk_stats(logits: &CubeTensor, temps: &CubeTensor) -> ChunkStats {
    let unread = empty_device_contiguous_dtype(logits.client.clone(), logits.device.clone(), [1].into(), burn::tensor::DType::U32);
    let (max, sum, _, chunks) = launch_partials(logits, temps, &unread, false);
    ChunkStats { max, sum, chunks }
}
