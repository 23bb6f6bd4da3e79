//! Decode partials with the scores in registers (CUDA, sm_80+): [`crate::ops::attention::decode::cmma`]'s
//! partial kernel (one split's max, sum and P V per query, then the fixed-order combine) on
//! `mma.sync` fragments, through [`crate::ops::attention::common::mma`]'s steps, so the same bits.
//!
//! Why this layout: decode streams K/V splits, and at long contexts the kernel is most of a
//! decode step. A cube is one warp per 16 of the tile's queries (one for Qwen3's 2-4 heads per
//! KV head) and walks `splits_per_cube` consecutive splits, writing one partial per split, so
//! which cube computes a split never changes its bits. ncu found the one-split
//! cubes issue-bound: ~3,400 instructions a split, 5 warps a multiprocessor (shared memory),
//! one instruction every 4.9 cycles a warp. The two launch levers, both bit-neutral:
//! - staging: `Two` keeps K and V stages and refills each as soon as it is read (the next
//!   split's K copies run under this split's P V); `One` passes K then V through one stage,
//!   half the shared memory, so about twice the warps a multiprocessor hide each other's latency;
//! - splits per cube: the query staging and fragment loads are paid once per cube.
//! Where a KV head has at most 8 query heads the automatic launch runs
//! [`super::mma_decode_narrow`] instead: the same partials with the queries on the `mma`'s
//! narrow side; this kernel serves larger groups and the comparisons.

use crate::ops::attention::common::splits::KV_SPLIT;
use crate::ops::attention::common::mma::{
    LDPW, SMEM_ALIGN, commit_copies, query_fragments, row_max, row_sum,
    value_lane_address, wait_copies, warp_probs, warp_scores, warp_values,
};
use crate::ops::attention::decode::cmma::TC_QUERIES;
use crate::ops::attention::common::staging::{issue_split, query_keys, stage_queries, valid_in_split, PAD};
use crate::ops::ptx::shared_address;
use crate::ops::reduce::cube_linear;
use crate::KernelError;
use burn_cubecl::cubecl::prelude::*;

/// Warps per cube for `heads_per_cube` queries per tile row: 16 queries each (a decode tile is
/// one row; at most [`TC_QUERIES`] queries).
pub fn decode_warps(heads_per_cube: usize) -> usize {
    heads_per_cube.div_ceil(16).clamp(1, TC_QUERIES / 16)
}

/// How the partial kernel is launched (consecutive splits per cube and the staging;
/// [`crate::kernel_choice::Tuning`]'s `LOCKSTEP_DECODE_LAUNCH`). Never changes a bit: each
/// split's partial is the same arithmetic wherever it runs.
pub use crate::kernel_choice::{DecodeLaunch, Staging};

/// The automatic choice: enough cubes to fill the device several times over, then longer
/// cubes; `None` in [`DecodeLaunch::parse`].
const AUTO_CUBES: usize = 4096;
const MAX_SPLITS_PER_CUBE: usize = 8;

impl DecodeLaunch {
    /// The automatic launch for `units` (tile, KV head, part, split) work items of
    /// `heads_per_cube` query heads: the staging [`crate::ops::attention::route`] picks, and
    /// [`Self::auto_splits`].
    pub fn auto(units: usize, heads_per_cube: usize) -> DecodeLaunch {
        DecodeLaunch { splits_per_cube: Self::auto_splits(units), staging: crate::ops::attention::route::auto_decode_staging(heads_per_cube) }
    }

    /// Splits per cube for `units` work items: enough cubes to fill the device several times
    /// over, then longer cubes.
    pub fn auto_splits(units: usize) -> usize {
        (units / AUTO_CUBES).clamp(1, MAX_SPLITS_PER_CUBE)
    }

    /// The launch asked for: this thread's choice's (a benchmark's [`with_decode_launch`]), else
    /// the process's `LOCKSTEP_DECODE_LAUNCH`; `None` for `auto`.
    pub fn requested() -> Result<Option<DecodeLaunch>, KernelError> {
        Ok(crate::kernel_choice::KernelChoice::current()?.tuning.decode_launch)
    }

    /// [`Self::requested`], else [`Self::auto`].
    pub fn for_units(units: usize, heads_per_cube: usize) -> Result<DecodeLaunch, KernelError> {
        Ok(Self::requested()?.unwrap_or_else(|| DecodeLaunch::auto(units, heads_per_cube)))
    }
}

/// Runs `f` with this thread's decode partials launched as `launch` (benchmarks compare them):
/// [`crate::kernel_choice::KernelChoice::scoped`].
pub fn with_decode_launch<R>(launch: DecodeLaunch, f: impl FnOnce() -> R) -> Result<R, KernelError> {
    crate::kernel_choice::KernelChoice::scoped(|c| c.tuning.decode_launch = Some(launch), f)
}

/// O = P V (step 3 of a split's partial) from the V stage at byte address `v_stage`, written after the max and sum.
#[cube]
#[allow(clippy::too_many_arguments)]
fn split_values(
    pa: &Array<u32>,
    v_stage: u32,
    partials: &mut Tensor<f32>,
    base_lo: usize,
    base_hi: usize,
    write_lo: bool,
    write_hi: bool,
    #[comptime] head_dim: usize,
    #[comptime] f16: bool,
) {
    let t = (UNIT_POS_X % 4) as usize;
    let v_addr = value_lane_address(v_stage, head_dim);
    let mut o = Array::<f32>::new(16usize);
    #[unroll]
    for dg in 0..comptime!(head_dim / 32) {
        warp_values(pa, v_addr + comptime!((dg * 64) as u32), &mut o, head_dim, f16);
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
    per_cube_arg: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
    #[comptime] f16: bool,
    #[comptime] warps: usize,
    #[comptime] one_stage: bool,
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
    // cube-uniform conditions only around the syncs below
    if tile < tiles_arg as usize {
        let first_row = u32::cast_from(tiles[2 * tile]) as usize;
        let count = u32::cast_from(tiles[2 * tile + 1]) as usize;
        let queries = count * hpc;
        let first_head = kv_head * group + part * hpc;
        let slot = u32::cast_from(slots[first_row]) as usize;
        let stage_len = comptime!(KV_SPLIT * (head_dim + PAD) / vs);
        let mut q_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(
            comptime!(warps * 16 * (head_dim + PAD) / vs),
            comptime!(SMEM_ALIGN),
        );
        let mut k_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(stage_len, comptime!(SMEM_ALIGN));
        // one stage: V goes through the K stage, this one is a placeholder
        let mut v_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(
            comptime!(if one_stage { 1 } else { stage_len }),
            comptime!(SMEM_ALIGN),
        );
        let mut p_sh = Shared::<[u32]>::new_aligned_slice(
            comptime!(warps * 16 * LDPW),
            comptime!(SMEM_ALIGN),
        );
        let mut keys_sh = Shared::<[u32]>::new_slice(comptime!(TC_QUERIES));
        let most_keys = query_keys(positions, &mut keys_sh, first_row, queries, hpc, TC_QUERIES);
        let used = most_keys.div_ceil(comptime!(KV_SPLIT));
        let first_split = chunk * per_cube;
        let mut end = first_split + per_cube;
        if end > used {
            end = used;
        }
        // cube-uniform: every sync below is reached by all units or none
        if first_split < end {
            issue_split::<F, N, I>(k_cache, &mut k_sh, block_rows, slot, width, first_split, most_keys, kv_heads, kv_head, head_dim, vs, units);
            commit_copies();
            if comptime!(!one_stage) {
                issue_split::<F, N, I>(v_cache, &mut v_sh, block_rows, slot, width, first_split, most_keys, kv_heads, kv_head, head_dim, vs, units);
                commit_copies();
            }
            // queries as [16 warps][head_dim + PAD], zeros past `queries`, while the copies fly
            stage_queries::<F, N>(q, &mut q_sh, first_row, queries, hpc, first_head, q_heads, 0, head_dim, vs, comptime!(warps * 16), units);
            sync_cube();
            let busy = warp * 16 < queries; // warp-uniform
            let mut qa = Array::<u32>::new(comptime!(head_dim / 4));
            if busy {
                query_fragments(shared_address::<Vector<F, N>>(&q_sh), &mut qa, head_dim);
            }
            let k_stage = shared_address::<Vector<F, N>>(&k_sh);
            let mut v_stage = k_stage;
            if comptime!(!one_stage) {
                v_stage = shared_address::<Vector<F, N>>(&v_sh);
            }
            let q_lo = warp * 16 + g;
            let q_hi = q_lo + 8;
            let p_row_lo = q_lo * comptime!(LDPW);
            let p_row_hi = q_hi * comptime!(LDPW);
            let pair_lo = (first_row + q_lo / hpc) * q_heads + first_head + q_lo % hpc;
            let pair_hi = (first_row + q_hi / hpc) * q_heads + first_head + q_hi % hpc;
            let keys_lo = keys_sh[q_lo] as usize;
            let keys_hi = keys_sh[q_hi] as usize;
            let mut pa = Array::<u32>::new(16usize);
            for split in first_split..end {
                let first = split * comptime!(KV_SPLIT);
                let valid_lo = valid_in_split(keys_lo, first);
                let valid_hi = valid_in_split(keys_hi, first);
                // partial = (max, sum, O) per query with keys in the split
                let write_lo = q_lo < queries && valid_lo > 0;
                let write_hi = q_hi < queries && valid_hi > 0;
                let base_lo = (pair_lo * splits + split) * comptime!(head_dim + 2);
                let base_hi = (pair_hi * splits + split) * comptime!(head_dim + 2);
                let next = split + 1 < end;
                // this split's K (two stages: V may still be in flight)
                if comptime!(one_stage) {
                    wait_copies(0usize);
                } else {
                    wait_copies(1usize);
                }
                sync_cube();
                if busy {
                    // S = Q Kᵀ, each query's split max and sum (the partial's first two values),
                    // P rounded to the dtype into `pa`
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
                sync_cube(); // the K stage is read
                if comptime!(one_stage) {
                    issue_split::<F, N, I>(v_cache, &mut k_sh, block_rows, slot, width, split, most_keys, kv_heads, kv_head, head_dim, vs, units);
                    commit_copies();
                    wait_copies(0usize);
                } else {
                    if next {
                        issue_split::<F, N, I>(k_cache, &mut k_sh, block_rows, slot, width, split + 1, most_keys, kv_heads, kv_head, head_dim, vs, units);
                    }
                    commit_copies(); // possibly empty: the group count stays uniform
                    wait_copies(1usize);
                }
                sync_cube(); // this split's V has landed
                if busy {
                    split_values(&pa, v_stage, partials, base_lo, base_hi, write_lo, write_hi, head_dim, f16);
                }
                sync_cube(); // the V stage is read
                if next {
                    if comptime!(one_stage) {
                        issue_split::<F, N, I>(k_cache, &mut k_sh, block_rows, slot, width, split + 1, most_keys, kv_heads, kv_head, head_dim, vs, units);
                    } else {
                        issue_split::<F, N, I>(v_cache, &mut v_sh, block_rows, slot, width, split + 1, most_keys, kv_heads, kv_head, head_dim, vs, units);
                    }
                }
                commit_copies();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_automatic_launch_keeps_small_launches_one_split_a_cube() {
        assert_eq!(DecodeLaunch::auto(100, 2).splits_per_cube, 1);
        assert_eq!(DecodeLaunch::auto(8_192, 2).splits_per_cube, 2);
        assert_eq!(DecodeLaunch::auto(10_000_000, 2).splits_per_cube, MAX_SPLITS_PER_CUBE);
    }

    #[test]
    fn the_automatic_launch_takes_the_narrow_kernel_where_the_heads_fit_it() {
        // Qwen3's 2 (0.6B-1.7B) and 4 (4B-8B) heads a KV head, Llama 70B's 8: narrow; 12+: the 16-row kernel
        for hpc in [1, 2, 4, 8] {
            assert_eq!(DecodeLaunch::auto(8_192, hpc).staging, Staging::Narrow, "{hpc}");
        }
        for hpc in [12, 16, 32] {
            assert_eq!(DecodeLaunch::auto(8_192, hpc).staging, Staging::One, "{hpc}");
        }
    }
}
