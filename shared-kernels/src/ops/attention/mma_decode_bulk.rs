//! Decode partials staged by Hopper bulk copies (CUDA sm_90): [`super::mma_decode`]'s one-stage
//! partial kernel, step for step, with each split's keys and then values brought into the stage
//! by one `cp.async.bulk` per 256-byte key row (completing on an mbarrier) instead of sixteen
//! 16-byte `cp.async` per row, so the same bits.
//!
//! Why: the partial kernel is bound by its instructions a split (~3,400, ncu, session 23; more
//! cubes a multiprocessor or more copies in flight did not move it, session 32,
//! docs/journal/decode-partials-tries.md), and ~800 of them issue the 16-byte copies and their
//! index arithmetic. Here a lane issues 2 bulk copies a stage. The copies carry no arithmetic;
//! rows past the tile's longest prefix are zeroed by plain stores, as the 16-byte copies
//! zero-filled them, so P V reads the same zeros.
//!
//! Its loop repeats `mma_decode`'s steps (it shares `split_values` only) rather than moving
//! them into helpers both kernels call: the measured default kernel's source stays as it was
//! until this one has been measured; fold them together if it is kept.
//!
//! Not yet measured on the H200 (session 32 wrote it with no device time left): it runs only
//! when `LOCKSTEP_DECODE_LAUNCH` asks for it (`SxB`), and its first visit must compare its
//! output with the other launches' as bits (`lockstep bench --attention-only`) and time it.

use crate::ops::kv_cache::cache_row;
use crate::ops::attention::splits::{KV_SPLIT, keys_in_split};
use crate::ops::attention::mma::{LDPW, SMEM_ALIGN, query_fragments, row_max, row_sum, warp_probs, warp_scores};
use crate::ops::attention::mma_decode::split_values;
use crate::ops::attention::cmma::{query_keys, stage_queries, valid_in_split, PAD, TC_QUERIES};
use crate::ops::matmul::wgmma_fragments::wait_parity_spin;
use crate::ops::ptx::{bulk_copy_to_shared, shared_address};
use crate::ops::reduce::cube_linear;
use burn_cubecl::cubecl::prelude::barrier::Barrier;
use burn_cubecl::cubecl::prelude::*;

/// Fills the stage with split `split`'s keys (`cache` = k) or values, completing on `bar`: unit 0
/// arms the barrier with the bytes to come, then every unit bulk-copies its rows and zeroes its
/// share of the rows past the tile's longest prefix. The caller waits on `bar`'s next phase.
#[cube]
#[allow(clippy::too_many_arguments)]
fn fill_stage<F: Float, N: Size, I: Int>(
    cache: &Tensor<Vector<F, N>>,
    stage: &mut Shared<[Vector<F, N>]>,
    stage_at: u32,
    bar: &Shared<Barrier>,
    block_rows: &Tensor<I>,
    slot: usize,
    width: usize,
    split: usize,
    most_keys: usize,
    kv_heads: usize,
    kv_head: usize,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
    #[comptime] units: usize,
) {
    let first = split * comptime!(KV_SPLIT);
    let staged = keys_in_split(most_keys, first);
    let split_row = cache_row(block_rows, slot, width, first);
    let hd_vecs = comptime!(head_dim / vs);
    let ld_vecs = comptime!((head_dim + PAD) / vs);
    let unit = UNIT_POS as usize;
    // the stage's earlier contents (read by ldmatrix, zeroed by plain stores) before the
    // async proxy writes it again
    sync_async_proxy_shared();
    if unit == 0 {
        bar.arrive_and_expect_tx(1u32, (staged * comptime!(head_dim * 2)) as u32);
    }
    let mut r = unit;
    while r < staged {
        let from = ((split_row + r) * kv_heads + kv_head) * hd_vecs;
        let to = r * ld_vecs;
        bulk_copy_to_shared::<Vector<F, N>>(stage_at + (to * comptime!(vs * 2)) as u32, &cache.slice(from, from + hd_vecs), comptime!(head_dim * 2) as u32, bar);
        r += comptime!(units);
    }
    // rows past the prefix: zeros, as the 16-byte copies' zero-fill left them
    let mut i = staged * hd_vecs + unit;
    while i < comptime!(KV_SPLIT * head_dim / vs) {
        stage[(i / hd_vecs) * ld_vecs + i % hd_vecs] = Vector::<F, N>::new(F::from_int(0));
        i += comptime!(units);
    }
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mma_partial_bulk_kernel<F: Float, N: Size, I: Int>(
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
    #[comptime] warps: usize,
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
    let warp = UNIT_POS_Y as usize;
    let g = (lane / 4) as usize;
    let units = comptime!(warps * 32);
    let bar = Barrier::shared_uninit();
    if UNIT_POS == 0 {
        bar.init_manual(1u32);
        sync_async_proxy_shared();
    }
    sync_cube();
    // cube-uniform conditions only around the syncs below
    if tile < tiles_arg as usize {
        let first_row = u32::cast_from(tiles[2 * tile]) as usize;
        let count = u32::cast_from(tiles[2 * tile + 1]) as usize;
        let queries = count * hpc;
        let first_head = kv_head * group + part * hpc;
        let slot = u32::cast_from(slots[first_row]) as usize;
        let mut q_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(warps * 16 * (head_dim + PAD) / vs), comptime!(SMEM_ALIGN));
        let mut stage = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(KV_SPLIT * (head_dim + PAD) / vs), comptime!(SMEM_ALIGN));
        let mut p_sh = Shared::<[u32]>::new_aligned_slice(comptime!(warps * 16 * LDPW), comptime!(SMEM_ALIGN));
        let mut keys_sh = Shared::<[u32]>::new_slice(comptime!(TC_QUERIES));
        let most_keys = query_keys(positions, &mut keys_sh, first_row, queries, hpc, TC_QUERIES);
        let used = most_keys.div_ceil(comptime!(KV_SPLIT));
        let first_split = chunk * per_cube;
        let mut end = first_split + per_cube;
        if end > used {
            end = used;
        }
        let stage_at = shared_address::<Vector<F, N>>(&stage);
        // cube-uniform: every sync below is reached by all units or none
        if first_split < end {
            fill_stage::<F, N, I>(k_cache, &mut stage, stage_at, &bar, block_rows, slot, width, first_split, most_keys, kv_heads, kv_head, head_dim, vs, units);
            // queries as [16 warps][head_dim + PAD], zeros past `queries`, while the copies fly
            stage_queries::<F, N>(q, &mut q_sh, first_row, queries, hpc, first_head, q_heads, 0, head_dim, vs, comptime!(warps * 16), units);
            sync_cube();
            let busy = warp * 16 < queries; // warp-uniform
            let mut qa = Array::<u32>::new(comptime!(head_dim / 4));
            if busy {
                query_fragments(shared_address::<Vector<F, N>>(&q_sh), &mut qa, head_dim);
            }
            let k_stage = stage_at;
            let q_lo = warp * 16 + g;
            let q_hi = q_lo + 8;
            let p_row_lo = q_lo * comptime!(LDPW);
            let p_row_hi = q_hi * comptime!(LDPW);
            let pair_lo = (first_row + q_lo / hpc) * q_heads + first_head + q_lo % hpc;
            let pair_hi = (first_row + q_hi / hpc) * q_heads + first_head + q_hi % hpc;
            let keys_lo = keys_sh[q_lo] as usize;
            let keys_hi = keys_sh[q_hi] as usize;
            let mut pa = Array::<u32>::new(16usize);
            // the barrier's phase: one per fill, keys then values
            let mut phase = 0u32;
            for split in first_split..end {
                let first = split * comptime!(KV_SPLIT);
                let valid_lo = valid_in_split(keys_lo, first);
                let valid_hi = valid_in_split(keys_hi, first);
                let write_lo = q_lo < queries && valid_lo > 0;
                let write_hi = q_hi < queries && valid_hi > 0;
                let base_lo = (pair_lo * splits + split) * comptime!(head_dim + 2);
                let base_hi = (pair_hi * splits + split) * comptime!(head_dim + 2);
                // this split's keys: the bulk copies, then every unit's zeroed rows
                wait_parity_spin(&bar, phase & 1u32); // a value, not the mutable local (its asm operand would be its address)
                phase ^= 1u32;
                sync_cube();
                if busy {
                    // S = Q Kᵀ, each query's split max and sum (the partial's first two values),
                    // P rounded to the dtype into `pa`: mma_decode's steps
                    let mut s = Array::<f32>::new(32usize);
                    warp_scores(&qa, k_stage, &mut s, head_dim, f16);
                    let max_lo = row_max(&s, valid_lo, scale, 0usize);
                    let max_hi = row_max(&s, valid_hi, scale, 1usize);
                    warp_probs::<F>(&s, &mut pa, &mut p_sh, p_row_lo, p_row_hi, valid_lo, valid_hi, max_lo, max_hi, scale);
                    sync_plane();
                    let sum_lo = row_sum::<F>(&p_sh, p_row_lo);
                    let sum_hi = row_sum::<F>(&p_sh, p_row_hi);
                    if lane % 4 == 0 {
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
                sync_cube(); // the stage's keys are read
                fill_stage::<F, N, I>(v_cache, &mut stage, stage_at, &bar, block_rows, slot, width, split, most_keys, kv_heads, kv_head, head_dim, vs, units);
                wait_parity_spin(&bar, phase & 1u32); // a value, not the mutable local (its asm operand would be its address)
                phase ^= 1u32;
                sync_cube(); // this split's values have landed (and every unit's zeros)
                if busy {
                    split_values(&pa, k_stage, partials, base_lo, base_hi, write_lo, write_hi, head_dim, f16);
                }
                sync_cube(); // the stage's values are read
                if split + 1 < end {
                    fill_stage::<F, N, I>(k_cache, &mut stage, stage_at, &bar, block_rows, slot, width, split + 1, most_keys, kv_heads, kv_head, head_dim, vs, units);
                }
            }
        }
    }
}
