//! The tensor-core tiles of [`crate::ops::matmul::tc`] fed by a multi-stage asynchronous-copy
//! pipeline (`cp.async`, CUDA sm80+): global -> shared without passing through registers, with
//! `stages - 1` k-tiles in flight while one is multiplied.
//!
//! Why: the register-prefetch kernel stalls on global loads (ncu: long-scoreboard
//! 9.4-11.4 cycles per issue at 24% occupancy); asynchronous copies keep several k-tiles in
//! flight and free the prefetch registers.
//!
//! Bits: the same as [`crate::ops::matmul::tc`]'s for every shape. The tile, the zero fill (rows past
//! M, columns past N, k past K: whole vectors, because the vector width divides K and, for
//! `InOut`, N) and the `mma` sequence are the same: both kernels run
//! [`crate::ops::matmul::tc::mma_k_tile`] on each staged k-tile in k order and write through
//! [`crate::ops::matmul::tc::write_accumulators`]. Only when the bytes arrive changes.
//!
//! A weight gradient's x is xᵀ stored `[K, M]` (`dyᵀ @ x`); `x_col_major` stages it as it is, as
//! a `[bk][bm + PAD]` A slot read by column-major fragment loads (the same values in the same
//! fragments, so the same `mma`s and bits as a transposed copy; M must then be a multiple of the
//! vector width too).
//!
//! Synchronization, per k-tile t (slot t % stages): `cp.async.wait_group stages-2` (this unit's
//! copies of tile t landed), `sync_cube` (everyone's landed, and everyone finished tile t-1, whose
//! slot is refilled next), issue tile t + stages - 1 into that slot, commit one group (empty
//! past the end, so the group count stays one per k-tile), multiply tile t.

use crate::ops::matmul::tc_fragments::{mma_k_tile, write_accumulators, INSTR, PAD, SMEM_ALIGN};
use burn_cubecl::cubecl::cmma::{self, MatrixIdent, MatrixLayout};
use burn_cubecl::cubecl::prelude::barrier::copy_async_checked;
use burn_cubecl::cubecl::prelude::*;
use crate::ops::ptx::{commit_copies, wait_copies};

/// Global -> shared, asynchronously: this unit's share of the `[tile_rows][tile_cols]` tile at
/// (row0, col0) of a row-major `[rows, cols]` matrix into the `[tile_rows][ld]` slot starting at
/// vector `base`. Vectors past `rows` or `cols` are zero-filled by the copy itself (source
/// length 0).
#[cube]
#[allow(clippy::too_many_arguments)]
fn copy_tile_async<F: Float, N: Size>(
    src: &Tensor<Vector<F, N>>,
    stage: &mut Shared<[Vector<F, N>]>,
    base: usize,
    row0: usize,
    col0: usize,
    rows: usize,
    cols: usize,
    #[comptime] tile_rows: usize,
    #[comptime] tile_cols: usize,
    #[comptime] ld: usize,
    #[comptime] vs: usize,
    #[comptime] units: usize,
) {
    let unit = UNIT_POS as usize;
    let per_row = comptime!(tile_cols / vs);
    let ld_vecs = comptime!(ld / vs);
    let total = comptime!(tile_rows * tile_cols / vs);
    let col_vecs = cols / vs;
    #[unroll]
    for i in 0..comptime!(total.div_ceil(units)) {
        let v = unit + i * units;
        if v < total {
            let grow = row0 + v / per_row;
            let gcol = col0 + (v % per_row) * vs;
            let mut from = 0usize;
            let mut len = 0usize;
            if grow < rows && gcol < cols {
                from = grow * col_vecs + gcol / vs;
                len = 1;
            }
            let to = base + (v / per_row) * ld_vecs + v % per_row;
            copy_async_checked(&src.slice(from, from + len), &mut stage.slice_mut(to, to + 1), comptime!(vs as u32));
        }
    }
}

/// Issues the copies of k-tile `k0 / bk` of A and B into slot `slot`. `x_col_major`: `x` holds
/// xᵀ, row-major `[K, M]` (a backward's `dyᵀ`), staged as `[bk][bm + PAD]` without a transposing
/// copy.
#[cube]
#[allow(clippy::too_many_arguments)]
fn issue_k_tile<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    w: &Tensor<Vector<F, N>>,
    a_sh: &mut Shared<[Vector<F, N>]>,
    b_sh: &mut Shared<[Vector<F, N>]>,
    slot: usize,
    m0: usize,
    n0: usize,
    k0: usize,
    m: usize,
    n: usize,
    k: usize,
    #[comptime] x_col_major: bool,
    #[comptime] w_out_in: bool,
    #[comptime] vs: usize,
    #[comptime] bm: usize,
    #[comptime] bn: usize,
    #[comptime] bk: usize,
    #[comptime] units: usize,
) {
    let ldb_nk = comptime!(bk + PAD);
    let ldb_kn = comptime!(bn + PAD);
    let a_slot = comptime!(a_slot_len(x_col_major, bm, bk, vs));
    let b_slot = comptime!(if w_out_in { bn * ldb_nk / vs } else { bk * ldb_kn / vs });
    if comptime!(x_col_major) {
        copy_tile_async::<F, N>(x, a_sh, slot * a_slot, k0, m0, k, m, bk, bm, comptime!(bm + PAD), vs, units);
    } else {
        copy_tile_async::<F, N>(x, a_sh, slot * a_slot, m0, k0, m, k, bm, bk, comptime!(bk + PAD), vs, units);
    }
    if comptime!(w_out_in) {
        copy_tile_async::<F, N>(w, b_sh, slot * b_slot, n0, k0, n, k, bn, bk, ldb_nk, vs, units);
    } else {
        copy_tile_async::<F, N>(w, b_sh, slot * b_slot, k0, n0, k, n, bk, bn, ldb_kn, vs, units);
    }
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_tc_async_kernel<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    w: &Tensor<Vector<F, N>>,
    y: &mut Tensor<F>,
    m_arg: u32,
    n_arg: u32,
    k_arg: u32,
    #[comptime] x_col_major: bool,
    #[comptime] w_out_in: bool,
    #[comptime] vs: usize,
    #[comptime] plane_dim: usize,
    #[comptime] warps_m: usize,
    #[comptime] warps_n: usize,
    #[comptime] frags_m: usize,
    #[comptime] frags_n: usize,
    #[comptime] bk: usize,
    #[comptime] stages: usize,
    #[define(F)] _dtype: ElemType,
) {
    let planes = comptime!(warps_m * warps_n);
    let bm = comptime!(warps_m * frags_m * INSTR);
    let bn = comptime!(warps_n * frags_n * INSTR);
    let units = comptime!(plane_dim * planes);
    let a_slot = comptime!(a_slot_len(x_col_major, bm, bk, vs));
    let b_slot = comptime!(if w_out_in { bn * (bk + PAD) / vs } else { bk * (bn + PAD) / vs });
    let m = m_arg as usize;
    let n = n_arg as usize;
    let k = k_arg as usize;
    let m0 = CUBE_POS_Y as usize * bm;
    let n0 = CUBE_POS_X as usize * bn;
    let plane = UNIT_POS_Y as usize;
    let row_base = (plane / comptime!(warps_n)) * comptime!(frags_m * INSTR);
    let col_base = (plane % comptime!(warps_n)) * comptime!(frags_n * INSTR);

    let mut a_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(stages * a_slot), comptime!(SMEM_ALIGN));
    let mut b_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(stages * b_slot), comptime!(SMEM_ALIGN));
    let mut accs = Sequence::<cmma::Matrix<f32>>::new();
    #[unroll]
    for _f in 0..comptime!(frags_m * frags_n) {
        accs.push(cmma::Matrix::<f32>::from_value(MatrixIdent::Accumulator, 16usize, 16usize, 16usize, MatrixLayout::Undefined, 0.0f32));
    }

    let k_tiles = k.div_ceil(bk);
    // Prologue: k-tiles 0 .. stages - 2 in flight, one group each.
    #[unroll]
    for s in 0..comptime!(stages - 1) {
        if s < k_tiles {
            issue_k_tile::<F, N>(x, w, &mut a_sh, &mut b_sh, s, m0, n0, s * bk, m, n, k, x_col_major, w_out_in, vs, bm, bn, bk, units);
        }
        commit_copies();
    }
    // Unrolled by `stages` so each k-tile's slot is a compile-time offset.
    for r in 0..k_tiles.div_ceil(stages) {
        #[unroll]
        for s in 0..comptime!(stages) {
            let t = r * stages + s;
            if t < k_tiles {
                wait_copies(comptime!(stages - 2));
                sync_cube();
                let next = t + stages - 1;
                if next < k_tiles {
                    issue_k_tile::<F, N>(x, w, &mut a_sh, &mut b_sh, comptime!((s + stages - 1) % stages), m0, n0, next * bk, m, n, k, x_col_major, w_out_in, vs, bm, bn, bk, units);
                }
                commit_copies();
                mma_k_tile::<F, N>(&a_sh, &b_sh, comptime!(s * a_slot), comptime!(s * b_slot), &accs, row_base, col_base, x_col_major, w_out_in, vs, bm, bn, bk, frags_m, frags_n);
            }
        }
    }
    write_accumulators::<F>(y, &accs, m0, n0, m, n, row_base, col_base, plane, plane_dim, planes, frags_m, frags_n);
}

/// Vectors of one A slot: `[bm][bk + PAD]`, or `[bk][bm + PAD]` for a transposed x.
fn a_slot_len(x_col_major: bool, bm: usize, bk: usize, vs: usize) -> usize {
    if x_col_major { bk * (bm + PAD) / vs } else { bm * (bk + PAD) / vs }
}
