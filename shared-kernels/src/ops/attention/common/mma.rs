//! Building blocks of the register-fragment attention kernels (CUDA, sm_80+): `mma.sync`,
//! `ldmatrix` and `cp.async` through inline PTX, and the steps of one split for a warp of 16
//! queries, which [`crate::ops::attention::prefill::mma_flash`] (prefill) and [`crate::ops::attention::decode::mma_decode`]
//! (decode partials) share, so that both compute a split operation for operation alike.
//!
//! A warp's 16 queries are the rows of `mma.m16n8k16` fragments: lane l holds rows g = l / 4
//! and g + 8, columns 2t, 2t + 1 (t = l % 4) of every 8-column block. Their arithmetic is the
//! cmma partial kernel's ([`crate::ops::attention::decode::cmma`]), step by step:
//! - S = Q Kᵀ: `mma.m16n8k16` chains over head_dim, k ascending from zero, f32 accumulators. A
//!   `cmma` 16x16x16 is two such instructions on the same fragments (battery: the two prefill
//!   kernels against the decode path);
//! - a query's split max over its valid scaled scores (max is exact in any order: the quad of
//!   lanes holding a row reduces it by shuffles);
//! - p = exp(s * scale - max) cast to the input dtype; the split sum l is four sums of 16 keys
//!   each in key order, added in quarter order: P goes through a per-warp shared stage once so
//!   one lane can add a quarter in key order;
//! - O = P V: the rounded P as the A fragment straight from registers, keys ascending from
//!   zero in chunks of 16.

use crate::ops::attention::common::splits::KV_SPLIT;
use crate::ops::attention::common::staging::PAD;
pub(crate) use crate::ops::ptx::{commit_copies, wait_copies};
use crate::ops::reduce::NEG_BIG;
use burn_cubecl::cubecl::prelude::*;

/// u32 words (two 16-bit p) per row of a warp's P stage: 32 + 4, so a quad's stores of 8 rows
/// hit 32 different banks.
pub(crate) const LDPW: usize = KV_SPLIT / 2 + 4;
pub(crate) const SMEM_ALIGN: usize = 128;

/// `mma.sync.m16n8k16` with f32 accumulators: d = a b + c (fragments as PTX lays them out).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mma16816(
    a0: u32,
    a1: u32,
    a2: u32,
    a3: u32,
    b0: u32,
    b1: u32,
    c0: f32,
    c1: f32,
    c2: f32,
    c3: f32,
    #[comptime] f16: bool,
) -> Vector<f32, Const<4>> {
    let ptx = comptime!(if f16 {
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    } else {
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
    });
    let d: Vector<f32, Const<4>>;
    gpu_asm!(
        "{ptx} {d}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{c0}, {c1}, {c2}, {c3}}};",
        d = out(_) d,
        a0 = in(_) a0,
        a1 = in(_) a1,
        a2 = in(_) a2,
        a3 = in(_) a3,
        b0 = in(_) b0,
        b1 = in(_) b1,
        c0 = in(_) c0,
        c1 = in(_) c1,
        c2 = in(_) c2,
        c3 = in(_) c3,
        options(pure, nomem)
    );
    d
}

/// Four 8x8 16-bit matrices from shared memory (`ldmatrix .x4`): lane i gives the address of row
/// i % 8 of matrix i / 8; `trans` delivers each matrix transposed.
#[cube]
pub(crate) fn ldmatrix_x4(addr: u32, #[comptime] trans: bool) -> Vector<u32, Const<4>> {
    let ptx = comptime!(if trans {
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
    } else {
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
    });
    let out: Vector<u32, Const<4>>;
    gpu_asm!("{ptx} {out}, [{addr}];", out = out(_) out, addr = in(_) addr);
    out
}

/// Two f32 rounded to the dtype (the cast the partial kernel applies to p) in one word, `lo` in
/// the low half: a row's two adjacent columns of an `mma` A fragment.
#[cube]
pub(crate) fn pack_pair<F: Float>(lo: f32, hi: f32) -> u32 {
    let l = u16::reinterpret(F::cast_from(lo));
    let h = u16::reinterpret(F::cast_from(hi));
    u32::cast_from(l) | (u32::cast_from(h) << 16u32)
}

/// The dtype value in the low (`high` false) or high half of `w`, as f32 (exact).
#[cube]
pub(crate) fn unpack_half<F: Float>(w: u32, #[comptime] high: bool) -> f32 {
    let mut bits = w & 0xffffu32;
    if comptime!(high) {
        bits = w >> 16u32;
    }
    f32::cast_from(F::reinterpret(u16::cast_from(bits)))
}

/// S = Q Kᵀ for this warp's 16 queries against the 64 keys staged at byte address `k_addr`:
/// `s[nt * 4 + c]` is fragment element c of key block nt (keys 8 nt ..), k over head_dim
/// ascending from zero.
#[cube]
pub(crate) fn warp_scores(
    qa: &Array<u32>,
    k_addr: u32,
    s: &mut Array<f32>,
    #[comptime] head_dim: usize,
    #[comptime] f16: bool,
) {
    let lane = UNIT_POS_X;
    let ld_bytes = comptime!(((head_dim + PAD) * 2) as u32);
    #[unroll]
    for i in 0..32usize {
        s[i] = 0.0f32;
    }
    // lane i addresses row i % 8 of matrix i / 8: keys 8 (i / 16) + i % 8, dims 8 ((i / 8) % 2)
    let lane_addr = k_addr + ((lane / 16) * 8 + lane % 8) * ld_bytes + ((lane / 8) % 2) * 16;
    #[unroll]
    for kc in 0..comptime!(head_dim / 16) {
        #[unroll]
        for np in 0..4usize {
            let b = ldmatrix_x4(
                lane_addr + comptime!((np * 16) as u32) * ld_bytes + comptime!((kc * 32) as u32),
                false,
            );
            #[unroll]
            for h in 0..2usize {
                let nt = comptime!(2 * np + h);
                let d = mma16816(
                    qa[comptime!(kc * 4)],
                    qa[comptime!(kc * 4 + 1)],
                    qa[comptime!(kc * 4 + 2)],
                    qa[comptime!(kc * 4 + 3)],
                    b.extract(comptime!(2 * h)),
                    b.extract(comptime!(2 * h + 1)),
                    s[comptime!(nt * 4)],
                    s[comptime!(nt * 4 + 1)],
                    s[comptime!(nt * 4 + 2)],
                    s[comptime!(nt * 4 + 3)],
                    f16,
                );
                #[unroll]
                for c in 0..4usize {
                    s[comptime!(nt * 4 + c)] = d.extract(c);
                }
            }
        }
    }
}

/// The largest valid scaled score of this lane's row `high` (0: row g, 1: row g + 8) over the
/// quad holding it; NEG_BIG when it has none. Max is exact, so any order gives the row's max.
#[cube]
pub(crate) fn row_max(s: &Array<f32>, valid: usize, scale: f32, #[comptime] high: usize) -> f32 {
    let t = (UNIT_POS_X % 4) as usize;
    let mut m = f32::new(NEG_BIG);
    #[unroll]
    for nt in 0..8usize {
        #[unroll]
        for e in 0..2usize {
            let j = nt * 8 + 2 * t + e;
            let score = s[comptime!(nt * 4 + high * 2 + e)] * scale;
            if j < valid && score > m {
                m = score;
            }
        }
    }
    let other = plane_shuffle_xor(m, 1u32);
    if other > m {
        m = other;
    }
    let other = plane_shuffle_xor(m, 2u32);
    if other > m {
        m = other;
    }
    m
}

/// p for this lane's S fragment (0 past a row's `valid` keys): the A fragments of P V into `pa`
/// (`pa[nt * 2 + h]`: key block nt, row g (h = 0) or g + 8) and the same words into the warp's P
/// stage rows `p_row_lo` / `p_row_hi`. The caller syncs the warp before the stage is read.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn warp_probs<F: Float>(
    s: &Array<f32>,
    pa: &mut Array<u32>,
    p_sh: &mut Shared<[u32]>,
    p_row_lo: usize,
    p_row_hi: usize,
    valid_lo: usize,
    valid_hi: usize,
    max_lo: f32,
    max_hi: f32,
    scale: f32,
) {
    let t = (UNIT_POS_X % 4) as usize;
    #[unroll]
    for nt in 0..8usize {
        #[unroll]
        for h in 0..2usize {
            let mut valid = valid_lo;
            let mut m = max_lo;
            let mut row = p_row_lo;
            if comptime!(h == 1) {
                valid = valid_hi;
                m = max_hi;
                row = p_row_hi;
            }
            let j = nt * 8 + 2 * t;
            let mut e0 = 0.0f32;
            let mut e1 = 0.0f32;
            if j < valid {
                e0 = (s[comptime!(nt * 4 + 2 * h)] * scale - m).exp();
            }
            if j + 1 < valid {
                e1 = (s[comptime!(nt * 4 + 2 * h + 1)] * scale - m).exp();
            }
            let w = pack_pair::<F>(e0, e1);
            pa[comptime!(nt * 2 + h)] = w;
            p_sh[row + nt * 4 + t] = w;
        }
    }
}

/// The split sum of the P stage row `p_row` (this lane's row g or g + 8): lane t of the quad adds
/// quarter t (keys 16t ..) in key order, then every lane adds the four in quarter order. p = 0
/// past a row's keys adds nothing to a sum of non-negative values.
#[cube]
pub(crate) fn row_sum<F: Float>(p_sh: &Shared<[u32]>, p_row: usize) -> f32 {
    let lane = UNIT_POS_X;
    let t = (lane % 4) as usize;
    let mut quarter = 0.0f32;
    #[unroll]
    for wi in 0..8usize {
        let w = p_sh[p_row + t * 8 + wi];
        quarter += unpack_half::<F>(w, false);
        quarter += unpack_half::<F>(w, true);
    }
    let quad = lane - lane % 4;
    ((plane_shuffle(quarter, quad) + plane_shuffle(quarter, quad + 1))
        + plane_shuffle(quarter, quad + 2))
        + plane_shuffle(quarter, quad + 3)
}

/// The lane's `ldmatrix .trans` address into a `[64][head_dim + PAD]` V stage at byte address
/// `stage`: lane i addresses row i % 8 of matrix i / 8, keys 8 ((i / 8) % 2) + i % 8, dims
/// 8 (i / 16).
#[cube]
pub(crate) fn value_lane_address(stage: u32, #[comptime] head_dim: usize) -> u32 {
    let lane = UNIT_POS_X;
    stage
        + (((lane / 8) % 2) * 8 + lane % 8) * comptime!(((head_dim + PAD) * 2) as u32)
        + (lane / 16) * 16
}

/// O = P V for 32 output dims: `o[nt * 4 + c]` for the 4 dim blocks at byte `v_addr` (from
/// [`value_lane_address`], offset to the group's first dim), keys ascending from zero.
#[cube]
pub(crate) fn warp_values(
    pa: &Array<u32>,
    v_addr: u32,
    o: &mut Array<f32>,
    #[comptime] head_dim: usize,
    #[comptime] f16: bool,
) {
    let ld_bytes = comptime!(((head_dim + PAD) * 2) as u32);
    #[unroll]
    for i in 0..16usize {
        o[i] = 0.0f32;
    }
    #[unroll]
    for kc in 0..4usize {
        #[unroll]
        for np in 0..2usize {
            let b = ldmatrix_x4(
                v_addr + comptime!((kc * 16) as u32) * ld_bytes + comptime!((np * 32) as u32),
                true,
            );
            #[unroll]
            for h in 0..2usize {
                let nt = comptime!(2 * np + h);
                let d = mma16816(
                    pa[comptime!(kc * 4)],
                    pa[comptime!(kc * 4 + 1)],
                    pa[comptime!(kc * 4 + 2)],
                    pa[comptime!(kc * 4 + 3)],
                    b.extract(comptime!(2 * h)),
                    b.extract(comptime!(2 * h + 1)),
                    o[comptime!(nt * 4)],
                    o[comptime!(nt * 4 + 1)],
                    o[comptime!(nt * 4 + 2)],
                    o[comptime!(nt * 4 + 3)],
                    f16,
                );
                #[unroll]
                for c in 0..4usize {
                    o[comptime!(nt * 4 + c)] = d.extract(c);
                }
            }
        }
    }
}

/// This warp's Q fragments (`qa[kc * 4 + r]`, k chunk kc) from a `[queries][head_dim + PAD]`
/// stage at byte address `stage`: lane i addresses row i % 8 of matrix i / 8, queries
/// 16 w + 8 ((i / 8) % 2) + i % 8, dims 8 (i / 16).
#[cube]
pub(crate) fn query_fragments(stage: u32, qa: &mut Array<u32>, #[comptime] head_dim: usize) {
    let lane = UNIT_POS_X;
    let ld_bytes = comptime!(((head_dim + PAD) * 2) as u32);
    let addr =
        stage + (UNIT_POS_Y * 16 + ((lane / 8) % 2) * 8 + lane % 8) * ld_bytes + (lane / 16) * 16;
    #[unroll]
    for kc in 0..comptime!(head_dim / 16) {
        let a = ldmatrix_x4(addr + comptime!((kc * 32) as u32), false);
        #[unroll]
        for r in 0..4usize {
            qa[comptime!(kc * 4 + r)] = a.extract(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;


    #[test]
    fn the_p_stage_stores_are_free_of_bank_conflicts() {
        // a warp's P-stage stores (rows g, words 4 nt + t) land in 32 different banks
        let banks: std::collections::BTreeSet<usize> = (0..8)
            .flat_map(|g| (0..4).map(move |t| (g * LDPW + t) % 32))
            .collect();
        assert_eq!(banks.len(), 32);
    }
}
