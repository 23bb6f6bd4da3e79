//! Warpgroup tensor-core matmul (Hopper `wgmma.mma_async`, CUDA sm_90a) in bf16/f16 with f32
//! accumulation: the instruction cuBLAS runs on the H200. The `mma.sync` (wmma) class the other
//! tc kernels use tops out at ~600 TFLOP/s there (`mma peak`, docs/perf.md).
//!
//! cubecl 0.11.3 has no `wgmma`; it is issued through `gpu_asm!` (inline PTX). A cube is `wg_m`
//! warpgroups (128 units each); warpgroup g owns the 64 x `bn` block of rows 64g.. of the cube's
//! tile, its 64 x bn f32 accumulators spread over its 128 units (bn / 2 each).
//!
//! Operands reach the tensor cores from shared memory through matrix descriptors, in the
//! 128-byte-swizzle layouts (the no-swizzle layout ran 1.5-2x slower, bank conflicts), staged by
//! the Tensor Memory Accelerator: one unit issues each k-tile's box copies, which swizzle,
//! zero-fill out-of-bounds rows and k, and complete on that slot's mbarrier. k-tiles are 64
//! deep. An operand stored k-contiguous (x `[M,K]`, W `[N,K]`: "K-major") is one `[rows][64]`
//! box, a row of 128 bytes per M or N; one stored M/N-contiguous (xᵀ `[K,M]` of a weight
//! gradient, W `[K,N]` of a backward `dy @ W`: "MN-major") is `[64 k][64]` boxes side by side,
//! a row of 128 bytes per k. Both layouts feed the same values to the same `wgmma` k-steps.
//!
//! Bits: every output accumulates k = 0, 16, 32, ... from zero, one 16-deep `wgmma` step each,
//! the order of the `mma.sync` kernels. That a `wgmma` k-step rounds as the `mma.sync` ones do is
//! checked as bits by the battery: f32 accumulators of this kernel against a plain cmma chain,
//! bf16 rows against the tc kernels at every M, both weight layouts and xᵀ read in place.
//!
//! This file holds the building blocks (PTX, descriptors, copies, epilogue), the launcher and
//! the synced kernel (`LOCKSTEP_WGMMA_SCHEDULE=synced`); the default schedule is the persistent,
//! warp-specialized kernel of [`crate::ops::matmul::wgmma_persistent`]; tiles and schedule choice are
//! [`crate::ops::matmul::wgmma_tiles`]'s.
//!
//! Synced kernel, per k-tile t: wait for its slot's mbarrier, issue its `wgmma`s (one inline-PTX block:
//! `wgmma.fence`, 4 k-steps, commit, `wait_group 1`: tile t - 1's are then done, t's run on),
//! sync the cube (everyone is done with t - 1), then unit 0 refills t - 1's slot with tile
//! t + stages - 1. The accumulators are PTX registers of function scope: `gpu_asm!` has no
//! in-out operands, and an accumulator passed through C++ between two blocks would be copied
//! while a `wgmma` still writes it.

use crate::ops::matmul::layout::WeightLayout;
use crate::ops::matmul::wgmma_fragments::{
    declare_accumulators, issue_operand, leading_units, read_accumulators, wait_parity_spin, wgmma_k_tile, write_accumulators, zero_accumulators, BK, BOX,
    BOX_BYTES, CHUNK, DESCRIPTOR_HI, SWIZZLE_ALIGN, WARPGROUP, WG_ROWS,
};
use crate::ops::ptx::shared_address;
use crate::ops::matmul::wgmma_persistent::{matmul_wgmma_persistent_kernel, PRODUCER};
pub use crate::ops::matmul::wgmma_tiles::{WgmmaSchedule, WgmmaTiles};
use crate::ops::matmul::wgmma_tiles::{cubes_per_multiprocessor, multiprocessors, wgmma_schedule, wgmma_tiles_for};
use crate::ops::storage;
use crate::{ensure, KernelError};
use burn::tensor::DType;
use burn_cubecl::cubecl::client::Client;
use burn_cubecl::cubecl::cmma::{self, MatrixIdent, MatrixLayout};
use burn_cubecl::cubecl::features::Tma;
use burn_cubecl::cubecl::prelude::barrier::Barrier;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_wgmma_kernel<F: Float, O: Float, N: Size, H: Size, P: Size>(
    x_map: &TensorMap<F, Tiled>,
    w_map: &TensorMap<F, Tiled>,
    y: &mut Tensor<Vector<O, P>>,
    m_arg: u32,
    n_arg: u32,
    k_arg: u32,
    #[comptime] wg_m: usize,
    #[comptime] bn: usize,
    #[comptime] stages: usize,
    #[comptime] f16: bool,
    #[comptime] a_mn: bool,
    #[comptime] b_mn: bool,
    #[comptime] pairs: bool,
    #[define(F, O)] _d: [ElemType; 2],
) {
    let bm = comptime!(wg_m * WG_ROWS);
    let a_slot = comptime!(bm * BK / CHUNK);
    let b_slot = comptime!(bn * BK / CHUNK);
    let tile_bytes = comptime!(((bm + bn) * BK * 2) as u32);
    let m = m_arg as usize;
    let n = n_arg as usize;
    let k = k_arg as usize;
    // m-tiles along x, the fast axis: the cubes resident at once share their weight tiles (an
    // lm_head's weight, 311 MB, is then read from HBM about once instead of once per m-tile)
    let m0 = CUBE_POS_X as usize * bm;
    let n0 = CUBE_POS_Y as usize * bn;
    let unit = UNIT_POS as usize;
    let group = unit / comptime!(WARPGROUP);

    let mut a_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(stages * a_slot), comptime!(SWIZZLE_ALIGN));
    let mut b_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(comptime!(stages * b_slot), comptime!(SWIZZLE_ALIGN));
    let mut full = Sequence::<Shared<Barrier>>::new();
    #[unroll]
    for _s in 0..comptime!(stages) {
        full.push(Barrier::shared_uninit());
    }
    if unit == 0 {
        #[unroll]
        for s in 0..comptime!(stages) {
            full.index(s).init_manual(1u32);
        }
        sync_async_proxy_shared();
    }
    sync_cube();
    // warpgroup g's 64 rows: 64 K-major rows of 128 bytes, or the g-th MN box; both 8 KiB in
    let a_lo = ((shared_address::<Vector<F, N>>(&a_sh) + (group * BOX_BYTES) as u32) >> 4) | comptime!(leading_units(a_mn) << 16);
    let b_lo = (shared_address::<Vector<F, N>>(&b_sh) >> 4) | comptime!(leading_units(b_mn) << 16);
    let hi = comptime!(DESCRIPTOR_HI);
    declare_accumulators(comptime!(bn / 2));
    zero_accumulators(comptime!(bn / 2));

    let k_tiles = k.div_ceil(BK);
    if unit == 0 {
        #[unroll]
        for s in 0..comptime!(stages - 1) {
            if s < k_tiles {
                let bar = full.index(s);
                bar.arrive_and_expect_tx(1u32, tile_bytes);
                issue_operand::<F, N>(bar, x_map, &mut a_sh, comptime!(s * a_slot), m0, s * BK, bm, a_mn);
                issue_operand::<F, N>(bar, w_map, &mut b_sh, comptime!(s * b_slot), n0, s * BK, bn, b_mn);
            }
        }
    }
    for r in 0..k_tiles.div_ceil(stages) {
        #[unroll]
        for s in 0..comptime!(stages) {
            let t = r * stages + s;
            if t < k_tiles {
                wait_parity_spin(full.index(s), (r & 1) as u32);
                // slot s starts s * slot-length 16-byte units further
                wgmma_k_tile(a_lo + comptime!((s * a_slot) as u32), hi, b_lo + comptime!((s * b_slot) as u32), hi, bn, f16, a_mn, b_mn);
                sync_cube();
                let next = t + stages - 1;
                if unit == 0 && next < k_tiles {
                    let slot = comptime!((s + stages - 1) % stages);
                    let bar = full.index(slot);
                    bar.arrive_and_expect_tx(1u32, tile_bytes);
                    issue_operand::<F, N>(bar, x_map, &mut a_sh, comptime!(slot * a_slot), m0, next * BK, bm, a_mn);
                    issue_operand::<F, N>(bar, w_map, &mut b_sh, comptime!(slot * b_slot), n0, next * BK, bn, b_mn);
                }
            }
        }
    }
    let acc = read_accumulators::<H>(comptime!(bn / 2));
    write_accumulators::<O, H, P>(y, acc, m0, n0, m, n, unit, group, bn, pairs);
}


/// The bits reference for the battery: one plane per 16 x 16 output block, a plain chain of
/// cmma 16x16x16 steps over k = 0, 16, ... straight from global memory, f32 accumulators
/// written as f32 (M, N and K multiples of 16; W `[N,K]`).
#[cube(launch)]
pub(crate) fn cmma_chain_f32_kernel<F: Float>(x: &Tensor<F>, w: &Tensor<F>, y: &mut Tensor<f32>, n_arg: u32, k_arg: u32, #[define(F)] _dtype: ElemType) {
    let n = n_arg as usize;
    let k = k_arg as usize;
    let m0 = CUBE_POS_Y as usize * 16;
    let n0 = CUBE_POS_X as usize * 16;
    let acc = cmma::Matrix::<f32>::from_value(MatrixIdent::Accumulator, 16usize, 16usize, 16usize, MatrixLayout::Undefined, 0.0f32);
    for kk in 0..k / 16 {
        let mut a = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::A, 16usize, 16usize, 16usize, MatrixLayout::RowMajor) };
        let mut b = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::B, 16usize, 16usize, 16usize, MatrixLayout::ColMajor) };
        cmma::load(&mut a, x.slice(m0 * k + kk * 16, x.len()), k as u32);
        cmma::load(&mut b, w.slice(n0 * k + kk * 16, w.len()), k as u32);
        cmma::execute(&a, &b, &acc, &acc);
    }
    cmma::store(y.slice_mut(m0 * n + n0, y.len()), &acc, n as u32, MatrixLayout::RowMajor);
}

/// Whether this device runs `wgmma`: CUDA compute capability 9.x (sm_90a; Blackwell dropped the
/// instruction). cubecl 0.11.3 exposes the capability only through features: TMA from 9.0, the
/// wide im2col TMA from 10.0.
pub fn wgmma_available(client: &Client) -> bool {
    let tma = &client.features().tma;
    crate::device::runtime_name() == "cuda" && tma.contains(Tma::Base) && !tma.contains(Tma::Im2colWide)
}

/// Whether [`matmul_wgmma`] takes `x @ W` (the tensor-core kernels' dtypes, bf16 and f16, are
/// checked with the kernel choice): every row stride a multiple of 16 bytes, as the copy engine
/// needs: K a multiple of 8, and N for W `[K,N]`, and M for an x given as xᵀ `[K,M]`.
pub(crate) fn wgmma_fits(layout: WeightLayout, x_transposed: bool, (m, k, n): (usize, usize, usize)) -> bool {
    k % CHUNK == 0 && (layout == WeightLayout::OutIn || n % CHUNK == 0) && (!x_transposed || m % CHUNK == 0)
}

/// `x[M,K] @ W` on warpgroup tensor cores (W as `layout` says; `x_transposed`: x is xᵀ stored
/// `[K,M]`), output in `out_dtype` (x's dtype, or f32 for the battery's bits check), freshly
/// allocated packed `[M,N]`. The caller checked the operands and [`wgmma_fits`].
pub(crate) fn matmul_wgmma(x: CubeTensor, w: CubeTensor, layout: WeightLayout, x_transposed: bool, dims: (usize, usize, usize), out_dtype: DType) -> Result<CubeTensor, KernelError> {
    matmul_wgmma_scheduled(None, None, x, w, layout, x_transposed, dims, out_dtype, None)
}

/// `acc[M,N] += x @ W` in place on the persistent warpgroup kernel: each output tile's f32
/// accumulators start from `acc`'s values instead of zero and continue the chain of 16-deep
/// k-steps, so calls over consecutive k ranges that each start on a multiple of 16 give the
/// bits of one call over all of k (zero-filled k past a call's end adds exact zeros).
/// `acc` f32 `[M,N]`, contiguous; the operands as for [`matmul_wgmma`].
pub(crate) fn fold_wgmma(acc: CubeTensor, x: CubeTensor, w: CubeTensor, layout: WeightLayout, x_transposed: bool, dims: (usize, usize, usize)) -> Result<CubeTensor, KernelError> {
    matmul_wgmma_scheduled(Some(WgmmaSchedule::Persistent), None, x, w, layout, x_transposed, dims, DType::F32, Some(acc))
}

/// Whether [`fold_wgmma`] takes `acc[M,N] += ...` on this device: the persistent kernel's tiles
/// for this output divide it (each unit loads its accumulators without bounds checks) and N is
/// even (2-element stores), besides [`wgmma_fits`] for the operands.
pub(crate) fn fold_wgmma_fits(client: &Client, layout: WeightLayout, x_transposed: bool, (m, k, n): (usize, usize, usize)) -> Result<bool, KernelError> {
    let t = wgmma_tiles_for(client, m, n, true)?;
    Ok(wgmma_available(client) && wgmma_fits(layout, x_transposed, (m, k, n)) && m % t.bm() == 0 && n % t.bn == 0 && n % 2 == 0)
}

/// [`matmul_wgmma`] under a named schedule and tiles where given (else this process's: the
/// battery checks each).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_wgmma_scheduled(
    schedule: Option<WgmmaSchedule>,
    tiles: Option<WgmmaTiles>,
    x: CubeTensor,
    w: CubeTensor,
    layout: WeightLayout,
    x_transposed: bool,
    (m, k, n): (usize, usize, usize),
    out_dtype: DType,
    into: Option<CubeTensor>,
) -> Result<CubeTensor, KernelError> {
    const OP: &str = "matmul";
    ensure!(matches!(x.dtype, DType::BF16 | DType::F16) && wgmma_fits(layout, x_transposed, (m, k, n)), OP, "the warpgroup kernel takes bf16/f16 with 16-byte row strides; got {:?}, {m}x{n}x{k} ({layout:?}, x transposed: {x_transposed})", x.dtype);
    ensure!(wgmma_available(&x.client), OP, "the warpgroup kernel needs a CUDA device of compute capability 9.x");
    let t = match tiles {
        Some(t) => t,
        None => wgmma_tiles_for(&x.client, m, n, into.is_some())?,
    };
    ensure!(n.div_ceil(t.bn) <= 65535, OP, "W has {n} output columns; at most {} per launch", 65535 * t.bn);
    let (a_mn, b_mn) = (x_transposed, layout == WeightLayout::InOut);
    ensure!(!a_mn || t.bm() % BOX == 0, OP, "unreachable: tiles of {} rows", t.bm());
    let client = x.client.clone();
    let accumulate = into.is_some();
    let y = match into {
        Some(acc) => {
            ensure!(acc.dtype == DType::F32 && out_dtype == DType::F32 && acc.meta.shape().num_elements() == m * n, OP, "a fold accumulates into f32 [{m}, {n}]");
            acc
        }
        None => empty_device_contiguous_dtype(client.clone(), x.device.clone(), [m, n].into(), out_dtype),
    };
    let storage_ty = storage(x.dtype);
    // boxes: K-major [rows][64], MN-major [64 k][64]
    let map = |tensor: CubeTensor, rows: usize, mn_major: bool| {
        let tile: Vec<usize> = if mn_major { vec![BK, BOX] } else { vec![rows, BK] };
        TensorMapArg::new(TiledArgs { tile_size: tile.into() }, tensor.into_tensor_arg(), storage_ty).with_swizzle(TensorMapSwizzle::B128)
    };
    let (x_map, w_map) = (map(x.clone(), t.bm(), a_mn), map(w, t.bn, b_mn));
    let schedule = match schedule {
        Some(s) => s,
        None => wgmma_schedule()?,
    };
    ensure!(!accumulate || schedule == WgmmaSchedule::Persistent, OP, "unreachable: a fold runs the persistent kernel");
    ensure!(!accumulate || (m % t.bm() == 0 && n % t.bn == 0 && n % 2 == 0), OP, "a fold's {m}x{n} output is not whole {}x{} tiles", t.bm(), t.bn);
    if schedule == WgmmaSchedule::Persistent {
        let m_tiles = m.div_ceil(t.bm());
        let tiles = m_tiles * n.div_ceil(t.bn);
        ensure!(tiles <= u32::MAX as usize, OP, "{m}x{n} is {tiles} output tiles; at most {} per launch", u32::MAX);
        let grid = tiles.min(multiprocessors(&client) * cubes_per_multiprocessor(t));
        matmul_wgmma_persistent_kernel::launch(
            &client,
            CubeCount::Static(grid as u32, 1, 1),
            CubeDim::new_1d((t.wg_m * WARPGROUP + PRODUCER) as u32),
            CHUNK,
            t.bn / 2,
            if n % 2 == 0 { 2 } else { 1 },
            x_map,
            w_map,
            y.clone().into_tensor_arg(),
            m as u32,
            n as u32,
            k as u32,
            m_tiles as u32,
            tiles as u32,
            t.wg_m,
            t.bn,
            t.stages,
            x.dtype == DType::F16,
            a_mn,
            b_mn,
            n % 2 == 0,
            accumulate,
            [storage_ty, storage(out_dtype)],
        );
        return Ok(y);
    }
    matmul_wgmma_kernel::launch(
        &client,
        CubeCount::Static(m.div_ceil(t.bm()) as u32, n.div_ceil(t.bn) as u32, 1),
        CubeDim::new_1d((t.wg_m * WARPGROUP) as u32),
        CHUNK,
        t.bn / 2,
        if n % 2 == 0 { 2 } else { 1 },
        x_map,
        w_map,
        y.clone().into_tensor_arg(),
        m as u32,
        n as u32,
        k as u32,
        t.wg_m,
        t.bn,
        t.stages,
        x.dtype == DType::F16,
        a_mn,
        b_mn,
        n % 2 == 0,
        [storage_ty, storage(out_dtype)],
    );
    Ok(y)
}

/// [`cmma_chain_f32_kernel`]: `x[M,K] @ W[N,K]ᵀ` with f32 output, M, N, K multiples of 16.
pub(crate) fn matmul_cmma_chain_f32(x: CubeTensor, w: CubeTensor, (m, k, n): (usize, usize, usize)) -> Result<CubeTensor, KernelError> {
    ensure!(m % 16 == 0 && n % 16 == 0 && k % 16 == 0, "matmul", "the cmma chain reference takes M, N, K multiples of 16; got {m}x{n}x{k}");
    let client = x.client.clone();
    let y = empty_device_contiguous_dtype(client.clone(), x.device.clone(), [m, n].into(), DType::F32);
    cmma_chain_f32_kernel::launch(&client, CubeCount::Static((n / 16) as u32, (m / 16) as u32, 1), CubeDim::new_1d(32), x.clone().into_tensor_arg(), w.into_tensor_arg(), y.clone().into_tensor_arg(), n as u32, k as u32, storage(x.dtype));
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::matmul::wgmma_fragments::{declare_ptx, load_ptx, read_ptx, wgmma_ptx};

    #[test]
    fn the_ptx_steps_each_layout_and_sets_its_transpose_flags() {
        let ptx = wgmma_ptx(256, "bf16", false, true);
        assert_eq!(ptx.matches("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {lsacc0, ").count(), 4);
        assert!(ptx.contains("lsacc127}, da, db, p, 1, 1, 0, 1;"));
        // K-major A: 32 bytes per k-step along its rows; MN-major B: 2048 bytes (16 k rows) down
        assert!(ptx.contains("add.u32 ta, %0, 6;"));
        assert!(ptx.contains("add.u32 tb, %2, 384;"));
        assert!(ptx.ends_with("wgmma.wait_group.sync.aligned 1;\n}\n"));
        assert!(declare_ptx(64).starts_with(".reg .f32 lsacc<64>;"));
        assert!(read_ptx(64).contains("mov.b32 %63, lsacc63;"));
        // accumulator 6: n8 chunk 1 (8 columns on: 32 bytes), the row 8 below (%1); 127: chunk 31, row 8 below, odd column
        let load = load_ptx(128);
        assert!(load.contains("ld.f32 lsacc0, [%0+0];\nld.f32 lsacc1, [%0+4];\nld.f32 lsacc2, [%1+0];\nld.f32 lsacc3, [%1+4];\nld.f32 lsacc4, [%0+32];"));
        assert!(load.contains("ld.f32 lsacc6, [%1+32];\n"));
        assert!(load.contains("ld.f32 lsacc127, [%1+996];\n"));
    }

    #[test]
    fn only_16_byte_row_strides_take_the_warpgroup_kernel() {
        assert!(wgmma_fits(WeightLayout::OutIn, false, (1, 1024, 3)));
        assert!(!wgmma_fits(WeightLayout::OutIn, false, (1, 1020, 64)));
        assert!(!wgmma_fits(WeightLayout::InOut, false, (1, 1024, 100)));
        assert!(!wgmma_fits(WeightLayout::InOut, true, (100, 1024, 64)));
        assert!(wgmma_fits(WeightLayout::InOut, true, (104, 1024, 64)));
    }
}
