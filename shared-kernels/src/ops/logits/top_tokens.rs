//! A row's most likely tokens and their logprobs (OpenAI's `top_logprobs`), batch invariant.
//!
//! The distribution is the sampler's raw one, `softmax(logits / T)` over the whole vocabulary,
//! normalised by the logprob's own pass 1 ([`full_chunk_stats`], whose max and sum the sampler's
//! pass 1 equals as bits) and [`row_normaliser`], and each
//! logprob is the same expression on the same values: so the sampled token's logprob, where it
//! is among the top, is the same bits here as in the sampler's answer and the trainer's.
//!
//! The order is by scaled logit, highest first, ties to the lower token id: rank r is the
//! greatest (key, -token) below rank r - 1's, found by one pass over the row and a fixed tree,
//! exact in any reduction order and for any batch.

use crate::bridge::{dims, float_in, float_out, int_in, int_out};
use crate::ops::logits::logprob::full_chunk_stats;
use crate::ops::logits::rows::{inv_temperature, order_key, row_normaliser, scaled_logit};
use crate::ops::reduce::cube_linear;
use crate::ops::{cube_count_for, storage, ROW_BLOCK};
use crate::{ensure, KernelError};
use burn::tensor::{DType, Int as BInt, Tensor as BTensor};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

/// The most tokens a row may ask for (OpenAI's and vLLM's bound).
pub const MAX_TOP: usize = 20;

/// No token: a unit that saw nothing eligible.
const NONE: u32 = 0xffff_ffff;

/// Whether (key, token) ranks above (best_key, best) (higher key, then lower token).
#[cube]
fn ranks_above(key: u32, token: u32, best_key: u32, best: u32) -> bool {
    best == NONE || key > best_key || (key == best_key && token < best)
}

/// Whether (key, token) ranks below the previous rank's (prev_key, prev) (everything does at
/// rank 0, where prev is `NONE`).
#[cube]
fn ranks_below(key: u32, token: u32, prev_key: u32, prev: u32) -> bool {
    prev == NONE || key < prev_key || (key == prev_key && token > prev)
}

/// The cube's best (key, token) (higher key, then lower token; `NONE` for a unit that saw
/// nothing): exact in any order, so the tree's shape is free. Every unit gets it.
#[cube]
fn tree_best(keys: &mut Shared<[u32]>, ids: &mut Shared<[u32]>, key: u32, token: u32) -> (u32, u32) {
    let unit = UNIT_POS_X as usize;
    keys[unit] = key;
    ids[unit] = token;
    sync_cube();
    let mut stride = (CUBE_DIM_X / 2u32) as usize;
    while stride > 0 {
        if unit < stride {
            let other_key = keys[unit + stride];
            let other = ids[unit + stride];
            let mine_key = keys[unit];
            let mine = ids[unit];
            if other != NONE && ranks_above(other_key, other, mine_key, mine) {
                keys[unit] = other_key;
                ids[unit] = other;
            }
        }
        sync_cube();
        stride /= 2;
    }
    let best = (keys[0], ids[0]);
    sync_cube();
    best
}

/// Pass 2, one cube per row: the normaliser, then `n` ranks, each one pass over the row.
#[cube(launch)]
fn top_tokens_kernel<F: Float, I: Int>(
    logits: &Tensor<F>,
    temperatures: &Tensor<f32>,
    chunk_max: &Tensor<f32>,
    chunk_sum: &Tensor<f32>,
    tokens: &mut Tensor<I>,
    logprobs: &mut Tensor<f32>,
    rows_arg: u32,
    vocab_arg: u32,
    chunks_arg: u32,
    n_arg: u32,
    #[comptime] block: usize,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let (vocab, chunks, n) = (vocab_arg as usize, chunks_arg as usize, n_arg as usize);
    let row = cube_linear();
    if row < rows_arg as usize {
        let inv_t = inv_temperature(temperatures[row]);
        let mut shared = Shared::new_slice(block);
        let (max, sum) = row_normaliser(chunk_max, chunk_sum, row * chunks, chunks, &mut shared, block);
        let log_sum = sum.ln();
        let mut keys = Shared::<[u32]>::new_slice(block);
        let mut ids = Shared::<[u32]>::new_slice(block);
        let mut prev_key = 0u32;
        let mut prev = u32::new(NONE as i64);
        for rank in 0..n {
            let mut best_key = 0u32;
            let mut best = u32::new(NONE as i64);
            let mut i = UNIT_POS_X as usize;
            while i < vocab {
                let key = order_key(scaled_logit(logits, row * vocab + i, inv_t));
                let token = i as u32;
                if ranks_below(key, token, prev_key, prev) && ranks_above(key, token, best_key, best) {
                    best_key = key;
                    best = token;
                }
                i += block;
            }
            // the best (key, token) of the cube: exact in any order
            let (won_key, won) = tree_best(&mut keys, &mut ids, best_key, best);
            prev_key = won_key;
            prev = won;
            if UNIT_POS_X == 0 {
                tokens[row * n + rank] = I::cast_from(prev);
                logprobs[row * n + rank] = scaled_logit(logits, row * vocab + prev as usize, inv_t) - max - log_sum;
            }
        }
    }
}

/// The `n` most likely tokens of each row of `logits` [rows, vocab] at the rows'
/// `temperatures` (0 or 1: the logits as they are), best first, with their logprobs:
/// ([rows * n] token ids, [rows * n] logprobs), row by row, on the device.
pub fn top_tokens(logits: BTensor<2>, temperatures: BTensor<1>, n: usize) -> Result<(BTensor<1, BInt>, BTensor<1>), KernelError> {
    const OP: &str = "top tokens";
    let logits = float_in(OP, "logits", logits)?;
    let ld = dims(&logits);
    let (rows, vocab) = (ld[0], ld[1]);
    ensure!(rows > 0 && vocab > 0, OP, "empty logits {ld:?}");
    ensure!((1..=MAX_TOP.min(vocab)).contains(&n), OP, "{n} tokens a row asked of a vocabulary of {vocab} (1 to {MAX_TOP})");
    let given = temperatures.dims()[0];
    ensure!(given == rows, OP, "logits have {rows} rows but {given} temperatures were given");
    ensure!(rows * vocab < u32::MAX as usize, OP, "logits [{rows}, {vocab}] exceed the u32 index range");
    let int_dtype = int_in(OP, "ids", BTensor::<1, BInt>::zeros([1], &temperatures.device()))?.dtype;
    let temps = float_in(OP, "temperatures", temperatures)?;
    let client = logits.client.clone();
    let alloc = |len: usize, dtype| empty_device_contiguous_dtype(client.clone(), logits.device.clone(), [len].into(), dtype);
    let stats = full_chunk_stats(&logits, &temps);
    let (tokens, logprobs) = (alloc(rows * n, int_dtype), alloc(rows * n, DType::F32));
    top_tokens_kernel::launch(
        &client,
        cube_count_for(rows, 1),
        CubeDim::new_1d(ROW_BLOCK as u32),
        logits.clone().into_tensor_arg(),
        temps.into_tensor_arg(),
        stats.max.into_tensor_arg(),
        stats.sum.into_tensor_arg(),
        tokens.clone().into_tensor_arg(),
        logprobs.clone().into_tensor_arg(),
        rows as u32,
        vocab as u32,
        stats.chunks as u32,
        n as u32,
        ROW_BLOCK,
        [storage(logits.dtype), storage(int_dtype)],
    );
    Ok((int_out(tokens), float_out(logprobs)))
}
