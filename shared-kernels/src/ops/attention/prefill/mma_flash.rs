//! Flash prefill with the scores in registers (CUDA, sm_80+): the arithmetic of
//! [`crate::ops::attention::prefill::cmma_flash`], operation for operation, so the bits of the decode path
//! (per-split partials + combine), with the work laid out as flash attention lays it out.
//!
//! Why: the `cmma` flash kernel passes every product through shared memory (`cmma` fragments
//! have no register layout a kernel may read) and syncs the whole cube five times per split,
//! with 32 queries per cube (ncu: 17% occupancy, stalled on shared memory; 11-13x torch's SDPA).
//! Here each warp owns 16 queries and keeps S, P and O in `mma.sync` fragments
//! ([`crate::ops::attention::common::mma`]'s steps); the cube syncs only to refill the K/V stages, which
//! `cp.async` fills one split ahead.
//!
//! As in the cmma flash kernel: pass 1 walks the splits for each query's M (the largest split
//! max over the splits holding its keys); pass 2 walks them again, folding each split's
//! (max, sum, P V) in as the combine kernel folds a partial: total += l_s exp(m_s - M),
//! acc += O_s exp(m_s - M); out = acc / total.
//!
//! For the training path (`with_stats`), pass 1 also folds each query's softmax statistics as
//! the backward's query kernel folds them ([`crate::ops::attention::common::online_stats`], the same
//! functions on the same score fragments), so the backward skips its own pass over the keys.

use crate::ops::kv_cache::cache_row;
use crate::ops::attention::common::splits::{KV_SPLIT, keys_in_split};
use crate::ops::attention::common::mma::{
    LDPW, SMEM_ALIGN, commit_copies, query_fragments, row_max, row_sum, value_lane_address, wait_copies, warp_probs, warp_scores, warp_values,
};
use crate::ops::attention::common::staging::{stage_split_async, query_keys, stage_queries, valid_in_split, PAD};
use crate::ops::attention::common::online_stats::{empty_stats, fold_split_stats};
use crate::ops::ptx::shared_address;
use crate::ops::reduce::{NEG_BIG, cube_linear};
use burn_cubecl::cubecl::prelude::*;

/// Warps per cube unless `LOCKSTEP_FLASH_WARPS` says otherwise; warp w owns queries
/// 16w .. 16w + 15 of the tile.
pub const MMA_WARPS: usize = 4;

/// Warps per prefill cube: `LOCKSTEP_FLASH_WARPS` (4 or 8; benchmark sweeps,
/// [`crate::kernel_choice::Tuning`]), else [`MMA_WARPS`]. A launch shape only: the bits do not
/// depend on it.
pub fn flash_warps() -> Result<usize, crate::KernelError> {
    Ok(crate::kernel_choice::KernelChoice::current()?.tuning.flash_warps.unwrap_or(MMA_WARPS))
}

/// Issues step `step`'s copies: pass 1 (`step < used`) stages split `step`'s keys, pass 2 split
/// `step - used`'s keys and values, into buffer `step % 2`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn issue_step<F: Float, N: Size, I: Int>(
    k_cache: &Tensor<Vector<F, N>>,
    v_cache: &Tensor<Vector<F, N>>,
    block_rows: &Tensor<I>,
    k_sh: &mut Shared<[Vector<F, N>]>,
    v_sh: &mut Shared<[Vector<F, N>]>,
    step: usize,
    used: usize,
    most_keys: usize,
    slot: usize,
    width: usize,
    kv_heads: usize,
    kv_head: usize,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
    #[comptime] units: usize,
) {
    let stage_vecs = comptime!(KV_SPLIT * (head_dim + PAD) / vs);
    let mut split = step;
    if step >= used {
        split = step - used;
    }
    let first = split * comptime!(KV_SPLIT);
    let staged = keys_in_split(most_keys, first);
    let split_row = cache_row(block_rows, slot, width, first);
    let base = (step % 2) * stage_vecs;
    stage_split_async::<F, N>(
        k_cache,
        k_sh,
        base,
        split_row,
        kv_heads,
        kv_head,
        staged,
        head_dim,
        vs,
        units,
    );
    if step >= used {
        stage_split_async::<F, N>(
            v_cache,
            v_sh,
            base,
            split_row,
            kv_heads,
            kv_head,
            staged,
            head_dim,
            vs,
            units,
        );
    }
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mma_flash_kernel<F: Float, N: Size, I: Int>(
    q: &Tensor<Vector<F, N>>,
    k_cache: &Tensor<Vector<F, N>>,
    v_cache: &Tensor<Vector<F, N>>,
    slots: &Tensor<I>,
    positions: &Tensor<I>,
    tiles: &Tensor<I>,
    block_rows: &Tensor<I>,
    out: &mut Tensor<F>,
    stats: &mut Tensor<f32>,
    tiles_arg: u32,
    q_heads_arg: u32,
    kv_heads_arg: u32,
    width_arg: u32,
    heads_per_cube_arg: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
    #[comptime] f16: bool,
    #[comptime] warps: usize,
    #[comptime] with_stats: bool,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let q_heads = q_heads_arg as usize;
    let kv_heads = kv_heads_arg as usize;
    let width = width_arg as usize;
    let hpc = heads_per_cube_arg as usize;
    let group = q_heads / kv_heads;
    let parts = group / hpc;
    let work = cube_linear(); // (tile * kv_heads + kv_head) * parts + part
    let part = work % parts;
    let kv_head = (work / parts) % kv_heads;
    let tile = work / (parts * kv_heads);
    let lane = UNIT_POS_X;
    let warp = UNIT_POS_Y as usize;
    let g = (lane / 4) as usize;
    let t = (lane % 4) as usize;
    if tile < tiles_arg as usize {
        let first_row = u32::cast_from(tiles[2 * tile]) as usize;
        let count = u32::cast_from(tiles[2 * tile + 1]) as usize;
        let queries = count * hpc;
        let first_head = kv_head * group + part * hpc;
        let slot = u32::cast_from(slots[first_row]) as usize;
        let stage_bytes = comptime!((KV_SPLIT * (head_dim + PAD) * 2) as u32);
        let mut q_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(
            comptime!(warps * 16 * (head_dim + PAD) / vs),
            comptime!(SMEM_ALIGN),
        );
        let mut k_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(
            comptime!(2 * KV_SPLIT * (head_dim + PAD) / vs),
            comptime!(SMEM_ALIGN),
        );
        let mut v_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(
            comptime!(2 * KV_SPLIT * (head_dim + PAD) / vs),
            comptime!(SMEM_ALIGN),
        );
        let mut p_sh = Shared::<[u32]>::new_aligned_slice(
            comptime!(warps * 16 * LDPW),
            comptime!(SMEM_ALIGN),
        );
        let mut keys_sh = Shared::<[u32]>::new_slice(comptime!(warps * 16));

        // queries as [64][head_dim + PAD], zeros past `queries`; every query's prefix length
        stage_queries::<F, N>(q, &mut q_sh, first_row, queries, hpc, first_head, q_heads, 0, head_dim, vs, comptime!(warps * 16), comptime!(warps * 32));
        let most_keys = query_keys(positions, &mut keys_sh, first_row, queries, hpc, comptime!(warps * 16));
        let mut warp_keys = 0usize; // the longest prefix among this warp's queries
        #[unroll]
        for qi in 0..16usize {
            let keys = keys_sh[warp * 16 + qi] as usize;
            if keys > warp_keys {
                warp_keys = keys;
            }
        }
        let keys_lo = keys_sh[warp * 16 + g] as usize;
        let keys_hi = keys_sh[warp * 16 + g + 8] as usize;
        let used = most_keys.div_ceil(comptime!(KV_SPLIT));
        let steps = 2 * used;
        issue_step::<F, N, I>(
            k_cache, v_cache, block_rows, &mut k_sh, &mut v_sh, 0, used, most_keys, slot, width, kv_heads, kv_head,
            head_dim, vs, comptime!(warps * 32),
        );
        commit_copies();

        // this warp's Q fragments
        let mut qa = Array::<u32>::new(comptime!(head_dim / 4));
        query_fragments(shared_address::<Vector<F, N>>(&q_sh), &mut qa, head_dim);

        let k_base = shared_address::<Vector<F, N>>(&k_sh);
        let v_base = shared_address::<Vector<F, N>>(&v_sh);
        let p_row_lo = (warp * 16 + g) * comptime!(LDPW);
        let p_row_hi = p_row_lo + comptime!(8 * LDPW);
        let mut s = Array::<f32>::new(32usize);
        let mut o = Array::<f32>::new(16usize);
        let mut pa = Array::<u32>::new(16usize);
        let mut acc = Array::<f32>::new(comptime!(head_dim / 2));
        #[unroll]
        for i in 0..comptime!(head_dim / 2) {
            acc[i] = 0.0f32;
        }
        let mut max_lo = f32::new(NEG_BIG);
        let mut max_hi = f32::new(NEG_BIG);
        let mut total_lo = 0.0f32;
        let mut total_hi = 0.0f32;
        // the training backward's statistics ([m_lo, l_lo, m_hi, l_hi], `with_stats` only)
        let mut ml = Array::<f32>::new(4usize);
        empty_stats(&mut ml);
        for step in 0..steps {
            // the next step's copies go out before this step's wait (one split in flight)
            if step + 1 < steps {
                issue_step::<F, N, I>(
                    k_cache,
                    v_cache,
                    block_rows,
                    &mut k_sh,
                    &mut v_sh,
                    step + 1,
                    used,
                    most_keys,
                    slot,
                    width,
                    kv_heads,
                    kv_head,
                    head_dim,
                    vs,
                    comptime!(warps * 32),
                );
            }
            commit_copies();
            wait_copies(1usize);
            sync_cube();
            let pass2 = step >= used;
            let mut split = step;
            if pass2 {
                split = step - used;
            }
            let first = split * comptime!(KV_SPLIT);
            let buf = (step % 2) as u32;
            if first < warp_keys {
                let valid_lo = valid_in_split(keys_lo, first);
                let valid_hi = valid_in_split(keys_hi, first);
                warp_scores(&qa, k_base + buf * stage_bytes, &mut s, head_dim, f16);
                let split_lo = row_max(&s, valid_lo, scale, 0usize);
                let split_hi = row_max(&s, valid_hi, scale, 1usize);
                if !pass2 {
                    // 1. M per query: the largest split max over the splits holding its keys
                    if valid_lo > 0 && split_lo > max_lo {
                        max_lo = split_lo;
                    }
                    if valid_hi > 0 && split_hi > max_hi {
                        max_hi = split_hi;
                    }
                    if comptime!(with_stats) {
                        fold_split_stats(&s, &mut ml, split_lo, split_hi, valid_lo, valid_hi, scale);
                    }
                } else {
                    // 2. p rounded to the dtype, its split sum, O = P V folded in
                    warp_probs::<F>(
                        &s, &mut pa, &mut p_sh, p_row_lo, p_row_hi, valid_lo, valid_hi, split_lo,
                        split_hi, scale,
                    );
                    sync_plane();
                    let sum_lo = row_sum::<F>(&p_sh, p_row_lo);
                    let sum_hi = row_sum::<F>(&p_sh, p_row_hi);
                    sync_plane(); // the stage is read before the next split writes it
                    let mut factor_lo = 0.0f32;
                    let mut factor_hi = 0.0f32;
                    if valid_lo > 0 {
                        factor_lo = (split_lo - max_lo).exp();
                        total_lo += sum_lo * factor_lo;
                    }
                    if valid_hi > 0 {
                        factor_hi = (split_hi - max_hi).exp();
                        total_hi += sum_hi * factor_hi;
                    }
                    let v_addr = value_lane_address(v_base + buf * stage_bytes, head_dim);
                    #[unroll]
                    for dg in 0..comptime!(head_dim / 32) {
                        warp_values(
                            &pa,
                            v_addr + comptime!((dg * 64) as u32),
                            &mut o,
                            head_dim,
                            f16,
                        );
                        // splits past a query's prefix are not folded in (the combine stops
                        // at the query's last split)
                        #[unroll]
                        for i in 0..16usize {
                            let mut valid = valid_lo;
                            let mut factor = factor_lo;
                            if comptime!(i % 4 >= 2) {
                                valid = valid_hi;
                                factor = factor_hi;
                            }
                            if valid > 0 {
                                acc[comptime!(dg * 16 + i)] += o[i] * factor;
                            }
                        }
                    }
                }
            }
            sync_cube(); // every warp is done with this step's buffer before it is refilled
        }

        // 3. out = acc / total; fragment element c of dim block nt: row g (c < 2) or g + 8,
        // dims 8 nt + 2 t + c % 2
        #[unroll]
        for i in 0..comptime!(head_dim / 2) {
            let c = comptime!(i % 4);
            let nt = comptime!(i / 4);
            let mut qi = warp * 16 + g;
            let mut total = total_lo;
            if comptime!(c >= 2) {
                qi += 8;
                total = total_hi;
            }
            if qi < queries {
                let pair = (first_row + qi / hpc) * q_heads + first_head + qi % hpc;
                out[pair * comptime!(head_dim) + nt * 8 + 2 * t + c % 2] =
                    F::cast_from(acc[i] / total);
            }
        }
        if comptime!(with_stats) && t == 0 {
            // indexed as the backward reads them: (row, head) pairs, (m, l)
            #[unroll]
            for h in 0..2usize {
                let qi = warp * 16 + g + h * 8;
                if qi < queries {
                    let pair = (first_row + qi / hpc) * q_heads + first_head + qi % hpc;
                    stats[pair * 2] = ml[comptime!(2 * h)];
                    stats[pair * 2 + 1] = ml[comptime!(2 * h + 1)];
                }
            }
        }
    }
}
