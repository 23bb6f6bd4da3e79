//! Seeded sampling with temperature, top-k and top-p, one row per cube, batch invariant.
//!
//! Distribution: `softmax(logits / T)` restricted to the top-k tokens, then to the smallest
//! head of that set holding at least `top_p` of its mass, renormalised. A draw is Gumbel-max
//! over the allowed tokens: `argmax_j z_j - ln(-ln u_j)` with `u_j` a hash of the row's key
//! (itself a hash of seed, request and position, see [`row_rng_key`]) and of the token id `j`.
//! The noise therefore depends only on (seed, request, position, token), never on the batch,
//! and argmax with lowest-index tie-breaking is exact in any reduction order.
//!
//! Truncation thresholds are found by bisection over the order-preserving u32 image of the
//! scaled logits; each step counts (top-k) or sums (top-p) with the fixed tree. Tokens tied
//! at the top-k boundary are all kept. T = 0 is greedy: argmax of the logits.
//!
//! The returned logprob is the one [`super::logprob`] defines (full softmax at temperature T,
//! before truncation) and is computed with the same functions, so it equals the trainer's bits.

use super::logprob::{inv_temperature, row_max, row_sum_exp, scaled_logit};
use super::reduce::{cube_linear, tree_count, tree_sum, NEG_BIG};
use super::{cube_count_for, storage, ROW_BLOCK};
use crate::bridge::{dims, float_in, float_out, int_in, int_out};
use crate::{ensure, KernelError};
use burn::tensor::{Device, Int as BInt, Tensor as BTensor, TensorData};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

/// One row's sampling parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingRow {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = no top-k truncation.
    pub top_k: u32,
    /// In (0, 1]; 1 = no top-p truncation.
    pub top_p: f32,
    /// From [`row_rng_key`].
    pub rng_key: u32,
}

/// Chris Wellons' lowbias32 integer hash (good avalanche, two multiplies).
pub fn lowbias32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// The per-row key of the counter-based RNG: a hash of (seed, request, position) only.
pub fn row_rng_key(seed: u64, request: u64, position: u32) -> u32 {
    let mut h = lowbias32(seed as u32 ^ 0x6a09_e667);
    h = lowbias32(h ^ (seed >> 32) as u32);
    h = lowbias32(h ^ request as u32);
    h = lowbias32(h ^ (request >> 32) as u32);
    lowbias32(h ^ position)
}

/// Host twin of the kernel's uniform draw for token `j`: (h >> 8 + 0.5) / 2^24, in (0, 1).
pub fn token_uniform(row_key: u32, token: u32) -> f32 {
    let h = lowbias32(row_key ^ lowbias32(token ^ 0x9e37_79b9));
    ((h >> 8) as f32 + 0.5) * (1.0 / 16_777_216.0)
}

#[cube]
fn lowbias32_dev(value: u32) -> u32 {
    let mut x = value;
    x ^= x >> 16u32;
    x *= 0x7feb_352du32;
    x ^= x >> 15u32;
    x *= 0x846c_a68bu32;
    x ^ (x >> 16u32)
}

/// Order-preserving map of a finite f32 onto u32.
#[cube]
fn order_key(z: f32) -> u32 {
    let bits = u32::reinterpret(z);
    let mut key = bits ^ 0x8000_0000u32;
    if bits >= 0x8000_0000u32 {
        key = !bits;
    }
    key
}

#[cube(launch)]
fn sample_kernel<F: Float, I: Int>(
    logits: &Tensor<F>,
    temperatures: &Tensor<f32>,
    top_ks: &Tensor<I>,
    top_ps: &Tensor<f32>,
    rng_keys: &Tensor<I>,
    tokens: &mut Tensor<I>,
    logprobs: &mut Tensor<f32>,
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
        let mut best_idx = Shared::<[u32]>::new_slice(block);
        let max = row_max(logits, base, vocab, inv_t, &mut shared, block);
        let sum = row_sum_exp(logits, base, vocab, inv_t, max, &mut shared, block);

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

        // Gumbel-max (or plain argmax when greedy) over allowed tokens, lowest index on ties.
        let key = u32::cast_from(rng_keys[row]);
        let mut my_best = f32::new(NEG_BIG);
        let mut my_idx = 0xffff_ffffu32;
        let mut i = unit;
        while i < vocab {
            let z = scaled_logit(logits, base + i, inv_t);
            if order_key(z) >= threshold {
                let mut score = z;
                if temperature > 0.0f32 {
                    let h = lowbias32_dev(key ^ lowbias32_dev((i as u32) ^ 0x9e37_79b9u32));
                    let u = (f32::cast_from(h >> 8u32) + 0.5f32) * (1.0f32 / 16_777_216.0f32);
                    score = z - (-u.ln()).ln();
                }
                if score > my_best || my_idx == 0xffff_ffffu32 {
                    my_best = score;
                    my_idx = i as u32;
                }
            }
            i += block;
        }
        shared[unit] = my_best;
        best_idx[unit] = my_idx;
        sync_cube();
        let mut stride = (CUBE_DIM_X / 2u32) as usize; // == block / 2: launchers use block units
        while stride > 0 {
            if unit < stride {
                let other = shared[unit + stride];
                let other_idx = best_idx[unit + stride];
                let mine_idx = best_idx[unit];
                let take = other_idx != 0xffff_ffffu32
                    && (mine_idx == 0xffff_ffffu32
                        || other > shared[unit]
                        || (other == shared[unit] && other_idx < mine_idx));
                if take {
                    shared[unit] = other;
                    best_idx[unit] = other_idx;
                }
            }
            sync_cube();
            stride /= 2;
        }
        if unit == 0 {
            let token = best_idx[0] as usize;
            tokens[row] = I::cast_from(token as u32);
            logprobs[row] = scaled_logit(logits, base + token, inv_t) - max - sum.ln();
        }
    }
}

/// Draw one token per row of `logits` [rows, vocab]. Returns (tokens [rows], logprobs [rows]).
pub fn sample(logits: BTensor<2>, params: &[SamplingRow]) -> Result<(BTensor<1, BInt>, BTensor<1>), KernelError> {
    const OP: &str = "sample";
    let device: Device = logits.device();
    let logits = float_in(OP, "logits", logits)?;
    let ld = dims(&logits);
    let (rows, vocab) = (ld[0], ld[1]);
    ensure!(rows > 0 && vocab > 0, OP, "empty logits {ld:?}");
    ensure!(params.len() == rows, OP, "logits have {rows} rows but {} parameter rows were given", params.len());
    for (r, p) in params.iter().enumerate() {
        ensure!(p.temperature.is_finite() && p.temperature >= 0.0, OP, "row {r}: temperature must be >= 0, got {}", p.temperature);
        ensure!(p.top_p > 0.0 && p.top_p <= 1.0, OP, "row {r}: top_p must be in (0, 1], got {}", p.top_p);
        ensure!(vocab < u32::MAX as usize, OP, "vocabulary too large: {vocab}");
    }
    let f32s = |v: Vec<f32>| BTensor::<1>::from_data(TensorData::new(v, [rows]), &device);
    let ints = |v: Vec<i64>| BTensor::<1, BInt>::from_data(TensorData::new(v, [rows]), &device);
    let temps = float_in(OP, "temperatures", f32s(params.iter().map(|p| p.temperature).collect()))?;
    let top_ps = float_in(OP, "top_p", f32s(params.iter().map(|p| p.top_p).collect()))?;
    let top_ks = int_in(OP, "top_k", ints(params.iter().map(|p| p.top_k as i64).collect()))?;
    let keys = int_in(OP, "rng_key", ints(params.iter().map(|p| p.rng_key as i32 as i64).collect()))?;
    ensure!(top_ks.dtype.size() >= 4, OP, "the device's int dtype {:?} cannot hold 32-bit keys", top_ks.dtype);
    let client = logits.client.clone();
    let tokens = empty_device_contiguous_dtype(client.clone(), logits.device.clone(), [rows].into(), top_ks.dtype);
    let lps = empty_device_contiguous_dtype(client.clone(), logits.device.clone(), [rows].into(), burn::tensor::DType::F32);
    sample_kernel::launch(
        &client,
        cube_count_for(rows, 1),
        CubeDim::new_1d(ROW_BLOCK as u32),
        logits.clone().into_tensor_arg(),
        temps.into_tensor_arg(),
        top_ks.clone().into_tensor_arg(),
        top_ps.into_tensor_arg(),
        keys.into_tensor_arg(),
        tokens.clone().into_tensor_arg(),
        lps.clone().into_tensor_arg(),
        rows as u32,
        vocab as u32,
        ROW_BLOCK,
        [storage(logits.dtype), storage(top_ks.dtype)],
    );
    Ok((int_out(tokens), float_out(lps)))
}
