//! The ablation's other "fast" matmul, deliberately NOT batch invariant: split-K with the number
//! of K splits chosen from M, as load-balancing servers do (few rows → more splits to fill the
//! GPU). Each split sums its K range into its own f32 partial; a second kernel adds the partials
//! in split order. A row's bits therefore change whenever the batch size moves it into another
//! split count, which is the classic source of sampler–trainer mismatch. Unlike burn's autotuned
//! matmul (the other fast path) it needs no warm-up, is deterministic for a given M, and runs
//! on every runtime. Never used by the trainer.

use crate::ops::matmul::{checked_dims, WeightLayout, TILE};
use crate::ops::reduce::cube_linear;
use crate::ops::{cube_count_for, storage};
use crate::bridge::{float_in, float_out};
use crate::KernelError;
use burn::tensor::{DType, Tensor as BTensor};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

/// K splits for a batch of `m` rows: 8 for decode-sized batches, down to 1 from 129 rows.
pub fn splits_for(m: usize) -> usize {
    match m {
        0..=8 => 8,
        9..=32 => 4,
        33..=128 => 2,
        _ => 1,
    }
}

#[cube(launch)]
fn partial_kernel<F: Float>(
    x: &Tensor<F>,
    w: &Tensor<F>,
    partial: &mut Tensor<f32>,
    m_arg: u32,
    n_arg: u32,
    k_arg: u32,
    splits_arg: u32,
    #[comptime] w_out_in: bool,
    #[define(F)] _dtype: ElemType,
) {
    let (m, n, k) = (m_arg as usize, n_arg as usize, k_arg as usize);
    let split = CUBE_POS_Z as usize;
    let row = CUBE_POS_Y as usize * comptime!(TILE) + UNIT_POS_Y as usize;
    let col = CUBE_POS_X as usize * comptime!(TILE) + UNIT_POS_X as usize;
    if row < m && col < n {
        let chunk = k.div_ceil(splits_arg as usize);
        let k0 = split * chunk;
        let mut k1 = k0 + chunk;
        if k1 > k {
            k1 = k;
        }
        let mut acc = 0.0f32;
        for i in k0..k1 {
            let wv = if w_out_in { w[col * k + i] } else { w[i * n + col] };
            acc += f32::cast_from(x[row * k + i]) * f32::cast_from(wv);
        }
        partial[(split * m + row) * n + col] = acc;
    }
}

#[cube(launch)]
fn combine_kernel<F: Float>(partial: &Tensor<f32>, y: &mut Tensor<F>, mn_arg: u32, splits_arg: u32, #[define(F)] _dtype: ElemType) {
    let idx = cube_linear() * 256 + UNIT_POS_X as usize;
    let mn = mn_arg as usize;
    if idx < mn {
        let mut acc = 0.0f32;
        for s in 0..splits_arg as usize {
            acc += partial[s * mn + idx];
        }
        y[idx] = F::cast_from(acc);
    }
}

/// `x[M,K] @ W` with [`splits_for`]`(M)` K splits. Plain tensors only (the sampler's path).
pub fn matmul_split_k(x: BTensor<2>, w: BTensor<2>, layout: WeightLayout) -> Result<BTensor<2>, KernelError> {
    const OP: &str = "matmul_split_k";
    let x = float_in(OP, "x", x)?;
    let w = float_in(OP, "w", w)?;
    let (m, k, n) = checked_dims(OP, &x, &w, layout)?;
    let splits = splits_for(m).min(k);
    let partial = empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), [splits, m, n].into(), DType::F32);
    partial_kernel::launch(
        &x.client,
        CubeCount::Static(n.div_ceil(TILE) as u32, m.div_ceil(TILE) as u32, splits as u32),
        CubeDim::new_2d(TILE as u32, TILE as u32),
        x.clone().into_tensor_arg(),
        w.into_tensor_arg(),
        partial.clone().into_tensor_arg(),
        m as u32,
        n as u32,
        k as u32,
        splits as u32,
        layout == WeightLayout::OutIn,
        storage(x.dtype),
    );
    let y = empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), [m, n].into(), x.dtype);
    combine_kernel::launch(
        &x.client,
        cube_count_for(m * n, 256),
        CubeDim::new_1d(256),
        partial.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        (m * n) as u32,
        splits as u32,
        storage(x.dtype),
    );
    Ok(float_out(y))
}
