//! The definition of the truncation thresholds, kept as the readable reference that
//! [`super::truncation`]'s fast kernel is checked against as bits (tests and the GPU battery):
//! the bisection exactly as it reads, one pass over the row for each of its 64 steps. The fast
//! kernel takes the same decisions from the same sums (top-k's counts are exact; each top-p
//! mass is added in this kernel's per-unit order and tree), with fewer passes.

use crate::ops::logits::rows::{inv_temperature, order_key, row_max, scaled_logit};
use crate::ops::reduce::{cube_linear, tree_count, tree_sum};
use burn_cubecl::cubecl::prelude::*;

/// The definition: 32 single bisection steps for top-k, one pass over the row each, then the
/// survivors' mass and 32 single steps for top-p; one cube per row, rows that do not truncate
/// get 0.
#[cube(launch)]
pub(crate) fn definition_kernel<F: Float, I: Int>(
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
