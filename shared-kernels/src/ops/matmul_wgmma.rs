//! Warpgroup tensor-core matmul (Hopper `wgmma.mma_async`, CUDA sm_90a), for `x[M,K] @ W[N,K]ᵀ`
//! in bf16 with f32 accumulation: the instruction cuBLAS runs on the H200. The `mma.sync` (wmma)
//! class the other tc kernels use tops out at ~600 TFLOP/s there (`mma peak`, docs/perf.md).
//!
//! cubecl 0.11.3 has no `wgmma`; it is issued through `gpu_asm!` (inline PTX). A cube is
//! `wg_m` warpgroups (128 units each); warpgroup g owns the 64 x `bn` block of rows 64g.. of the
//! cube's tile, 64 x bn f32 accumulators spread over its 128 units (bn / 2 each, one vector
//! register operand). Operands come from shared memory through matrix descriptors, in the
//! 128-byte-swizzle K-major layout (what cuBLAS/CUTLASS use; the no-swizzle layout was measured
//! 1.5-2x slower, bank conflicts): a `rows x 64` (k) block is `rows` rows of 128 bytes, row r's
//! 16-byte chunk c stored at chunk `c ^ (r % 8)`; 8-row groups 1024 bytes apart (the stride
//! byte offset); a deeper k-tile is several such blocks. A multi-stage `cp.async` ring fills
//! the slots as in [`super::matmul_tc_async`].
//!
//! Bits: every output accumulates k = 0, 16, 32, ... from zero, one 16-deep `wgmma` step each,
//! the order of the `mma.sync` kernels. Whether a `wgmma` k-step rounds as two `mma.sync`
//! m16n8k16 do is the hardware's business: the battery checks it as bits (f32 accumulators of
//! this kernel against a plain cmma chain, and bf16 rows against the tc kernels).
//!
//! Synchronization per k-tile: `cp.async.wait_group`, `fence.proxy.async` (the copies are
//! generic-proxy writes, `wgmma` reads through the async proxy), `sync_cube`, issue the next
//! copies, then one inline-PTX block: `wgmma.fence`, the tile's k-steps, commit, `wait_group 0`
//! (the accumulators leave the block complete, so no register is read while in flight).

use super::matmul::WeightLayout;
use super::storage;
use crate::{ensure, KernelError};
use burn::tensor::DType;
use burn_cubecl::cubecl::client::Client;
use burn_cubecl::cubecl::features::Tma;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::cubecl::cmma::{self, MatrixIdent, MatrixLayout};
use burn_cubecl::cubecl::prelude::barrier::copy_async_checked;
use burn_cubecl::cubecl::prelude::*;

/// Units of one warpgroup.
pub const WARPGROUP: usize = 128;
/// Rows of one warpgroup's block (the instruction's M).
pub const WG_ROWS: usize = 64;
/// 16-bit elements per 16-byte chunk.
const CHUNK: usize = 8;
/// 16-byte chunks per swizzled row (128 bytes: 64 elements of k).
const SWIZZLE_CHUNKS: usize = 8;
/// The 128-byte swizzle repeats every 1024 bytes; slots start on that boundary.
const SWIZZLE_ALIGN: usize = 1024;

/// Closes this unit's copies issued since the last commit into one group.
#[cube]
fn commit_copies() {
    gpu_asm!("cp.async.commit_group;");
}

/// Waits until at most `pending` of this unit's committed groups are still in flight.
#[cube]
fn wait_copies(#[comptime] pending: usize) {
    gpu_asm!("cp.async.wait_group {n};", n = const pending);
}

/// Makes this unit's generic-proxy shared-memory writes visible to the async proxy (`wgmma`).
#[cube]
fn fence_proxy_async() {
    gpu_asm!("fence.proxy.async.shared::cta;");
}

/// The 32-bit shared-state-space address of a shared slice's first element.
#[cube]
fn shared_address<E: CubePrimitive>(s: &[E]) -> u32 {
    let p = unsafe { s.as_ptr_unchecked() };
    let out: u32;
    gpu_asm!("{{ .reg .u64 t; cvta.to.shared.u64 t, {p}; cvt.u32.u64 {out}, t; }}", p = in(_) p, out = out(_) out, options(nomem));
    out
}

/// Global -> shared, asynchronously, into the swizzled layout: the `[tile_rows][bk]` tile at
/// (row0, k0) of a row-major `[rows, cols]` matrix (16-byte vectors). Chunk c (of 8 elements)
/// of row r goes to block c / 8 (`tile_rows x 64` each), row r, chunk `(c % 8) ^ (r % 8)`.
/// Chunks past `rows` or `cols` are zero-filled. Eight consecutive units take one row's 128
/// bytes: one coalesced read, and a permutation of one shared row (conflict-free).
#[cube]
#[allow(clippy::too_many_arguments)]
fn copy_swizzled_tile<F: Float, N: Size>(
    src: &Tensor<Vector<F, N>>,
    stage: &mut Shared<[Vector<F, N>]>,
    base: usize,
    row0: usize,
    k0: usize,
    rows: usize,
    cols: usize,
    #[comptime] tile_rows: usize,
    #[comptime] bk: usize,
    #[comptime] units: usize,
) {
    let unit = UNIT_POS as usize;
    let total = comptime!(tile_rows * bk / CHUNK);
    let block_chunks = comptime!(tile_rows * SWIZZLE_CHUNKS);
    let col_vecs = cols / CHUNK;
    #[unroll]
    for i in 0..comptime!(total / units) {
        let v = unit + i * units;
        // v -> (block, row, chunk within the row's 128 bytes)
        let block = v / block_chunks;
        let r = (v % block_chunks) / comptime!(SWIZZLE_CHUNKS);
        let c = v % comptime!(SWIZZLE_CHUNKS);
        let grow = row0 + r;
        let gk = k0 + (block * comptime!(SWIZZLE_CHUNKS) + c) * CHUNK;
        let mut from = 0usize;
        let mut len = 0usize;
        if grow < rows && gk < cols {
            from = grow * col_vecs + gk / CHUNK;
            len = 1;
        }
        let to = base + block * block_chunks + r * comptime!(SWIZZLE_CHUNKS) + (c ^ (r % 8));
        copy_async_checked(&src.slice(from, from + len), &mut stage.slice_mut(to, to + 1), comptime!(CHUNK as u32));
    }
}

/// 16-byte units of k-step `s` (16 elements) from the start of a `rows`-row slot: its 64-wide
/// block, then 32 bytes per step inside the block (the swizzle is applied by the hardware on
/// the address bits, so the start may point inside a 128-byte row).
fn step_offset(rows: usize, s: usize) -> usize {
    (s / 4) * rows * SWIZZLE_CHUNKS + (s % 4) * 2
}

/// PTX register names of the accumulators: `lsacc0 ..`, declared at function scope by
/// [`declare_accumulators`], so they live across the inline-PTX blocks (cubecl's `gpu_asm!` has
/// no in-out operands, and an accumulator passed through C++ between blocks would be copied
/// while a `wgmma` still writes it).
const ACC: &str = "lsacc";

fn accumulator_list(h: usize) -> String {
    (0..h).map(|i| format!("{ACC}{i}")).collect::<Vec<_>>().join(", ")
}

/// Declares the `h` accumulator registers (no enclosing braces: function scope) and zeroes them.
fn declare_ptx(h: usize) -> String {
    let mut s = format!(".reg .f32 {ACC}<{h}>;\n");
    for i in 0..h {
        s += &format!("mov.b32 {ACC}{i}, 0;\n");
    }
    s
}

/// The inline PTX of one k-tile: `steps` 16-deep `wgmma` steps on the 64 x `bn` accumulators,
/// committed as one group; then waits until at most `pending` groups are in flight (1: the
/// previous k-tile's `wgmma`s are done, this one's run on). Operands: %0 / %1 the A descriptor's
/// low / high words, %2 / %3 B's. Step s reads A at [`step_offset`]`(bm, s)` and B at `(bn, s)`.
fn wgmma_ptx(bm: usize, bn: usize, steps: usize, ty: &str, pending: usize) -> String {
    let d = accumulator_list(bn / 2);
    let mut s = String::from("{\n.reg .b64 da, db;\n.reg .b32 ta, tb;\n.reg .pred p;\n");
    // the high word holds the stride byte offset, never zero: p (scale-d: accumulate) is true
    s += "setp.ne.b32 p, %1, 0;\nwgmma.fence.sync.aligned;\n";
    for step in 0..steps {
        s += &format!("add.u32 ta, %0, {};\nmov.b64 da, {{ta, %1}};\n", step_offset(bm, step));
        s += &format!("add.u32 tb, %2, {};\nmov.b64 db, {{tb, %3}};\n", step_offset(bn, step));
        s += &format!("wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{ty}.{ty} {{{d}}}, da, db, p, 1, 1, 0, 0;\n");
    }
    s += &format!("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned {pending};\n}}\n");
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
fn declare_accumulators(#[comptime] h: usize) {
    let ptx = comptime!(declare_ptx(h));
    gpu_asm!("{ptx}");
}

/// Issues one staged k-tile's `wgmma`s into the accumulators; returns once the previous
/// k-tile's have completed (its slot may be refilled after the next cube-wide sync).
#[cube]
#[allow(clippy::too_many_arguments)]
fn wgmma_k_tile(a_lo: u32, a_hi: u32, b_lo: u32, b_hi: u32, #[comptime] bm: usize, #[comptime] bn: usize, #[comptime] bk: usize, #[comptime] f16: bool) {
    let ptx = comptime!(wgmma_ptx(bm, bn, bk / 16, if f16 { "f16" } else { "bf16" }, 1));
    gpu_asm!("{ptx} /* {alo} {ahi} {blo} {bhi} */", alo = in(_) a_lo, ahi = in(_) a_hi, blo = in(_) b_lo, bhi = in(_) b_hi);
}

#[cube]
fn read_accumulators<H: Size>(#[comptime] h: usize) -> Vector<f32, H> {
    let ptx = comptime!(read_ptx(h));
    let out: Vector<f32, H>;
    gpu_asm!("{ptx} /* {d} */", d = out(_) out);
    out
}

/// Descriptor low word: start address in 16-byte units (bits 0-13); the leading byte offset
/// (bits 16-29) is unused by swizzled K-major layouts and set to 1, as CUTLASS does.
#[cube]
fn descriptor_lo(address: u32) -> u32 {
    (address >> 4) | (1u32 << 16)
}

/// Descriptor high word: stride byte offset 1024 (8 rows of 128 bytes) in 16-byte units (bits
/// 32-45), base offset 0 (slots are 1024-byte aligned), layout 1 = 128-byte swizzle (bits 62-63).
const DESCRIPTOR_HI: u32 = (1024 >> 4) | (1 << 30);

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_wgmma_kernel<F: Float, O: Float, N: Size, H: Size, P: Size>(
    x: &Tensor<Vector<F, N>>,
    w: &Tensor<Vector<F, N>>,
    y: &mut Tensor<Vector<O, P>>,
    m_arg: u32,
    n_arg: u32,
    k_arg: u32,
    #[comptime] wg_m: usize,
    #[comptime] bn: usize,
    #[comptime] bk: usize,
    #[comptime] stages: usize,
    #[comptime] f16: bool,
    #[comptime] pairs: bool,
    #[define(F, O)] _d: [ElemType; 2],
) {
    let bm = comptime!(wg_m * WG_ROWS);
    let units = comptime!(wg_m * WARPGROUP);
    let a_slot = comptime!(bm * bk / CHUNK);
    let b_slot = comptime!(bn * bk / CHUNK);
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
    // this warpgroup's rows start 64 rows of 128 bytes into each A block
    let a_lo = descriptor_lo(shared_address::<Vector<F, N>>(&a_sh) + (group * comptime!(WG_ROWS * 128)) as u32);
    let b_lo = descriptor_lo(shared_address::<Vector<F, N>>(&b_sh));
    let stride_hi = comptime!(DESCRIPTOR_HI);
    declare_accumulators(comptime!(bn / 2));

    // Per k-tile t: its copies landed (`stages - 3` later ones may still fly), everyone sees
    // them and everyone's `wgmma`s of tile t - 2 are done (each waited for them after issuing
    // t - 1), so tile t + stages - 2 refills t - 2's slot; then tile t's `wgmma`s are issued and
    // run on while the next iteration waits and copies.
    let k_tiles = k.div_ceil(bk);
    #[unroll]
    for s in 0..comptime!(stages - 2) {
        if s < k_tiles {
            copy_swizzled_tile::<F, N>(x, &mut a_sh, comptime!(s * a_slot), m0, s * bk, m, k, bm, bk, units);
            copy_swizzled_tile::<F, N>(w, &mut b_sh, comptime!(s * b_slot), n0, s * bk, n, k, bn, bk, units);
        }
        commit_copies();
    }
    for r in 0..k_tiles.div_ceil(stages) {
        #[unroll]
        for s in 0..comptime!(stages) {
            let t = r * stages + s;
            if t < k_tiles {
                wait_copies(comptime!(stages - 3));
                fence_proxy_async();
                sync_cube();
                let next = t + stages - 2;
                if next < k_tiles {
                    let slot = comptime!((s + stages - 2) % stages);
                    copy_swizzled_tile::<F, N>(x, &mut a_sh, comptime!(slot * a_slot), m0, next * bk, m, k, bm, bk, units);
                    copy_swizzled_tile::<F, N>(w, &mut b_sh, comptime!(slot * b_slot), n0, next * bk, n, k, bn, bk, units);
                }
                commit_copies();
                // slot s starts s * slot-length 16-byte units further
                wgmma_k_tile(a_lo + comptime!((s * a_slot) as u32), stride_hi, b_lo + comptime!((s * b_slot) as u32), stride_hi, bm, bn, bk, f16);
            }
        }
    }
    let acc = read_accumulators::<H>(comptime!(bn / 2));

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

/// The cube tile: `wg_m` warpgroups along M (64 rows each), `bn` columns (the instruction's N),
/// k extent `16 k_steps` per shared-memory slot, `stages` slots. Scheduling only: every output
/// walks k = 0, 16, ... from zero whatever the tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgmmaTiles {
    pub wg_m: usize,
    pub bn: usize,
    pub k_steps: usize,
    pub stages: usize,
}

/// Shared memory one cube may use (an H100/H200 block may opt into 227 KiB).
const SHARED_LIMIT: usize = 224 * 1024;

impl WgmmaTiles {
    /// 128 x 256 tiles (two warpgroups of m64n256), k 64, 4 slots: 192 KiB, one cube per SM.
    /// The fastest of 8 shapes swept at M = 1024 and 4096 on the H200 (docs/perf.md).
    pub const DEFAULT: WgmmaTiles = WgmmaTiles { wg_m: 2, bn: 256, k_steps: 4, stages: 4 };
    /// 128 x 128 tiles for outputs too small to give every multiprocessor a 128 x 256 cube.
    pub const NARROW: WgmmaTiles = WgmmaTiles { wg_m: 2, bn: 128, k_steps: 4, stages: 4 };
    pub fn bm(self) -> usize {
        self.wg_m * WG_ROWS
    }
    pub fn bk(self) -> usize {
        self.k_steps * 16
    }
    /// A and B slots of 16-bit values.
    pub fn shared_bytes(self) -> usize {
        self.stages * 2 * (self.bm() + self.bn) * self.bk()
    }
    /// `wg_m/bn/k_steps/stages`, e.g. `2/128/4/3`.
    pub fn parse(text: &str) -> Result<WgmmaTiles, String> {
        let bad = || format!("LOCKSTEP_WGMMA_TILES={text:?} is not wg_m/bn/k_steps/stages (wg_m 1-4, bn a multiple of 16 from 16 to 256 whose units' copies divide evenly, k_steps 4 or 8, stages 3-8, at most {} KiB of shared memory)", SHARED_LIMIT / 1024);
        let parts: Vec<usize> = text.split('/').map(|p| p.trim().parse::<usize>()).collect::<Result<_, _>>().map_err(|_| bad())?;
        let [wg_m, bn, k_steps, stages] = parts[..] else { return Err(bad()) };
        let t = WgmmaTiles { wg_m, bn, k_steps, stages };
        let units = wg_m * WARPGROUP;
        let copies_divide = |rows: usize| (rows * t.bk() / CHUNK) % units == 0;
        let ok = (1..=4).contains(&wg_m) && bn % 16 == 0 && (16..=256).contains(&bn) && [4, 8].contains(&k_steps) && (3..=8).contains(&stages) && t.shared_bytes() <= SHARED_LIMIT && copies_divide(t.bm()) && copies_divide(bn);
        ok.then_some(t).ok_or_else(bad)
    }
}

/// `LOCKSTEP_WGMMA_TILES` (benchmark sweeps; read once per process; `None`: unset).
pub(crate) fn wgmma_tiles() -> Result<Option<WgmmaTiles>, KernelError> {
    static TILES: std::sync::OnceLock<Result<Option<WgmmaTiles>, String>> = std::sync::OnceLock::new();
    TILES
        .get_or_init(|| std::env::var("LOCKSTEP_WGMMA_TILES").ok().map(|text| WgmmaTiles::parse(&text)).transpose())
        .clone()
        .map_err(|e| KernelError::new("matmul", e))
}

/// The tiles of an `[M, N]` output: `LOCKSTEP_WGMMA_TILES` if set, else [`WgmmaTiles::DEFAULT`]
/// where its 128 x 256 cubes fill every multiprocessor, [`WgmmaTiles::NARROW`] below.
/// Scheduling only: both give the same bits.
fn wgmma_tiles_for(client: &Client, m: usize, n: usize) -> Result<WgmmaTiles, KernelError> {
    if let Some(t) = wgmma_tiles()? {
        return Ok(t);
    }
    let sms = client.properties().hardware.num_streaming_multiprocessors.unwrap_or(132) as usize;
    let d = WgmmaTiles::DEFAULT;
    Ok(if m.div_ceil(d.bm()) * n.div_ceil(d.bn) >= sms { d } else { WgmmaTiles::NARROW })
}

/// Whether this device runs `wgmma`: CUDA compute capability 9.x (sm_90a; Blackwell dropped the
/// instruction). cubecl 0.11.3 exposes the capability only through features: TMA from 9.0, the
/// wide im2col TMA from 10.0.
pub fn wgmma_available(client: &Client) -> bool {
    let tma = &client.features().tma;
    crate::device::runtime_name() == "cuda" && tma.contains(Tma::Base) && !tma.contains(Tma::Im2colWide)
}

/// Whether [`matmul_wgmma`] takes this call (the tensor-core kernels' dtypes, bf16 and f16,
/// are checked with the kernel choice): W `[N,K]`, K a multiple of 8 (16-byte copies). Everything else runs the cmma tiles (the same bits).
pub(crate) fn wgmma_fits(layout: WeightLayout, k: usize) -> bool {
    layout == WeightLayout::OutIn && k % CHUNK == 0
}

/// `x[M,K] @ W[N,K]ᵀ` on warpgroup tensor cores, output in `out_dtype` (x's dtype, or f32 for
/// the battery's bits check), freshly allocated packed `[M,N]`. The caller checked the operands
/// and [`wgmma_fits`].
pub(crate) fn matmul_wgmma(x: CubeTensor, w: CubeTensor, (m, k, n): (usize, usize, usize), out_dtype: DType) -> Result<CubeTensor, KernelError> {
    const OP: &str = "matmul";
    ensure!(matches!(x.dtype, DType::BF16 | DType::F16) && wgmma_fits(WeightLayout::OutIn, k), OP, "the warpgroup kernel takes bf16/f16 with W [N,K] and K a multiple of 8; got {:?}, K {k}", x.dtype);
    ensure!(wgmma_available(&x.client), OP, "the warpgroup kernel needs a CUDA device of compute capability 9.x");
    let t = wgmma_tiles_for(&x.client, m, n)?;
    ensure!(n.div_ceil(t.bn) <= 65535, OP, "W has {n} rows; at most {} per launch", 65535 * t.bn);
    let client = x.client.clone();
    let y = empty_device_contiguous_dtype(client.clone(), x.device.clone(), [m, n].into(), out_dtype);
    matmul_wgmma_kernel::launch(
        &client,
        CubeCount::Static(m.div_ceil(t.bm()) as u32, n.div_ceil(t.bn) as u32, 1),
        CubeDim::new_1d((t.wg_m * WARPGROUP) as u32),
        CHUNK,
        t.bn / 2,
        if n % 2 == 0 { 2 } else { 1 },
        x.clone().into_tensor_arg(),
        w.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        m as u32,
        n as u32,
        k as u32,
        t.wg_m,
        t.bn,
        t.bk(),
        t.stages,
        x.dtype == DType::F16,
        n % 2 == 0,
        [storage(x.dtype), storage(out_dtype)],
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
    fn wgmma_tiles_parse_within_shared_memory_or_name_the_variable() {
        assert!(WgmmaTiles::parse("2/128/4/3").is_ok());
        assert_eq!(WgmmaTiles::parse("2/256/4/4").unwrap(), WgmmaTiles::DEFAULT);
        assert_eq!(WgmmaTiles::DEFAULT.shared_bytes(), 192 * 1024);
        assert!(WgmmaTiles::parse("1/256/4/3").is_ok());
        for bad in ["2/128/4", "0/128/4/3", "2/120/4/3", "2/512/4/3", "2/128/3/3", "2/128/4/2", "2/256/8/3", "2/128/2/3", "x/128/4/3"] {
            assert!(WgmmaTiles::parse(bad).unwrap_err().contains("LOCKSTEP_WGMMA_TILES"), "{bad}");
        }
    }

    #[test]
    fn the_ptx_names_every_operand_once_per_step() {
        let ptx = wgmma_ptx(128, 128, 8, "bf16", 1);
        assert_eq!(ptx.matches("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {lsacc0, ").count(), 8);
        assert!(ptx.contains("lsacc63}, da, db, p, 1, 1, 0, 0;"));
        // step 3: 96 bytes into the first 64-wide block; step 5: the second block (128 rows of
        // 128 bytes further) plus 32 bytes
        assert!(ptx.contains("add.u32 ta, %0, 6;"));
        assert!(ptx.contains("add.u32 tb, %2, 1026;"));
        assert!(ptx.ends_with("wgmma.wait_group.sync.aligned 1;\n}\n"));
        assert!(declare_ptx(64).starts_with(".reg .f32 lsacc<64>;"));
        assert!(read_ptx(64).contains("mov.b32 %63, lsacc63;"));
    }
}
