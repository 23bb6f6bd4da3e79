//! Prefill tiles of the tensor-core attention, flash-style: one cube per (tile, KV head, head
//! part) walks every split of its queries and writes the attention output itself, with no
//! partials in global memory and no combine launch.
//!
//! It must give the bits of [`crate::ops::attention::decode::cmma`]'s partial kernel followed by the combine
//! kernel (which decode rows run), so it does their arithmetic, operation for operation, in
//! their order:
//! 1. pass 1, split by split: S on `cmma`, each query's split max m_s ([`quarter_max`]); the
//!    query's M = the largest m_s over the splits holding its keys (the combine's max);
//! 2. pass 2, split by split in order: S, m_s, the rounded p and the split sum l_s, O_s = P V
//!    (the same helpers as the partial kernel), then, as the combine does for split s,
//!    total += l_s * exp(m_s - M) and acc[d] += O_s[d] * exp(m_s - M);
//! 3. out[d] = acc[d] / total, in the output dtype.
//! Pass 1 recomputes the scores pass 2 computes again: 1.5x the products, but the partials of a
//! long prefill (f32, head_dim + 2 per query and split) never travel through memory.

use crate::ops::kv_cache::cache_row;
use crate::ops::attention::common::splits::{keys_in_split, KV_SPLIT};
use crate::ops::attention::decode::cmma::{
    load_values, quarter_max, quarter_probs, query_max, query_sum, score_stage_len, split_output, split_scores, stage_split, store_values, LDP, PLANE_DIM, SMEM_ALIGN, TC_QUERIES, UNITS, WINDOW,
};
use crate::ops::attention::common::staging::{query_keys, stage_queries, valid_in_split, PAD};
use crate::ops::reduce::{cube_linear, NEG_BIG};
use burn_cubecl::cubecl::prelude::*;

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn tc_flash_kernel<F: Float, N: Size, I: Int>(
    q: &Tensor<Vector<F, N>>,
    k_cache: &Tensor<Vector<F, N>>,
    v_cache: &Tensor<Vector<F, N>>,
    slots: &Tensor<I>,
    positions: &Tensor<I>,
    tiles: &Tensor<I>,
    block_rows: &Tensor<I>,
    out: &mut Tensor<F>,
    tiles_arg: u32,
    q_heads_arg: u32,
    kv_heads_arg: u32,
    width_arg: u32,
    heads_per_cube_arg: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
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
    let unit = UNIT_POS as usize;
    let lane = UNIT_POS_X as usize;
    let plane = UNIT_POS_Y as usize;
    if tile < tiles_arg as usize {
        let first_row = u32::cast_from(tiles[2 * tile]) as usize;
        let count = u32::cast_from(tiles[2 * tile + 1]) as usize;
        let queries = count * hpc;
        let first_head = kv_head * group + part * hpc;
        let slot = u32::cast_from(slots[first_row]) as usize;
        let mut q_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(TC_QUERIES * (head_dim + PAD) / vs), comptime!(SMEM_ALIGN));
        let mut kv_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(KV_SPLIT * (head_dim + PAD) / vs), comptime!(SMEM_ALIGN));
        let mut s_sh = Shared::<[f32]>::new_aligned_slice(comptime!(score_stage_len(head_dim)), comptime!(SMEM_ALIGN));
        let mut p_sh = Shared::<[F]>::new_aligned_slice(comptime!(TC_QUERIES * LDP), comptime!(SMEM_ALIGN));
        let mut keys_sh = Shared::<[u32]>::new_slice(comptime!(TC_QUERIES));
        let mut quarter_sh = Shared::<[f32]>::new_slice(comptime!(TC_QUERIES * 4));
        // per query of the split: exp(m_s - M), or 0 where the split holds none of its keys
        let mut factor_sh = Shared::<[f32]>::new_slice(comptime!(TC_QUERIES));
        let mut total_sh = Shared::<[f32]>::new_slice(comptime!(TC_QUERIES));
        stage_queries::<F, N>(q, &mut q_sh, first_row, queries, hpc, first_head, q_heads, 0, head_dim, vs, TC_QUERIES, UNITS);
        let most_keys = query_keys(positions, &mut keys_sh, first_row, queries, hpc, TC_QUERIES);
        let used = most_keys.div_ceil(comptime!(KV_SPLIT));
        let busy = (plane / 2) * 16 < queries; // plane-uniform
        let qi = unit / 4;
        let my_keys = keys_sh[qi] as usize;

        // 1. M per query: the largest split max over the splits holding its keys
        let mut run_max = f32::new(NEG_BIG);
        for split in 0..used {
            let first = split * comptime!(KV_SPLIT);
            let staged = keys_in_split(most_keys, first);
            stage_split::<F, N>(k_cache, &mut kv_sh, cache_row(block_rows, slot, width, first), kv_heads, kv_head, staged, head_dim, vs);
            sync_cube();
            split_scores::<F, N>(&q_sh, &kv_sh, &mut s_sh, busy, head_dim, vs);
            sync_cube();
            let valid = valid_in_split(my_keys, first);
            quarter_sh[unit] = quarter_max(&s_sh, valid, scale);
            sync_cube();
            let split_max = query_max(&quarter_sh, qi);
            if valid > 0 && split_max > run_max {
                run_max = split_max;
            }
            sync_cube(); // the next split overwrites the stages
        }

        // 2. the splits again, in order, each folded in as the combine kernel folds a partial
        let mut total = 0.0f32;
        let mut acc = Array::<f32>::new(comptime!((head_dim / 32) * (WINDOW / PLANE_DIM)));
        #[unroll]
        for i in 0..comptime!((head_dim / 32) * (WINDOW / PLANE_DIM)) {
            acc[i] = 0.0f32;
        }
        let mut v_regs = Array::<Vector<F, N>>::new(comptime!((KV_SPLIT * head_dim / vs).div_ceil(UNITS)));
        for split in 0..used {
            let first = split * comptime!(KV_SPLIT);
            let staged = keys_in_split(most_keys, first);
            stage_split::<F, N>(k_cache, &mut kv_sh, cache_row(block_rows, slot, width, first), kv_heads, kv_head, staged, head_dim, vs);
            load_values::<F, N>(v_cache, &mut v_regs, cache_row(block_rows, slot, width, first), kv_heads, kv_head, staged, head_dim, vs);
            sync_cube();
            split_scores::<F, N>(&q_sh, &kv_sh, &mut s_sh, busy, head_dim, vs);
            sync_cube();
            let valid = valid_in_split(my_keys, first);
            quarter_sh[unit] = quarter_max(&s_sh, valid, scale);
            store_values::<F, N>(&v_regs, &mut kv_sh, head_dim, vs);
            sync_cube();
            let split_max = query_max(&quarter_sh, qi);
            let quarter_sum = quarter_probs::<F>(&s_sh, &mut p_sh, valid, scale, split_max);
            sync_cube();
            quarter_sh[unit] = quarter_sum;
            sync_cube();
            if unit % 4 == 0 {
                let mut factor = 0.0f32;
                if valid > 0 {
                    factor = (split_max - run_max).exp();
                    total += query_sum(&quarter_sh, qi) * factor;
                }
                factor_sh[qi] = factor;
            }
            split_output::<F, N>(&p_sh, &kv_sh, &mut s_sh, busy, head_dim, vs);
            sync_cube();
            if busy {
                let qb = plane / 2;
                #[unroll]
                for b in 0..comptime!(head_dim / 32) {
                    let w = (plane * comptime!(head_dim / 32) + b) * comptime!(WINDOW);
                    #[unroll]
                    for e_it in 0..comptime!(WINDOW / PLANE_DIM) {
                        let e = lane + e_it * comptime!(PLANE_DIM);
                        let oq = qb * 16 + e / 16;
                        let i = comptime!(b * (WINDOW / PLANE_DIM) + e_it);
                        // splits past a query's prefix are not folded in (the combine stops
                        // at the query's last split)
                        if first < keys_sh[oq] as usize {
                            acc[i] += s_sh[w + e] * factor_sh[oq];
                        }
                    }
                }
            }
            sync_cube(); // the next split overwrites the stages
        }

        // 3. out = acc / total
        if unit % 4 == 0 {
            total_sh[qi] = total;
        }
        sync_cube();
        if busy {
            let qb = plane / 2;
            #[unroll]
            for b in 0..comptime!(head_dim / 32) {
                let db = (plane % 2) * comptime!(head_dim / 32) + b;
                #[unroll]
                for e_it in 0..comptime!(WINDOW / PLANE_DIM) {
                    let e = lane + e_it * comptime!(PLANE_DIM);
                    let oq = qb * 16 + e / 16;
                    let i = comptime!(b * (WINDOW / PLANE_DIM) + e_it);
                    if oq < queries {
                        let pair = (first_row + oq / hpc) * q_heads + first_head + oq % hpc;
                        out[pair * head_dim + db * 16 + e % 16] = F::cast_from(acc[i] / total_sh[oq]);
                    }
                }
            }
        }
    }
}
