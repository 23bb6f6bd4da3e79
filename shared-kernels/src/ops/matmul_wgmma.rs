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
//! warp-specialized kernel of [`super::matmul_wgmma_persistent`]; tiles and schedule choice are
//! [`super::matmul_wgmma_tiles`]'s.
//!
//! Synced kernel, per k-tile t: wait for its slot's mbarrier, issue its `wgmma`s (one inline-PTX block:
//! `wgmma.fence`, 4 k-steps, commit, `wait_group 1`: tile t - 1's are then done, t's run on),
//! sync the cube (everyone is done with t - 1), then unit 0 refills t - 1's slot with tile
//! t + stages - 1. The accumulators are PTX registers of function scope: `gpu_asm!` has no
//! in-out operands, and an accumulator passed through C++ between two blocks would be copied
//! while a `wgmma` still writes it.

use super::matmul::WeightLayout;
use super::matmul_wgmma_persistent::{matmul_wgmma_persistent_kernel, PRODUCER};
pub use super::matmul_wgmma_tiles::{WgmmaSchedule, WgmmaTiles};
use super::matmul_wgmma_tiles::{cubes_per_multiprocessor, multiprocessors, wgmma_schedule, wgmma_tiles_for};
use super::storage;
use crate::{ensure, KernelError};
use burn::tensor::DType;
use burn_cubecl::cubecl::client::Client;
use burn_cubecl::cubecl::cmma::{self, MatrixIdent, MatrixLayout};
use burn_cubecl::cubecl::features::Tma;
use burn_cubecl::cubecl::prelude::barrier::Barrier;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

/// Units of one warpgroup.
pub const WARPGROUP: usize = 128;
/// Rows of one warpgroup's block (the instruction's M).
pub const WG_ROWS: usize = 64;
/// k extent of a k-tile: one 128-byte swizzled row of 16-bit values.
pub(super) const BK: usize = 64;
/// Edge of one box of an MN-major operand: 64 values of M or N (128 bytes) by 64 of k.
pub(super) const BOX: usize = 64;
/// 16-bit elements per 16-byte vector.
pub(super) const CHUNK: usize = 8;
/// Bytes of one `[64][64]` box (and of 64 K-major rows).
pub(super) const BOX_BYTES: usize = BOX * BK * 2;
/// The 128-byte swizzle repeats every 1024 bytes; slots start on that boundary.
pub(super) const SWIZZLE_ALIGN: usize = 1024;

/// The 32-bit shared-state-space address of a shared slice's first element.
#[cube]
pub(super) fn shared_address<E: CubePrimitive>(s: &[E]) -> u32 {
    let p = unsafe { s.as_ptr_unchecked() };
    let out: u32;
    gpu_asm!("{{ .reg .u64 t; cvta.to.shared.u64 t, {p}; cvt.u32.u64 {out}, t; }}", p = in(_) p, out = out(_) out, options(nomem));
    out
}

/// 16-byte units from a slot's start to k-step `s` (16 k): 32 bytes along a K-major operand's
/// 128-byte rows, two 8-row k groups (2048 bytes) down an MN-major one's.
fn step_offset(mn_major: bool, s: usize) -> usize {
    if mn_major { s * 128 } else { s * 2 }
}

/// Waits until the phase of `bar` of parity `parity` has completed: a bare `try_wait` loop.
/// libcu++'s `wait_parity` (what `Barrier::wait_parity` compiles to) polls with a back-off
/// that reads the global timer and sleeps, latency a tight pipeline pays on every k-tile.
#[cube]
pub(super) fn wait_parity_spin(bar: &Shared<Barrier>, parity: u32) {
    gpu_asm!(
        "{{ .reg .pred p; .reg .u64 t; .reg .u32 a; cvta.to.shared.u64 t, {b}; cvt.u32.u64 a, t; LOCKSTEP_WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [a], {ph}; @!p bra LOCKSTEP_WAIT; }}",
        b = in(_) bar,
        ph = in(_) parity
    );
}

/// PTX register names of the accumulators: `lsacc0 ..`, declared at function scope.
const ACC: &str = "lsacc";

fn accumulator_list(h: usize) -> String {
    (0..h).map(|i| format!("{ACC}{i}")).collect::<Vec<_>>().join(", ")
}

/// Declares the `h` accumulator registers (no enclosing braces: function scope).
fn declare_ptx(h: usize) -> String {
    format!(".reg .f32 {ACC}<{h}>;\n")
}

/// Zeroes the `h` accumulator registers (a tile's start: every output accumulates from zero).
fn zero_ptx(h: usize) -> String {
    (0..h).map(|i| format!("mov.b32 {ACC}{i}, 0;\n")).collect()
}

/// Sets the `h` accumulator registers straight from global memory: %0 / %1 the generic
/// addresses of this unit's first column in its two rows (row, row + 8), accumulator i at
/// column offset (i / 4) * 8 + i % 2 of row (i % 4) / 2, as [`write_accumulators`] lays them
/// out. The values never pass through a vector: the first fold kernel copied 128 of them into a
/// local array beside the 128 accumulators and ran 8x slower than the cmma chain (docs/scale.md).
fn load_ptx(h: usize) -> String {
    let mut s = String::from("{\n");
    for i in 0..h {
        let row = (i % 4) / 2;
        let offset = 4 * ((i / 4) * 8 + i % 2);
        s += &format!("ld.f32 {ACC}{i}, [%{row}+{offset}];\n");
    }
    s + "}\n"
}

/// The inline PTX of one k-tile: 4 16-deep `wgmma` steps on the 64 x `bn` accumulators,
/// committed as one group; then waits until at most one group is in flight (the previous
/// k-tile's `wgmma`s are done, this one's run on). Operands: %0 / %1 the A descriptor's low /
/// high words, %2 / %3 B's. `a_mn` / `b_mn`: the operand is MN-major (the instruction's
/// transpose flag).
fn wgmma_ptx(bn: usize, ty: &str, a_mn: bool, b_mn: bool) -> String {
    let d = accumulator_list(bn / 2);
    let mut s = String::from("{\n.reg .b64 da, db;\n.reg .b32 ta, tb;\n.reg .pred p;\n");
    // the high word holds the stride byte offset, never zero: p (scale-d: accumulate) is true
    s += "setp.ne.b32 p, %1, 0;\nwgmma.fence.sync.aligned;\n";
    for step in 0..BK / 16 {
        s += &format!("add.u32 ta, %0, {};\nmov.b64 da, {{ta, %1}};\n", step_offset(a_mn, step));
        s += &format!("add.u32 tb, %2, {};\nmov.b64 db, {{tb, %3}};\n", step_offset(b_mn, step));
        s += &format!("wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{ty}.{ty} {{{d}}}, da, db, p, 1, 1, {}, {};\n", a_mn as u8, b_mn as u8);
    }
    s += "wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 1;\n}\n";
    s
}

/// Waits for every `wgmma` of this warpgroup, then copies the accumulators out (%0..).
fn read_ptx(h: usize) -> String {
    let mut s = String::from("{\nwgmma.wait_group.sync.aligned 0;\n");
    for i in 0..h {
        s += &format!("mov.b32 %{i}, {ACC}{i};\n");
    }
    s + "}\n"
}

#[cube]
pub(super) fn declare_accumulators(#[comptime] h: usize) {
    let ptx = comptime!(declare_ptx(h));
    gpu_asm!("{ptx}");
}

#[cube]
pub(super) fn zero_accumulators(#[comptime] h: usize) {
    let ptx = comptime!(zero_ptx(h));
    gpu_asm!("{ptx}");
}

/// [`load_ptx`]: the accumulators from the f32 `[m, n]` output `y` (2-element vectors) at the
/// tile (m0, n0), which the caller guarantees lies wholly inside `y` (a fold's tiles divide it).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn load_accumulators_in_place<O: Float, P: Size>(y: &mut Tensor<Vector<O, P>>, m0: usize, n0: usize, n: usize, unit: usize, group: usize, #[comptime] h: usize) {
    let plane = (unit / 32) % 4;
    let lane = unit % 32;
    let row = m0 + group * comptime!(WG_ROWS) + plane * 16 + lane / 4;
    let col = n0 + (lane % 4) * 2;
    let top = unsafe { y.slice((row * n + col) / 2, y.len()).as_ptr_unchecked() };
    let bottom = unsafe { y.slice(((row + 8) * n + col) / 2, y.len()).as_ptr_unchecked() };
    let ptx = comptime!(load_ptx(h));
    gpu_asm!("{ptx} /* {t} {b} */", t = in(_) top, b = in(_) bottom);
}

/// Issues one staged k-tile's `wgmma`s into the accumulators; returns once the previous
/// k-tile's have completed.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn wgmma_k_tile(a_lo: u32, a_hi: u32, b_lo: u32, b_hi: u32, #[comptime] bn: usize, #[comptime] f16: bool, #[comptime] a_mn: bool, #[comptime] b_mn: bool) {
    let ptx = comptime!(wgmma_ptx(bn, if f16 { "f16" } else { "bf16" }, a_mn, b_mn));
    gpu_asm!("{ptx} /* {alo} {ahi} {blo} {bhi} */", alo = in(_) a_lo, ahi = in(_) a_hi, blo = in(_) b_lo, bhi = in(_) b_hi);
}

#[cube]
pub(super) fn read_accumulators<H: Size>(#[comptime] h: usize) -> Vector<f32, H> {
    let ptx = comptime!(read_ptx(h));
    let out: Vector<f32, H>;
    gpu_asm!("{ptx} /* {d} */", d = out(_) out);
    out
}

/// Descriptor low word: start address in 16-byte units (bits 0-13), leading byte offset in
/// 16-byte units (bits 16-29): unused by K-major swizzled layouts (1, as CUTLASS sets it), the
/// distance between 64-wide MN boxes for MN-major ones.
pub(super) fn leading_units(mn_major: bool) -> u32 {
    if mn_major { (BOX_BYTES >> 4) as u32 } else { 1 }
}

/// Descriptor high word: stride byte offset 1024 (8 rows of 128 bytes: the next 8 M/N rows of a
/// K-major operand, the next 8 k of an MN-major one) in 16-byte units (bits 32-45), base offset
/// 0 (slots are 1024-byte aligned), layout 1 = 128-byte swizzle (bits 62-63).
pub(super) const DESCRIPTOR_HI: u32 = (1024 >> 4) | (1 << 30);

/// One operand's box copies of the k-tile at `k0` into the slot starting at vector
/// `slot_start`, completing on `bar` (issued by unit 0). K-major: one `[rows][64]` box at
/// (row0, k0); MN-major (stored `[K, rows]`): `rows / 64` `[64][64]` boxes at (k0, row0 + 64 j),
/// 8 KiB apart.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn issue_operand<F: Float, N: Size>(
    bar: &Barrier,
    map: &TensorMap<F, Tiled>,
    stage: &mut Shared<[Vector<F, N>]>,
    slot_start: usize,
    row0: usize,
    k0: usize,
    #[comptime] rows: usize,
    #[comptime] mn_major: bool,
) {
    if comptime!(mn_major) {
        #[unroll]
        for j in 0..comptime!(rows / BOX) {
            let start = slot_start + comptime!(j * BOX_BYTES / 16);
            bar.tma_load_2d::<F, Vector<F, N>>(map, &mut stage.slice_mut(start, start + comptime!(BOX_BYTES / 16)), k0 as i32, (row0 + j * BOX) as i32);
        }
    } else {
        bar.tma_load_2d::<F, Vector<F, N>>(map, &mut stage.slice_mut(slot_start, slot_start + comptime!(rows * BK / CHUNK)), row0 as i32, k0 as i32);
    }
}

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

/// The epilogue: each unit's accumulators, cast to the output type, straight to global memory.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn write_accumulators<O: Float, H: Size, P: Size>(
    y: &mut Tensor<Vector<O, P>>,
    acc: Vector<f32, H>,
    m0: usize,
    n0: usize,
    m: usize,
    n: usize,
    unit: usize,
    group: usize,
    #[comptime] bn: usize,
    #[comptime] pairs: bool,
) {
    // accumulator i of a unit: n8 chunk i / 4; rows lane / 4 (+ 8 for i % 4 >= 2) of its plane's
    // 16, columns 2 (lane % 4) (+ 1 for odd i). `pairs` (N even): accumulators i and i + 1 go out
    // as one 2-element vector store.
    let plane = (unit / 32) % 4;
    let lane = unit % 32;
    let row = m0 + group * comptime!(WG_ROWS) + plane * 16 + lane / 4;
    let col = n0 + (lane % 4) * 2;
    if comptime!(pairs) {
        #[unroll]
        for j in 0..comptime!(bn / 4) {
            let i = comptime!(2 * j);
            let grow = row + comptime!((i % 4) / 2 * 8);
            let gcol = col + comptime!((i / 4) * 8);
            if grow < m && gcol < n {
                let mut v = Vector::<O, P>::empty();
                v.insert(0usize, O::cast_from(acc.extract(i)));
                v.insert(1usize, O::cast_from(acc.extract(comptime!(i + 1))));
                y[(grow * n + gcol) / 2] = v;
            }
        }
    } else {
        #[unroll]
        for i in 0..comptime!(bn / 2) {
            let grow = row + comptime!((i % 4) / 2 * 8);
            let gcol = col + comptime!((i / 4) * 8 + i % 2);
            if grow < m && gcol < n {
                y[grow * n + gcol] = Vector::<O, P>::new(O::cast_from(acc.extract(i)));
            }
        }
    }
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
    let t = wgmma_tiles_for(client, m, n)?;
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
        None => wgmma_tiles_for(&x.client, m, n)?,
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
