//! The tc tiles' building blocks, shared by the register-prefetch kernel ([`super::tc`]) and the
//! asynchronous-copy kernel ([`super::tc_async`]): the tile constants, the one `mma` sequence of a
//! staged k-tile, and the epilogue. Both kernels run exactly this arithmetic; only how the bytes
//! reach shared memory differs.

use burn_cubecl::cubecl::cmma::{self, MatrixIdent, MatrixLayout};
use burn_cubecl::cubecl::prelude::*;

/// Instruction shape edge: every `mma` is 16x16x16.
pub const INSTR: usize = 16;
/// Planes (warps) of a cube along M and along N.
pub const WARPS_M: usize = 4;
pub const WARPS_N: usize = 2;
/// 16x16 accumulator fragments a plane owns along M and along N.
pub const FRAGS_M: usize = 2;
pub const FRAGS_N: usize = 2;
/// Output rows of a cube (128).
pub const BM: usize = WARPS_M * FRAGS_M * INSTR;
/// Output columns of a cube (64).
pub const BN: usize = WARPS_N * FRAGS_N * INSTR;
/// Default k extent of one shared-memory stage (two 16-deep `mma` steps).
pub const BK: usize = 32;
/// Slots of the asynchronous-copy pipeline: k-tiles in flight while one is multiplied, plus one.
pub const STAGES: usize = 3;
/// Planes per cube.
pub const PLANES: usize = WARPS_M * WARPS_N;
/// The only plane size this kernel is launched with (CUDA warps).
pub const PLANE_DIM: usize = 32;

/// Shared-memory row padding, in elements: 16 bytes for 16-bit types. Keeps every row start a
/// multiple of 16 bytes (wmma needs `ldm % 8 == 0` for 16-bit elements) and shifts consecutive
/// rows by 4 banks, which makes the fragment loads conflict-free.
pub(crate) const PAD: usize = 8;
/// Stages (k extent `bk`, see [`TileShape::k_steps`]): A `[BM][bk + PAD]`, k contiguous; B for
/// `OutIn` `[BN][bk + PAD]`, k contiguous (column-major B fragments); B for `InOut`
/// `[bk][BN + PAD]`, n contiguous (row-major B fragments).
/// Elements of one 16x16 f32 accumulator fragment staged for the epilogue.
pub(crate) const FRAG_ELEMS: usize = INSTR * INSTR;
/// Shared-memory base alignment in bytes (wmma wants 32-byte aligned fragment pointers; every
/// fragment offset used below is a multiple of 32 bytes from the base).
pub(crate) const SMEM_ALIGN: usize = 128;

/// The `mma`s of one staged k-tile, the ONLY instruction sequence every tc tiles kernel runs:
/// k-steps kk = 0, 1, ... (k offset 16 kk within the tile) in order, each accumulator fragment
/// `execute`d into itself. `a_base` / `b_base`: the stage's first vector in `a_sh` / `b_sh`
/// (a multi-stage ring passes its slot's offset). `a_col_major`: the A stage is `[bk][bm + PAD]`
/// (x given transposed) instead of `[bm][bk + PAD]`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mma_k_tile<F: Float, N: Size>(
    a_sh: &Shared<[Vector<F, N>]>,
    b_sh: &Shared<[Vector<F, N>]>,
    a_base: usize,
    b_base: usize,
    accs: &Sequence<cmma::Matrix<f32>>,
    row_base: usize,
    col_base: usize,
    #[comptime] a_col_major: bool,
    #[comptime] w_out_in: bool,
    #[comptime] vs: usize,
    #[comptime] bm: usize,
    #[comptime] bn: usize,
    #[comptime] bk: usize,
    #[comptime] frags_m: usize,
    #[comptime] frags_n: usize,
) {
    let lda = comptime!(bk + PAD);
    let lda_t = comptime!(bm + PAD);
    let ldb_nk = comptime!(bk + PAD);
    let ldb_kn = comptime!(bn + PAD);
    let a_len = a_sh.len();
    let b_len = b_sh.len();
    #[unroll]
    for kk in 0..comptime!(bk / INSTR) {
        let mut b_frags = Sequence::<cmma::Matrix<F>>::new();
        #[unroll]
        for j in 0..comptime!(frags_n) {
            let col = col_base + j * comptime!(INSTR);
            if comptime!(w_out_in) {
                // b_sh[n][k]: element (k, n) at n * LDB_NK + k -> column-major B.
                let mut b = unsafe {
                    cmma::Matrix::<F>::uninitialized(
                        MatrixIdent::B,
                        16usize,
                        16usize,
                        16usize,
                        MatrixLayout::ColMajor,
                    )
                };
                let off = b_base + (col * ldb_nk + kk * comptime!(INSTR)) / comptime!(vs);
                cmma::load(&mut b, b_sh.slice(off, b_len), comptime!(ldb_nk as u32));
                b_frags.push(b);
            } else {
                // b_sh[k][n]: element (k, n) at k * LDB_KN + n -> row-major B.
                let mut b = unsafe {
                    cmma::Matrix::<F>::uninitialized(
                        MatrixIdent::B,
                        16usize,
                        16usize,
                        16usize,
                        MatrixLayout::RowMajor,
                    )
                };
                let off = b_base + (kk * comptime!(INSTR * ldb_kn) + col) / comptime!(vs);
                cmma::load(&mut b, b_sh.slice(off, b_len), comptime!(ldb_kn as u32));
                b_frags.push(b);
            }
        }
        #[unroll]
        for i in 0..comptime!(frags_m) {
            let row = row_base + i * comptime!(INSTR);
            let mut a = unsafe {
                cmma::Matrix::<F>::uninitialized(
                    MatrixIdent::A,
                    16usize,
                    16usize,
                    16usize,
                    comptime!(if a_col_major { MatrixLayout::ColMajor } else { MatrixLayout::RowMajor }),
                )
            };
            if comptime!(a_col_major) {
                // a_sh[k][m]: element (m, k) at k * LDA_T + m -> column-major A (the same
                // fragment values as the row-major stage holds, so the same `mma`s and bits)
                let off = a_base + (kk * comptime!(INSTR * lda_t) + row) / comptime!(vs);
                cmma::load(&mut a, a_sh.slice(off, a_len), comptime!(lda_t as u32));
            } else {
                // a_sh[m][k]: element (m, k) at m * LDA + k -> row-major A.
                let off = a_base + (row * lda + kk * comptime!(INSTR)) / comptime!(vs);
                cmma::load(&mut a, a_sh.slice(off, a_len), comptime!(lda as u32));
            }
            #[unroll]
            for j in 0..comptime!(frags_n) {
                let acc = accs.index(comptime!(i * frags_n + j));
                cmma::execute(&a, b_frags.index(j), acc, acc);
            }
        }
    }
}

/// Epilogue: each plane stages one fragment at a time in its own 16x16 f32 window, then writes
/// the in-bounds elements, cast to the output dtype. The window is the plane's alone, so a
/// plane-wide sync orders its store, reads and next store (no cube-wide syncs).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_accumulators<F: Float>(
    y: &mut Tensor<F>,
    accs: &Sequence<cmma::Matrix<f32>>,
    m0: usize,
    n0: usize,
    m: usize,
    n: usize,
    row_base: usize,
    col_base: usize,
    plane: usize,
    #[comptime] plane_dim: usize,
    #[comptime] planes: usize,
    #[comptime] frags_m: usize,
    #[comptime] frags_n: usize,
) {
    let mut stage = Shared::<[f32]>::new_aligned_slice(comptime!(planes * FRAG_ELEMS), comptime!(SMEM_ALIGN));
    let lane = UNIT_POS_X as usize;
    let st = plane * comptime!(FRAG_ELEMS);
    #[unroll]
    for i in 0..comptime!(frags_m) {
        #[unroll]
        for j in 0..comptime!(frags_n) {
            cmma::store(
                stage.slice_mut(st, st + comptime!(FRAG_ELEMS)),
                accs.index(comptime!(i * frags_n + j)),
                16u32,
                MatrixLayout::RowMajor,
            );
            sync_plane();
            #[unroll]
            for e_iter in 0..comptime!(FRAG_ELEMS / plane_dim) {
                let e = lane + e_iter * comptime!(plane_dim);
                let grow = m0 + row_base + i * comptime!(INSTR) + e / comptime!(INSTR);
                let gcol = n0 + col_base + j * comptime!(INSTR) + e % comptime!(INSTR);
                if grow < m && gcol < n {
                    y[grow * n + gcol] = F::cast_from(stage[st + e]);
                }
            }
            sync_plane();
        }
    }
}
