//! Decode-shaped tensor-core matmul (M <= 64): each plane owns 16 output columns and streams
//! its weight strip in groups of `GROUP` 16-deep k-steps; only the few x rows (at most 64) are
//! staged in shared memory, per cube.
//!
//! At decode sizes the [`crate::ops::matmul::tc`] tiles compute 128 rows for one and stage 64 weight
//! columns per cube behind one register prefetch (the lm_head at M = 1 ran at 17% of the HBM
//! roofline, cubek's pipelined kernel at 42%). Two ways to feed the planes, measured on the H200
//! (docs/perf.md):
//! * wide weights (N >= 8192, the lm_head): each plane fills its own shared-memory slab of
//!   16 columns x GROUP*16 k with coalesced 16-byte loads (256-byte runs of a row), the next
//!   group's loads in flight while this group multiplies; 4 planes per cube;
//! * narrow ones: a plane loads its `cmma` fragments straight from global memory, all GROUP of
//!   them before the first multiply; one plane per cube, so N/16 planes spread over the SMs.
//!
//! Same bits as [`crate::ops::matmul::tc`] (and [`crate::ops::matmul::pipelined`]): every output fragment is
//! `execute(a, b, acc, acc)`'d with the one 16x16x16 instruction over k = 0, 16, 32, ... from a
//! +0.0 accumulator, rows past M are zeros, and the f32 accumulator is cast to the output dtype
//! element by element. A row's value therefore does not depend on M or on which of the kernels
//! ran; the battery checks rows of these launches against rows of large tc and pipelined ones.
//! Only shapes whose k-steps match the tc kernel's exactly run here: K a multiple of 32 (tc pads
//! K to its 32-deep stages; an extra all-zero step could turn a -0.0 into +0.0), N a multiple of
//! 16 (whole fragments, no out-of-bounds loads).

use crate::ops::matmul::layout::WeightLayout;
use crate::ops::storage;
use crate::kernel_choice::SkinnyLaunch;
use crate::KernelError;
use burn_cubecl::cubecl::cmma::{self, MatrixIdent, MatrixLayout};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

const INSTR: usize = 16;
const PLANE_DIM: usize = 32;
/// Fragment loads a plane issues before multiplying: 8 x 512 bytes of weight in flight.
const GROUP: usize = 8;
/// Largest M this kernel takes (four 16-row fragments per plane).
pub const SKINNY_MAX_M: usize = 64;
/// Elements of x staged per cube at once: 16 rows x 1024 k (32 KB of bf16) whatever the row count.
const STAGE_ELEMS: usize = 16 * 1024;
/// Shared-memory row padding (16 bytes): row starts stay 32-byte aligned for `wmma`, rows
/// shift by 4 banks.
const PAD: usize = 8;
/// Planes per cube for wide weights (lm_heads) and for the rest.
const WIDE_PLANES: usize = 4;
const NARROW_PLANES: usize = 1;
const WIDE_N: usize = 8192;
/// Whether wide `[N,K]` weights go through shared-memory slabs (see [`LaunchShape`]).
const STAGED: bool = true;

/// Largest M for narrow weights: from 17 rows on, one plane per cube re-stages its 2-4 x tiles
/// per k chunk and the tc tiles are faster (H200, M = 64: 0.056 vs 0.036 ms at 1024x1024,
/// sampler at 64 requests 0.75x).
pub const SKINNY_MAX_M_NARROW: usize = 16;

/// Whether `x[M,K] @ W` runs here: a decode shape where this kernel is the faster one, whose
/// k-steps and fragments match the tc kernel's exactly.
pub fn skinny_applies(m: usize, k: usize, n: usize) -> bool {
    m <= if n >= WIDE_N { SKINNY_MAX_M } else { SKINNY_MAX_M_NARROW } && k % 32 == 0 && n % INSTR == 0
}

/// Static shared memory a cube may use (cubecl's CUDA kernels declare it statically).
const MAX_SHARED: usize = 48 * 1024;

/// Shared memory of one cube, bytes (16-bit x and W, f32 epilogue windows).
fn shared_bytes(m_tiles: usize, planes: usize, group: usize, staged: bool) -> usize {
    let x_stage = m_tiles * INSTR * (stage_k(m_tiles, staged) + PAD);
    let slabs = if staged { planes * INSTR * (group * INSTR + PAD) } else { 0 };
    2 * (x_stage + slabs) + 4 * planes * 256
}

/// k extent of one x stage for `m_tiles` 16-row tiles (a multiple of 32); half as deep when the
/// weight is staged too (its slabs need the shared memory).
fn stage_k(m_tiles: usize, staged: bool) -> usize {
    STAGE_ELEMS / (16 * m_tiles.next_power_of_two()) / if staged { 2 } else { 1 }
}

/// This lane's share of a plane's slab: W rows n0 .. n0 + 16, k from `k0`, `row_vecs` vectors
/// per row; consecutive lanes read consecutive 16 bytes of a row.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_slab<F: Float, N: Size>(w: &Tensor<Vector<F, N>>, regs: &mut Array<Vector<F, N>>, n0: usize, k0: usize, k_vecs: usize, lane: usize, #[comptime] per_lane: usize, #[comptime] row_vecs: usize, #[comptime] vs: usize) {
    #[unroll]
    for i in 0..per_lane {
        let v = lane + i * comptime!(PLANE_DIM);
        if v < comptime!(INSTR * row_vecs) {
            regs[i] = w[(n0 + v / comptime!(row_vecs)) * k_vecs + k0 / comptime!(vs) + v % comptime!(row_vecs)];
        }
    }
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn matmul_skinny_kernel<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    w: &Tensor<Vector<F, N>>,
    y: &mut Tensor<F>,
    m_arg: u32,
    n_arg: u32,
    k_arg: u32,
    #[comptime] w_out_in: bool,
    #[comptime] vs: usize,
    #[comptime] planes: usize,
    #[comptime] m_tiles: usize,
    #[comptime] kc: usize,
    #[comptime] group: usize,
    #[comptime] staged: bool,
    #[define(F)] _dtype: ElemType,
) {
    let m = m_arg as usize;
    let n = n_arg as usize;
    let k = k_arg as usize;
    let units = comptime!(planes * PLANE_DIM);
    let unit = UNIT_POS as usize;
    let plane = UNIT_POS_Y as usize;
    let n0 = (CUBE_POS_X as usize * comptime!(planes) + plane) * comptime!(INSTR);
    let active = n0 < n;

    // x stage: [m_tiles * 16][kc + PAD], k contiguous, rows past M zero.
    let lda = comptime!(kc + PAD);
    let rows = comptime!(m_tiles * INSTR);
    let a_len = comptime!(m_tiles * INSTR * (kc + PAD) / vs);
    let mut a_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(a_len, 128usize);
    // staged: each plane's own [16 columns][group * 16 + PAD] slab of W, filled with coalesced
    // 16-byte loads (whole 256-byte runs of a row) instead of per-fragment strided loads
    let ldw = comptime!(group * INSTR + PAD);
    let slab_len = comptime!(if staged { planes * INSTR * ldw / vs } else { 1 });
    let mut slab = Shared::<[Vector<F, N>]>::new_aligned_slice(slab_len, 128usize);
    let slab0 = plane * comptime!(INSTR * ldw / vs);
    let lane_id = UNIT_POS_X as usize;
    let per_lane = comptime!((INSTR * group * INSTR / vs).div_ceil(PLANE_DIM));
    let row_vecs = comptime!(group * INSTR / vs);
    let mut regs = Array::<Vector<F, N>>::new(per_lane);

    let mut accs = Sequence::<cmma::Matrix<f32>>::new();
    #[unroll]
    for _t in 0..m_tiles {
        accs.push(cmma::Matrix::<f32>::from_value(MatrixIdent::Accumulator, 16usize, 16usize, 16usize, MatrixLayout::Undefined, 0.0f32));
    }
    let b_layout = comptime!(if w_out_in { MatrixLayout::ColMajor } else { MatrixLayout::RowMajor });
    let ldb = if comptime!(w_out_in) { k } else { n };
    let w_len = n * k / comptime!(vs);
    let k_vecs = k / comptime!(vs);

    let mut c0 = 0usize;
    while c0 < k {
        let mut len = k - c0;
        if len > comptime!(kc) {
            len = comptime!(kc);
        }
        // Stage x[:, c0 .. c0 + len] (the previous chunk's readers finished at the loop's end).
        let per_row = len / comptime!(vs);
        let total = comptime!(rows) * per_row;
        let mut v = unit;
        while v < total {
            let r = v / per_row;
            let c = v % per_row;
            let mut val = Vector::<F, N>::new(F::from_int(0));
            if r < m {
                val = x[r * k_vecs + c0 / comptime!(vs) + c];
            }
            a_sh[r * comptime!(lda / vs) + c] = val;
            v += units;
        }
        sync_cube();

        if active {
            let steps = len / comptime!(INSTR);
            let groups = steps / comptime!(group);
            if comptime!(staged) {
                // registers hold the next group's slab while this group multiplies
                if groups > 0 {
                    load_slab::<F, N>(w, &mut regs, n0, c0, k_vecs, lane_id, per_lane, row_vecs, vs);
                }
                for g in 0..groups {
                    sync_plane();
                    #[unroll]
                    for i in 0..per_lane {
                        let v = lane_id + i * comptime!(PLANE_DIM);
                        if v < comptime!(INSTR * row_vecs) {
                            slab[slab0 + (v / comptime!(row_vecs)) * comptime!(ldw / vs) + v % comptime!(row_vecs)] = regs[i];
                        }
                    }
                    sync_plane();
                    if g + 1 < groups {
                        load_slab::<F, N>(w, &mut regs, n0, c0 + (g + 1) * comptime!(group * INSTR), k_vecs, lane_id, per_lane, row_vecs, vs);
                    }
                    #[unroll]
                    for u in 0..group {
                        let kl = (g * comptime!(group) + u) * comptime!(INSTR);
                        let mut b = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::B, 16usize, 16usize, 16usize, MatrixLayout::ColMajor) };
                        cmma::load(&mut b, slab.slice(slab0 + u * comptime!(INSTR / vs), slab_len), comptime!(ldw as u32));
                        #[unroll]
                        for t in 0..m_tiles {
                            let mut a = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::A, 16usize, 16usize, 16usize, MatrixLayout::RowMajor) };
                            cmma::load(&mut a, a_sh.slice((t * comptime!(INSTR * lda) + kl) / comptime!(vs), a_len), comptime!(lda as u32));
                            let acc = accs.index(t);
                            cmma::execute(&a, &b, acc, acc);
                        }
                    }
                }
            }
            let mut direct_groups = groups;
            if comptime!(staged) {
                direct_groups = 0;
            }
            for g in 0..direct_groups {
                // all of the group's weight fragments are requested before the first multiply
                let mut bs = Sequence::<cmma::Matrix<F>>::new();
                #[unroll]
                for u in 0..group {
                    let kk = c0 + (g * comptime!(group) + u) * comptime!(INSTR);
                    let mut b = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::B, 16usize, 16usize, 16usize, b_layout) };
                    let off = if comptime!(w_out_in) { n0 * k + kk } else { kk * n + n0 };
                    cmma::load(&mut b, w.slice(off / comptime!(vs), w_len), ldb as u32);
                    bs.push(b);
                }
                #[unroll]
                for u in 0..group {
                    let kl = (g * comptime!(group) + u) * comptime!(INSTR);
                    #[unroll]
                    for t in 0..m_tiles {
                        let mut a = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::A, 16usize, 16usize, 16usize, MatrixLayout::RowMajor) };
                        cmma::load(&mut a, a_sh.slice((t * comptime!(INSTR * lda) + kl) / comptime!(vs), a_len), comptime!(lda as u32));
                        let acc = accs.index(t);
                        cmma::execute(&a, bs.index(u), acc, acc);
                    }
                }
            }
            // the chunk's last steps, one at a time, still in k order
            for s in groups * comptime!(group)..steps {
                let kk = c0 + s * comptime!(INSTR);
                let mut b = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::B, 16usize, 16usize, 16usize, b_layout) };
                let off = if comptime!(w_out_in) { n0 * k + kk } else { kk * n + n0 };
                cmma::load(&mut b, w.slice(off / comptime!(vs), w_len), ldb as u32);
                #[unroll]
                for t in 0..m_tiles {
                    let mut a = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::A, 16usize, 16usize, 16usize, MatrixLayout::RowMajor) };
                    cmma::load(&mut a, a_sh.slice((t * comptime!(INSTR * lda) + s * comptime!(INSTR)) / comptime!(vs), a_len), comptime!(lda as u32));
                    let acc = accs.index(t);
                    cmma::execute(&a, &b, acc, acc);
                }
            }
        }
        sync_cube();
        c0 += comptime!(kc);
    }

    // Epilogue: each plane stages one 16x16 f32 fragment in its own window, then writes the
    // in-bounds elements cast to the output dtype (uniform syncs: every plane runs it).
    let mut stage = Shared::<[f32]>::new_aligned_slice(comptime!(planes * 256), 128usize);
    let st = plane * comptime!(256usize);
    let lane = UNIT_POS_X as usize;
    #[unroll]
    for t in 0..m_tiles {
        cmma::store(stage.slice_mut(st, st + 256), accs.index(t), 16u32, MatrixLayout::RowMajor);
        sync_cube();
        #[unroll]
        for e_iter in 0..comptime!(256 / PLANE_DIM) {
            let e = lane + e_iter * comptime!(PLANE_DIM);
            let row = t * comptime!(INSTR) + e / comptime!(INSTR);
            let col = n0 + e % comptime!(INSTR);
            if active && row < m {
                y[row * n + col] = F::cast_from(stage[st + e]);
            }
        }
        sync_cube();
    }
}

/// `x[M,K] @ W` for [`skinny_applies`] shapes on a device with tensor cores for x's dtype (the
/// caller, [`crate::ops::matmul::matmul_with`], checked both). Output packed `[M,N]` in x's dtype.
pub(crate) fn matmul_skinny(x: CubeTensor, w: CubeTensor, layout: WeightLayout, (m, k, n): (usize, usize, usize)) -> Result<CubeTensor, KernelError> {
    crate::ensure!(skinny_applies(m, k, n), "matmul", "the skinny kernel does not take {m}x{k} @ {k}x{n}");
    let vs = 8; // k % 32 == 0 and n % 16 == 0 (skinny_applies): 16-byte vectors of x and W
    let m_tiles = m.div_ceil(INSTR);
    let shape = launch_shape()?;
    let planes = if n >= WIDE_N { shape.wide } else { shape.narrow };
    // slabs pay off where many planes stream a wide weight (the lm_head: 1.6x at M = 1 on the
    // H200); narrow weights have too few planes to hide the slab round trip (1.9x slower)
    let staged = shape.staged && layout == WeightLayout::OutIn && n >= WIDE_N;
    let (group, kc) = (shape.group, stage_k(m_tiles, staged));
    let smem = shared_bytes(m_tiles, planes, group, staged);
    crate::ensure!(smem <= MAX_SHARED, "matmul", "skinny launch shape {shape:?} needs {smem} bytes of shared memory per cube (48 KiB at most)");
    let client = x.client.clone();
    let y = empty_device_contiguous_dtype(client.clone(), x.device.clone(), [m, n].into(), x.dtype);
    matmul_skinny_kernel::launch(
        &client,
        CubeCount::Static((n / INSTR).div_ceil(planes) as u32, 1, 1),
        CubeDim::new_2d(PLANE_DIM as u32, planes as u32),
        vs,
        x.clone().into_tensor_arg(),
        w.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        m as u32,
        n as u32,
        k as u32,
        layout == WeightLayout::OutIn,
        vs,
        planes,
        m_tiles,
        kc,
        group,
        staged,
        storage(x.dtype),
    );
    Ok(y)
}

/// The constants above, or `LOCKSTEP_SKINNY` (benchmark sweeps; [`crate::kernel_choice::Tuning`]).
pub(crate) fn launch_shape() -> Result<SkinnyLaunch, KernelError> {
    let chosen = crate::kernel_choice::KernelChoice::current()?.tuning.skinny;
    Ok(chosen.unwrap_or(SkinnyLaunch { group: GROUP, wide: WIDE_PLANES, narrow: NARROW_PLANES, staged: STAGED }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_shapes_follow_the_tc_k_steps_and_the_measured_crossovers() {
        assert!(skinny_applies(1, 1024, 151936) && skinny_applies(64, 1024, 151936));
        assert!(!skinny_applies(65, 1024, 151936), "wide weights: tiles from 65 rows");
        assert!(skinny_applies(16, 3072, 1024) && !skinny_applies(17, 3072, 1024), "narrow weights: tiles from 17 rows");
        assert!(!skinny_applies(1, 1000, 1024), "K % 32 != 0 would add a zero k-step the tiles do not");
        assert!(!skinny_applies(1, 1024, 1000), "N % 16 != 0: partial fragments");
    }

    #[test]
    fn every_default_launch_fits_static_shared_memory_and_stages_whole_k_steps() {
        for m_tiles in 1..=SKINNY_MAX_M / INSTR {
            for staged in [false, true] {
                let planes = if staged { WIDE_PLANES } else { WIDE_PLANES.max(NARROW_PLANES) };
                let bytes = shared_bytes(m_tiles, planes, GROUP, staged);
                assert!(bytes <= MAX_SHARED, "{m_tiles} row tiles, staged {staged}: {bytes} bytes");
                assert_eq!(stage_k(m_tiles, staged) % 32, 0);
                assert_eq!(stage_k(m_tiles, staged) % (GROUP * INSTR), 0, "a stage holds whole groups");
            }
        }
    }
}
