//! Decode partials with the scores in registers (CUDA, sm_80+): [`crate::ops::attention::cmma`]'s
//! partial kernel (one split's max, sum and P V per query, then the fixed-order combine) on
//! `mma.sync` fragments, through [`crate::ops::attention::mma`]'s steps, so the same bits.
//!
//! Why: decode is a stream of K/V splits; the cmma partial kernel stages each split through
//! registers, syncs its 4 warps seven times and leaves two of them idle (a decode tile holds
//! the few query heads of one KV head). Here a cube is one warp per 16 of the tile's queries
//! (one for Qwen3's 2 heads per KV head, so 5 cubes fit a multiprocessor's shared memory),
//! the split's K and V are both in flight at once through `cp.async`, and the scores start
//! as soon as K has landed.

use crate::ops::kv_cache::cache_row;
use crate::ops::attention::splits::{KV_SPLIT, keys_in_split};
use crate::ops::attention::mma::{
    LDPW, SMEM_ALIGN, commit_copies, query_fragments, row_max, row_sum, stage_split_async,
    value_lane_address, wait_copies, warp_probs, warp_scores, warp_values,
};
use crate::ops::attention::cmma::{query_keys, stage_queries, valid_in_split, PAD, TC_QUERIES};
use crate::ops::ptx::shared_address;
use crate::ops::reduce::cube_linear;
use burn_cubecl::cubecl::prelude::*;

/// Warps per cube for `heads_per_cube` queries per tile row: 16 queries each (a decode tile is
/// one row; at most [`TC_QUERIES`] queries).
pub fn decode_warps(heads_per_cube: usize) -> usize {
    heads_per_cube.div_ceil(16).clamp(1, TC_QUERIES / 16)
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mma_partial_kernel<F: Float, N: Size, I: Int>(
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
    #[comptime] f16: bool,
    #[comptime] warps: usize,
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
    let lane = UNIT_POS_X;
    let warp = UNIT_POS_Y as usize;
    let g = (lane / 4) as usize;
    let t = (lane % 4) as usize;
    // cube-uniform conditions only around the syncs below
    if tile < tiles_arg as usize {
        let first_row = u32::cast_from(tiles[2 * tile]) as usize;
        let count = u32::cast_from(tiles[2 * tile + 1]) as usize;
        let queries = count * hpc;
        let first_head = kv_head * group + part * hpc;
        let slot = u32::cast_from(slots[first_row]) as usize;
        let first = split * comptime!(KV_SPLIT);
        let mut q_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(
            comptime!(warps * 16 * (head_dim + PAD) / vs),
            comptime!(SMEM_ALIGN),
        );
        let mut k_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(
            comptime!(KV_SPLIT * (head_dim + PAD) / vs),
            comptime!(SMEM_ALIGN),
        );
        let mut v_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(
            comptime!(KV_SPLIT * (head_dim + PAD) / vs),
            comptime!(SMEM_ALIGN),
        );
        let mut p_sh = Shared::<[u32]>::new_aligned_slice(
            comptime!(warps * 16 * LDPW),
            comptime!(SMEM_ALIGN),
        );
        let mut keys_sh = Shared::<[u32]>::new_slice(comptime!(TC_QUERIES));
        let most_keys = query_keys(positions, &mut keys_sh, first_row, queries, hpc, TC_QUERIES);
        // cube-uniform: every sync below is reached by all units or none
        if first < most_keys {
            let staged = keys_in_split(most_keys, first);
            let split_row = cache_row(block_rows, slot, width, first);
            // K and V in two copy groups: the scores start as soon as K has landed
            stage_split_async::<F, N>(k_cache, &mut k_sh, 0, split_row, kv_heads, kv_head, staged, head_dim, vs, comptime!(warps * 32));
            commit_copies();
            stage_split_async::<F, N>(v_cache, &mut v_sh, 0, split_row, kv_heads, kv_head, staged, head_dim, vs, comptime!(warps * 32));
            commit_copies();
            // queries as [16 warps][head_dim + PAD], zeros past `queries`, while the copies fly
            stage_queries::<F, N>(q, &mut q_sh, first_row, queries, hpc, first_head, q_heads, 0, head_dim, vs, comptime!(warps * 16), comptime!(warps * 32));
            wait_copies(1usize);
            sync_cube();
            let busy = warp * 16 < queries; // warp-uniform
            let q_lo = warp * 16 + g;
            let q_hi = q_lo + 8;
            let valid_lo = valid_in_split(keys_sh[q_lo] as usize, first);
            let valid_hi = valid_in_split(keys_sh[q_hi] as usize, first);
            let p_row_lo = q_lo * comptime!(LDPW);
            let p_row_hi = q_hi * comptime!(LDPW);
            let mut pa = Array::<u32>::new(16usize);
            // partial = (max, sum, O) per query with keys in the split
            let write_lo = q_lo < queries && valid_lo > 0;
            let write_hi = q_hi < queries && valid_hi > 0;
            let base_lo = (((first_row + q_lo / hpc) * q_heads + first_head + q_lo % hpc) * splits + split) * comptime!(head_dim + 2);
            let base_hi = (((first_row + q_hi / hpc) * q_heads + first_head + q_hi % hpc) * splits + split) * comptime!(head_dim + 2);
            if busy {
                let mut qa = Array::<u32>::new(comptime!(head_dim / 4));
                query_fragments(shared_address::<Vector<F, N>>(&q_sh), &mut qa, head_dim);
                let mut s = Array::<f32>::new(32usize);
                warp_scores(&qa, shared_address::<Vector<F, N>>(&k_sh), &mut s, head_dim, f16);
                let max_lo = row_max(&s, valid_lo, scale, 0usize);
                let max_hi = row_max(&s, valid_hi, scale, 1usize);
                warp_probs::<F>(&s, &mut pa, &mut p_sh, p_row_lo, p_row_hi, valid_lo, valid_hi, max_lo, max_hi, scale);
                sync_plane();
                let sum_lo = row_sum::<F>(&p_sh, p_row_lo);
                let sum_hi = row_sum::<F>(&p_sh, p_row_hi);
                if t == 0 {
                    if write_lo {
                        partials[base_lo] = max_lo;
                        partials[base_lo + 1] = sum_lo;
                    }
                    if write_hi {
                        partials[base_hi] = max_hi;
                        partials[base_hi + 1] = sum_hi;
                    }
                }
            }
            wait_copies(0usize);
            sync_cube();
            if busy {
                let v_addr = value_lane_address(shared_address::<Vector<F, N>>(&v_sh), head_dim);
                let mut o = Array::<f32>::new(16usize);
                #[unroll]
                for dg in 0..comptime!(head_dim / 32) {
                    warp_values(&pa, v_addr + comptime!((dg * 64) as u32), &mut o, head_dim, f16);
                    // fragment element c of dim block nt: row g (c < 2) or g + 8, dim 8 nt + 2 t + c % 2
                    #[unroll]
                    for i in 0..16usize {
                        let dim = comptime!((dg * 4 + i / 4) * 8 + i % 2) + 2 * t;
                        let mut write = write_lo;
                        let mut base = base_lo;
                        if comptime!(i % 4 >= 2) {
                            write = write_hi;
                            base = base_hi;
                        }
                        if write {
                            partials[base + 2 + dim] = o[i];
                        }
                    }
                }
            }
        }
    }
}
