//! The online softmax statistics of the training path's attention backward, per query row:
//! `m` the running max of `q . k * scale` over the row's keys and `l` the sum of
//! `e^(q . k * scale - m)`, folded split by split in key order. The backward's query kernel
//! computes them itself ([`crate::ops::attention::backward::mma_backward`]), or the training forward
//! computes them in its first pass over the keys ([`crate::ops::attention::prefill::mma_flash`]) with
//! these same functions on the same score fragments, so both give the same bits and the
//! backward may skip its own pass. Also the approximate `2^x` of `LOCKSTEP_BACKWARD_MATH=fast`.

use crate::ops::reduce::NEG_BIG;
use burn_cubecl::cubecl::prelude::*;

/// The split's sum `sum_j e^(s_j scale - m)` over this lane's row `high` (0: g, 1: g + 8) of
/// the quad, keys in order within a lane, then lanes t = 0..3 in order.
#[cube]
pub(crate) fn row_exp_sum(s: &Array<f32>, valid: usize, scale: f32, m: f32, #[comptime] high: usize) -> f32 {
    let lane = UNIT_POS_X;
    let t = (lane % 4) as usize;
    let mut part = 0.0f32;
    #[unroll]
    for nt in 0..8usize {
        #[unroll]
        for e in 0..2usize {
            let j = nt * 8 + 2 * t + e;
            if j < valid {
                part += (s[comptime!(nt * 4 + high * 2 + e)] * scale - m).exp();
            }
        }
    }
    let quad = lane - lane % 4;
    ((plane_shuffle(part, quad) + plane_shuffle(part, quad + 1)) + plane_shuffle(part, quad + 2)) + plane_shuffle(part, quad + 3)
}

/// Folds one split into this lane's rows' statistics `ml` = [m_lo, l_lo, m_hi, l_hi] (rows g
/// and g + 8 of the warp's 16): `m' = max(m, split max)`, `l = l e^(m - m') + sum_j
/// e^(s_j scale - m')` ([`row_exp_sum`]'s order); a row with no key in the split keeps its
/// values. `split_lo` / `split_hi`: the rows' split maxima ([`crate::ops::attention::common::mma::row_max`]).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn fold_split_stats(s: &Array<f32>, ml: &mut Array<f32>, split_lo: f32, split_hi: f32, valid_lo: usize, valid_hi: usize, scale: f32) {
    let (m_lo, m_hi) = (ml[0], ml[2]);
    let mut new_lo = m_lo;
    if split_lo > new_lo {
        new_lo = split_lo;
    }
    let mut new_hi = m_hi;
    if split_hi > new_hi {
        new_hi = split_hi;
    }
    let sum_lo = row_exp_sum(s, valid_lo, scale, new_lo, 0usize);
    let sum_hi = row_exp_sum(s, valid_hi, scale, new_hi, 1usize);
    if valid_lo > 0 {
        ml[1] = ml[1] * (m_lo - new_lo).exp() + sum_lo;
        ml[0] = new_lo;
    }
    if valid_hi > 0 {
        ml[3] = ml[3] * (m_hi - new_hi).exp() + sum_hi;
        ml[2] = new_hi;
    }
}

/// The statistics before the first split: no max yet, an empty sum.
#[cube]
pub(crate) fn empty_stats(ml: &mut Array<f32>) {
    ml[0] = f32::new(NEG_BIG);
    ml[1] = 0.0f32;
    ml[2] = f32::new(NEG_BIG);
    ml[3] = 0.0f32;
}

/// log2(e): the fast backward's exponentials are `2^(x log2 e)`.
pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;

/// `2^x` by the multi-function unit's approximation (`ex2.approx.ftz.f32`, ~2 ulp): the
/// exponential of `LOCKSTEP_BACKWARD_MATH=fast` (other bits than the accurate `exp`).
#[cube]
pub(crate) fn exp2_approx(x: f32) -> f32 {
    let out: f32;
    gpu_asm!("ex2.approx.ftz.f32 {out}, {x};", x = in(_) x, out = out(_) out, options(nomem));
    out
}
