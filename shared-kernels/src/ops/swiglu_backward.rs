//! swiglu's backward in one launch: `dg = dy u silu'(g)` and `du = dy silu(g)` from the bf16
//! (or f16, f32) forward inputs and incoming gradient, written in their dtype.
//!
//! The arithmetic is the op chain that defined this backward (burn's f32 tensor ops, eleven
//! launches over f32 `[rows, width]` tensors, 12% of the 1.7B update at 4,096-token sequences):
//! [`swiglu_backward_ops`], kept as the reference the tests and the battery compare with as
//! bits. Each value is the same f32 operation on the same operands, rounded once, in the same
//! order; sigmoid as burn computes it (`exp(-ln(exp(-g) + 1))`), `silu' = s (g (1 - s) + 1)`,
//! `dg = (dy u) silu'`. The additions that follow a product or a library call go through
//! [`add_unfused`] and each step's value through [`opaque`] (`ops/unfused.rs`: why), so the
//! compiler merges no two roundings that separate launches kept apart.

use crate::ops::unfused::{add_unfused, opaque};
use crate::ops::reduce::cube_linear;
use crate::ops::{cube_count_for, storage, vector_width};
use crate::bridge::{dims, float_in, float_out, same_device};
use crate::{ensure, KernelError};
use burn::tensor::{DType, Tensor as BTensor};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

const BLOCK: usize = 256;

/// burn's sigmoid of an f32 value: `exp(-ln(exp(-x) + 1))`, each step rounded.
#[cube]
fn sigmoid_as_chain(x: f32, #[comptime] cuda: bool) -> f32 {
    let e = opaque((-x).exp(), cuda);
    let l = opaque(add_unfused(e, 1.0f32, cuda).ln(), cuda);
    opaque((-l).exp(), cuda)
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn swiglu_backward_kernel<F: Float, N: Size>(
    gate: &Tensor<Vector<F, N>>,
    up: &Tensor<Vector<F, N>>,
    dy: &Tensor<Vector<F, N>>,
    d_gate: &mut Tensor<Vector<F, N>>,
    d_up: &mut Tensor<Vector<F, N>>,
    vecs_arg: u32,
    #[comptime] vs: usize,
    #[comptime] cuda: bool,
    #[define(F)] _d: ElemType,
) {
    let i = cube_linear() * comptime!(BLOCK) + UNIT_POS_X as usize;
    if i < vecs_arg as usize {
        let (g, u, d) = (gate[i], up[i], dy[i]);
        let mut dg = Vector::<F, N>::new(F::from_int(0));
        let mut du = Vector::<F, N>::new(F::from_int(0));
        #[unroll]
        for l in 0..vs {
            let gl = f32::cast_from(g.extract(l));
            let ul = f32::cast_from(u.extract(l));
            let dl = f32::cast_from(d.extract(l));
            let s = sigmoid_as_chain(gl, cuda);
            let silu = opaque(gl * s, cuda);
            let one_minus_s = add_unfused(-s, 1.0f32, cuda);
            let dsilu = opaque(s * add_unfused(gl * one_minus_s, 1.0f32, cuda), cuda);
            dg.insert(l, F::cast_from(dl * ul * dsilu));
            du.insert(l, F::cast_from(dl * silu));
        }
        d_gate[i] = dg;
        d_up[i] = du;
    }
}

/// `(d gate, d up)` of `silu(gate) * up` for the incoming gradient `dy`, in the inputs' dtype
/// (plain tensors: the backward of [`crate::swiglu`]); the op chain on a runtime the kernel does
/// not run on by default (`ops/unfused.rs`).
pub fn swiglu_backward<const D: usize>(gate: BTensor<D>, up: BTensor<D>, dy: BTensor<D>) -> Result<(BTensor<D>, BTensor<D>), KernelError> {
    swiglu_backward_with(gate, up, dy, false)
}

/// [`swiglu_backward`] in one launch on any runtime with plane shuffles (the checks on lavapipe).
pub fn swiglu_backward_one_launch<const D: usize>(gate: BTensor<D>, up: BTensor<D>, dy: BTensor<D>) -> Result<(BTensor<D>, BTensor<D>), KernelError> {
    swiglu_backward_with(gate, up, dy, true)
}

fn swiglu_backward_with<const D: usize>(gate: BTensor<D>, up: BTensor<D>, dy: BTensor<D>, forced: bool) -> Result<(BTensor<D>, BTensor<D>), KernelError> {
    const OP: &str = "swiglu_backward";
    let (g, u, d) = (float_in(OP, "gate", gate)?, float_in(OP, "up", up)?, float_in(OP, "dy", dy)?);
    same_device(OP, &g, &u, "up")?;
    same_device(OP, &g, &d, "dy")?;
    ensure!(dims(&g) == dims(&u) && dims(&g) == dims(&d), OP, "shapes differ: gate {:?}, up {:?}, dy {:?}", dims(&g), dims(&u), dims(&d));
    ensure!(g.dtype == u.dtype && g.dtype == d.dtype, OP, "dtypes differ: gate {:?}, up {:?}, dy {:?}", g.dtype, u.dtype, d.dtype);
    let len: usize = dims(&g).iter().product();
    ensure!(len <= u32::MAX as usize, OP, "{len} elements exceed the u32 index range");
    if !crate::ops::unfused::one_launch(&g.client, forced) {
        return Ok(swiglu_backward_ops(float_out(g), float_out(u), float_out(d)));
    }
    let out = || empty_device_contiguous_dtype(g.client.clone(), g.device.clone(), dims(&g).into(), g.dtype);
    let (dg, du) = (out(), out());
    if len > 0 {
        let vs = vector_width(g.dtype, len);
        swiglu_backward_kernel::launch(
            &g.client,
            cube_count_for(len / vs, BLOCK),
            CubeDim::new_1d(BLOCK as u32),
            vs,
            g.clone().into_tensor_arg(),
            u.into_tensor_arg(),
            d.into_tensor_arg(),
            dg.clone().into_tensor_arg(),
            du.clone().into_tensor_arg(),
            (len / vs) as u32,
            vs,
            crate::device::runtime_name() == "cuda",
            storage(g.dtype),
        );
    }
    Ok((float_out(dg), float_out(du)))
}

/// The op chain [`swiglu_backward`] computes, in burn's f32 tensor ops: the definition its
/// bits are checked against (tests, `lockstep-battery`).
pub fn swiglu_backward_ops<const D: usize>(gate: BTensor<D>, up: BTensor<D>, dy: BTensor<D>) -> (BTensor<D>, BTensor<D>) {
    let dtype = gate.dtype();
    let (g, u, dy) = (gate.cast(DType::F32), up.cast(DType::F32), dy.cast(DType::F32));
    let s = burn::tensor::activation::sigmoid(g.clone());
    let silu = g.clone() * s.clone();
    let dsilu = s.clone() * (g * (s.neg().add_scalar(1.0))).add_scalar(1.0);
    let dg = dy.clone() * u * dsilu;
    let du = dy * silu;
    (dg.cast(dtype), du.cast(dtype))
}
