//! RMSNorm with weight, in Qwen3/Llama's convention: normalise in f32, cast back to the input
//! dtype, then multiply by the weight (`weight * (x * rsqrt(mean(x^2) + eps)).to(dtype)`).
//!
//! Batch invariance: one row per cube, `ROW_BLOCK` units, each folding its strided elements in
//! order, then one fixed reduction tree.

use crate::ops::reduce::{cube_linear, tree_sum};
use crate::ops::pointwise::add_lanes;
use crate::ops::rmsnorm_math::{inv_rms_of_total, normed};
use crate::ops::rmsnorm_planes::{rmsnorm_plane_kernel, NormKernel};
use crate::ops::{cube_count_for, storage, vector_width, ROW_BLOCK};
use crate::bridge::{dims, float_in, float_out, same_device};
use crate::autodiff::{column_sums, cube, from_tracked, inner, plain, tracked, tracked_in};
use crate::{ensure, KernelError};
use burn::tensor::{DType, Tensor as BTensor};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

/// Unit u's elements u, u + block, u + 2 block, ... of `x[base..base + hidden]` into `vals`,
/// every load issued before any is used (a strided `while` loop left one load in flight per
/// unit: rmsnorm at 36% of the H200's bandwidth). Slots past the row's end hold zero and are
/// skipped by every reader.
#[cube]
pub(crate) fn load_strided<F: Float>(x: &Tensor<F>, vals: &mut Array<F>, base: usize, hidden: usize, #[comptime] block: usize, #[comptime] per_unit: usize) {
    #[unroll]
    for j in 0..per_unit {
        let i = UNIT_POS_X as usize + j * block;
        let mut v = F::from_int(0);
        if i < hidden {
            v = x[base + i];
        }
        vals[j] = v;
    }
}

/// The unit's sum of squares over its strided elements, in order: the one fold every rmsnorm
/// (plain, fused with the residual add, per head in [`crate::ops::attention::decode::inputs`]) runs, so all
/// give the same bits for the same row.
#[cube]
pub(crate) fn squares_sum<F: Float>(vals: &Array<F>, hidden: usize, #[comptime] block: usize, #[comptime] per_unit: usize) -> f32 {
    let mut partial = 0.0f32;
    #[unroll]
    for j in 0..per_unit {
        if UNIT_POS_X as usize + j * block < hidden {
            let v = f32::cast_from(vals[j]);
            partial += v * v;
        }
    }
    partial
}

/// `1 / sqrt(mean(x^2) + eps)` over `x[base..base + hidden]` (`per_unit` = hidden / block,
/// rounded up): the strided loads, [`squares_sum`], then one fixed tree.
#[cube]
pub(crate) fn row_inv_rms<F: Float>(x: &Tensor<F>, base: usize, hidden: usize, eps: f32, #[comptime] block: usize, #[comptime] per_unit: usize) -> f32 {
    let mut vals = Array::<F>::new(per_unit);
    load_strided(x, &mut vals, base, hidden, block, per_unit);
    inv_rms_of(squares_sum(&vals, hidden, block, per_unit), hidden, eps, block)
}

/// The cube's tree over each unit's sum of squares, then `1 / sqrt(mean + eps)`.
#[cube]
pub(crate) fn inv_rms_of(partial: f32, hidden: usize, eps: f32, #[comptime] block: usize) -> f32 {
    let mut shared = Shared::new_slice(block);
    let total = tree_sum(&mut shared, partial, block);
    inv_rms_of_total(total, hidden, eps)
}

/// Unit u's strided elements u, u + block, ... of a row staged in shared memory, as
/// [`load_strided`] reads them from global memory (zero past the row's end).
#[cube]
fn strided_from_shared<F: Float>(row_sh: &Shared<[F]>, vals: &mut Array<F>, #[comptime] hidden: usize, #[comptime] block: usize, #[comptime] per_unit: usize) {
    #[unroll]
    for k in 0..per_unit {
        let i = UNIT_POS_X as usize + k * block;
        let mut v = F::from_int(0);
        if i < hidden {
            v = row_sh[i];
        }
        vals[k] = v;
    }
}

/// Unit u's vectors u, u + block, ... of the row starting at vector `base_v`, every load issued
/// before any is used.
#[cube]
fn load_vectors<F: Float, N: Size>(x: &Tensor<Vector<F, N>>, own: &mut Array<Vector<F, N>>, base_v: usize, #[comptime] hidden: usize, #[comptime] block: usize, #[comptime] vs: usize) {
    #[unroll]
    for j in 0..comptime!((hidden / vs).div_ceil(block)) {
        let v = UNIT_POS_X as usize + j * block;
        if v < comptime!(hidden / vs) {
            own[j] = x[base_v + v];
        }
    }
}

/// The lanes of the unit's vectors (u, u + block, ... of the row) into the row's shared copy,
/// then a sync.
#[cube]
fn stage_lanes<F: Float, N: Size>(own: &Array<Vector<F, N>>, row_sh: &mut Shared<[F]>, #[comptime] hidden: usize, #[comptime] block: usize, #[comptime] vs: usize) {
    let hv = comptime!(hidden / vs);
    #[unroll]
    for j in 0..comptime!((hidden / vs).div_ceil(block)) {
        let v = UNIT_POS_X as usize + j * block;
        if v < hv {
            let xv = own[j];
            #[unroll]
            for l in 0..vs {
                row_sh[v * vs + l] = xv.extract(l);
            }
        }
    }
    sync_cube();
}

/// 1 / rms of a row held as the cube's vectors: staged to shared memory, then each unit folds
/// its strided elements with [`squares_sum`] and the cube runs [`inv_rms_of`], exactly as
/// [`row_inv_rms`] does from global memory.
#[cube]
fn staged_inv_rms<F: Float, N: Size>(own: &Array<Vector<F, N>>, eps: f32, #[comptime] hidden: usize, #[comptime] block: usize, #[comptime] vs: usize) -> f32 {
    let mut row_sh = Shared::<[F]>::new_slice(hidden);
    stage_lanes(own, &mut row_sh, hidden, block, vs);
    let mut vals = Array::<F>::new(comptime!(hidden.div_ceil(block)));
    strided_from_shared(&row_sh, &mut vals, hidden, block, comptime!(hidden.div_ceil(block)));
    inv_rms_of(squares_sum(&vals, hidden, block, comptime!(hidden.div_ceil(block))), hidden, eps, block)
}

/// Writes unit u's vectors u, u + block, ... of the row, normalised lane by lane.
#[cube]
fn store_normed<F: Float, N: Size>(own: &Array<Vector<F, N>>, weight: &Tensor<Vector<F, N>>, y: &mut Tensor<Vector<F, N>>, base_v: usize, inv_rms: f32, #[comptime] hidden: usize, #[comptime] block: usize, #[comptime] vs: usize) {
    let hv = comptime!(hidden / vs);
    #[unroll]
    for j in 0..comptime!((hidden / vs).div_ceil(block)) {
        let v = UNIT_POS_X as usize + j * block;
        if v < hv {
            let (xv, wv) = (own[j], weight[v]);
            let mut out = Vector::<F, N>::new(F::from_int(0));
            #[unroll]
            for l in 0..vs {
                out.insert(l, normed::<F>(xv.extract(l), wv.extract(l), inv_rms));
            }
            y[base_v + v] = out;
        }
    }
}

/// One row per cube, read once: unit u loads vectors u, u + block, ... (16 bytes each on CUDA,
/// all in flight), keeps them in registers for the output and folds the row through shared
/// memory in [`row_inv_rms`]'s order, so the vector width moves bytes, never bits (2-byte
/// strided loads ran at 36-46% of the H200's bandwidth).
#[cube(launch)]
fn rmsnorm_kernel<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    weight: &Tensor<Vector<F, N>>,
    y: &mut Tensor<Vector<F, N>>,
    rows_arg: u32,
    eps: f32,
    #[comptime] block: usize,
    #[comptime] hidden: usize,
    #[comptime] vs: usize,
    #[define(F)] _dtype: ElemType,
) {
    let row = cube_linear();
    if row < rows_arg as usize {
        let base_v = row * comptime!(hidden / vs);
        let mut own = Array::<Vector<F, N>>::new(comptime!((hidden / vs).div_ceil(block)));
        load_vectors(x, &mut own, base_v, hidden, block, vs);
        let inv_rms = staged_inv_rms(&own, eps, hidden, block, vs);
        store_normed(&own, weight, y, base_v, inv_rms, hidden, block, vs);
    }
}

/// `sum = a + b` (the residual add, same arithmetic as [`crate::add`]) and `y = rmsnorm(sum)`
/// in one pass: the decode path's "add then normalise" without a second read of the sum.
#[cube(launch)]
fn add_rmsnorm_kernel<F: Float, N: Size>(
    a: &Tensor<Vector<F, N>>,
    b: &Tensor<Vector<F, N>>,
    weight: &Tensor<Vector<F, N>>,
    sum: &mut Tensor<Vector<F, N>>,
    y: &mut Tensor<Vector<F, N>>,
    rows_arg: u32,
    eps: f32,
    #[comptime] block: usize,
    #[comptime] hidden: usize,
    #[comptime] vs: usize,
    #[define(F)] _dtype: ElemType,
) {
    let row = cube_linear();
    if row < rows_arg as usize {
        let hv = comptime!(hidden / vs);
        let base_v = row * hv;
        let mut own = Array::<Vector<F, N>>::new(comptime!((hidden / vs).div_ceil(block)));
        let mut vb = Array::<Vector<F, N>>::new(comptime!((hidden / vs).div_ceil(block)));
        load_vectors(a, &mut own, base_v, hidden, block, vs);
        load_vectors(b, &mut vb, base_v, hidden, block, vs);
        // the sums as stored (the add kernel's lanes), then rmsnorm of them
        #[unroll]
        for j in 0..comptime!((hidden / vs).div_ceil(block)) {
            let v = UNIT_POS_X as usize + j * block;
            if v < hv {
                own[j] = add_lanes(own[j], vb[j], vs);
                sum[base_v + v] = own[j];
            }
        }
        let inv_rms = staged_inv_rms(&own, eps, hidden, block, vs);
        store_normed(&own, weight, y, base_v, inv_rms, hidden, block, vs);
    }
}

/// The kernels stage one row in shared memory: bound its size well inside the 48 KB a cube can
/// have everywhere (hidden 8192 in f32 is 32 KB).
fn ensure_staged_row_fits(op: &'static str, hidden: usize, dtype: DType) -> Result<(), KernelError> {
    ensure!(hidden * dtype.size() <= 40 * 1024, op, "rows of {hidden} {dtype:?} values exceed the 40 KB a cube stages in shared memory");
    Ok(())
}

/// RMSNorm over the last dimension of `x` (any rank, rows = all leading dims).
pub fn rmsnorm<const D: usize>(x: BTensor<D>, weight: BTensor<1>, eps: f32) -> Result<BTensor<D>, KernelError> {
    if !x.is_autodiff() {
        return rmsnorm_plain(x, weight, eps);
    }
    let (xa, wa) = (tracked_in("rmsnorm", "x", x)?, tracked_in("rmsnorm", "weight", weight)?);
    let (xp, wp) = (plain::<D>(inner(&xa)), plain::<1>(inner(&wa)));
    let y = rmsnorm_plain(xp.clone(), wp.clone(), eps)?;
    let w_id = wa.id().value;
    let w_frozen = !wa.is_tracked();
    Ok(from_tracked(tracked([&xa, &wa], cube(y), move |dy| {
        let shape = xp.shape();
        let rows = shape.num_elements() / shape[D - 1];
        let dtype = wp.dtype();
        let (dx, weighted) = crate::ops::rmsnorm_backward::rmsnorm_backward(xp, wp, plain::<D>(dy), eps).expect("rmsnorm backward: shapes and dtypes checked in forward");
        let dx = Some(cube::<D>(dx));
        if w_frozen {
            return [dx, None]; // a frozen weight (LoRA's base norms)
        }
        if crate::grad_fold::folds(w_id) {
            // granules of FOLD_ROWS tokens: rows / shape[0] rows per token ([n, heads, d] inputs)
            let chunk_rows = crate::ops::weight_grad::FOLD_ROWS * (rows / shape[0]);
            crate::grad_fold::fold_into(w_id, crate::grad_fold::FoldUse::Norm, |acc| {
                crate::ops::weight_grad::fold_column_sums(acc, weighted, chunk_rows).expect("rmsnorm backward: rows of the op's input")
            });
            return [dx, None];
        }
        let dw = column_sums(weighted);
        [dx, Some(cube::<1>(dw.cast(dtype)))]
    })))
}

fn rmsnorm_plain<const D: usize>(x: BTensor<D>, weight: BTensor<1>, eps: f32) -> Result<BTensor<D>, KernelError> {
    rmsnorm_on(NormKernel::Chosen, x, weight, eps)
}

/// [`rmsnorm`] (without autodiff) on the plane kernel for rows of [`ROW_BLOCK`] values with
/// planes of this size (`ops/rmsnorm_planes.rs`; it must be the device's own), or `None`: on the
/// cube kernel. Lets CI and the battery compare the two whatever the process chose.
#[doc(hidden)]
pub fn rmsnorm_with_planes<const D: usize>(plane: Option<usize>, x: BTensor<D>, weight: BTensor<1>, eps: f32) -> Result<BTensor<D>, KernelError> {
    ensure!(!x.is_autodiff(), "rmsnorm", "rmsnorm_with_planes takes plain tensors (rmsnorm records the backward)");
    rmsnorm_on(plane.map_or(NormKernel::Cube, NormKernel::Planes), x, weight, eps)
}

fn rmsnorm_on<const D: usize>(kernel: NormKernel, x: BTensor<D>, weight: BTensor<1>, eps: f32) -> Result<BTensor<D>, KernelError> {
    const OP: &str = "rmsnorm";
    let x = float_in(OP, "x", x)?;
    let weight = float_in(OP, "weight", weight)?;
    same_device(OP, &x, &weight, "weight")?;
    let (xd, wd) = (dims(&x), dims(&weight));
    let hidden = *xd.last().unwrap_or(&0);
    ensure!(wd == [hidden], OP, "x is {xd:?} but weight is {wd:?}; expected weight [{hidden}]");
    ensure!(x.dtype == weight.dtype, OP, "x is {:?} but weight is {:?}", x.dtype, weight.dtype);
    ensure!(eps.is_finite() && eps > 0.0, OP, "eps must be finite and > 0, got {eps}");
    let rows: usize = xd[..xd.len() - 1].iter().product();
    ensure!(rows > 0 && hidden > 0, OP, "empty input {xd:?}");
    let y = empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), xd.clone().into(), x.dtype);
    if let Some(plane) = kernel.plane(OP, &x.client, hidden)? {
        let vs = vector_width(x.dtype, ROW_BLOCK / plane);
        rmsnorm_plane_kernel::launch(
            &x.client,
            cube_count_for(rows, ROW_BLOCK / plane),
            CubeDim::new_1d(ROW_BLOCK as u32),
            vs,
            x.clone().into_tensor_arg(),
            weight.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            rows as u32,
            eps,
            plane,
            vs,
            storage(x.dtype),
        );
        return Ok(float_out(y));
    }
    ensure_staged_row_fits(OP, hidden, x.dtype)?;
    let vs = vector_width(x.dtype, hidden);
    rmsnorm_kernel::launch(
        &x.client,
        cube_count_for(rows, 1),
        CubeDim::new_1d(ROW_BLOCK as u32),
        vs,
        x.clone().into_tensor_arg(),
        weight.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        rows as u32,
        eps,
        ROW_BLOCK,
        hidden,
        vs,
        storage(x.dtype),
    );
    Ok(float_out(y))
}

/// `(a + b, rmsnorm(a + b))` in one launch, bit-identical to [`crate::add`] then [`rmsnorm`]
/// (inference only: the training path keeps the two differentiable ops).
pub fn add_rmsnorm(a: BTensor<2>, b: BTensor<2>, weight: BTensor<1>, eps: f32) -> Result<(BTensor<2>, BTensor<2>), KernelError> {
    const OP: &str = "add_rmsnorm";
    ensure!(!a.is_autodiff() && !b.is_autodiff(), OP, "inference only: use add then rmsnorm on the training path");
    let a = float_in(OP, "a", a)?;
    let b = float_in(OP, "b", b)?;
    let weight = float_in(OP, "weight", weight)?;
    same_device(OP, &a, &b, "b")?;
    same_device(OP, &a, &weight, "weight")?;
    let (ad, bd, wd) = (dims(&a), dims(&b), dims(&weight));
    ensure!(ad == bd, OP, "a is {ad:?} but b is {bd:?}");
    let (rows, hidden) = (ad[0], ad[1]);
    ensure!(wd == [hidden], OP, "a is {ad:?} but weight is {wd:?}; expected weight [{hidden}]");
    ensure!(a.dtype == b.dtype && a.dtype == weight.dtype, OP, "dtypes differ: a {:?}, b {:?}, weight {:?}", a.dtype, b.dtype, weight.dtype);
    ensure!(eps.is_finite() && eps > 0.0, OP, "eps must be finite and > 0, got {eps}");
    ensure!(rows > 0 && hidden > 0, OP, "empty input {ad:?}");
    let sum = empty_device_contiguous_dtype(a.client.clone(), a.device.clone(), ad.clone().into(), a.dtype);
    let y = empty_device_contiguous_dtype(a.client.clone(), a.device.clone(), ad.clone().into(), a.dtype);
    ensure_staged_row_fits(OP, hidden, a.dtype)?;
    let vs = vector_width(a.dtype, hidden);
    add_rmsnorm_kernel::launch(
        &a.client,
        cube_count_for(rows, 1),
        CubeDim::new_1d(ROW_BLOCK as u32),
        vs,
        a.clone().into_tensor_arg(),
        b.into_tensor_arg(),
        weight.into_tensor_arg(),
        sum.clone().into_tensor_arg(),
        y.clone().into_tensor_arg(),
        rows as u32,
        eps,
        ROW_BLOCK,
        hidden,
        vs,
        storage(a.dtype),
    );
    Ok((float_out(sum), float_out(y)))
}
