//! RMSNorm's backward in one launch a row: `dx` in the input's dtype and the f32 terms
//! `(dy x) r` the weight's gradient sums over rows (the caller folds or sums them).
//!
//! The arithmetic is the op chain that defined this backward (burn's f32 tensor ops and two
//! [`crate::ops::reduce::row_sums`], ~14 launches a norm over f32 `[rows, hidden]` tensors, ~12%
//! of the 1.7B update at 4,096-token sequences): [`rmsnorm_backward_ops`], the reference the
//! tests and the battery compare with as bits. Per row, with `r = 1 / sqrt(sum(x²) / n + eps)`:
//! `dx = (dy w) r - (x r³) (sum(dy w x) / n)`, where each row sum is `row_sums`' order (unit u of
//! the cube's 128 adds elements u, u + 128, ... in order, then the fixed tree) and `r³` is
//! `powf(r, 3)` as burn's `powi_scalar` computes it. Every step keeps its own rounding: the
//! additions go through [`add_unfused`] and each step's value through [`opaque`]
//! (`ops/unfused.rs`: why).

use crate::ops::reduce::{cube_linear, row_sums, tree_sum};
use crate::ops::rmsnorm_math::{element_grads, row_factors};
use crate::ops::unfused::{add_unfused, opaque};
use crate::ops::rmsnorm_planes::{rmsnorm_backward_plane_kernel, NormKernel};
use crate::ops::{cube_count_for, storage, vector_width, ROW_BLOCK};
use crate::bridge::{dims, float_in, float_out, same_device};
use crate::{ensure, KernelError};
use burn::tensor::{DType, Tensor as BTensor};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn rmsnorm_backward_kernel<F: Float>(
    x: &Tensor<F>,
    weight: &Tensor<F>,
    dy: &Tensor<F>,
    dx: &mut Tensor<F>,
    weighted: &mut Tensor<f32>,
    rows_arg: u32,
    hidden_arg: u32,
    eps: f32,
    three: f32,
    #[comptime] block: usize,
    #[comptime] per_unit: usize,
    #[comptime] cuda: bool,
    #[define(F)] _d: ElemType,
) {
    let row = cube_linear();
    if row < rows_arg as usize {
        let hidden = hidden_arg as usize;
        let base = row * hidden;
        let unit = UNIT_POS_X as usize;
        // the two row sums, each unit's elements in order (row_sums' order)
        let mut sums = Array::<f32>::new(2usize);
        sums[0usize] = 0.0f32;
        sums[1usize] = 0.0f32;
        #[unroll]
        for k in 0..per_unit {
            let i = unit + k * block;
            if i < hidden {
                let xv = f32::cast_from(x[base + i]);
                let gw = opaque(f32::cast_from(dy[base + i]) * f32::cast_from(weight[i]), cuda);
                sums[0usize] = add_unfused(sums[0usize] * 1.0f32, opaque(xv * xv, cuda), cuda);
                sums[1usize] = add_unfused(sums[1usize] * 1.0f32, opaque(gw * xv, cuda), cuda);
            }
        }
        let mut shared = Shared::new_slice(block);
        let squares = tree_sum(&mut shared, sums[0usize], block);
        let products = tree_sum(&mut shared, sums[1usize], block);
        let (r, r3, dot) = row_factors(squares, products, f32::cast_from(hidden as u32), eps, three, cuda);
        #[unroll]
        for k in 0..per_unit {
            let i = unit + k * block;
            if i < hidden {
                let (dxe, we) = element_grads(f32::cast_from(x[base + i]), f32::cast_from(dy[base + i]), f32::cast_from(weight[i]), r, r3, dot, cuda);
                dx[base + i] = F::cast_from(dxe);
                weighted[base + i] = we;
            }
        }
    }
}

/// `(dx, (dy x) r)` of `rmsnorm(x, weight, eps)` for the incoming gradient `dy`: `dx` shaped and
/// typed as `x`, the weight-gradient terms f32 `[rows, hidden]` (plain tensors: the backward of
/// [`crate::rmsnorm`]); the op chain on a runtime the kernel does not run on by default
/// (`ops/unfused.rs`).
pub fn rmsnorm_backward<const D: usize>(x: BTensor<D>, weight: BTensor<1>, dy: BTensor<D>, eps: f32) -> Result<(BTensor<D>, BTensor<2>), KernelError> {
    rmsnorm_backward_with(x, weight, dy, eps, NormKernel::Chosen)
}

/// [`rmsnorm_backward`] in one launch on any runtime with plane shuffles (the checks on lavapipe).
pub fn rmsnorm_backward_one_launch<const D: usize>(x: BTensor<D>, weight: BTensor<1>, dy: BTensor<D>, eps: f32) -> Result<(BTensor<D>, BTensor<2>), KernelError> {
    rmsnorm_backward_with(x, weight, dy, eps, NormKernel::Cube)
}

/// [`rmsnorm_backward`] for rows of [`ROW_BLOCK`] values on the plane kernel with planes of
/// `plane` lanes (`ops/rmsnorm_planes.rs`), which must be the device's own plane size: lets CI
/// and the battery run it where the process's choice would not.
#[doc(hidden)]
pub fn rmsnorm_backward_on_planes<const D: usize>(plane: usize, x: BTensor<D>, weight: BTensor<1>, dy: BTensor<D>, eps: f32) -> Result<(BTensor<D>, BTensor<2>), KernelError> {
    rmsnorm_backward_with(x, weight, dy, eps, NormKernel::Planes(plane))
}

fn rmsnorm_backward_with<const D: usize>(x: BTensor<D>, weight: BTensor<1>, dy: BTensor<D>, eps: f32, kernel: NormKernel) -> Result<(BTensor<D>, BTensor<2>), KernelError> {
    const OP: &str = "rmsnorm_backward";
    let (xc, w, d) = (float_in(OP, "x", x)?, float_in(OP, "weight", weight)?, float_in(OP, "dy", dy)?);
    same_device(OP, &xc, &w, "weight")?;
    same_device(OP, &xc, &d, "dy")?;
    let xd = dims(&xc);
    let hidden = *xd.last().unwrap_or(&0);
    ensure!(dims(&d) == xd, OP, "x is {xd:?} but dy is {:?}", dims(&d));
    ensure!(dims(&w) == [hidden], OP, "x is {xd:?} but weight is {:?}; expected weight [{hidden}]", dims(&w));
    ensure!(xc.dtype == w.dtype && xc.dtype == d.dtype, OP, "dtypes differ: x {:?}, weight {:?}, dy {:?}", xc.dtype, w.dtype, d.dtype);
    let len: usize = xd.iter().product();
    ensure!(hidden > 0 && len > 0, OP, "empty input {xd:?}");
    ensure!(len <= u32::MAX as usize, OP, "{len} elements exceed the u32 index range");
    let plane = kernel.plane(OP, &xc.client, hidden)?;
    // by default, off the plane kernel, the op chain where the cube kernel does not run
    if kernel == NormKernel::Chosen && plane.is_none() && !crate::ops::unfused::one_launch(&xc.client, false) {
        return rmsnorm_backward_ops(float_out::<D>(xc), float_out(w), float_out::<D>(d), eps);
    }
    let rows = len / hidden;
    let dx = empty_device_contiguous_dtype(xc.client.clone(), xc.device.clone(), xd.clone().into(), xc.dtype);
    let weighted = empty_device_contiguous_dtype(xc.client.clone(), xc.device.clone(), [rows, hidden].into(), DType::F32);
    let cuda = crate::device::runtime_name() == "cuda";
    if let Some(plane) = plane {
        let vs = vector_width(xc.dtype, ROW_BLOCK / plane).min(vector_width(DType::F32, ROW_BLOCK / plane));
        rmsnorm_backward_plane_kernel::launch(
            &xc.client,
            cube_count_for(rows, ROW_BLOCK / plane),
            CubeDim::new_1d(ROW_BLOCK as u32),
            vs,
            xc.clone().into_tensor_arg(),
            w.into_tensor_arg(),
            d.into_tensor_arg(),
            dx.clone().into_tensor_arg(),
            weighted.clone().into_tensor_arg(),
            rows as u32,
            eps,
            3.0f32,
            plane,
            vs,
            cuda,
            storage(xc.dtype),
        );
        return Ok((float_out::<D>(dx), float_out(weighted)));
    }
    rmsnorm_backward_kernel::launch(
        &xc.client,
        cube_count_for(rows, 1),
        CubeDim::new_1d(ROW_BLOCK as u32),
        xc.clone().into_tensor_arg(),
        w.into_tensor_arg(),
        d.into_tensor_arg(),
        dx.clone().into_tensor_arg(),
        weighted.clone().into_tensor_arg(),
        rows as u32,
        hidden as u32,
        eps,
        3.0f32,
        ROW_BLOCK,
        hidden.div_ceil(ROW_BLOCK),
        cuda,
        storage(xc.dtype),
    );
    Ok((float_out::<D>(dx), float_out(weighted)))
}

/// The op chain [`rmsnorm_backward`] computes, in burn's f32 tensor ops and `row_sums`: the
/// definition its bits are checked against (tests, `lockstep-battery`).
pub fn rmsnorm_backward_ops<const D: usize>(x: BTensor<D>, weight: BTensor<1>, dy: BTensor<D>, eps: f32) -> Result<(BTensor<D>, BTensor<2>), KernelError> {
    // y = w * x * r with r = (mean(x^2) + eps)^-1/2, per row of the last dim
    let shape = x.shape();
    let hidden = shape[D - 1];
    let rows = shape.num_elements() / hidden;
    let dtype = x.dtype();
    let x2 = x.reshape([rows, hidden]).cast(DType::F32);
    let dy2 = dy.reshape([rows, hidden]).cast(DType::F32);
    let w = weight.cast(DType::F32).unsqueeze::<2>();
    let row_means = |t: BTensor<2>| row_sums(t).map(|sums| sums.div_scalar(hidden as f64).reshape([rows, 1]));
    let r = row_means(x2.clone() * x2.clone())?.add_scalar(eps as f64).sqrt().recip();
    let gw = dy2.clone() * w;
    let dot = row_means(gw.clone() * x2.clone())?;
    let dx = gw * r.clone() - x2.clone() * r.clone().powi_scalar(3) * dot;
    Ok((dx.cast(dtype).reshape(shape), dy2 * x2 * r))
}
