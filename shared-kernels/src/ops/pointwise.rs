//! Pointwise ops: every output element depends on its own inputs only, so they are batch
//! invariant as written. swiglu computes `silu(gate) * up` in f32 and casts once. Each unit
//! handles one vector of up to 16 bytes ([`crate::ops::vector_width`]), lane by lane in scalar
//! arithmetic: 2-byte loads kept too few bytes in flight to stream (add at 22% of the H200's
//! bandwidth, swiglu 30%).

use crate::ops::reduce::cube_linear;
use crate::ops::{cube_count_for, storage, vector_width};
use crate::bridge::{dims, float_in, float_out, same_device};
use crate::autodiff::{cube, from_tracked, inner, plain, tracked, tracked_in};
use crate::{ensure, KernelError};
use burn::tensor::Tensor as BTensor;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

const BLOCK: usize = 256;

/// `silu(gate) * up` over vectors of `vs` elements: each unit loads one vector of each input and
/// computes its lanes one by one with the scalar arithmetic of [`swiglu_lanes`], so the bits do not
/// depend on the vector width (wide loads only keep more bytes in flight per unit).
#[cube(launch)]
fn swiglu_kernel<F: Float, N: Size>(gate: &Tensor<Vector<F, N>>, up: &Tensor<Vector<F, N>>, y: &mut Tensor<Vector<F, N>>, vecs_arg: u32, #[comptime] vs: usize, #[define(F)] _d: ElemType) {
    let i = cube_linear() * comptime!(BLOCK) + UNIT_POS_X as usize;
    if i < vecs_arg as usize {
        let (g, u) = (gate[i], up[i]);
        y[i] = swiglu_lanes::<F, N>(g, u, vs);
    }
}

/// `silu(g) * u` lane by lane, in f32 and rounded once per lane: shared by both swiglu kernels.
#[cube]
fn swiglu_lanes<F: Float, N: Size>(g: Vector<F, N>, u: Vector<F, N>, #[comptime] vs: usize) -> Vector<F, N> {
    let mut out = Vector::<F, N>::new(F::from_int(0));
    #[unroll]
    for l in 0..vs {
        let (gl, ul) = (f32::cast_from(g.extract(l)), f32::cast_from(u.extract(l)));
        out.insert(l, F::cast_from(gl / (1.0f32 + (-gl).exp()) * ul));
    }
    out
}

/// swiglu over the output of the fused gate/up projection `[rows, 2 * width]` (gate columns
/// first): the same arithmetic as [`swiglu_kernel`] without splitting the matrix first. Vector
/// `i` of the output is vector `(i / wv) * 2 * wv + i % wv` of the input (`wv` = width / vs).
#[cube(launch)]
fn swiglu_halves_kernel<F: Float, N: Size>(gate_up: &Tensor<Vector<F, N>>, y: &mut Tensor<Vector<F, N>>, vecs_arg: u32, width_vecs_arg: u32, #[comptime] vs: usize, #[define(F)] _d: ElemType) {
    let wv = width_vecs_arg as usize;
    let i = cube_linear() * comptime!(BLOCK) + UNIT_POS_X as usize;
    if i < vecs_arg as usize {
        let at = (i / wv) * 2 * wv + i % wv;
        let (g, u) = (gate_up[at], gate_up[at + wv]);
        y[i] = swiglu_lanes::<F, N>(g, u, vs);
    }
}

/// `x + z` lane by lane (the same single rounding as a scalar add): the residual add of
/// [`add_kernel`] and of the fused add + rmsnorm.
#[cube]
pub(crate) fn add_lanes<F: Float, N: Size>(x: Vector<F, N>, z: Vector<F, N>, #[comptime] vs: usize) -> Vector<F, N> {
    let mut out = Vector::<F, N>::new(F::from_int(0));
    #[unroll]
    for l in 0..vs {
        out.insert(l, x.extract(l) + z.extract(l));
    }
    out
}

/// `a + b` over vectors.
#[cube(launch)]
fn add_kernel<F: Float, N: Size>(a: &Tensor<Vector<F, N>>, b: &Tensor<Vector<F, N>>, y: &mut Tensor<Vector<F, N>>, vecs_arg: u32, #[comptime] vs: usize, #[define(F)] _d: ElemType) {
    let i = cube_linear() * comptime!(BLOCK) + UNIT_POS_X as usize;
    if i < vecs_arg as usize {
        y[i] = add_lanes(a[i], b[i], vs);
    }
}

fn binary<const D: usize>(
    op: &'static str,
    a: BTensor<D>,
    b: BTensor<D>,
    launch: impl FnOnce(&burn_cubecl::tensor::CubeTensor, &burn_cubecl::tensor::CubeTensor, &burn_cubecl::tensor::CubeTensor, usize),
) -> Result<BTensor<D>, KernelError> {
    let a = float_in(op, "a", a)?;
    let b = float_in(op, "b", b)?;
    same_device(op, &a, &b, "b")?;
    ensure!(dims(&a) == dims(&b), op, "shapes differ: {:?} and {:?}", dims(&a), dims(&b));
    ensure!(a.dtype == b.dtype, op, "dtypes differ: {:?} and {:?}", a.dtype, b.dtype);
    let len: usize = dims(&a).iter().product();
    let y = empty_device_contiguous_dtype(a.client.clone(), a.device.clone(), dims(&a).into(), a.dtype);
    if len > 0 {
        launch(&a, &b, &y, len);
    }
    Ok(float_out(y))
}

/// `silu(gate) * up`, elementwise.
pub fn swiglu<const D: usize>(gate: BTensor<D>, up: BTensor<D>) -> Result<BTensor<D>, KernelError> {
    if !gate.is_autodiff() {
        return swiglu_plain(gate, up);
    }
    let (ga, ua) = (tracked_in("swiglu", "gate", gate)?, tracked_in("swiglu", "up", up)?);
    let (gp, up_) = (plain::<D>(inner(&ga)), plain::<D>(inner(&ua)));
    let y = swiglu_plain(gp.clone(), up_.clone())?;
    Ok(from_tracked(tracked([&ga, &ua], cube(y), move |dy| {
        let (dg, du) = crate::ops::swiglu_backward::swiglu_backward(gp, up_, plain::<D>(dy)).expect("swiglu backward: shapes and dtypes checked in forward");
        [Some(cube(dg)), Some(cube(du))]
    })))
}

fn swiglu_plain<const D: usize>(gate: BTensor<D>, up: BTensor<D>) -> Result<BTensor<D>, KernelError> {
    binary("swiglu", gate, up, |a, b, y, len| {
        let vs = vector_width(a.dtype, len);
        swiglu_kernel::launch(
            &a.client,
            cube_count_for(len / vs, BLOCK),
            CubeDim::new_1d(BLOCK as u32),
            vs,
            a.clone().into_tensor_arg(),
            b.clone().into_tensor_arg(),
            y.clone().into_tensor_arg(),
            (len / vs) as u32,
            vs,
            storage(a.dtype),
        )
    })
}

/// `a + b`, elementwise (the residual add).
pub fn add<const D: usize>(a: BTensor<D>, b: BTensor<D>) -> Result<BTensor<D>, KernelError> {
    if !a.is_autodiff() {
        return add_plain(a, b);
    }
    let (aa, ba) = (tracked_in("add", "a", a)?, tracked_in("add", "b", b)?);
    let y = add_plain(plain::<D>(inner(&aa)), plain::<D>(inner(&ba)))?;
    Ok(from_tracked(tracked([&aa, &ba], cube(y), move |dy| [Some(dy.clone()), Some(dy)])))
}

fn add_plain<const D: usize>(a: BTensor<D>, b: BTensor<D>) -> Result<BTensor<D>, KernelError> {
    binary("add", a, b, |a, b, y, len| {
        let vs = vector_width(a.dtype, len);
        add_kernel::launch(
            &a.client,
            cube_count_for(len / vs, BLOCK),
            CubeDim::new_1d(BLOCK as u32),
            vs,
            a.clone().into_tensor_arg(),
            b.clone().into_tensor_arg(),
            y.clone().into_tensor_arg(),
            (len / vs) as u32,
            vs,
            storage(a.dtype),
        )
    })
}

/// `silu(gate) * up` for `gate_up` = `[rows, 2 * width]` = [gate | up], as the fused gate/up
/// projection produces it; bit-identical to [`swiglu`] on the two halves (inference only).
pub fn swiglu_halves(gate_up: BTensor<2>) -> Result<BTensor<2>, KernelError> {
    const OP: &str = "swiglu_halves";
    ensure!(!gate_up.is_autodiff(), OP, "inference only: use swiglu on the training path");
    let x = float_in(OP, "gate_up", gate_up)?;
    let [rows, both] = [dims(&x)[0], dims(&x)[1]];
    ensure!(both % 2 == 0 && both > 0, OP, "gate_up is [{rows}, {both}]; expected an even, non-zero number of columns [gate | up]");
    let width = both / 2;
    let y = empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), vec![rows, width].into(), x.dtype);
    let len = rows * width;
    if len > 0 {
        let vs = vector_width(x.dtype, width);
        swiglu_halves_kernel::launch(
            &x.client,
            cube_count_for(len / vs, BLOCK),
            CubeDim::new_1d(BLOCK as u32),
            vs,
            x.clone().into_tensor_arg(),
            y.clone().into_tensor_arg(),
            (len / vs) as u32,
            (width / vs) as u32,
            vs,
            storage(x.dtype),
        );
    }
    Ok(float_out(y))
}
