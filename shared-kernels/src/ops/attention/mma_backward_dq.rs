//! dQ of the tensor-core attention backward from a stored dS (`LOCKSTEP_BACKWARD_DQ=stored`):
//! the key kernel ([`super::mma_backward`]) already computes every dS the query kernel would
//! (`Sᵀ = K Qᵀ` and `dPᵀ = V dOᵀ` are the same products as `S = Q Kᵀ` and `dP = dO Vᵀ` with the
//! operands swapped, the same bits; the same p, the same rounding to the dtype), so it writes
//! them to a buffer and [`mma_backward_dq_kernel`] only runs `dQ += dS K`: per 64-key split a
//! chain of four 16-key steps from zero added to the f32 accumulators in split order, the warps
//! that the query kernel skips skipping the same splits. dQ is then the query kernel's, as bits,
//! without its recomputation of S, P and dP (the battery's `attention backward stored dS`).
//!
//! The buffer holds, per sequence, per query head, the causal 64 x 64 blocks (query tile i, key
//! tile j <= i) row by row, each `[key][query]` (dSᵀ as the key kernel holds it); its size is
//! quadratic in a sequence's length, so past [`DS_STORE_LIMIT`] elements the query kernel runs
//! instead (the same bits).

use crate::ops::attention::cmma::PAD;
use crate::ops::attention::mma::{commit_copies, ldmatrix_x4, stage_split_async, value_lane_address, wait_copies, warp_values, SMEM_ALIGN};
use crate::ops::attention::splits::{keys_in_split, KV_SPLIT};
use crate::ops::ptx::shared_address;
use crate::ops::reduce::cube_linear;
use burn_cubecl::cubecl::prelude::*;

/// The stored dS's largest size in elements (2 GiB in 16 bits): one update's micro-batch of
/// 4 x 4,096 tokens at 16 query heads holds 0.55 G, one 8,192-token sequence 0.54 G.
pub const DS_STORE_LIMIT: usize = 1 << 30;

const WARPS: usize = KV_SPLIT / 16;
const UNITS: usize = WARPS * 32;
const VS: usize = 8;

/// Per tile of `sequences` (the tile table's order), the first block of its sequence in the
/// stored dS, and the buffer's size in elements; `None` past [`DS_STORE_LIMIT`].
pub fn stored_ds_layout(sequences: &[(usize, usize)], q_heads: usize) -> Option<(Vec<i32>, usize)> {
    let mut bases = Vec::new();
    let mut blocks = 0usize;
    for &(_, len) in sequences {
        let n = len.div_ceil(KV_SPLIT);
        bases.extend(std::iter::repeat_n(blocks as i32, n));
        blocks += q_heads * n * (n + 1) / 2;
        if blocks * KV_SPLIT * KV_SPLIT > DS_STORE_LIMIT {
            return None;
        }
    }
    Some((bases, (blocks * KV_SPLIT * KV_SPLIT).max(1)))
}

/// The first element of the block (query tile of position `query_first`, `head`, key tile of
/// position `key_first`) of `tile`'s sequence (of `len` tokens) in the stored dS.
#[cube]
pub(crate) fn ds_block<I: Int>(ds_bases: &Tensor<I>, tile: usize, len: usize, key_first: usize, query_first: usize, head: usize) -> usize {
    let n = len.div_ceil(KV_SPLIT);
    let qi = query_first / KV_SPLIT;
    let kj = key_first / KV_SPLIT;
    let base = u32::cast_from(ds_bases[tile]) as usize;
    (base + head * (n * (n + 1) / 2) + qi * (qi + 1) / 2 + kj) * comptime!(KV_SPLIT * KV_SPLIT)
}

/// The warp's 16 query rows of dS over the 64 keys of a staged `[key][query]` block as `mma`
/// A fragments (`a[kc * 4 + r]`, the layout `pack_fragment` gives): `ldmatrix.trans` of the
/// 8 x 8 blocks (keys 16 kc + 8 (r / 2), queries 16 warp + 8 (r % 2)).
#[cube]
fn transposed_fragments(stage: u32, a: &mut Array<u32>) {
    let lane = UNIT_POS_X;
    let ld_bytes = comptime!(((KV_SPLIT + PAD) * 2) as u32);
    let addr = stage + ((lane / 16) * 8 + lane % 8) * ld_bytes + (UNIT_POS_Y * 16 + ((lane / 8) % 2) * 8) * 2;
    #[unroll]
    for kc in 0..4usize {
        let m = ldmatrix_x4(addr + comptime!((kc * 16) as u32) * ld_bytes, true);
        #[unroll]
        for r in 0..4usize {
            a[comptime!(kc * 4 + r)] = m.extract(r);
        }
    }
}

/// One cube per (query tile, query head): dQ of the tile's rows from the stored dS and K, in the
/// query kernel's order (see the module).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mma_backward_dq_kernel<F: Float, N: Size, I: Int>(
    k: &Tensor<Vector<F, N>>,
    d_s: &Tensor<Vector<F, N>>,
    tiles: &Tensor<I>,
    ds_bases: &Tensor<I>,
    d_q: &mut Tensor<F>,
    tiles_arg: u32,
    q_heads_arg: u32,
    kv_heads_arg: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] f16: bool,
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
        let first_row = u32::cast_from(tiles[3 * tile]) as usize;
        let start = u32::cast_from(tiles[3 * tile + 1]) as usize;
        let len = u32::cast_from(tiles[3 * tile + 2]) as usize;
        let first_pos = first_row - start;
        let count = keys_in_split(len, first_pos);
        let k_vecs = comptime!(KV_SPLIT * (head_dim + PAD) / VS);
        let k_bytes = comptime!((KV_SPLIT * (head_dim + PAD) * 2) as u32);
        let ds_vecs = comptime!(KV_SPLIT * (KV_SPLIT + PAD) / VS);
        let ds_bytes = comptime!((KV_SPLIT * (KV_SPLIT + PAD) * 2) as u32);
        // two K and two dS stages: the next split's copies fly while this split's products run
        let mut k_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(2 * k_vecs), comptime!(SMEM_ALIGN));
        let mut ds_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(2 * ds_vecs), comptime!(SMEM_ALIGN));
        let most_keys = first_pos + count;
        let splits = most_keys.div_ceil(comptime!(KV_SPLIT));
        // the block rows of split 0: the buffer viewed as rows of 64 values
        let row0 = ds_block(ds_bases, tile, len, 0, first_pos, head) / comptime!(KV_SPLIT);
        stage_split_async::<F, N>(k, &mut k_sh, 0, start, kv_heads, kv_head, keys_in_split(most_keys, 0), head_dim, comptime!(VS), comptime!(UNITS));
        stage_split_async::<F, N>(d_s, &mut ds_sh, 0, row0, 1, 0, comptime!(KV_SPLIT), comptime!(KV_SPLIT), comptime!(VS), comptime!(UNITS));
        // split 0's copies are their own group: the loop's wait_copies(1) leaves only the newest
        // group in flight, so without this commit split 0 would be read before it lands
        commit_copies();
        let k_addr = shared_address::<Vector<F, N>>(&k_sh);
        let ds_addr = shared_address::<Vector<F, N>>(&ds_sh);
        // the longest prefix among the warp's rows (the query kernel's skip rule)
        let mut warp_most = 0usize;
        if warp * 16 < count {
            let mut last_row = warp * 16 + 15;
            if last_row >= count {
                last_row = count - 1;
            }
            warp_most = first_pos + last_row + 1;
        }
        let mut dsa = Array::<u32>::new(16usize);
        let mut o = Array::<f32>::new(16usize);
        let mut acc = Array::<f32>::new(comptime!(head_dim / 2));
        #[unroll]
        for i in 0..comptime!(head_dim / 2) {
            acc[i] = 0.0f32;
        }
        for split in 0..splits {
            let first = split * comptime!(KV_SPLIT);
            let buf = (split % 2) as u32;
            let next = split + 1;
            if next < splits {
                let next_first = next * comptime!(KV_SPLIT);
                let other = 1 - split % 2;
                stage_split_async::<F, N>(k, &mut k_sh, other * k_vecs, start + next_first, kv_heads, kv_head, keys_in_split(most_keys, next_first), head_dim, comptime!(VS), comptime!(UNITS));
                stage_split_async::<F, N>(d_s, &mut ds_sh, other * ds_vecs, row0 + next * comptime!(KV_SPLIT), 1, 0, comptime!(KV_SPLIT), comptime!(KV_SPLIT), comptime!(VS), comptime!(UNITS));
            }
            commit_copies();
            wait_copies(1usize);
            sync_cube();
            if first < warp_most {
                transposed_fragments(ds_addr + buf * ds_bytes, &mut dsa);
                let k_trans = value_lane_address(k_addr + buf * k_bytes, head_dim);
                #[unroll]
                for dg in 0..comptime!(head_dim / 32) {
                    warp_values(&dsa, k_trans + comptime!((dg * 64) as u32), &mut o, head_dim, f16);
                    #[unroll]
                    for i in 0..16usize {
                        acc[comptime!(dg * 16 + i)] += o[i];
                    }
                }
            }
            sync_cube(); // every warp is done with this split's stages before the next refills them
        }
        let r_lo = warp * 16 + g;
        #[unroll]
        for i in 0..comptime!(head_dim / 2) {
            let r = r_lo + comptime!(i % 4 / 2 * 8);
            if r < count {
                d_q[((first_row + r) * q_heads + head) * comptime!(head_dim) + comptime!(i / 4) * 8 + 2 * t + comptime!(i % 2)] = F::cast_from(acc[i] * scale);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sequence_holds_its_causal_blocks_per_head_and_the_limit_falls_back() {
        // 64 tokens: 1 tile, 1 block a head; 65: 2 tiles, 3 blocks a head; 1: 1 block
        let (bases, elements) = stored_ds_layout(&[(0, 64), (64, 65), (129, 1)], 2).unwrap();
        assert_eq!(bases, vec![0, 2, 2, 8]);
        assert_eq!(elements, (2 + 6 + 2) * 64 * 64);
        // 16 heads: 4 x 4,096 fits, one sequence of 16,384 does not
        assert!(stored_ds_layout(&[(0, 4096), (4096, 4096), (8192, 4096), (12288, 4096)], 16).is_some());
        assert!(stored_ds_layout(&[(0, 16384)], 16).is_none());
    }
}
