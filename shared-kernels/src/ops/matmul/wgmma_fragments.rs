//! The warpgroup (`wgmma`) building blocks both warpgroup kernels share: the instruction's
//! constants, the PTX that declares, zeroes, loads and reads the f32 accumulators and issues a
//! k-tile, the Tensor Memory Accelerator's operand copies and the epilogue. The kernels are
//! [`super::wgmma`] (the launcher and the synced schedule) and [`super::wgmma_persistent`].

use burn_cubecl::cubecl::prelude::barrier::Barrier;
use burn_cubecl::cubecl::prelude::*;

/// Units of one warpgroup.
pub const WARPGROUP: usize = 128;
/// Rows of one warpgroup's block (the instruction's M).
pub const WG_ROWS: usize = 64;
/// k extent of a k-tile: one 128-byte swizzled row of 16-bit values.
pub(crate) const BK: usize = 64;
/// Edge of one box of an MN-major operand: 64 values of M or N (128 bytes) by 64 of k.
pub(crate) const BOX: usize = 64;
/// 16-bit elements per 16-byte vector.
pub(crate) const CHUNK: usize = 8;
/// Bytes of one `[64][64]` box (and of 64 K-major rows).
pub(crate) const BOX_BYTES: usize = BOX * BK * 2;
/// The 128-byte swizzle repeats every 1024 bytes; slots start on that boundary.
pub(crate) const SWIZZLE_ALIGN: usize = 1024;

/// 16-byte units from a slot's start to k-step `s` (16 k): 32 bytes along a K-major operand's
/// 128-byte rows, two 8-row k groups (2048 bytes) down an MN-major one's.
fn step_offset(mn_major: bool, s: usize) -> usize {
    if mn_major { s * 128 } else { s * 2 }
}

/// Waits until the phase of `bar` of parity `parity` has completed: a bare `try_wait` loop.
/// libcu++'s `wait_parity` (what `Barrier::wait_parity` compiles to) polls with a back-off
/// that reads the global timer and sleeps, latency a tight pipeline pays on every k-tile.
#[cube]
pub(crate) fn wait_parity_spin(bar: &Shared<Barrier>, parity: u32) {
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
pub(crate) fn declare_ptx(h: usize) -> String {
    format!(".reg .f32 {ACC}<{h}>;\n")
}

/// Zeroes the `h` accumulator registers (a tile's start: every output accumulates from zero).
pub(crate) fn zero_ptx(h: usize) -> String {
    (0..h).map(|i| format!("mov.b32 {ACC}{i}, 0;\n")).collect()
}

/// Sets the `h` accumulator registers straight from global memory: %0 / %1 the generic
/// addresses of this unit's first column in its two rows (row, row + 8), accumulator i at
/// column offset (i / 4) * 8 + i % 2 of row (i % 4) / 2, as [`write_accumulators`] lays them
/// out. The values never pass through a vector: the first fold kernel copied 128 of them into a
/// local array beside the 128 accumulators and ran 8x slower than the cmma chain (docs/journal/scale-history.md).
pub(crate) fn load_ptx(h: usize) -> String {
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
pub(crate) fn wgmma_ptx(bn: usize, ty: &str, a_mn: bool, b_mn: bool) -> String {
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
pub(crate) fn read_ptx(h: usize) -> String {
    let mut s = String::from("{\nwgmma.wait_group.sync.aligned 0;\n");
    for i in 0..h {
        s += &format!("mov.b32 %{i}, {ACC}{i};\n");
    }
    s + "}\n"
}

#[cube]
pub(crate) fn declare_accumulators(#[comptime] h: usize) {
    let ptx = comptime!(declare_ptx(h));
    gpu_asm!("{ptx}");
}

#[cube]
pub(crate) fn zero_accumulators(#[comptime] h: usize) {
    let ptx = comptime!(zero_ptx(h));
    gpu_asm!("{ptx}");
}

/// [`load_ptx`]: the accumulators from the f32 `[m, n]` output `y` (2-element vectors) at the
/// tile (m0, n0), which the caller guarantees lies wholly inside `y` (a fold's tiles divide it).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_accumulators_in_place<O: Float, P: Size>(y: &mut Tensor<Vector<O, P>>, m0: usize, n0: usize, n: usize, unit: usize, group: usize, #[comptime] h: usize) {
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
pub(crate) fn wgmma_k_tile(a_lo: u32, a_hi: u32, b_lo: u32, b_hi: u32, #[comptime] bn: usize, #[comptime] f16: bool, #[comptime] a_mn: bool, #[comptime] b_mn: bool) {
    let ptx = comptime!(wgmma_ptx(bn, if f16 { "f16" } else { "bf16" }, a_mn, b_mn));
    gpu_asm!("{ptx} /* {alo} {ahi} {blo} {bhi} */", alo = in(_) a_lo, ahi = in(_) a_hi, blo = in(_) b_lo, bhi = in(_) b_hi);
}

#[cube]
pub(crate) fn read_accumulators<H: Size>(#[comptime] h: usize) -> Vector<f32, H> {
    let ptx = comptime!(read_ptx(h));
    let out: Vector<f32, H>;
    gpu_asm!("{ptx} /* {d} */", d = out(_) out);
    out
}

/// Descriptor low word: start address in 16-byte units (bits 0-13), leading byte offset in
/// 16-byte units (bits 16-29): unused by K-major swizzled layouts (1, as CUTLASS sets it), the
/// distance between 64-wide MN boxes for MN-major ones.
pub(crate) fn leading_units(mn_major: bool) -> u32 {
    if mn_major { (BOX_BYTES >> 4) as u32 } else { 1 }
}

/// Descriptor high word: stride byte offset 1024 (8 rows of 128 bytes: the next 8 M/N rows of a
/// K-major operand, the next 8 k of an MN-major one) in 16-byte units (bits 32-45), base offset
/// 0 (slots are 1024-byte aligned), layout 1 = 128-byte swizzle (bits 62-63).
pub(crate) const DESCRIPTOR_HI: u32 = (1024 >> 4) | (1 << 30);

/// One operand's box copies of the k-tile at `k0` into the slot starting at vector
/// `slot_start`, completing on `bar` (issued by unit 0). K-major: one `[rows][64]` box at
/// (row0, k0); MN-major (stored `[K, rows]`): `rows / 64` `[64][64]` boxes at (k0, row0 + 64 j),
/// 8 KiB apart.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn issue_operand<F: Float, N: Size>(
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

/// The epilogue: each unit's accumulators, cast to the output type, straight to global memory.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_accumulators<O: Float, H: Size, P: Size>(
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
