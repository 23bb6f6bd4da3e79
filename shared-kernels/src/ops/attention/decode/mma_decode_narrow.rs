//! Decode partials with the queries on the `mma`'s narrow side (CUDA, sm_80+): the same
//! partial as [`super::mma_decode`] (one split's max, sum and P V per query), computed as
//! Sᵀ = K Qᵀ and Oᵀ = Vᵀ Pᵀ so a cube's ≤ 8 queries are the 8 columns of `mma.m16n8k16` and
//! the keys and dims its 16 rows.
//!
//! Why: a decode cube holds one row's query heads of one KV head (2 for Qwen3 0.6B-1.7B, 4 at
//! 4B-8B). As the 16 rows of the fragments (the prefill layout) 14 or 12 of them compute
//! nothing; as the 8 columns, half the `mma`s, `ldmatrix`es and exponentials a split do the
//! same work (32 + 32 `mma`s instead of 64 + 64 at head_dim 128).
//! Measured on the H200 (`lockstep bench --attention-only`): 3-8% faster than the
//! 16-row kernel at 16-256 rows x 1,024-4,096 keys, within noise at 128 keys; 1.07x the
//! 1.7B shape's decode tokens/s at 256 requests x 1,024 tokens; the default
//! wherever a KV head's query heads fit.
//!
//! Why the same bits: every output is the same sum of the same exact products in the same
//! k-chunks: a score over head_dim in chunks of 16 from zero, an output over the split's keys
//! in chunks of 16 from zero; only which operand is A and which B changes. The max is exact in
//! any order; p = exp(s * scale - max) is the same f32 expression rounded to the dtype; the
//! split sum reads the same `[query][LDPW]` P stage with [`row_sum`] (quarters in key order).
//! On the H200 the bench's launch rows compare it with the 16-row kernel as bits (bf16) and the
//! battery's decode rows with prefill tiles; f16 rests on the same argument, unmeasured.

use crate::ops::attention::common::splits::KV_SPLIT;
use crate::ops::attention::common::mma::{
    ldmatrix_x4, mma16816, pack_pair, row_sum, wait_copies, commit_copies, LDPW, SMEM_ALIGN,
};
use crate::ops::attention::decode::cmma::TC_QUERIES;
use crate::ops::attention::common::staging::{issue_split, query_keys, stage_queries, valid_in_split, PAD};
use crate::ops::ptx::shared_address;
use crate::ops::reduce::{cube_linear, NEG_BIG};
use burn_cubecl::cubecl::prelude::*;

pub use crate::ops::attention::route::NARROW_QUERIES;

/// This lane's B fragments of the queries, `qb[kc * 2 + r]`: query g, dims 16 kc + 8 r + 2t and
/// + 1, from the `[queries][head_dim + PAD]` stage at byte address `stage`. Lane i addresses
/// row i % 8 (a query) of matrix i / 8 (dims 8 (i / 8) of a pair of k chunks).
#[cube]
fn query_b_fragments(stage: u32, qb: &mut Array<u32>, #[comptime] head_dim: usize) {
    let lane = UNIT_POS_X;
    let ld_bytes = comptime!(((head_dim + PAD) * 2) as u32);
    let addr = stage + (lane % 8) * ld_bytes + (lane / 8) * 16;
    #[unroll]
    for kp in 0..comptime!(head_dim / 32) {
        let b = ldmatrix_x4(addr + comptime!((kp * 64) as u32), false);
        #[unroll]
        for r in 0..4usize {
            qb[comptime!(kp * 4 + r)] = b.extract(r);
        }
    }
}

/// Sᵀ = K Qᵀ for the 64 keys staged at byte address `k_addr`: `s[kb * 4 + c]` is the score of
/// key 16 kb + g (c < 2) or 16 kb + g + 8 and query 2t + c % 2, k over head_dim ascending from
/// zero in chunks of 16, as [`crate::ops::attention::common::mma::warp_scores`] chains it.
#[cube]
fn narrow_scores(qb: &Array<u32>, k_addr: u32, s: &mut Array<f32>, #[comptime] head_dim: usize, #[comptime] f16: bool) {
    let lane = UNIT_POS_X;
    let ld_bytes = comptime!(((head_dim + PAD) * 2) as u32);
    #[unroll]
    for i in 0..16usize {
        s[i] = 0.0f32;
    }
    // lane i addresses row i % 8 of matrix i / 8: keys 8 ((i / 8) % 2) + i % 8, dims 8 (i / 16)
    let lane_addr = k_addr + (((lane / 8) % 2) * 8 + lane % 8) * ld_bytes + (lane / 16) * 16;
    #[unroll]
    for kc in 0..comptime!(head_dim / 16) {
        #[unroll]
        for kb in 0..4usize {
            let a = ldmatrix_x4(lane_addr + comptime!((kb * 16) as u32) * ld_bytes + comptime!((kc * 32) as u32), false);
            let d = mma16816(
                a.extract(0usize),
                a.extract(1usize),
                a.extract(2usize),
                a.extract(3usize),
                qb[comptime!(kc * 2)],
                qb[comptime!(kc * 2 + 1)],
                s[comptime!(kb * 4)],
                s[comptime!(kb * 4 + 1)],
                s[comptime!(kb * 4 + 2)],
                s[comptime!(kb * 4 + 3)],
                f16,
            );
            #[unroll]
            for c in 0..4usize {
                s[comptime!(kb * 4 + c)] = d.extract(c);
            }
        }
    }
}

/// The largest valid scaled score of query 2t + `e` in the split: this lane's 8 keys, then over
/// the 8 lanes holding that query (shuffles across g). Max is exact, so any order gives it.
#[cube]
fn narrow_max(s: &Array<f32>, valid: usize, scale: f32, #[comptime] e: usize) -> f32 {
    let g = (UNIT_POS_X / 4) as usize;
    let mut m = f32::new(NEG_BIG);
    #[unroll]
    for kb in 0..4usize {
        #[unroll]
        for h in 0..2usize {
            let j = kb * 16 + h * 8 + g;
            let score = s[comptime!(kb * 4 + h * 2 + e)] * scale;
            if j < valid && score > m {
                m = score;
            }
        }
    }
    let other = plane_shuffle_xor(m, 4u32);
    if other > m {
        m = other;
    }
    let other = plane_shuffle_xor(m, 8u32);
    if other > m {
        m = other;
    }
    let other = plane_shuffle_xor(m, 16u32);
    if other > m {
        m = other;
    }
    m
}

/// p for this lane's scores (0 past a query's `valid` keys) into the P stage as `[query][LDPW]`
/// words of two keys (word w: keys 2w, 2w + 1, as [`crate::ops::attention::common::mma::warp_probs`] lays them out).
/// Lanes g and g ^ 1 hold neighbouring keys: they swap values, and the even one writes query
/// 2t's word, the odd one query 2t + 1's. The caller syncs the warp before the stage is read.
#[cube]
#[allow(clippy::too_many_arguments)]
fn narrow_probs<F: Float>(
    s: &Array<f32>,
    p_sh: &mut Shared<[u32]>,
    valid0: usize,
    valid1: usize,
    max0: f32,
    max1: f32,
    scale: f32,
) {
    let lane = UNIT_POS_X;
    let g = (lane / 4) as usize;
    let t = (lane % 4) as usize;
    #[unroll]
    for kb in 0..4usize {
        #[unroll]
        for h in 0..2usize {
            let key = kb * 16 + h * 8 + g;
            let mut e0 = 0.0f32;
            let mut e1 = 0.0f32;
            if key < valid0 {
                e0 = (s[comptime!(kb * 4 + h * 2)] * scale - max0).exp();
            }
            if key < valid1 {
                e1 = (s[comptime!(kb * 4 + h * 2 + 1)] * scale - max1).exp();
            }
            let n0 = plane_shuffle_xor(e0, 4u32);
            let n1 = plane_shuffle_xor(e1, 4u32);
            if g % 2 == 0 {
                p_sh[2 * t * comptime!(LDPW) + key / 2] = pack_pair::<F>(e0, n0);
            } else {
                p_sh[(2 * t + 1) * comptime!(LDPW) + key / 2] = pack_pair::<F>(n1, e1);
            }
        }
    }
}

/// Oᵀ = Vᵀ Pᵀ for the split, one block of 16 dims at a time, keys ascending from zero in chunks
/// of 16 (each output the chain [`crate::ops::attention::common::mma::warp_values`] computes), written as the partials
/// of queries 2t (`base0`) and 2t + 1 (`base1`): element c of dim block db is dim 16 db + g
/// (c < 2) or + 8, query 2t + c % 2. `pb[kc * 2 + r]`: query g's p of keys 16 kc + 8 r + 2t, + 1.
#[cube]
#[allow(clippy::too_many_arguments)]
fn narrow_values(
    pb: &Array<u32>,
    v_stage: u32,
    partials: &mut Tensor<f32>,
    base0: usize,
    base1: usize,
    write0: bool,
    write1: bool,
    #[comptime] head_dim: usize,
    #[comptime] f16: bool,
) {
    let lane = UNIT_POS_X;
    let g = (lane / 4) as usize;
    let ld_bytes = comptime!(((head_dim + PAD) * 2) as u32);
    // `.trans`: lane i addresses row i % 8 of matrix i / 8: keys 8 (i / 16) + i % 8, dims 8 ((i / 8) % 2)
    let addr = v_stage + ((lane / 16) * 8 + lane % 8) * ld_bytes + ((lane / 8) % 2) * 16;
    #[unroll]
    for db in 0..comptime!(head_dim / 16) {
        // an array, not four mutable locals: a mutable local given to `gpu_asm!` is passed as its address
        let mut o = Array::<f32>::new(4usize);
        #[unroll]
        for c in 0..4usize {
            o[c] = 0.0f32;
        }
        #[unroll]
        for kc in 0..4usize {
            let a = ldmatrix_x4(addr + comptime!((kc * 16) as u32) * ld_bytes + comptime!((db * 32) as u32), true);
            let d = mma16816(a.extract(0usize), a.extract(1usize), a.extract(2usize), a.extract(3usize), pb[comptime!(kc * 2)], pb[comptime!(kc * 2 + 1)], o[0usize], o[1usize], o[2usize], o[3usize], f16);
            #[unroll]
            for c in 0..4usize {
                o[c] = d.extract(c);
            }
        }
        let dim = comptime!(db * 16) + g;
        if write0 {
            partials[base0 + 2 + dim] = o[0usize];
            partials[base0 + 10 + dim] = o[2usize];
        }
        if write1 {
            partials[base1 + 2 + dim] = o[1usize];
            partials[base1 + 10 + dim] = o[3usize];
        }
    }
}

/// The decode partials of one-row tiles with at most [`NARROW_QUERIES`] heads a cube: one warp a
/// cube, `per_cube_arg` consecutive splits, K then V through one stage (as `mma_decode`'s
/// one-stage launch), the same partials layout.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mma_partial_narrow_kernel<F: Float, N: Size, I: Int>(
    q: &Tensor<Vector<F, N>>,
    k_cache: &Tensor<Vector<F, N>>,
    v_cache: &Tensor<Vector<F, N>>,
    slots: &Tensor<I>,
    positions: &Tensor<I>,
    tiles: &Tensor<I>,
    block_rows: &Tensor<I>,
    partials: &mut Tensor<f32>,
    tiles_arg: u32,
    q_heads_arg: u32,
    kv_heads_arg: u32,
    width_arg: u32,
    splits_arg: u32,
    heads_per_cube_arg: u32,
    per_cube_arg: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
    #[comptime] f16: bool,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let q_heads = q_heads_arg as usize;
    let kv_heads = kv_heads_arg as usize;
    let width = width_arg as usize;
    let splits = splits_arg as usize;
    let per_cube = per_cube_arg as usize;
    let chunks = (splits + per_cube - 1) / per_cube;
    let hpc = heads_per_cube_arg as usize;
    let group = q_heads / kv_heads;
    let parts = group / hpc;
    let work = cube_linear(); // ((tile * kv_heads + kv_head) * parts + part) * chunks + chunk
    let chunk = work % chunks;
    let part = (work / chunks) % parts;
    let kv_head = (work / (chunks * parts)) % kv_heads;
    let tile = work / (chunks * parts * kv_heads);
    let lane = UNIT_POS_X;
    let g = (lane / 4) as usize;
    let t = (lane % 4) as usize;
    if tile < tiles_arg as usize {
        let first_row = u32::cast_from(tiles[2 * tile]) as usize;
        let count = u32::cast_from(tiles[2 * tile + 1]) as usize;
        let queries = count * hpc;
        let first_head = kv_head * group + part * hpc;
        let slot = u32::cast_from(slots[first_row]) as usize;
        let mut q_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(NARROW_QUERIES * (head_dim + PAD) / vs), comptime!(SMEM_ALIGN));
        let mut stage = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(KV_SPLIT * (head_dim + PAD) / vs), comptime!(SMEM_ALIGN));
        let mut p_sh = Shared::<[u32]>::new_aligned_slice(comptime!(NARROW_QUERIES * LDPW), comptime!(SMEM_ALIGN));
        let mut keys_sh = Shared::<[u32]>::new_slice(comptime!(TC_QUERIES));
        let most_keys = query_keys(positions, &mut keys_sh, first_row, queries, hpc, TC_QUERIES);
        let used = most_keys.div_ceil(comptime!(KV_SPLIT));
        let first_split = chunk * per_cube;
        let mut end = first_split + per_cube;
        if end > used {
            end = used;
        }
        if first_split < end {
            issue_split::<F, N, I>(k_cache, &mut stage, block_rows, slot, width, first_split, most_keys, kv_heads, kv_head, head_dim, vs, 32usize);
            commit_copies();
            stage_queries::<F, N>(q, &mut q_sh, first_row, queries, hpc, first_head, q_heads, 0, head_dim, vs, comptime!(NARROW_QUERIES), 32usize);
            sync_cube();
            let mut qb = Array::<u32>::new(comptime!(head_dim / 8));
            query_b_fragments(shared_address::<Vector<F, N>>(&q_sh), &mut qb, head_dim);
            let stage_at = shared_address::<Vector<F, N>>(&stage);
            // this lane's two queries (outputs, maxima) and its quad's one (sums)
            let q0 = 2 * t;
            let q1 = q0 + 1;
            let pair0 = (first_row + q0 / hpc) * q_heads + first_head + q0 % hpc;
            let pair1 = (first_row + q1 / hpc) * q_heads + first_head + q1 % hpc;
            let pair_g = (first_row + g / hpc) * q_heads + first_head + g % hpc;
            let keys0 = keys_sh[q0] as usize;
            let keys1 = keys_sh[q1] as usize;
            let keys_g = keys_sh[g] as usize;
            let mut pb = Array::<u32>::new(8usize);
            for split in first_split..end {
                let first = split * comptime!(KV_SPLIT);
                let valid0 = valid_in_split(keys0, first);
                let valid1 = valid_in_split(keys1, first);
                let valid_g = valid_in_split(keys_g, first);
                let write0 = q0 < queries && valid0 > 0;
                let write1 = q1 < queries && valid1 > 0;
                let base0 = (pair0 * splits + split) * comptime!(head_dim + 2);
                let base1 = (pair1 * splits + split) * comptime!(head_dim + 2);
                let base_g = (pair_g * splits + split) * comptime!(head_dim + 2);
                wait_copies(0usize);
                sync_cube(); // this split's keys have landed
                let mut s = Array::<f32>::new(16usize);
                narrow_scores(&qb, stage_at, &mut s, head_dim, f16);
                let max0 = narrow_max(&s, valid0, scale, 0usize);
                let max1 = narrow_max(&s, valid1, scale, 1usize);
                narrow_probs::<F>(&s, &mut p_sh, valid0, valid1, max0, max1, scale);
                sync_cube(); // the P stage is written
                // quad g: query g's max (held by lanes t = g / 2) and split sum
                let from_lo = plane_shuffle(max0, (g / 2) as u32);
                let from_hi = plane_shuffle(max1, (g / 2) as u32);
                let mut max_g = from_lo;
                if g % 2 == 1 {
                    max_g = from_hi;
                }
                let sum_g = row_sum::<F>(&p_sh, g * comptime!(LDPW));
                if t == 0 && g < queries && valid_g > 0 {
                    partials[base_g] = max_g;
                    partials[base_g + 1] = sum_g;
                }
                #[unroll]
                for kc in 0..4usize {
                    pb[comptime!(kc * 2)] = p_sh[g * comptime!(LDPW) + comptime!(kc * 8) + t];
                    pb[comptime!(kc * 2 + 1)] = p_sh[g * comptime!(LDPW) + comptime!(kc * 8 + 4) + t];
                }
                sync_cube(); // the keys and the P stage are read
                issue_split::<F, N, I>(v_cache, &mut stage, block_rows, slot, width, split, most_keys, kv_heads, kv_head, head_dim, vs, 32usize);
                commit_copies();
                wait_copies(0usize);
                sync_cube(); // this split's values have landed
                narrow_values(&pb, stage_at, partials, base0, base1, write0, write1, head_dim, f16);
                sync_cube(); // the values are read
                if split + 1 < end {
                    issue_split::<F, N, I>(k_cache, &mut stage, block_rows, slot, width, split + 1, most_keys, kv_heads, kv_head, head_dim, vs, 32usize);
                    commit_copies();
                }
            }
        }
    }
}
