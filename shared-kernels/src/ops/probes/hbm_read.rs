//! The memory-bandwidth ceiling a cubecl kernel reaches on this device: a grid-stride read of a
//! tensor with 16-byte loads, four in flight per unit. `lockstep bench` reports it beside the
//! decode matmuls, whose targets are fractions of HBM bandwidth, so "% of roofline" can be read
//! against what a kernel that does nothing but read reaches here. A benchmark, not an op.

use crate::ops::storage;
use crate::{ensure, KernelError};
use burn::tensor::Tensor as BTensor;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

const UNITS: usize = 256;
/// Loads each unit issues before adding any of them.
const IN_FLIGHT: usize = 4;

#[cube(launch)]
fn hbm_read_kernel<F: Float, N: Size>(src: &Tensor<Vector<F, N>>, out: &mut Tensor<Vector<F, N>>, n_vecs: u32, #[define(F)] _dtype: ElemType) {
    let stride = (CUBE_COUNT_X * CUBE_DIM_X) as usize;
    let n = n_vecs as usize;
    let mut acc = Vector::<F, N>::new(F::from_int(0));
    let mut i = ABSOLUTE_POS_X as usize;
    while i + comptime!(IN_FLIGHT - 1) * stride < n {
        let mut vals = Array::<Vector<F, N>>::new(IN_FLIGHT);
        #[unroll]
        for j in 0..IN_FLIGHT {
            vals[j] = src[i + j * stride];
        }
        #[unroll]
        for j in 0..IN_FLIGHT {
            acc += vals[j];
        }
        i += comptime!(IN_FLIGHT) * stride;
    }
    while i < n {
        acc += src[i];
        i += stride;
    }
    out[ABSOLUTE_POS_X as usize] = acc;
}

/// Reads all of `x` (its element count a multiple of 8) with `cubes` cubes of 256 units;
/// returns the per-unit sums (for the caller to sync on) and the bytes read.
pub fn hbm_read(x: &BTensor<2>, cubes: usize) -> Result<(BTensor<1>, f64), KernelError> {
    const OP: &str = "hbm_read";
    let t = crate::bridge::float_in(OP, "x", x.clone())?;
    let elems: usize = crate::bridge::dims(&t).iter().product();
    ensure!(elems % 8 == 0 && elems / 8 <= u32::MAX as usize, OP, "{elems} elements: want a multiple of 8 within the u32 range");
    ensure!(cubes > 0 && cubes <= 65535, OP, "cubes {cubes} out of range");
    // 16-byte loads for 16-bit types on CUDA; WGSL's vectors stop at 4
    let vs = if crate::device::runtime_name() == "cuda" { 8 } else { 4 };
    let out = empty_device_contiguous_dtype(t.client.clone(), t.device.clone(), [cubes * UNITS * vs].into(), t.dtype);
    hbm_read_kernel::launch(
        &t.client,
        CubeCount::Static(cubes as u32, 1, 1),
        CubeDim::new_1d(UNITS as u32),
        vs,
        t.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        (elems / vs) as u32,
        storage(t.dtype),
    );
    Ok((crate::bridge::float_out(out), (elems * t.dtype.size()) as f64))
}
