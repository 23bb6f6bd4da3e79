//! A projection's bias (Qwen2's q/k/v, Llama's with `attention_bias`): `x [rows, cols] + bias
//! [cols]`, each element one add rounded once to the dtype, as the residual add rounds
//! ([`add_lanes`]). Elementwise, so a row's bits depend on its own values only; the sampler's
//! fused q/k/v projection adds the three biases concatenated and gets the same bits.
//!
//! The gradient: `dx = dy`, and the bias's is a sum over tokens, folded like a norm weight's in
//! granules of [`crate::grad_fold`]'s rows, so its bits do not depend on the micro-batch size.

use crate::autodiff::{column_sums, cube, from_tracked, inner, plain, tracked, tracked_in};
use crate::bridge::{dims, float_in, float_out, same_device};
use crate::ops::pointwise::add_lanes;
use crate::ops::reduce::cube_linear;
use crate::ops::{cube_count_for, storage, vector_width};
use crate::{ensure, KernelError};
use burn::tensor::Tensor as BTensor;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

const BLOCK: usize = 256;

/// Vector `i` of `x` plus vector `i % col_vecs` of the bias (`vs` divides the columns).
#[cube(launch)]
fn bias_add_kernel<F: Float, N: Size>(x: &Tensor<Vector<F, N>>, bias: &Tensor<Vector<F, N>>, y: &mut Tensor<Vector<F, N>>, vecs_arg: u32, col_vecs_arg: u32, #[comptime] vs: usize, #[define(F)] _d: ElemType) {
    let i = cube_linear() * comptime!(BLOCK) + UNIT_POS_X as usize;
    if i < vecs_arg as usize {
        y[i] = add_lanes(x[i], bias[i % col_vecs_arg as usize], vs);
    }
}

/// `x + bias` with the bias broadcast over the rows of `x`.
pub fn bias_add(x: BTensor<2>, bias: BTensor<1>) -> Result<BTensor<2>, KernelError> {
    if !x.is_autodiff() {
        return bias_add_plain(x, bias);
    }
    let (xa, ba) = (tracked_in("bias_add", "x", x)?, tracked_in("bias_add", "bias", bias)?);
    let bp = plain::<1>(inner(&ba));
    let y = bias_add_plain(plain::<2>(inner(&xa)), bp.clone())?;
    let b_id = ba.id().value;
    let b_frozen = !ba.is_tracked();
    Ok(from_tracked(tracked([&xa, &ba], cube(y), move |dy| {
        if b_frozen {
            return [Some(dy), None]; // a frozen bias (LoRA's base)
        }
        let dyp = plain::<2>(dy.clone());
        if crate::grad_fold::folds(b_id) {
            crate::grad_fold::fold_into(b_id, crate::grad_fold::FoldUse::Bias, |acc| {
                crate::ops::weight_grad::fold_column_sums(acc, dyp, crate::ops::weight_grad::FOLD_ROWS).expect("bias_add backward: dy has the forward's shape")
            });
            return [Some(dy), None];
        }
        let db = column_sums(dyp.cast(burn::tensor::DType::F32)).cast(bp.dtype());
        [Some(dy), Some(cube::<1>(db))]
    })))
}

fn bias_add_plain(x: BTensor<2>, bias: BTensor<1>) -> Result<BTensor<2>, KernelError> {
    const OP: &str = "bias_add";
    let x = float_in(OP, "x", x)?;
    let b = float_in(OP, "bias", bias)?;
    same_device(OP, &x, &b, "bias")?;
    let [rows, cols] = [dims(&x)[0], dims(&x)[1]];
    ensure!(dims(&b) == [cols], OP, "x is [{rows}, {cols}] but the bias is {:?}", dims(&b));
    ensure!(x.dtype == b.dtype, OP, "dtypes differ: x {:?}, bias {:?}", x.dtype, b.dtype);
    let len = rows * cols;
    let y = empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), vec![rows, cols].into(), x.dtype);
    if len > 0 {
        let vs = vector_width(x.dtype, cols);
        bias_add_kernel::launch(
            &x.client,
            cube_count_for(len / vs, BLOCK),
            CubeDim::new_1d(BLOCK as u32),
            vs,
            x.clone().into_tensor_arg(),
            b.clone().into_tensor_arg(),
            y.clone().into_tensor_arg(),
            (len / vs) as u32,
            (cols / vs) as u32,
            vs,
            storage(x.dtype),
        );
    }
    Ok(float_out(y))
}
