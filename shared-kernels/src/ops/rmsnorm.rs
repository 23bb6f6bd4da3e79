//! RMSNorm with weight, in Qwen3/Llama's convention: normalise in f32, cast back to the input
//! dtype, then multiply by the weight (`weight * (x * rsqrt(mean(x^2) + eps)).to(dtype)`).
//!
//! Batch invariance: one row per cube, `ROW_BLOCK` units, one fixed reduction tree.

use super::reduce::{cube_linear, tree_sum};
use super::{cube_count_for, storage, ROW_BLOCK};
use crate::bridge::{dims, float_in, float_out, same_device};
use crate::autodiff::{cube, from_tracked, inner, plain, tracked, tracked_in};
use crate::{ensure, KernelError};
use burn::tensor::{DType, Tensor as BTensor};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

/// `1 / sqrt(mean(x^2) + eps)` over `x[base..base + hidden]`: each unit folds its strided
/// slice, then one fixed tree. Every rmsnorm (plain, fused with the residual add, per head in
/// [`super::attention_inputs`]) calls this, so all give the same bits for the same row.
#[cube]
pub(crate) fn row_inv_rms<F: Float>(x: &Tensor<F>, base: usize, hidden: usize, eps: f32, #[comptime] block: usize) -> f32 {
    let unit = UNIT_POS_X as usize;
    let mut partial = 0.0f32;
    let mut i = unit;
    while i < hidden {
        let v = f32::cast_from(x[base + i]);
        partial += v * v;
        i += block;
    }
    inv_rms_of(partial, hidden, eps, block)
}

/// The cube's tree over each unit's sum of squares, then `1 / sqrt(mean + eps)`.
#[cube]
pub(crate) fn inv_rms_of(partial: f32, hidden: usize, eps: f32, #[comptime] block: usize) -> f32 {
    let mut shared = Shared::new_slice(block);
    let total = tree_sum(&mut shared, partial, block);
    1.0f32 / (total / f32::cast_from(hidden as u32) + eps).sqrt()
}

/// One normalised element: normalise in f32, cast to the storage type, then scale (HF order).
#[cube]
pub(crate) fn normed<F: Float>(x: F, weight: F, inv_rms: f32) -> F {
    weight * F::cast_from(f32::cast_from(x) * inv_rms)
}

#[cube(launch)]
fn rmsnorm_kernel<F: Float>(
    x: &Tensor<F>,
    weight: &Tensor<F>,
    y: &mut Tensor<F>,
    rows_arg: u32,
    hidden_arg: u32,
    eps: f32,
    #[comptime] block: usize,
    #[define(F)] _dtype: ElemType,
) {
    let rows = rows_arg as usize;
    let hidden = hidden_arg as usize;
    let row = cube_linear();
    if row < rows {
        let base = row * hidden;
        let inv_rms = row_inv_rms(x, base, hidden, eps, block);
        let mut j = UNIT_POS_X as usize;
        while j < hidden {
            y[base + j] = normed::<F>(x[base + j], weight[j], inv_rms);
            j += block;
        }
    }
}

/// `sum = a + b` (the residual add, same arithmetic as [`crate::add`]) and `y = rmsnorm(sum)`
/// in one pass: the decode path's "add then normalise" without a second read of the sum.
#[cube(launch)]
fn add_rmsnorm_kernel<F: Float>(
    a: &Tensor<F>,
    b: &Tensor<F>,
    weight: &Tensor<F>,
    sum: &mut Tensor<F>,
    y: &mut Tensor<F>,
    rows_arg: u32,
    hidden_arg: u32,
    eps: f32,
    #[comptime] block: usize,
    #[define(F)] _dtype: ElemType,
) {
    let rows = rows_arg as usize;
    let hidden = hidden_arg as usize;
    let row = cube_linear();
    if row < rows {
        let base = row * hidden;
        // the same strided fold as row_inv_rms, over the sums as stored
        let mut partial = 0.0f32;
        let mut i = UNIT_POS_X as usize;
        while i < hidden {
            let stored = a[base + i] + b[base + i];
            sum[base + i] = stored;
            let v = f32::cast_from(stored);
            partial += v * v;
            i += block;
        }
        let inv_rms = inv_rms_of(partial, hidden, eps, block);
        let mut j = UNIT_POS_X as usize;
        while j < hidden {
            y[base + j] = normed::<F>(sum[base + j], weight[j], inv_rms);
            j += block;
        }
    }
}

/// RMSNorm over the last dimension of `x` (any rank, rows = all leading dims).
pub fn rmsnorm<const D: usize>(x: BTensor<D>, weight: BTensor<1>, eps: f32) -> Result<BTensor<D>, KernelError> {
    if !x.is_autodiff() {
        return rmsnorm_plain(x, weight, eps);
    }
    let (xa, wa) = (tracked_in("rmsnorm", "x", x)?, tracked_in("rmsnorm", "weight", weight)?);
    let (xp, wp) = (plain::<D>(inner(&xa)), plain::<1>(inner(&wa)));
    let y = rmsnorm_plain(xp.clone(), wp.clone(), eps)?;
    Ok(from_tracked(tracked([&xa, &wa], cube(y), move |dy| {
        // y = w * x * r with r = (mean(x^2) + eps)^-1/2, per row of the last dim
        let shape = xp.shape();
        let hidden = shape[D - 1];
        let rows = shape.num_elements() / hidden;
        let x2 = xp.reshape([rows, hidden]).cast(DType::F32);
        let dy2 = plain::<D>(dy).reshape([rows, hidden]).cast(DType::F32);
        let w = wp.clone().cast(DType::F32).unsqueeze::<2>();
        let r = (x2.clone() * x2.clone()).mean_dim(1).add_scalar(eps as f64).sqrt().recip();
        let gw = dy2.clone() * w;
        let dot = (gw.clone() * x2.clone()).mean_dim(1);
        let dx = gw * r.clone() - x2.clone() * r.clone().powi_scalar(3) * dot;
        let dw = (dy2 * x2 * r).sum_dim(0).reshape([hidden]);
        let dtype = wp.dtype();
        [Some(cube::<D>(dx.cast(dtype).reshape(shape))), Some(cube::<1>(dw.cast(dtype)))]
    })))
}

fn rmsnorm_plain<const D: usize>(x: BTensor<D>, weight: BTensor<1>, eps: f32) -> Result<BTensor<D>, KernelError> {
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
    rmsnorm_kernel::launch(
        &x.client,
        cube_count_for(rows, 1),
        CubeDim::new_1d(ROW_BLOCK as u32),
        x.clone().into_tensor_arg(),
        weight.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        rows as u32,
        hidden as u32,
        eps,
        ROW_BLOCK,
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
    add_rmsnorm_kernel::launch(
        &a.client,
        cube_count_for(rows, 1),
        CubeDim::new_1d(ROW_BLOCK as u32),
        a.clone().into_tensor_arg(),
        b.into_tensor_arg(),
        weight.into_tensor_arg(),
        sum.clone().into_tensor_arg(),
        y.clone().into_tensor_arg(),
        rows as u32,
        hidden as u32,
        eps,
        ROW_BLOCK,
        storage(a.dtype),
    );
    Ok((float_out(sum), float_out(y)))
}
