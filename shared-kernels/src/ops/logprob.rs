//! Token logprobs and entropy: `log_softmax(logits / T)[target]` and `-sum p log p`, per row.
//!
//! This is THE definition of a token's logprob in lockstep, used by the trainer and returned by
//! the sampler: the temperature-scaled distribution over the full vocabulary, before any
//! top-k/top-p truncation (the same choice slime makes). Temperature 0 means greedy decoding;
//! its logprob is taken at T = 1.
//!
//! Batch invariance: the row is cut into chunks of `VOCAB_CHUNK` logits from token 0 (the cut
//! depends on the vocabulary only). Pass 1, one cube of `ROW_BLOCK` units per (row, chunk):
//! each unit loads its strided slice into registers and folds it sequentially, then a fixed
//! tree gives the chunk's max m_c,
//! `s_c = sum exp(z - m_c)` and `d_c = sum exp(z - m_c)(z - m_c)`. Pass 2, one cube per row:
//! M = max m_c, `S = sum_c s_c exp(m_c - M)` folded in chunk order per unit then the same tree;
//! logprob = z_target - M - ln S. Many cubes per row keep a 151936-token row from waiting on one
//! cube (session 5: 4.4-5x torch's time at M <= 16 with one cube per row).

use super::reduce::{cube_linear, tree_max, tree_sum, tree_sum_pair, NEG_BIG};
use super::{cube_count_for, storage, ROW_BLOCK};

use crate::bridge::{dims, float_in, float_out, int_in, same_device};
use super::logprob_grad::{logprob_grad, ChunkStats};
use crate::autodiff::{from_tracked, inner, plain, tracked, tracked_in, untracked};
use crate::{ensure, KernelError};
use burn::tensor::{Int as BInt, Tensor as BTensor};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

/// Logits per pass-1 chunk. Part of the numerics (chunk results are combined in chunk order),
/// so fixed for every shape and batch; shared with the sampling kernels, whose returned logprob
/// must equal this file's bits.
pub const VOCAB_CHUNK: usize = 2048;

/// Per-row outputs, f32 whatever the logits dtype.
#[derive(Debug)]
pub struct TokenLogprobs {
    /// `log_softmax(logits / T)[target]`, [rows].
    pub logprobs: BTensor<1>,
    /// Entropy of `softmax(logits / T)`, [rows].
    pub entropy: BTensor<1>,
}

/// The scale applied to logits for temperature `t` (shared with the sampling kernel).
#[cube]
pub fn inv_temperature(t: f32) -> f32 {
    let mut inv = 1.0f32;
    if t > 0.0f32 {
        inv = 1.0f32 / t;
    }
    inv
}

/// `logits[i] * inv_t` in f32: the one place a logit is scaled by temperature.
#[cube]
pub fn scaled_logit<F: Float>(logits: &Tensor<F>, i: usize, inv_t: f32) -> f32 {
    f32::cast_from(logits[i]) * inv_t
}

/// Row maximum of the scaled logits (fixed tree).
#[cube]
pub fn row_max<F: Float>(logits: &Tensor<F>, base: usize, vocab: usize, inv_t: f32, shared: &mut Shared<[f32]>, #[comptime] block: usize) -> f32 {
    let mut local_max = f32::new(NEG_BIG);
    let mut i = UNIT_POS_X as usize;
    while i < vocab {
        let z = scaled_logit(logits, base + i, inv_t);
        if z > local_max {
            local_max = z;
        }
        i += block;
    }
    tree_max(shared, local_max, block)
}

/// Where chunk `chunk` of row `row` starts in `logits` and how many logits it holds.
#[cube]
pub fn chunk_span(row: usize, chunk: usize, vocab: usize, #[comptime] chunk_len: usize) -> (usize, usize) {
    let start = chunk * chunk_len;
    let mut len = vocab - start;
    if len > chunk_len {
        len = chunk_len;
    }
    (row * vocab + start, len)
}

/// Unit u's scaled logits u, u + block, ... of a chunk into `vals` (`NEG_BIG` past its end),
/// every load issued before any is used. The chunk is read from memory once; the max, the sums
/// and the sampler's scores all come from these registers (three strided `while` loops over
/// memory, one load in flight per unit each, ran at 7% of the H200's bandwidth).
#[cube]
pub fn load_chunk<F: Float>(logits: &Tensor<F>, vals: &mut Array<f32>, base: usize, len: usize, inv_t: f32, #[comptime] block: usize, #[comptime] per_unit: usize) {
    #[unroll]
    for j in 0..per_unit {
        let i = UNIT_POS_X as usize + j * block;
        let mut z = f32::new(NEG_BIG);
        if i < len {
            z = scaled_logit(logits, base + i, inv_t);
        }
        vals[j] = z;
    }
}

/// A chunk's softmax statistics from [`load_chunk`]'s registers: its max m (fixed tree),
/// `sum exp(z - m)` and, with `with_dot`, `sum exp(z - m)(z - m)` (each unit's elements in
/// order, then one fixed tree for both). The one pass-1 computation of both the logprob and the
/// sampling kernels, so their chunks agree as bits.
#[cube]
#[allow(unused_assignments)] // sum and dot are set in one of two comptime branches
pub fn chunk_stats(vals: &Array<f32>, len: usize, shared: &mut Shared<[f32]>, #[comptime] block: usize, #[comptime] per_unit: usize, #[comptime] with_dot: bool) -> (f32, f32, f32) {
    let unit = UNIT_POS_X as usize;
    let mut local_max = f32::new(NEG_BIG);
    #[unroll]
    for j in 0..per_unit {
        if unit + j * block < len && vals[j] > local_max {
            local_max = vals[j];
        }
    }
    let max = tree_max(shared, local_max, block);
    let mut local_sum = 0.0f32;
    let mut local_dot = 0.0f32;
    #[unroll]
    for j in 0..per_unit {
        if unit + j * block < len {
            let shifted = vals[j] - max;
            let e = shifted.exp();
            local_sum += e;
            if comptime!(with_dot) {
                local_dot += e * shifted;
            }
        }
    }
    let mut sum = 0.0f32;
    let mut dot = 0.0f32;
    if comptime!(with_dot) {
        let mut other = Shared::new_slice(block);
        let totals = tree_sum_pair(shared, &mut other, local_sum, local_dot, block);
        sum = totals.0;
        dot = totals.1;
    } else {
        sum = tree_sum(shared, local_sum, block);
    }
    (max, sum, dot)
}

/// The row's softmax normaliser from its chunks: M = the max of the chunk maxima (exact in any
/// order) and `sum_c s_c exp(m_c - M)` (chunks folded per unit in ascending order, then the
/// fixed tree). The one pass-2 fold of both the logprob and the sampling kernels.
#[cube]
pub fn row_normaliser(chunk_max: &Tensor<f32>, chunk_sum: &Tensor<f32>, first: usize, chunks: usize, shared: &mut Shared<[f32]>, #[comptime] block: usize) -> (f32, f32) {
    let mut local_max = f32::new(NEG_BIG);
    let mut c = UNIT_POS_X as usize;
    while c < chunks {
        let m = chunk_max[first + c];
        if m > local_max {
            local_max = m;
        }
        c += block;
    }
    let max = tree_max(shared, local_max, block);
    let mut local_sum = 0.0f32;
    let mut c = UNIT_POS_X as usize;
    while c < chunks {
        local_sum += chunk_sum[first + c] * (chunk_max[first + c] - max).exp();
        c += block;
    }
    (max, tree_sum(shared, local_sum, block))
}

/// Pass 1: one cube per (row, chunk of `VOCAB_CHUNK` logits): the chunk's max, `sum exp(z - m)`
/// and `sum exp(z - m)(z - m)`.
#[cube(launch)]
fn logprob_partials_kernel<F: Float>(
    logits: &Tensor<F>,
    temperatures: &Tensor<f32>,
    chunk_max: &mut Tensor<f32>,
    chunk_sum: &mut Tensor<f32>,
    chunk_dot: &mut Tensor<f32>,
    rows_arg: u32,
    vocab_arg: u32,
    chunks_arg: u32,
    #[comptime] block: usize,
    #[comptime] chunk_len: usize,
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
        let (max, sum, dot) = chunk_stats(&vals, len, &mut shared, block, comptime!(chunk_len / block), true);
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
    chunk_max: &Tensor<f32>,
    chunk_sum: &Tensor<f32>,
    chunk_dot: &Tensor<f32>,
    logprobs: &mut Tensor<f32>,
    entropy: &mut Tensor<f32>,
    rows_arg: u32,
    vocab_arg: u32,
    chunks_arg: u32,
    #[comptime] block: usize,
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
                logprobs[row] = scaled_logit(logits, row * vocab + target, inv_t) - max - log_sum;
            } else {
                logprobs[row] = f32::new(NEG_BIG); // callers validate ids on the host; never read OOB
            }
            entropy[row] = log_sum - dot / sum;
        }
    }
}

/// Logprob of `targets[r]` and entropy for each row of `logits` [rows, vocab], at
/// `temperatures[r]` (a tensor of f32, one per row; 0 = greedy, scored at T = 1).
pub fn token_logprobs(
    logits: BTensor<2>,
    targets: BTensor<1, BInt>,
    temperatures: BTensor<1>,
) -> Result<TokenLogprobs, KernelError> {
    if !logits.is_autodiff() {
        let inputs = Inputs::checked(logits, targets, temperatures)?;
        let (lp, ent, _) = inputs.launch();
        return Ok(TokenLogprobs { logprobs: float_out(lp), entropy: float_out(ent) });
    }
    let la = tracked_in("token_logprobs", "logits", logits)?;
    let inputs = Inputs::checked(plain::<2>(inner(&la)), untracked(targets), untracked(temperatures))?;
    let (lp, ent, stats) = inputs.launch();
    // the entropy output is a metric and carries no gradient
    let logprobs = from_tracked(tracked([&la], lp, move |dl| [Some(logprob_grad(&inputs.logits, &inputs.targets, &inputs.temps, &stats, dl))]));
    Ok(TokenLogprobs { logprobs, entropy: float_out(ent) })
}

/// The gradient of [`token_logprobs`]' logprobs w.r.t. `logits` for incoming gradients `dl`
/// [rows] (untracked tensors): the chunk statistics recomputed (the forward's bits), then
/// [`logprob_grad`]. For callers that recompute logits in their backward instead of keeping them.
pub(crate) fn token_logprobs_grad(logits: BTensor<2>, targets: BTensor<1, BInt>, temperatures: BTensor<1>, dl: BTensor<1>) -> Result<BTensor<2>, KernelError> {
    let inputs = Inputs::checked(logits, targets, temperatures)?;
    let (_, _, stats) = inputs.launch();
    let dl = float_in("token_logprobs", "dl", dl)?;
    Ok(float_out(logprob_grad(&inputs.logits, &inputs.targets, &inputs.temps, &stats, dl)))
}

/// The op's inputs, checked and contiguous.
struct Inputs {
    logits: CubeTensor,
    targets: CubeTensor,
    temps: CubeTensor,
    rows: usize,
    vocab: usize,
}

impl Inputs {
    fn checked(logits: BTensor<2>, targets: BTensor<1, BInt>, temperatures: BTensor<1>) -> Result<Self, KernelError> {
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
        Ok(Self { logits, targets, temps, rows, vocab })
    }

    /// Pass 1 and pass 2: (logprobs, entropy, the chunk statistics the backward reuses).
    fn launch(&self) -> (CubeTensor, CubeTensor, ChunkStats) {
        let Self { logits, targets, temps, rows, vocab } = self;
        let (rows, vocab) = (*rows, *vocab);
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
            chunk_max.clone().into_tensor_arg(),
            chunk_sum.clone().into_tensor_arg(),
            chunk_dot.clone().into_tensor_arg(),
            rows as u32,
            vocab as u32,
            chunks as u32,
            ROW_BLOCK,
            VOCAB_CHUNK,
            storage(logits.dtype),
        );
        let (lp, ent) = (out(rows), out(rows));
        logprob_combine_kernel::launch(
            &client,
            cube_count_for(rows, 1),
            CubeDim::new_1d(ROW_BLOCK as u32),
            logits.clone().into_tensor_arg(),
            targets.clone().into_tensor_arg(),
            temps.clone().into_tensor_arg(),
            chunk_max.clone().into_tensor_arg(),
            chunk_sum.clone().into_tensor_arg(),
            chunk_dot.into_tensor_arg(),
            lp.clone().into_tensor_arg(),
            ent.clone().into_tensor_arg(),
            rows as u32,
            vocab as u32,
            chunks as u32,
            ROW_BLOCK,
            [storage(logits.dtype), storage(targets.dtype)],
        );
        (lp, ent, ChunkStats { max: chunk_max, sum: chunk_sum, chunks })
    }
}
