//! Tensor-core (`cmma`) matmul: y[M,N] = x[M,K] @ W for bf16 / f16 operands, f32 accumulation,
//! output in x's dtype. W is stored `[N,K]` ([`WeightLayout::OutIn`]) or `[K,N]`
//! ([`WeightLayout::InOut`]), as for the scalar [`crate::ops::matmul::matmul`].
//!
//! Batch invariance (bitwise): the value of output row `r` must not depend on M or on anything
//! else in the launch. So:
//! * ONE block tile for every shape: a cube computes `BM x BN` outputs with `PLANES` planes, each
//!   plane owning the same fixed `FRAGS_M x FRAGS_N` grid of 16x16 f32 accumulator fragments;
//! * ONE instruction shape, 16x16x16, and no split-K: every accumulator fragment is
//!   `execute(a, b, c, c)`'d with k-chunks `0, 16, 32, ...` in that order, always into itself;
//! * rows beyond M, columns beyond N and k beyond K are staged into shared memory as zeros, so a
//!   boundary tile runs exactly the instruction sequence of an interior one (the zero products
//!   added past K are the same for every M, because K is fixed per weight);
//! * the f32 accumulator is staged through shared memory and only in-bounds elements are cast and
//!   written, so there are no out-of-bounds writes.
//!
//! M only decides how many cubes launch. Row `r` lives in cube row `r / BM`, at tile row `r % BM`,
//! which fixes its plane and fragment, and that fragment sees the same A row, the same B columns
//! and the same instruction sequence whatever the other rows hold.
//!
//! The global loads are vectorized by `vs` in {8,4,2,1} (the largest dividing K, and N for
//! `InOut`): a property of the weight, never of M. Loads only move data; they don't touch the
//! numerics.
//!
//! Pipelining: one shared-memory stage plus a register prefetch: the next k-tile's global loads
//! are issued before the current k-tile's `mma`s, and only written to shared memory after the
//! trailing `sync_cube`.
//!
//! One file past 400 lines: the kernel, its staging helpers and its launcher share the tile
//! constants that make every shape run the same instruction sequence.

use crate::ops::matmul::layout::WeightLayout;
pub use crate::ops::matmul::tc_fragments::*;
pub use crate::ops::matmul::tc_fragments::PLANE_DIM;
use crate::ops::storage;
use crate::{ensure, KernelError};
use burn::tensor::DType;
use burn_cubecl::cubecl::client::Client;
use burn_cubecl::cubecl::cmma::{self, MatrixIdent, MatrixLayout};
use burn_cubecl::cubecl::features::MmaConfig;
use burn_cubecl::cubecl::ir::FloatKind;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;


/// Global -> registers: this unit's share of the `[tile_rows][tile_cols]` tile at (row0, col0) of
/// a row-major `[rows, cols]` matrix (x or W `[N,K]`: rows x k; W `[K,N]`: k x n). Elements past
/// `rows` or `cols` read as zero.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_tile<F: Float, N: Size>(
    src: &Tensor<Vector<F, N>>,
    regs: &mut Array<Vector<F, N>>,
    row0: usize,
    col0: usize,
    rows: usize,
    cols: usize,
    #[comptime] tile_rows: usize,
    #[comptime] tile_cols: usize,
    #[comptime] vs: usize,
    #[comptime] units: usize,
) {
    let unit = UNIT_POS as usize;
    let per_row = comptime!(tile_cols / vs);
    let total = comptime!(tile_rows * tile_cols / vs);
    let col_vecs = cols / vs;
    #[unroll]
    for i in 0..comptime!(total.div_ceil(units)) {
        let v = unit + i * units;
        let grow = row0 + v / per_row;
        let gcol = col0 + (v % per_row) * vs;
        let mut val = Vector::<F, N>::new(F::from_int(0));
        if v < total && grow < rows && gcol < cols {
            val = src[grow * col_vecs + gcol / vs];
        }
        regs[i] = val;
    }
}

/// Registers -> shared: the inverse of [`load_tile`] into a `[tile_rows][ld]` stage.
#[cube]
fn store_tile<F: Float, N: Size>(
    regs: &Array<Vector<F, N>>,
    stage: &mut Shared<[Vector<F, N>]>,
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
    #[unroll]
    for i in 0..comptime!(total.div_ceil(units)) {
        let v = unit + i * units;
        if v < total {
            stage[(v / per_row) * ld_vecs + v % per_row] = regs[i];
        }
    }
}



#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn matmul_tc_kernel<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    w: &Tensor<Vector<F, N>>,
    y: &mut Tensor<F>,
    m_arg: u32,
    n_arg: u32,
    k_arg: u32,
    #[comptime] w_out_in: bool,
    #[comptime] vs: usize,
    #[comptime] plane_dim: usize,
    #[comptime] warps_m: usize,
    #[comptime] warps_n: usize,
    #[comptime] frags_m: usize,
    #[comptime] frags_n: usize,
    #[comptime] bk: usize,
    #[define(F)] _dtype: ElemType,
) {
    let lda = comptime!(bk + PAD);
    let ldb_nk = comptime!(bk + PAD);
    let planes = comptime!(warps_m * warps_n);
    let bm = comptime!(warps_m * frags_m * INSTR);
    let bn = comptime!(warps_n * frags_n * INSTR);
    let ldb_kn = comptime!(bn + PAD);
    let m = m_arg as usize;
    let n = n_arg as usize;
    let k = k_arg as usize;
    let units = comptime!(plane_dim * planes);

    let m0 = CUBE_POS_Y as usize * bm;
    let n0 = CUBE_POS_X as usize * bn;

    // This plane's fixed place in the cube tile.
    let plane = UNIT_POS_Y as usize;
    let row_base = (plane / comptime!(warps_n)) * comptime!(frags_m * INSTR);
    let col_base = (plane % comptime!(warps_n)) * comptime!(frags_n * INSTR);

    // Shared stages, vectors of `vs` elements; the cmma loads address them in elements.
    let a_len = comptime!(bm * lda / vs);
    let b_len = comptime!(if w_out_in { bn * ldb_nk / vs } else { bk * ldb_kn / vs });
    let mut a_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(a_len, comptime!(SMEM_ALIGN));
    let mut b_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(b_len, comptime!(SMEM_ALIGN));

    // Register prefetch buffers: this unit's share of one k-tile of A and of B.
    let a_regs_len = comptime!((bm * bk / vs).div_ceil(units));
    let b_regs_len = comptime!((bn * bk / vs).div_ceil(units));
    let mut a_regs = Array::<Vector<F, N>>::new(a_regs_len);
    let mut b_regs = Array::<Vector<F, N>>::new(b_regs_len);

    // The plane's accumulators, flattened i * FRAGS_N + j, all starting at +0.0.
    let mut accs = Sequence::<cmma::Matrix<f32>>::new();
    #[unroll]
    for _f in 0..comptime!(frags_m * frags_n) {
        accs.push(cmma::Matrix::<f32>::from_value(
            MatrixIdent::Accumulator,
            16usize,
            16usize,
            16usize,
            MatrixLayout::Undefined,
            0.0f32,
        ));
    }

    let k_tiles = (k + bk - 1) / bk;

    // Prologue: k-tile 0 into registers.
    load_tile::<F, N>(x, &mut a_regs, m0, 0, m, k, bm, bk, vs, units);
    if comptime!(w_out_in) {
        load_tile::<F, N>(w, &mut b_regs, n0, 0, n, k, bn, bk, vs, units);
    } else {
        load_tile::<F, N>(w, &mut b_regs, 0, n0, k, n, bk, bn, vs, units);
    }

    for t in 0..k_tiles {
        // Registers -> shared (the previous tile's readers finished at the trailing sync).
        store_tile::<F, N>(&a_regs, &mut a_sh, bm, bk, lda, vs, units);
        if comptime!(w_out_in) {
            store_tile::<F, N>(&b_regs, &mut b_sh, bn, bk, ldb_nk, vs, units);
        } else {
            store_tile::<F, N>(&b_regs, &mut b_sh, bk, bn, ldb_kn, vs, units);
        }
        sync_cube();

        // Prefetch the next k-tile while this one is multiplied.
        let next = t + 1;
        if next < k_tiles {
            let k_next = next * bk;
            load_tile::<F, N>(x, &mut a_regs, m0, k_next, m, k, bm, bk, vs, units);
            if comptime!(w_out_in) {
                load_tile::<F, N>(w, &mut b_regs, n0, k_next, n, k, bn, bk, vs, units);
            } else {
                load_tile::<F, N>(w, &mut b_regs, k_next, n0, k, n, bk, bn, vs, units);
            }
        }

        mma_k_tile::<F, N>(&a_sh, &b_sh, 0, 0, &accs, row_base, col_base, false, w_out_in, vs, bm, bn, bk, frags_m, frags_n);
        sync_cube();
    }

    write_accumulators::<F>(y, &accs, m0, n0, m, n, row_base, col_base, plane, plane_dim, planes, frags_m, frags_n);
}

fn mma_config(operand: FloatKind) -> MmaConfig {
    MmaConfig {
        a_type: ElemType::Float(operand),
        b_type: ElemType::Float(operand),
        cd_type: ElemType::Float(FloatKind::F32),
        m: INSTR as u32,
        n: INSTR as u32,
        k: INSTR as u32,
    }
}

fn fixed_plane_dim(client: &Client) -> Option<usize> {
    let hw = &client.properties().hardware;
    (hw.plane_size_min == hw.plane_size_max && hw.plane_size_max as usize == PLANE_DIM)
        .then_some(PLANE_DIM)
}

/// Whether this device runs [`matmul_tensor_core`] for `dtype` (bf16 or f16): the runtime
/// advertises the `dtype x dtype -> f32`, 16x16x16 cmma configuration, and its planes are
/// exactly [`PLANE_DIM`] units (the kernel maps one plane to `UNIT_POS_Y`).
pub fn tensor_cores_available_for(client: &Client, dtype: DType) -> bool {
    let kind = match dtype {
        DType::BF16 => FloatKind::BF16,
        DType::F16 => FloatKind::F16,
        _ => return false,
    };
    fixed_plane_dim(client).is_some() && client.features().matmul.cmma.contains(&mma_config(kind))
}

/// `x[M,K] @ W` on tensor cores, `w` laid out as `layout` says, for [`crate::ops::matmul::matmul`]
/// once it has checked the operands (`m, k, n` from its shape check) and
/// [`tensor_cores_available_for`] holds. bf16 or f16, f32 accumulation, output in x's dtype,
/// freshly allocated packed `[M,N]`.
/// `pipeline`: [`Pipeline::AsyncCopies`] runs [`crate::ops::matmul::tc_async`]'s kernel where the
/// vector width allows `cp.async` (at least 2 elements: 4, 8 or 16 bytes; a function of K and N,
/// never of M), else the register-prefetch kernel; the bits are the same either way.
/// `x_col_major`: `x` is xᵀ stored row-major `[K, M]` (asynchronous pipeline only, and M a
/// multiple of the vector width; see [`transposed_x_fits`]).
pub(crate) fn matmul_tensor_core(x: CubeTensor, w: CubeTensor, layout: WeightLayout, (m, k, n): (usize, usize, usize), pipeline: Pipeline, x_col_major: bool) -> Result<CubeTensor, KernelError> {
    const OP: &str = "matmul";
    ensure!(matches!(x.dtype, DType::BF16 | DType::F16), OP, "x has dtype {:?}; the tensor-core kernel takes bf16 or f16", x.dtype);
    let vs = vector_width(layout, k, n);
    // Vector width of the global loads: a function of K (and N for `InOut`) only, never of M;
    // `cp.async` moves 4, 8 or 16 bytes, so width 1 takes the register-prefetch kernel.
    let pipeline = if vs >= 2 { pipeline } else { Pipeline::RegisterPrefetch };
    ensure!(!x_col_major || transposed_x_fits(layout, (m, k, n)), OP, "a transposed x needs the asynchronous tiles and M ({m}) a multiple of the vector width {vs}");
    let tiles = tile_shape(pipeline)?;
    let (bm, bn, planes) = (tiles.bm(), tiles.bn(), tiles.planes());
    ensure!(m.div_ceil(bm) <= 65535, OP, "x has {m} rows; at most {} per launch", 65535 * bm);
    let client = x.client.clone();
    let y = empty_device_contiguous_dtype(client.clone(), x.device.clone(), [m, n].into(), x.dtype);
    let (count, dim) = (CubeCount::Static(n.div_ceil(bn) as u32, m.div_ceil(bm) as u32, 1), CubeDim::new_2d(PLANE_DIM as u32, planes as u32));
    if pipeline == Pipeline::AsyncCopies {
        crate::ops::matmul::tc_async::matmul_tc_async_kernel::launch(
            &client,
            count,
            dim,
            vs,
            x.clone().into_tensor_arg(),
            w.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            m as u32,
            n as u32,
            k as u32,
            x_col_major,
            layout == WeightLayout::OutIn,
            vs,
            PLANE_DIM,
            tiles.warps_m,
            tiles.warps_n,
            tiles.frags_m,
            tiles.frags_n,
            tiles.bk(),
            tiles.stages,
            storage(x.dtype),
        );
        return Ok(y);
    }
    matmul_tc_kernel::launch(
        &client,
        count,
        dim,
        vs,
        x.clone().into_tensor_arg(),
        w.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        m as u32,
        n as u32,
        k as u32,
        layout == WeightLayout::OutIn,
        vs,
        PLANE_DIM,
        tiles.warps_m,
        tiles.warps_n,
        tiles.frags_m,
        tiles.frags_n,
        tiles.bk(),
        storage(x.dtype),
    );
    Ok(y)
}

/// Vector width of the tiles' global loads: the largest of 8, 4, 2, 1 dividing K (and N for
/// `InOut`): a property of the weight, never of M.
fn vector_width(layout: WeightLayout, k: usize, n: usize) -> usize {
    [8usize, 4, 2, 1].into_iter().find(|&v| k % v == 0 && (layout == WeightLayout::OutIn || n % v == 0)).unwrap_or(1)
}

/// Whether [`matmul_tensor_core`] can read x as xᵀ `[K, M]` directly: the asynchronous copies
/// run (vector width at least 2) and whole vectors of xᵀ's rows (M long) stay in bounds.
pub(crate) fn transposed_x_fits(layout: WeightLayout, (m, k, n): (usize, usize, usize)) -> bool {
    let vs = vector_width(layout, k, n);
    vs >= 2 && m % vs == 0
}

/// How the tiles' k-tiles reach shared memory (scheduling only: the same bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pipeline {
    /// Global -> registers one k-tile ahead, registers -> shared after each tile's `mma`s.
    RegisterPrefetch,
    /// `cp.async` global -> shared, `stages - 1` k-tiles in flight ([`crate::ops::matmul::tc_async`]).
    AsyncCopies,
}

pub use crate::kernel_choice::TileShape;

/// `LOCKSTEP_TC_TILES` (benchmark sweeps; [`crate::kernel_choice::Tuning`]) for both pipelines,
/// else the pipeline's default: [`TileShape::DEFAULT`] for the register-prefetch kernel,
/// [`TileShape::ASYNC_DEFAULT`] for the asynchronous one.
pub(crate) fn tile_shape(pipeline: Pipeline) -> Result<TileShape, KernelError> {
    let chosen = crate::kernel_choice::KernelChoice::current()?.tuning.tc_tiles;
    Ok(chosen.unwrap_or(match pipeline {
        Pipeline::RegisterPrefetch => TileShape::DEFAULT,
        Pipeline::AsyncCopies => TileShape::ASYNC_DEFAULT,
    }))
}
