//! The per-row device helpers every logits kernel shares (the logprob forward and backward, the
//! sampler's token choice): the vocabulary's fixed chunking, the temperature scale, and the folds
//! that turn a row's chunks into its softmax normaliser. One definition, so the sampler's logprob
//! and the trainer's are the same arithmetic.

use crate::ops::reduce::{tree_max, tree_sum, tree_sum_pair, NEG_BIG};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::tensor::CubeTensor;

/// Logits per pass-1 chunk. Part of the numerics (chunk results are combined in chunk order),
/// so fixed for every shape and batch; shared with the sampling kernels, whose returned logprob
/// must equal this file's bits.
pub const VOCAB_CHUNK: usize = 2048;


/// The scale applied to logits for temperature `t` (shared with the sampling kernel). A
/// `select`, not a mutable local: [`scaled_by`] hands it to inline PTX.
#[cube]
pub fn inv_temperature(t: f32) -> f32 {
    select(t > 0.0f32, 1.0f32 / t, 1.0f32)
}

/// `logits[i] * inv_t` in f32: the one place a logit is scaled by temperature.
#[cube]
pub fn scaled_logit<F: Float>(logits: &Tensor<F>, i: usize, inv_t: f32) -> f32 {
    scaled_by(f32::cast_from(logits[i]), inv_t)
}

/// `logit * inv_t` rounded to f32 before any use. Every logits kernel (the sampler's, the
/// trainer's logprob forward and backward, the kept sets' thresholds) then starts from the same
/// scaled value: NVRTC would otherwise contract the product into an FMA with whatever
/// subtraction follows (`z - max`), unrounded in one kernel and rounded in another. With a
/// plain product, the H100 battery found the masked logprob kernels (a kept set
/// of the whole vocabulary) 1 ulp from the unmasked ones in 22 / 19 of 257 rows (bf16 / f32),
/// all at T 0.8 or 1.2. At T = 1 and T = 0 the product is exact: no bit changes there.
#[cube]
pub fn scaled_by(logit: f32, inv_t: f32) -> f32 {
    crate::ops::unfused::mul_unfused(logit, inv_t, comptime!(cfg!(feature = "cuda")))
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

/// Order-preserving map of a finite f32 onto u32: the truncated distribution's kept set is
/// every token whose scaled logit's key is at least the row's threshold (0 keeps every token).
#[cube]
pub fn order_key(z: f32) -> u32 {
    let bits = u32::reinterpret(z);
    let mut key = bits ^ 0x8000_0000u32;
    if bits >= 0x8000_0000u32 {
        key = !bits;
    }
    key
}

/// Whether register `j` of [`load_chunk`] holds a logit of the distribution: inside the chunk
/// and, with `masked`, in the row's kept set (key >= `threshold`). Unmasked, the comparison is
/// not compiled at all, so the full distribution's kernels are the code they always were.
#[cube]
pub fn counted(vals: &Array<f32>, j: usize, len: usize, threshold: u32, #[comptime] block: usize, #[comptime] masked: bool) -> bool {
    let mut inside = UNIT_POS_X as usize + j * block < len;
    if comptime!(masked) {
        inside = inside && order_key(vals[j]) >= threshold;
    }
    inside
}

/// A chunk's softmax statistics from [`load_chunk`]'s registers: its max m (fixed tree),
/// `sum exp(z - m)` and, with `with_dot`, `sum exp(z - m)(z - m)` (each unit's elements in
/// order, then one fixed tree for both). The one pass-1 computation of both the logprob and the
/// sampling kernels, so their chunks agree as bits. With `masked`, only the kept set's logits
/// count ([`counted`]); a chunk with none of them gives max `NEG_BIG` and zero sums, which the
/// row's fold weighs by exp(NEG_BIG - M) = 0.
#[cube]
#[allow(unused_assignments)] // sum and dot are set in one of two comptime branches
#[allow(clippy::too_many_arguments)]
pub fn chunk_stats(vals: &Array<f32>, len: usize, threshold: u32, shared: &mut Shared<[f32]>, #[comptime] block: usize, #[comptime] per_unit: usize, #[comptime] with_dot: bool, #[comptime] masked: bool) -> (f32, f32, f32) {
    let mut local_max = f32::new(NEG_BIG);
    #[unroll]
    for j in 0..per_unit {
        if counted(vals, j, len, threshold, block, masked) && vals[j] > local_max {
            local_max = vals[j];
        }
    }
    let max = tree_max(shared, local_max, block);
    let mut local_sum = 0.0f32;
    let mut local_dot = 0.0f32;
    #[unroll]
    for j in 0..per_unit {
        if counted(vals, j, len, threshold, block, masked) {
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

/// The forward's per-(row, chunk) softmax statistics, kept for the backward.
#[derive(Clone, Debug)]
pub(crate) struct ChunkStats {
    pub max: CubeTensor,
    pub sum: CubeTensor,
    pub chunks: usize,
}
