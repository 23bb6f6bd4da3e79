//! The training path's causal attention backward on tensor cores (CUDA, sm_80+, bf16/f16,
//! head_dim 64 or 128): flash attention 2's backward without atomics, built from
//! [`crate::ops::attention::common::mma`]'s warp steps (`mma.sync` fragments, `ldmatrix` from padded stages).
//! Memory is linear in the tokens; every sequence's gradients come from its own rows alone, in
//! an order fixed by the sequence (tiles of 64 rows from its first row), so they do not depend
//! on the other sequences of the batch or micro-batch.
//!
//! Per sequence, tiles of [`KV_SPLIT`] rows (a cube of 4 warps, 16 rows each):
//! 0. `D = dO . O` per (row, head): one sequential f32 dot product ([`row_dot_kernel`]).
//! 1. per (query tile, query head), [`mma_backward_query_kernel`]: the rows' softmax max and
//!    sum over their keys, split by split in key order (online: `l = l e^(m - m') + sum_j
//!    e^(s_j - m')`, each split's sum lane by lane in key order, then over the quad in lane
//!    order); then split by split again `P = e^(s - m) / l`, `dP = dO Vᵀ`, `dS = P (dP - D)`
//!    and `dQ += dS K` (dS rounded to the dtype for the tensor cores, f32 accumulators), keys
//!    ascending. Writes dQ and the rows' (m, l).
//! 2. per (key tile, KV head), [`mma_backward_key_kernel`]: over the query splits at or after
//!    the tile, in order, and inside a split over the KV head's query heads in head order:
//!    `Sᵀ = K Qᵀ`, `Pᵀ` from the queries' (m, l), `dPᵀ = V dOᵀ`, `dSᵀ = Pᵀ (dPᵀ - D)`,
//!    `dV += Pᵀ dO` and `dK += dSᵀ Q` (Pᵀ and dSᵀ rounded to the dtype), each split's
//!    products added to f32 accumulators held in registers.
//! `dQ` and `dK` carry the softmax scale; scores are `(q . k) * scale` as in the forward.
//!
//! Both kernels keep two copies of the stages that change from step to step (K and V on the
//! query side, Q, dO and the statistics on the key side): the next step's copies are in flight
//! while this step's products run. Where a value is copied does not change what is added in
//! which order, so the stages and the accumulators' home leave every gradient's bits as they
//! were; they set how many cubes fit on a multiprocessor (two of 102-104 KiB of shared memory).
//!
//! One file past 400 lines: the three kernels and their launcher share the warp-step helpers,
//! the tile constants and the stage layout, and are read together to check the fixed order.

use crate::ops::attention::common::splits::{keys_in_split, KV_SPLIT};
use crate::ops::attention::common::mma::{
    commit_copies, pack_pair, query_fragments, row_max, value_lane_address,
    wait_copies, warp_scores, warp_values, SMEM_ALIGN,
};
use crate::ops::attention::common::staging::{stage_split_async, valid_in_split, PAD};
use crate::ops::attention::common::online_stats::{empty_stats, exp2_approx, fold_split_stats, LOG2E};
use crate::ops::ptx::shared_address;
use crate::ops::reduce::cube_linear;
use crate::ops::{cube_count_for, storage};
use crate::bridge::{dims, float_in, float_out};
use crate::{ensure, KernelError};
use burn::tensor::{DType, Int as BInt, Tensor as BTensor, TensorData};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

/// Warps per cube: 16 rows each, one tile of [`KV_SPLIT`] rows.
const WARPS: usize = KV_SPLIT / 16;
const UNITS: usize = WARPS * 32;
/// 16-bit values per staged 16-byte vector.
const VS: usize = 8;

/// One unit per (row, head): the sequential dot product over the head's elements in order,
/// read as 16-byte vectors (scalar 2-byte loads kept the kernel at ~470 GB/s).
#[cube(launch)]
fn row_dot_kernel<F: Float, N: Size>(out: &Tensor<Vector<F, N>>, d_out: &Tensor<Vector<F, N>>, dots: &mut Tensor<f32>, pairs_arg: u32, #[comptime] head_dim: usize, #[comptime] vs: usize, #[define(F)] _d: ElemType) {
    let pair = cube_linear() * comptime!(UNITS) + UNIT_POS_X as usize;
    if pair < pairs_arg as usize {
        let vecs = comptime!(head_dim / vs);
        let base = pair * vecs;
        let mut acc = 0.0f32;
        for v in 0..vecs {
            let (d, o) = (d_out[base + v], out[base + v]);
            #[unroll]
            for l in 0..vs {
                acc += f32::cast_from(d.extract(l)) * f32::cast_from(o.extract(l));
            }
        }
        dots[pair] = acc;
    }
}

/// Rounds a 16 x 64 f32 fragment (`x[nt * 4 + c]`) to the dtype as the A operand of the
/// next product (`a[nt * 2 + h]`: key block nt, row g (h = 0) or g + 8).
#[cube]
fn pack_fragment<F: Float>(x: &Array<f32>, a: &mut Array<u32>) {
    #[unroll]
    for nt in 0..8usize {
        #[unroll]
        for h in 0..2usize {
            a[comptime!(nt * 2 + h)] = pack_pair::<F>(x[comptime!(nt * 4 + 2 * h)], x[comptime!(nt * 4 + 2 * h + 1)]);
        }
    }
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn mma_backward_query_kernel<F: Float, N: Size, I: Int>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    d_out: &Tensor<Vector<F, N>>,
    dots: &Tensor<f32>,
    tiles: &Tensor<I>,
    d_q: &mut Tensor<F>,
    stats: &mut Tensor<f32>,
    tiles_arg: u32,
    q_heads_arg: u32,
    kv_heads_arg: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] f16: bool,
    #[comptime] stats_given: bool,
    #[comptime] fast: bool,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let q_heads = q_heads_arg as usize;
    let kv_heads = kv_heads_arg as usize;
    let work = cube_linear(); // tile * q_heads + head
    let head = work % q_heads;
    let tile = work / q_heads;
    let kv_head = head / (q_heads / kv_heads);
    let lane = UNIT_POS_X;
    let warp = UNIT_POS_Y as usize;
    let g = (lane / 4) as usize;
    let t = (lane % 4) as usize;
    if tile < tiles_arg as usize {
        // the tile's first row, its sequence's first row and length
        let first_row = u32::cast_from(tiles[3 * tile]) as usize;
        let start = u32::cast_from(tiles[3 * tile + 1]) as usize;
        let len = u32::cast_from(tiles[3 * tile + 2]) as usize;
        let first_pos = first_row - start;
        let count = keys_in_split(len, first_pos);
        let stage_vecs = comptime!(KV_SPLIT * (head_dim + PAD) / VS);
        let stage_bytes = comptime!((KV_SPLIT * (head_dim + PAD) * 2) as u32);
        let mut q_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(stage_vecs, comptime!(SMEM_ALIGN));
        let mut do_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(stage_vecs, comptime!(SMEM_ALIGN));
        // two K and two V stages: the next split's copies fly while this split's products run
        let mut k_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(2 * stage_vecs), comptime!(SMEM_ALIGN));
        let mut v_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(2 * stage_vecs), comptime!(SMEM_ALIGN));
        let most_keys = first_pos + count;
        let splits = most_keys.div_ceil(comptime!(KV_SPLIT));
        // steps 0 .. splits: pass 1 (K); steps splits .. 2 splits: pass 2 (K and V), split step -
        // splits. With the statistics given (the forward computed them) pass 1 is skipped.
        let steps = 2 * splits;
        let mut first_step = 0usize;
        if comptime!(stats_given) {
            first_step = splits;
        }
        let first_base = (first_step % 2) * stage_vecs;
        stage_split_async::<F, N>(q, &mut q_sh, 0, first_row, q_heads, head, count, head_dim, comptime!(VS), comptime!(UNITS));
        stage_split_async::<F, N>(d_out, &mut do_sh, 0, first_row, q_heads, head, count, head_dim, comptime!(VS), comptime!(UNITS));
        stage_split_async::<F, N>(k, &mut k_sh, first_base, start, kv_heads, kv_head, keys_in_split(most_keys, 0), head_dim, comptime!(VS), comptime!(UNITS));
        if comptime!(stats_given) {
            stage_split_async::<F, N>(v, &mut v_sh, first_base, start, kv_heads, kv_head, keys_in_split(most_keys, 0), head_dim, comptime!(VS), comptime!(UNITS));
        }
        commit_copies();
        wait_copies(0usize);
        sync_cube();
        let q_addr = shared_address::<Vector<F, N>>(&q_sh);
        let do_addr = shared_address::<Vector<F, N>>(&do_sh);
        let k_addr = shared_address::<Vector<F, N>>(&k_sh);
        let v_addr = shared_address::<Vector<F, N>>(&v_sh);
        let mut qa = Array::<u32>::new(comptime!(head_dim / 4));
        let mut da = Array::<u32>::new(comptime!(head_dim / 4));
        query_fragments(q_addr, &mut qa, head_dim);
        query_fragments(do_addr, &mut da, head_dim);
        // this lane's rows g and g + 8 of the warp's 16: their keys (0 past the tile's rows)
        let r_lo = warp * 16 + g;
        let r_hi = r_lo + 8;
        let mut keys_lo = 0usize;
        let mut keys_hi = 0usize;
        if r_lo < count {
            keys_lo = first_pos + r_lo + 1;
        }
        if r_hi < count {
            keys_hi = first_pos + r_hi + 1;
        }
        // the longest prefix among the warp's rows
        let mut warp_most = 0usize;
        if warp * 16 < count {
            let mut last_row = warp * 16 + 15;
            if last_row >= count {
                last_row = count - 1;
            }
            warp_most = first_pos + last_row + 1;
        }
        let mut s = Array::<f32>::new(32usize);
        let mut dp = Array::<f32>::new(32usize);
        let mut dsa = Array::<u32>::new(16usize);
        let mut o = Array::<f32>::new(16usize);
        let mut d_lo = 0.0f32;
        let mut d_hi = 0.0f32;
        if r_lo < count {
            d_lo = dots[(first_row + r_lo) * q_heads + head];
        }
        if r_hi < count {
            d_hi = dots[(first_row + r_hi) * q_heads + head];
        }
        // [m_lo, l_lo, m_hi, l_hi]: the rows' softmax statistics, from the forward or pass 1
        let mut ml = Array::<f32>::new(4usize);
        empty_stats(&mut ml);
        if comptime!(stats_given) {
            if r_lo < count {
                ml[0] = stats[((first_row + r_lo) * q_heads + head) * 2];
                ml[1] = stats[((first_row + r_lo) * q_heads + head) * 2 + 1];
            }
            if r_hi < count {
                ml[2] = stats[((first_row + r_hi) * q_heads + head) * 2];
                ml[3] = stats[((first_row + r_hi) * q_heads + head) * 2 + 1];
            }
        }
        let mut acc = Array::<f32>::new(comptime!(head_dim / 2));
        #[unroll]
        for i in 0..comptime!(head_dim / 2) {
            acc[i] = 0.0f32;
        }
        for step in first_step..steps {
            let second = step >= splits;
            let mut split = step;
            if second {
                split = step - splits;
            }
            let first = split * comptime!(KV_SPLIT);
            let buf = (step % 2) as u32;
            let next = step + 1;
            // the next step's copies go out before this step's wait (one split in flight)
            if next < steps {
                let mut next_split = next;
                if next >= splits {
                    next_split = next - splits;
                }
                let next_first = next_split * comptime!(KV_SPLIT);
                let staged = keys_in_split(most_keys, next_first);
                let base = (1 - step % 2) * stage_vecs;
                stage_split_async::<F, N>(k, &mut k_sh, base, start + next_first, kv_heads, kv_head, staged, head_dim, comptime!(VS), comptime!(UNITS));
                if next >= splits {
                    stage_split_async::<F, N>(v, &mut v_sh, base, start + next_first, kv_heads, kv_head, staged, head_dim, comptime!(VS), comptime!(UNITS));
                }
            }
            commit_copies();
            wait_copies(1usize);
            sync_cube();
            let k_buf = k_addr + buf * stage_bytes;
            if first < warp_most {
                let valid_lo = valid_in_split(keys_lo, first);
                let valid_hi = valid_in_split(keys_hi, first);
                warp_scores(&qa, k_buf, &mut s, head_dim, f16);
                if !second {
                    // pass 1: each row's max and sum over its keys, split by split
                    let split_lo = row_max(&s, valid_lo, scale, 0usize);
                    let split_hi = row_max(&s, valid_hi, scale, 1usize);
                    fold_split_stats(&s, &mut ml, split_lo, split_hi, valid_lo, valid_hi, scale);
                } else {
                    // pass 2: dS, then dQ += dS K
                    warp_scores(&da, v_addr + buf * stage_bytes, &mut dp, head_dim, f16);
                    // the fast arm's per-row terms: p = 2^(s scale log2e - m log2e) / l
                    let scale2 = scale * LOG2E;
                    let (m2_lo, m2_hi) = (ml[0] * LOG2E, ml[2] * LOG2E);
                    let (inv_lo, inv_hi) = (1.0f32 / ml[1], 1.0f32 / ml[3]);
                    #[unroll]
                    for i in 0..32usize {
                        let j = comptime!(i / 4) * 8 + 2 * t + comptime!(i % 2);
                        let mut valid = valid_lo;
                        let mut m = ml[0];
                        let mut l = ml[1];
                        let mut dd = d_lo;
                        if comptime!(i % 4 >= 2) {
                            valid = valid_hi;
                            m = ml[2];
                            l = ml[3];
                            dd = d_hi;
                        }
                        let mut ds = 0.0f32;
                        if j < valid {
                            if comptime!(fast) {
                                let (mut m2, mut inv) = (m2_lo, inv_lo);
                                if comptime!(i % 4 >= 2) {
                                    m2 = m2_hi;
                                    inv = inv_hi;
                                }
                                let p = exp2_approx(s[i] * scale2 - m2) * inv;
                                ds = p * (dp[i] - dd);
                            } else {
                                let p = (s[i] * scale - m).exp() / l;
                                ds = p * (dp[i] - dd);
                            }
                        }
                        s[i] = ds;
                    }
                    pack_fragment::<F>(&s, &mut dsa);
                    let k_trans = value_lane_address(k_buf, head_dim);
                    #[unroll]
                    for dg in 0..comptime!(head_dim / 32) {
                        warp_values(&dsa, k_trans + comptime!((dg * 64) as u32), &mut o, head_dim, f16);
                        #[unroll]
                        for i in 0..16usize {
                            acc[comptime!(dg * 16 + i)] += o[i];
                        }
                    }
                }
            }
            sync_cube(); // every warp is done with this stage before the next step refills it
        }
        // fragment element c of dim block nt: row g (c < 2) or g + 8, dims 8 nt + 2 t + c % 2
        #[unroll]
        for i in 0..comptime!(head_dim / 2) {
            let mut r = r_lo;
            if comptime!(i % 4 >= 2) {
                r = r_hi;
            }
            if r < count {
                d_q[((first_row + r) * q_heads + head) * comptime!(head_dim) + comptime!(i / 4) * 8 + 2 * t + comptime!(i % 2)] = F::cast_from(acc[i] * scale);
            }
        }
        if !comptime!(stats_given) && t == 0 {
            if r_lo < count {
                stats[((first_row + r_lo) * q_heads + head) * 2] = ml[0];
                stats[((first_row + r_lo) * q_heads + head) * 2 + 1] = ml[1];
            }
            if r_hi < count {
                stats[((first_row + r_hi) * q_heads + head) * 2] = ml[2];
                stats[((first_row + r_hi) * q_heads + head) * 2 + 1] = ml[3];
            }
        }
    }
}

/// One step's Q and dO of `head`, queries `first .. first + queries` of the sequence at `start`,
/// into the stages at vector `base` (asynchronously, not committed).
#[cube]
#[allow(clippy::too_many_arguments)]
fn stage_queries<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    d_out: &Tensor<Vector<F, N>>,
    q_sh: &mut Shared<[Vector<F, N>]>,
    do_sh: &mut Shared<[Vector<F, N>]>,
    base: usize,
    row: usize,
    q_heads: usize,
    head: usize,
    queries: usize,
    #[comptime] head_dim: usize,
) {
    stage_split_async::<F, N>(q, q_sh, base, row, q_heads, head, queries, head_dim, comptime!(VS), comptime!(UNITS));
    stage_split_async::<F, N>(d_out, do_sh, base, row, q_heads, head, queries, head_dim, comptime!(VS), comptime!(UNITS));
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn mma_backward_key_kernel<F: Float, N: Size, I: Int>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    d_out: &Tensor<Vector<F, N>>,
    dots: &Tensor<f32>,
    stats: &Tensor<f32>,
    tiles: &Tensor<I>,
    d_k: &mut Tensor<F>,
    d_v: &mut Tensor<F>,
    tiles_arg: u32,
    q_heads_arg: u32,
    kv_heads_arg: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] f16: bool,
    #[comptime] fast: bool,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let q_heads = q_heads_arg as usize;
    let kv_heads = kv_heads_arg as usize;
    let group = q_heads / kv_heads;
    let work = cube_linear(); // tile * kv_heads + kv head
    let kv_head = work % kv_heads;
    let tile = work / kv_heads;
    let lane = UNIT_POS_X;
    let warp = UNIT_POS_Y as usize;
    let unit = UNIT_POS as usize;
    let g = (lane / 4) as usize;
    let t = (lane % 4) as usize;
    if tile < tiles_arg as usize {
        // the tile's first row, its sequence's first row and length
        let first_row = u32::cast_from(tiles[3 * tile]) as usize;
        let start = u32::cast_from(tiles[3 * tile + 1]) as usize;
        let len = u32::cast_from(tiles[3 * tile + 2]) as usize;
        let first_pos = first_row - start;
        let count = keys_in_split(len, first_pos);
        let stage_vecs = comptime!(KV_SPLIT * (head_dim + PAD) / VS);
        let stage_bytes = comptime!((KV_SPLIT * (head_dim + PAD) * 2) as u32);
        let mut k_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(stage_vecs, comptime!(SMEM_ALIGN));
        let mut v_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(stage_vecs, comptime!(SMEM_ALIGN));
        // two Q and two dO stages: the next step's copies fly while this step's products run
        let mut q_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(2 * stage_vecs), comptime!(SMEM_ALIGN));
        let mut do_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(2 * stage_vecs), comptime!(SMEM_ALIGN));
        // per query of a step: m, l, D (two sets, as the stages)
        let mut stat_sh = Shared::<[f32]>::new_slice(comptime!(2 * 3 * KV_SPLIT));
        // steps: the query splits at or after the tile in order, inside a split the KV head's
        // query heads in head order
        let splits = (len - first_pos).div_ceil(comptime!(KV_SPLIT));
        let steps = splits * group;
        stage_split_async::<F, N>(k, &mut k_sh, 0, first_row, kv_heads, kv_head, count, head_dim, comptime!(VS), comptime!(UNITS));
        stage_split_async::<F, N>(v, &mut v_sh, 0, first_row, kv_heads, kv_head, count, head_dim, comptime!(VS), comptime!(UNITS));
        stage_queries::<F, N>(q, d_out, &mut q_sh, &mut do_sh, 0, first_row, q_heads, kv_head * group, count, head_dim);
        commit_copies();
        if unit < comptime!(KV_SPLIT) {
            let mut m = 0.0f32;
            let mut l = 1.0f32;
            let mut dd = 0.0f32;
            if unit < count {
                let pair = (first_row + unit) * q_heads + kv_head * group;
                m = stats[pair * 2];
                l = stats[pair * 2 + 1];
                dd = dots[pair];
            }
            // the fast arm stages m log2e and 1 / l
            if comptime!(fast) {
                m *= LOG2E;
                l = 1.0f32 / l;
            }
            stat_sh[unit] = m;
            stat_sh[unit + comptime!(KV_SPLIT)] = l;
            stat_sh[unit + comptime!(2 * KV_SPLIT)] = dd;
        }
        let k_addr = shared_address::<Vector<F, N>>(&k_sh);
        let v_addr = shared_address::<Vector<F, N>>(&v_sh);
        let q_addr = shared_address::<Vector<F, N>>(&q_sh);
        let do_addr = shared_address::<Vector<F, N>>(&do_sh);
        let r_lo = warp * 16 + g;
        let r_hi = r_lo + 8;
        let key_lo = first_pos + r_lo;
        let key_hi = first_pos + r_hi;
        let mut s = Array::<f32>::new(32usize);
        let mut dp = Array::<f32>::new(32usize);
        let mut frag = Array::<u32>::new(comptime!(head_dim / 4));
        let mut pa = Array::<u32>::new(16usize);
        let mut dsa = Array::<u32>::new(16usize);
        let mut o = Array::<f32>::new(16usize);
        // dK and dV of the lane's fragment elements, f32, in registers for the whole kernel
        let mut acc_dk = Array::<f32>::new(comptime!(head_dim / 2));
        let mut acc_dv = Array::<f32>::new(comptime!(head_dim / 2));
        #[unroll]
        for i in 0..comptime!(head_dim / 2) {
            acc_dk[i] = 0.0f32;
            acc_dv[i] = 0.0f32;
        }
        for step in 0..steps {
            let first = first_pos + (step / group) * comptime!(KV_SPLIT); // the split's first query position
            let queries = keys_in_split(len, first);
            let buf = step % 2;
            let next = step + 1;
            // the next step's copies go out before this step's wait, its statistics into registers
            let mut next_m = 0.0f32;
            let mut next_l = 1.0f32;
            let mut next_d = 0.0f32;
            if next < steps {
                let next_first = first_pos + (next / group) * comptime!(KV_SPLIT);
                let next_queries = keys_in_split(len, next_first);
                let next_head = kv_head * group + next % group;
                stage_queries::<F, N>(q, d_out, &mut q_sh, &mut do_sh, (1 - buf) * stage_vecs, start + next_first, q_heads, next_head, next_queries, head_dim);
                if unit < next_queries {
                    let pair = (start + next_first + unit) * q_heads + next_head;
                    next_m = stats[pair * 2];
                    next_l = stats[pair * 2 + 1];
                    next_d = dots[pair];
                }
            }
            commit_copies();
            wait_copies(1usize);
            sync_cube();
            let sb = buf * comptime!(3 * KV_SPLIT);
            let q_buf = q_addr + (buf as u32) * stage_bytes;
            let do_buf = do_addr + (buf as u32) * stage_bytes;
            // the warp's keys meet a query of this split (query position >= key position)
            if warp * 16 < count && first + queries > first_pos + warp * 16 {
                query_fragments(k_addr, &mut frag, head_dim);
                warp_scores(&frag, q_buf, &mut s, head_dim, f16);
                query_fragments(v_addr, &mut frag, head_dim);
                warp_scores(&frag, do_buf, &mut dp, head_dim, f16);
                #[unroll]
                for i in 0..32usize {
                    let j = comptime!(i / 4) * 8 + 2 * t + comptime!(i % 2);
                    let mut r = r_lo;
                    let mut key = key_lo;
                    if comptime!(i % 4 >= 2) {
                        r = r_hi;
                        key = key_hi;
                    }
                    let mut p = 0.0f32;
                    let mut ds = 0.0f32;
                    if r < count && j < queries && first + j >= key {
                        if comptime!(fast) {
                            p = exp2_approx(s[i] * (scale * LOG2E) - stat_sh[sb + j]) * stat_sh[sb + j + comptime!(KV_SPLIT)];
                        } else {
                            p = (s[i] * scale - stat_sh[sb + j]).exp() / stat_sh[sb + j + comptime!(KV_SPLIT)];
                        }
                        ds = p * (dp[i] - stat_sh[sb + j + comptime!(2 * KV_SPLIT)]);
                    }
                    s[i] = p;
                    dp[i] = ds;
                }
                pack_fragment::<F>(&s, &mut pa);
                pack_fragment::<F>(&dp, &mut dsa);
                let do_trans = value_lane_address(do_buf, head_dim);
                let q_trans = value_lane_address(q_buf, head_dim);
                #[unroll]
                for dg in 0..comptime!(head_dim / 32) {
                    warp_values(&pa, do_trans + comptime!((dg * 64) as u32), &mut o, head_dim, f16);
                    #[unroll]
                    for i in 0..16usize {
                        acc_dv[comptime!(dg * 16 + i)] += o[i];
                    }
                    warp_values(&dsa, q_trans + comptime!((dg * 64) as u32), &mut o, head_dim, f16);
                    #[unroll]
                    for i in 0..16usize {
                        acc_dk[comptime!(dg * 16 + i)] += o[i];
                    }
                }
            }
            // the next step's statistics into the other set, which no warp reads in this step
            if next < steps && unit < comptime!(KV_SPLIT) {
                let nb = (1 - buf) * comptime!(3 * KV_SPLIT);
                if comptime!(fast) {
                    next_m *= LOG2E;
                    next_l = 1.0f32 / next_l;
                }
                stat_sh[nb + unit] = next_m;
                stat_sh[nb + unit + comptime!(KV_SPLIT)] = next_l;
                stat_sh[nb + unit + comptime!(2 * KV_SPLIT)] = next_d;
            }
            sync_cube(); // every warp is done with this step's stages before the next step refills them
        }
        #[unroll]
        for i in 0..comptime!(head_dim / 2) {
            let mut r = r_lo;
            if comptime!(i % 4 >= 2) {
                r = r_hi;
            }
            if r < count {
                let at = ((first_row + r) * kv_heads + kv_head) * comptime!(head_dim) + comptime!(i / 4) * 8 + 2 * t + comptime!(i % 2);
                d_k[at] = F::cast_from(acc_dk[i] * scale);
                d_v[at] = F::cast_from(acc_dv[i]);
            }
        }
    }
}

/// The kernel the training backward runs for `q` ([`crate::ops::attention::route`]): this one,
/// or the per-sequence paths of [`crate::ops::attention::backward`] (`LOCKSTEP_ATTENTION_BACKWARD
/// = per_sequence`, the `cmma` set, f32, other head sizes, other runtimes).
pub fn backward_route(q: &burn::tensor::Tensor<3>, head_dim: usize, group: usize) -> Result<crate::ops::attention::route::Kernel, KernelError> {
    let probe = crate::bridge::float_in("attention backward", "q", q.clone())?;
    let call = crate::ops::attention::tensor_cores::call_on(&probe.client, q.dtype(), head_dim, group, 0);
    Ok(crate::ops::attention::route::route(crate::ops::attention::route::Phase::Backward, &call, &crate::ops::attention::tensor_cores::choices()?))
}

/// Whether [`mma_attention_backward`] takes these inputs (whatever `LOCKSTEP_ATTENTION_BACKWARD`
/// says): CUDA with the register-fragment attention kernels on, 16-bit inputs, head_dim 64 or 128.
pub fn mma_backward_available(dtype: DType, head_dim: usize) -> bool {
    let call = crate::ops::attention::route::Call { cuda: crate::device::runtime_name() == "cuda", dtype, tensor_cores: true, head_dim, group: 1, max_len: 0 };
    let Ok(mut choices) = crate::ops::attention::tensor_cores::choices() else { return false };
    choices.backward_on_tensor_cores = true;
    crate::ops::attention::route::route(crate::ops::attention::route::Phase::Backward, &call, &choices) == crate::ops::attention::route::Kernel::MmaBackward
}

/// The tile table for `sequences` (first row, length): per sequence, tiles of [`KV_SPLIT`]
/// rows from its first row, each `(first row, sequence's first row, sequence's length)`.
pub fn backward_tiles(sequences: &[(usize, usize)]) -> Vec<i32> {
    sequences
        .iter()
        .flat_map(|&(start, len)| (0..len.div_ceil(KV_SPLIT)).flat_map(move |i| [(start + i * KV_SPLIT) as i32, start as i32, len as i32]))
        .collect()
}

/// The backward's results: the gradients in the inputs' dtype (each f32 accumulator rounded
/// once) and the softmax statistics it used (f32, (m, l) per (row, query head)).
pub struct MmaBackward {
    pub d_q: BTensor<3>,
    pub d_k: BTensor<3>,
    pub d_v: BTensor<3>,
    pub stats: BTensor<1>,
}

/// The gradients of causal attention over `q` [rows, q_heads, d] and `k`/`v` [rows, kv_heads,
/// d] (16-bit) with forward output `out` and its gradient `d_out` (q's shape), for rows made of
/// the contiguous `sequences` (first row, length) that cover every row. `forward_stats`: the
/// softmax statistics the training forward wrote
/// ([`crate::ops::attention::attention_for_rows_with_stats`]), which skip the query kernel's
/// first pass; `None`: that pass computes them (the same bits). `fast`: the probabilities as
/// `2^x` on the multi-function unit times a reciprocal of `l` (`LOCKSTEP_BACKWARD_MATH=fast`,
/// other gradient bits), else the accurate `exp` and a division.
#[allow(clippy::too_many_arguments)]
pub fn mma_attention_backward(
    q: BTensor<3>,
    k: BTensor<3>,
    v: BTensor<3>,
    out: BTensor<3>,
    d_out: BTensor<3>,
    sequences: &[(usize, usize)],
    scale: f32,
    forward_stats: Option<BTensor<1>>,
    fast: bool,
) -> Result<MmaBackward, KernelError> {
    const OP: &str = "attention_backward (tensor cores)";
    let device = q.device();
    let (q, k, v, out, d_out) = (float_in(OP, "q", q)?, float_in(OP, "k", k)?, float_in(OP, "v", v)?, float_in(OP, "out", out)?, float_in(OP, "d_out", d_out)?);
    let (qd, kd) = (dims(&q), dims(&k));
    ensure!(qd.len() == 3 && kd.len() == 3 && kd == dims(&v), OP, "q {qd:?}, k {kd:?}, v {:?}", dims(&v));
    let (rows, q_heads, head_dim) = (qd[0], qd[1], qd[2]);
    let kv_heads = kd[1];
    ensure!(kd[0] == rows && kd[2] == head_dim && kv_heads > 0 && q_heads % kv_heads == 0, OP, "q {qd:?} and k {kd:?} do not pair");
    ensure!(dims(&out) == qd && dims(&d_out) == qd, OP, "out and d_out must be {qd:?}");
    ensure!(mma_backward_available(q.dtype, head_dim), OP, "needs CUDA, bf16/f16 and head_dim 64 or 128; got {:?}, head_dim {head_dim}", q.dtype);
    ensure!([&k, &v, &out, &d_out].iter().all(|t| t.dtype == q.dtype), OP, "dtypes differ");
    ensure!(sequences.iter().map(|s| s.1).sum::<usize>() == rows && sequences.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0), OP, "the sequences must cover the {rows} rows in order");
    crate::bridge::check_index_range(OP, "q", &qd, rows * q_heads * head_dim)?;
    let tiles = backward_tiles(sequences);
    let n_tiles = tiles.len() / 3;
    let client = q.client.clone();
    let cube_device = q.device.clone();
    let f32_of = |shape: Vec<usize>| empty_device_contiguous_dtype(client.clone(), cube_device.clone(), shape.into(), DType::F32);
    // the gradients in the inputs' dtype, each f32 accumulator rounded once as it is written
    let of_dtype = |shape: Vec<usize>| empty_device_contiguous_dtype(client.clone(), cube_device.clone(), shape.into(), q.dtype);
    let stats_given = forward_stats.is_some();
    let stats = match forward_stats {
        Some(given) => {
            ensure!(given.dims() == [rows * q_heads * 2] && given.dtype() == DType::F32, OP, "the forward's statistics are {:?} {:?}, not f32 [{}] (2 per row and query head)", given.dtype(), given.dims(), rows * q_heads * 2);
            float_in(OP, "forward_stats", given)?
        }
        None => f32_of(vec![rows * q_heads * 2]),
    };
    let (d_q, dots) = (of_dtype(qd.clone()), f32_of(vec![rows * q_heads]));
    let (d_k, d_v) = (of_dtype(kd.clone()), of_dtype(kd.clone()));
    let tiles_t: CubeTensor = crate::bridge::int_in(OP, "tiles", BTensor::<1, BInt>::from_data(TensorData::new(tiles, [n_tiles * 3]), &device))?;
    let (fdt, idt) = (storage(q.dtype), storage(tiles_t.dtype));
    let f16 = q.dtype == DType::F16;
    row_dot_kernel::launch(
        &client,
        cube_count_for(rows * q_heads, UNITS),
        CubeDim::new_1d(UNITS as u32),
        VS,
        out.into_tensor_arg(),
        d_out.clone().into_tensor_arg(),
        dots.clone().into_tensor_arg(),
        (rows * q_heads) as u32,
        head_dim,
        VS,
        fdt,
    );
    let vec_arg = |t: &CubeTensor| t.clone().into_tensor_arg();
    mma_backward_query_kernel::launch(
        &client,
        cube_count_for(n_tiles * q_heads, 1),
        CubeDim::new_2d(32, WARPS as u32),
        VS,
        vec_arg(&q),
        vec_arg(&k),
        vec_arg(&v),
        vec_arg(&d_out),
        dots.clone().into_tensor_arg(),
        tiles_t.clone().into_tensor_arg(),
        d_q.clone().into_tensor_arg(),
        stats.clone().into_tensor_arg(),
        n_tiles as u32,
        q_heads as u32,
        kv_heads as u32,
        scale,
        head_dim,
        f16,
        stats_given,
        fast,
        [fdt, idt],
    );
    mma_backward_key_kernel::launch(
        &client,
        cube_count_for(n_tiles * kv_heads, 1),
        CubeDim::new_2d(32, WARPS as u32),
        VS,
        vec_arg(&q),
        vec_arg(&k),
        vec_arg(&v),
        vec_arg(&d_out),
        dots.into_tensor_arg(),
        stats.clone().into_tensor_arg(),
        tiles_t.into_tensor_arg(),
        d_k.clone().into_tensor_arg(),
        d_v.clone().into_tensor_arg(),
        n_tiles as u32,
        q_heads as u32,
        kv_heads as u32,
        scale,
        head_dim,
        f16,
        fast,
        [fdt, idt],
    );
    Ok(MmaBackward { d_q: float_out(d_q), d_k: float_out(d_k), d_v: float_out(d_v), stats: float_out(stats) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_start_at_each_sequence_and_never_cross_one() {
        assert_eq!(backward_tiles(&[(0, 64), (64, 65), (129, 1)]), vec![0, 0, 64, 64, 64, 65, 128, 64, 65, 129, 129, 1]);
    }
}
