//! The warpgroup matmul ([`crate::ops::matmul::wgmma`]) as a persistent, warp-specialized kernel: the
//! schedule CUTLASS runs on Hopper, on the same instruction, layouts and tiles.
//!
//! A cube is `wg_m` consumer warpgroups and one producer warp. The producer's first unit walks
//! the cube's tiles and their k-tiles, issuing each k-tile's copies into the next free slot as
//! soon as the consumers have released it; the consumers walk the same sequence, waiting for
//! each slot to fill, issuing its `wgmma`s and releasing the previous k-tile's slot once its
//! `wgmma`s are done. No cube-wide sync in the loop: two mbarriers per slot ("full": the copies
//! landed; "empty": every consumer warp is done reading it). The grid is as many cubes as the
//! multiprocessors hold at once, each taking tiles cube, cube + grid, ... so that a tile's
//! epilogue (accumulators to global memory) runs while the producer already stages the next
//! tile's first k-tiles.
//!
//! Bits: scheduling only. Every output still accumulates k = 0, 16, 32, ... from zero, one
//! 16-deep `wgmma` step each, in the same tiles as the synced kernel (the battery compares them
//! and both against the `mma.sync` kernels, as bits).

use crate::ops::ptx::shared_address;
use crate::ops::matmul::wgmma_fragments::{
    declare_accumulators, issue_operand, leading_units, load_accumulators_in_place, read_accumulators, wait_parity_spin, wgmma_k_tile, write_accumulators, zero_accumulators, BK,
    BOX_BYTES, CHUNK, DESCRIPTOR_HI, SWIZZLE_ALIGN, WARPGROUP, WG_ROWS,
};
use burn_cubecl::cubecl::prelude::barrier::Barrier;
use burn_cubecl::cubecl::prelude::*;

/// Units of the producer warp (after the consumer warpgroups: `wgmma` needs each warpgroup's
/// first warp at a multiple of 4).
pub(super) const PRODUCER: usize = 32;

/// How many times slot `s` is filled per tile of `k_tiles` k-tiles: the phase count the two
/// sides advance it by per tile.
#[cube]
fn slot_uses(k_tiles: usize, #[comptime] s: usize, #[comptime] stages: usize) -> usize {
    (k_tiles + comptime!(stages - 1 - s)) / comptime!(stages)
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_wgmma_persistent_kernel<F: Float, O: Float, N: Size, H: Size, P: Size>(
    x_map: &TensorMap<F, Tiled>,
    w_map: &TensorMap<F, Tiled>,
    y: &mut Tensor<Vector<O, P>>,
    m_arg: u32,
    n_arg: u32,
    k_arg: u32,
    m_tiles_arg: u32,
    tiles_arg: u32,
    #[comptime] wg_m: usize,
    #[comptime] bn: usize,
    #[comptime] stages: usize,
    #[comptime] f16: bool,
    #[comptime] a_mn: bool,
    #[comptime] b_mn: bool,
    #[comptime] pairs: bool,
    #[comptime] accumulate: bool,
    #[define(F, O)] _d: [ElemType; 2],
) {
    let bm = comptime!(wg_m * WG_ROWS);
    let a_slot = comptime!(bm * BK / CHUNK);
    let b_slot = comptime!(bn * BK / CHUNK);
    let tile_bytes = comptime!(((bm + bn) * BK * 2) as u32);
    let consumers = comptime!(wg_m * WARPGROUP);
    let m = m_arg as usize;
    let n = n_arg as usize;
    let k = k_arg as usize;
    let m_tiles = m_tiles_arg as usize;
    let unit = UNIT_POS as usize;

    let mut a_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(stages * a_slot), comptime!(SWIZZLE_ALIGN));
    let mut b_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(stages * b_slot), comptime!(SWIZZLE_ALIGN));
    let mut full = Sequence::<Shared<Barrier>>::new();
    let mut empty = Sequence::<Shared<Barrier>>::new();
    #[unroll]
    for _s in 0..comptime!(stages) {
        full.push(Barrier::shared_uninit());
        empty.push(Barrier::shared_uninit());
    }
    if unit == 0 {
        #[unroll]
        for s in 0..comptime!(stages) {
            full.index(s).init_manual(1u32);
            // one arrival per consumer warp
            empty.index(s).init_manual(comptime!((wg_m * WARPGROUP / 32) as u32));
        }
        sync_async_proxy_shared();
    }
    sync_cube();
    declare_accumulators(comptime!(bn / 2));

    let k_tiles = k.div_ceil(BK);
    let rounds = k_tiles.div_ceil(stages);
    let cube = CUBE_POS_X as usize;
    let grid = CUBE_COUNT_X as usize;
    // the launcher makes grid <= tiles: every cube has at least one
    let my_tiles = (tiles_arg as usize - cube).div_ceil(grid);
    if unit >= consumers {
        if unit == consumers {
            for j in 0..my_tiles {
                let tile = cube + j * grid;
                let m0 = (tile % m_tiles) * bm;
                let n0 = (tile / m_tiles) * bn;
                for r in 0..rounds {
                    #[unroll]
                    for s in 0..comptime!(stages) {
                        let t = r * stages + s;
                        if t < k_tiles {
                            // use u of the slot: wait for the consumers' release of use u - 1
                            // (the first use finds the phase before it complete)
                            let u = j * slot_uses(k_tiles, s, stages) + r;
                            wait_parity_spin(empty.index(s), ((u & 1) ^ 1) as u32);
                            let bar = full.index(s);
                            bar.arrive_and_expect_tx(1u32, tile_bytes);
                            issue_operand::<F, N>(bar, x_map, &mut a_sh, comptime!(s * a_slot), m0, t * BK, bm, a_mn);
                            issue_operand::<F, N>(bar, w_map, &mut b_sh, comptime!(s * b_slot), n0, t * BK, bn, b_mn);
                        }
                    }
                }
            }
        }
    } else {
        let group = unit / comptime!(WARPGROUP);
        let lane = unit % 32;
        // warpgroup g's 64 rows: 64 K-major rows of 128 bytes, or the g-th MN box; both 8 KiB in
        let a_lo = ((shared_address::<Vector<F, N>>(&a_sh) + (group * BOX_BYTES) as u32) >> 4) | comptime!(leading_units(a_mn) << 16);
        let b_lo = (shared_address::<Vector<F, N>>(&b_sh) >> 4) | comptime!(leading_units(b_mn) << 16);
        let hi = comptime!(DESCRIPTOR_HI);
        for j in 0..my_tiles {
            let tile = cube + j * grid;
            let m0 = (tile % m_tiles) * bm;
            let n0 = (tile / m_tiles) * bn;
            if comptime!(accumulate) {
                // a fold: the chain continues from the tile's current values
                load_accumulators_in_place::<O, P>(y, m0, n0, n, unit, group, comptime!(bn / 2));
            } else {
                zero_accumulators(comptime!(bn / 2));
            }
            for r in 0..rounds {
                #[unroll]
                for s in 0..comptime!(stages) {
                    let t = r * stages + s;
                    if t < k_tiles {
                        let u = j * slot_uses(k_tiles, s, stages) + r;
                        wait_parity_spin(full.index(s), (u & 1) as u32);
                        wgmma_k_tile(a_lo + comptime!((s * a_slot) as u32), hi, b_lo + comptime!((s * b_slot) as u32), hi, bn, f16, a_mn, b_mn);
                        // the previous k-tile's wgmmas are done: its slot is free
                        if t > 0 && lane == 0 {
                            empty.index(comptime!((s + stages - 1) % stages)).arrive();
                        }
                    }
                }
            }
            let acc = read_accumulators::<H>(comptime!(bn / 2));
            // every wgmma is done: release the last k-tile's slot before the epilogue
            if lane == 0 {
                let last = (k_tiles - 1) % stages;
                #[unroll]
                for s in 0..comptime!(stages) {
                    if last == s {
                        empty.index(s).arrive();
                    }
                }
            }
            write_accumulators::<O, H, P>(y, acc, m0, n0, m, n, unit, group, bn, pairs);
        }
    }
}
