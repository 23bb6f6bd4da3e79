//! Split-KV attention on tensor cores through shared memory (`cmma`; CUDA, bf16/f16): the
//! `LOCKSTEP_ATTENTION_TC=cmma` set, and the arithmetic the default `mma` set (`mma.rs`,
//! `mma_flash.rs`, `mma_decode*.rs`) follows step by step with the same bits.
//!
//! The scheme is [`crate::ops::attention::decode::split_kv`]'s: keys in splits of 64 from key 0, one partial
//! (split max m, sum l, unnormalised output o) per (query, split), then the same fixed-order
//! combine kernel. Only the partial changes: the split's two products run on `cmma`
//! 16x16x16 instructions with f32 accumulators, k ascending from a zero accumulator:
//! 1. S = Q K^T over head_dim (chunks 0, 16, ...), scaled by `scale` in f32;
//! 2. m = max of the query's valid scores, p_j = exp(s_j - m) rounded to the input dtype (the
//!    `mma` operand), l = the sum of those rounded p_j: four sums of 16 keys each in key
//!    order, added in quarter order;
//! 3. O = P V over the split's 64 keys (chunks 0, 16, 32, 48), p_j = 0 past the query's keys.
//!
//! Bits. A query's partial depends only on its own Q row and the split's K/V rows: an `mma`
//! output element is the dot product of one A row and one B column, and the battery checks
//! that tensor-core rows do not depend on the other rows of the fragment or on the fragment
//! row they land in (`matmul ... tc = pipelined`, and this kernel's own rows). Keys past a
//! query's prefix enter S (their scores are never read) and O with p = 0, and keys past the
//! cube's staged keys are staged as zeros, so a prefill row in a tile of 32 queries and the
//! same row decoded alone run the same instructions on the same values. Prefill, chunked
//! prefill and decode of a (query, prefix) pair therefore give the same bits, in any batch.
//!
//! The arithmetic differs from the scalar kernels (P is rounded to bf16 before O, as in flash
//! attention), so a process uses this kernel for every attention call of a dtype and head
//! size, sampler and trainer alike, whatever the cache length.
//!
//! Work: one cube of 4 planes per (tile, KV head, head part, split). A tile is up to
//! [`TC_QUERIES`] queries sharing one KV head and one sequence: consecutive rows of a sequence
//! (prefill) times the query heads of the group; decode rows are tiles of one row. The split's
//! K, then V, is staged in shared memory once per tile.
//!
//! One file past 400 lines: the split kernel and its launcher share the split and fragment
//! constants.

use crate::ops::attention::common::splits::{keys_in_split, KV_SPLIT};
use crate::ops::attention::common::staging::{query_keys, stage_queries, valid_in_split, PAD};
use crate::ops::kv_cache::cache_row;
use crate::ops::reduce::{cube_linear, NEG_BIG};
use burn_cubecl::cubecl::cmma::{self, MatrixIdent, MatrixLayout};
use burn_cubecl::cubecl::prelude::*;

/// Queries per cube: two 16-row fragments.
pub const TC_QUERIES: usize = 32;
/// Planes per cube; plane p works on query block p / 2 (S: key blocks, O: output dims, by p % 2).
pub(crate) const PLANES: usize = 4;
pub(crate) const PLANE_DIM: usize = 32;
pub(crate) const UNITS: usize = PLANES * PLANE_DIM;
/// f32 score rows: 64 scores + 4.
pub(crate) const LDS: usize = KV_SPLIT + 4;
/// 16-bit p rows: 64 + PAD.
pub(crate) const LDP: usize = KV_SPLIT + PAD;
/// One plane's 16x16 f32 output window in the score stage.
pub(crate) const WINDOW: usize = 256;
pub(crate) const SMEM_ALIGN: usize = 128;

/// Stage keys (or values) `first_pos .. first_pos + staged` of `kv_head` as `[64][head_dim + PAD]`
/// rows; rows past `staged` are zeros.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn stage_split<F: Float, N: Size>(
    cache: &Tensor<Vector<F, N>>,
    stage: &mut Shared<[Vector<F, N>]>,
    first_pos: usize,
    kv_heads: usize,
    kv_head: usize,
    staged: usize,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
) {
    let mut regs = Array::<Vector<F, N>>::new(comptime!((KV_SPLIT * head_dim / vs).div_ceil(UNITS)));
    load_values::<F, N>(cache, &mut regs, first_pos, kv_heads, kv_head, staged, head_dim, vs);
    store_values::<F, N>(&regs, stage, head_dim, vs);
}

/// This unit's share of a split's keys or values (rows past `staged` as zeros) in registers;
/// [`store_values`] puts them in the stage. Values are loaded this way while the scores are
/// computed, so their loads overlap the products.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_values<F: Float, N: Size>(
    cache: &Tensor<Vector<F, N>>,
    regs: &mut Array<Vector<F, N>>,
    first_pos: usize,
    kv_heads: usize,
    kv_head: usize,
    staged: usize,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
) {
    let hd_vecs = comptime!(head_dim / vs);
    #[unroll]
    for it in 0..comptime!((KV_SPLIT * head_dim / vs).div_ceil(UNITS)) {
        let i = UNIT_POS as usize + it * comptime!(UNITS);
        let j = i / hd_vecs;
        let mut val = Vector::<F, N>::new(F::from_int(0));
        if i < comptime!(KV_SPLIT * head_dim / vs) && j < staged {
            val = cache[((first_pos + j) * kv_heads + kv_head) * hd_vecs + i % hd_vecs];
        }
        regs[it] = val;
    }
}

#[cube]
pub(crate) fn store_values<F: Float, N: Size>(regs: &Array<Vector<F, N>>, stage: &mut Shared<[Vector<F, N>]>, #[comptime] head_dim: usize, #[comptime] vs: usize) {
    let hd_vecs = comptime!(head_dim / vs);
    let ld_vecs = comptime!((head_dim + PAD) / vs);
    #[unroll]
    for it in 0..comptime!((KV_SPLIT * head_dim / vs).div_ceil(UNITS)) {
        let i = UNIT_POS as usize + it * comptime!(UNITS);
        if i < comptime!(KV_SPLIT * head_dim / vs) {
            stage[(i / hd_vecs) * ld_vecs + i % hd_vecs] = regs[it];
        }
    }
}

/// S = Q K^T on `cmma` into `s_sh` (`[32][LDS]` f32): plane p computes query block p / 2
/// against key blocks 2 (p % 2) and 2 (p % 2) + 1, k over head_dim ascending from zero.
/// `busy`: the plane's query block holds queries (plane-uniform).
#[cube]
pub(crate) fn split_scores<F: Float, N: Size>(
    q_sh: &Shared<[Vector<F, N>]>,
    kv_sh: &Shared<[Vector<F, N>]>,
    s_sh: &mut Shared<[f32]>,
    busy: bool,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
) {
    let plane = UNIT_POS_Y as usize;
    let ld = comptime!(head_dim + PAD);
    let kv_len = comptime!(KV_SPLIT * (head_dim + PAD) / vs);
    let q_len = comptime!(TC_QUERIES * (head_dim + PAD) / vs);
    let s_len = comptime!(score_stage_len(head_dim));
    let qb = plane / 2;
    let kb = (plane % 2) * 2;
    if busy {
        let s0 = cmma::Matrix::<f32>::from_value(MatrixIdent::Accumulator, 16usize, 16usize, 16usize, MatrixLayout::Undefined, 0.0f32);
        let s1 = cmma::Matrix::<f32>::from_value(MatrixIdent::Accumulator, 16usize, 16usize, 16usize, MatrixLayout::Undefined, 0.0f32);
        #[unroll]
        for kk in 0..comptime!(head_dim / 16) {
            let mut a = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::A, 16usize, 16usize, 16usize, MatrixLayout::RowMajor) };
            cmma::load(&mut a, q_sh.slice((qb * 16 * ld + kk * 16) / vs, q_len), comptime!(ld as u32));
            // kv_sh[key][e]: element (e, key) of K^T at key * ld + e -> column-major B
            let mut b0 = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::B, 16usize, 16usize, 16usize, MatrixLayout::ColMajor) };
            cmma::load(&mut b0, kv_sh.slice((kb * 16 * ld + kk * 16) / vs, kv_len), comptime!(ld as u32));
            let mut b1 = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::B, 16usize, 16usize, 16usize, MatrixLayout::ColMajor) };
            cmma::load(&mut b1, kv_sh.slice(((kb + 1) * 16 * ld + kk * 16) / vs, kv_len), comptime!(ld as u32));
            cmma::execute(&a, &b0, &s0, &s0);
            cmma::execute(&a, &b1, &s1, &s1);
        }
        cmma::store(s_sh.slice_mut(qb * 16 * comptime!(LDS) + kb * 16, s_len), &s0, comptime!(LDS as u32), MatrixLayout::RowMajor);
        cmma::store(s_sh.slice_mut(qb * 16 * comptime!(LDS) + (kb + 1) * 16, s_len), &s1, comptime!(LDS as u32), MatrixLayout::RowMajor);
    }
}

/// Unit u's quarter of query u / 4's scaled scores, keys 16 (u % 4) .. +16 below `valid`: their
/// max (NEG_BIG when none). Max is exact, so any grouping gives the query's max.
#[cube]
pub(crate) fn quarter_max(s_sh: &Shared<[f32]>, valid: usize, scale: f32) -> f32 {
    let qi = UNIT_POS as usize / 4;
    let quarter = UNIT_POS as usize % 4;
    let mut max = f32::new(NEG_BIG);
    #[unroll]
    for jj in 0..16usize {
        let j = quarter * 16 + jj;
        if j < valid {
            let score = s_sh[qi * comptime!(LDS) + j] * scale;
            if score > max {
                max = score;
            }
        }
    }
    max
}

/// The largest of query `qi`'s four quarter values in `quarter_sh`.
#[cube]
pub(crate) fn query_max(quarter_sh: &Shared<[f32]>, qi: usize) -> f32 {
    let mut max = quarter_sh[qi * 4];
    #[unroll]
    for c in 1..4usize {
        if quarter_sh[qi * 4 + c] > max {
            max = quarter_sh[qi * 4 + c];
        }
    }
    max
}

/// Unit u's quarter of query u / 4: p_j = exp(s_j - max) rounded to F into `p_sh` (0 past
/// `valid`), and the sum of the rounded p_j in key order.
#[cube]
pub(crate) fn quarter_probs<F: Float>(s_sh: &Shared<[f32]>, p_sh: &mut Shared<[F]>, valid: usize, scale: f32, max: f32) -> f32 {
    let qi = UNIT_POS as usize / 4;
    let quarter = UNIT_POS as usize % 4;
    let mut sum = 0.0f32;
    #[unroll]
    for jj in 0..16usize {
        let j = quarter * 16 + jj;
        let mut p = F::from_int(0);
        if j < valid {
            p = F::cast_from((s_sh[qi * comptime!(LDS) + j] * scale - max).exp());
            sum += f32::cast_from(p);
        }
        p_sh[qi * comptime!(LDP) + j] = p;
    }
    sum
}

/// Query `qi`'s split sum: its four quarter sums in quarter order.
#[cube]
pub(crate) fn query_sum(quarter_sh: &Shared<[f32]>, qi: usize) -> f32 {
    ((quarter_sh[qi * 4] + quarter_sh[qi * 4 + 1]) + quarter_sh[qi * 4 + 2]) + quarter_sh[qi * 4 + 3]
}

/// O = P V on `cmma`: plane p computes query block p / 2, output dims half p % 2 (blocks of 16,
/// keys ascending from zero), and stores block b at window p * blocks + b of `s_sh` (16x16
/// row-major). The scores must no longer be read.
#[cube]
pub(crate) fn split_output<F: Float, N: Size>(
    p_sh: &Shared<[F]>,
    kv_sh: &Shared<[Vector<F, N>]>,
    s_sh: &mut Shared<[f32]>,
    busy: bool,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
) {
    let plane = UNIT_POS_Y as usize;
    let ld = comptime!(head_dim + PAD);
    let kv_len = comptime!(KV_SPLIT * (head_dim + PAD) / vs);
    let blocks = comptime!(head_dim / 32);
    let qb = plane / 2;
    if busy {
        let mut accs = Sequence::<cmma::Matrix<f32>>::new();
        #[unroll]
        for _b in 0..blocks {
            accs.push(cmma::Matrix::<f32>::from_value(MatrixIdent::Accumulator, 16usize, 16usize, 16usize, MatrixLayout::Undefined, 0.0f32));
        }
        #[unroll]
        for kc in 0..comptime!(KV_SPLIT / 16) {
            let mut a = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::A, 16usize, 16usize, 16usize, MatrixLayout::RowMajor) };
            cmma::load(&mut a, p_sh.slice(qb * 16 * comptime!(LDP) + kc * 16, comptime!(TC_QUERIES * LDP)), comptime!(LDP as u32));
            #[unroll]
            for b in 0..blocks {
                let db = (plane % 2) * comptime!(head_dim / 32) + b;
                // kv_sh[key][d]: element (key, d) at key * ld + d -> row-major B
                let mut v = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::B, 16usize, 16usize, 16usize, MatrixLayout::RowMajor) };
                cmma::load(&mut v, kv_sh.slice((kc * 16 * ld + db * 16) / vs, kv_len), comptime!(ld as u32));
                let acc = accs.index(b);
                cmma::execute(&a, &v, acc, acc);
            }
        }
        #[unroll]
        for b in 0..blocks {
            let w = (plane * comptime!(head_dim / 32) + b) * comptime!(WINDOW);
            cmma::store(s_sh.slice_mut(w, w + comptime!(WINDOW)), accs.index(b), 16u32, MatrixLayout::RowMajor);
        }
    }
}

/// f32 elements of the score stage: the scores, or every plane's output windows.
pub(crate) const fn score_stage_len(head_dim: usize) -> usize {
    let windows = PLANES * (head_dim / 32) * WINDOW;
    if TC_QUERIES * LDS > windows { TC_QUERIES * LDS } else { windows }
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn tc_partial_kernel<F: Float, N: Size, I: Int>(
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
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let q_heads = q_heads_arg as usize;
    let kv_heads = kv_heads_arg as usize;
    let width = width_arg as usize;
    let splits = splits_arg as usize;
    let hpc = heads_per_cube_arg as usize;
    let group = q_heads / kv_heads;
    let parts = group / hpc;
    let work = cube_linear(); // ((tile * kv_heads + kv_head) * parts + part) * splits + split
    let split = work % splits;
    let part = (work / splits) % parts;
    let kv_head = (work / (splits * parts)) % kv_heads;
    let tile = work / (splits * parts * kv_heads);
    let unit = UNIT_POS as usize;
    let lane = UNIT_POS_X as usize;
    let plane = UNIT_POS_Y as usize;
    // cube-uniform conditions only around the syncs below
    if tile < tiles_arg as usize {
        let first_row = u32::cast_from(tiles[2 * tile]) as usize;
        let count = u32::cast_from(tiles[2 * tile + 1]) as usize;
        let queries = count * hpc;
        let first_head = kv_head * group + part * hpc;
        let slot = u32::cast_from(slots[first_row]) as usize;
        let first = split * comptime!(KV_SPLIT);
        let mut q_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(TC_QUERIES * (head_dim + PAD) / vs), comptime!(SMEM_ALIGN));
        let mut kv_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(KV_SPLIT * (head_dim + PAD) / vs), comptime!(SMEM_ALIGN));
        let mut s_sh = Shared::<[f32]>::new_aligned_slice(comptime!(score_stage_len(head_dim)), comptime!(SMEM_ALIGN));
        let mut p_sh = Shared::<[F]>::new_aligned_slice(comptime!(TC_QUERIES * LDP), comptime!(SMEM_ALIGN));
        let mut keys_sh = Shared::<[u32]>::new_slice(comptime!(TC_QUERIES));
        let mut quarter_sh = Shared::<[f32]>::new_slice(comptime!(TC_QUERIES * 4));
        let most_keys = query_keys(positions, &mut keys_sh, first_row, queries, hpc, TC_QUERIES);
        if first < most_keys {
            let staged = keys_in_split(most_keys, first);
            stage_queries::<F, N>(q, &mut q_sh, first_row, queries, hpc, first_head, q_heads, 0, head_dim, vs, TC_QUERIES, UNITS);
            stage_split::<F, N>(k_cache, &mut kv_sh, cache_row(block_rows, slot, width, first), kv_heads, kv_head, staged, head_dim, vs);
            let mut v_regs = Array::<Vector<F, N>>::new(comptime!((KV_SPLIT * head_dim / vs).div_ceil(UNITS)));
            load_values::<F, N>(v_cache, &mut v_regs, cache_row(block_rows, slot, width, first), kv_heads, kv_head, staged, head_dim, vs);
            sync_cube();
            let busy = (plane / 2) * 16 < queries; // plane-uniform
            split_scores::<F, N>(&q_sh, &kv_sh, &mut s_sh, busy, head_dim, vs);
            sync_cube();
            let qi = unit / 4;
            let valid = valid_in_split(keys_sh[qi] as usize, first);
            quarter_sh[unit] = quarter_max(&s_sh, valid, scale);
            store_values::<F, N>(&v_regs, &mut kv_sh, head_dim, vs); // K is no longer read
            sync_cube();
            let max = query_max(&quarter_sh, qi);
            let quarter_sum = quarter_probs::<F>(&s_sh, &mut p_sh, valid, scale, max);
            sync_cube(); // every unit has read the quarter maxima: the sums take their place
            quarter_sh[unit] = quarter_sum;
            sync_cube();
            if unit % 4 == 0 && qi < queries && valid > 0 {
                let base = (((first_row + qi / hpc) * q_heads + first_head + qi % hpc) * splits + split) * comptime!(head_dim + 2);
                partials[base] = max;
                partials[base + 1] = query_sum(&quarter_sh, qi);
            }
            split_output::<F, N>(&p_sh, &kv_sh, &mut s_sh, busy, head_dim, vs);
            sync_cube();
            if busy {
                let qb = plane / 2;
                #[unroll]
                for b in 0..comptime!(head_dim / 32) {
                    let db = (plane % 2) * comptime!(head_dim / 32) + b;
                    let w = (plane * comptime!(head_dim / 32) + b) * comptime!(WINDOW);
                    #[unroll]
                    for e_it in 0..comptime!(WINDOW / PLANE_DIM) {
                        let e = lane + e_it * comptime!(PLANE_DIM);
                        let oq = qb * 16 + e / 16;
                        if oq < queries {
                            if first < keys_sh[oq] as usize {
                                let base = (((first_row + oq / hpc) * q_heads + first_head + oq % hpc) * splits + split) * comptime!(head_dim + 2);
                                partials[base + 2 + db * 16 + e % 16] = s_sh[w + e];
                            }
                        }
                    }
                }
            }
        }
    }
}
