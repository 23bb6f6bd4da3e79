//! The ceiling of the instruction every lockstep tensor-core kernel is built on: `cmma`
//! 16x16x16 (bf16/f16 in, f32 accumulate), as cubecl 0.11 emits it, with operands already in
//! registers and nothing else to do. `lockstep bench` reports it beside the matmul rows, so the
//! matmul's gap to cuBLAS (which uses Hopper's warpgroup MMA) splits into what the instruction
//! allows and what the kernels leave on the table. A benchmark, not an op: its output is only
//! there so the products are not optimised away.

use crate::ops::matmul::tc::tensor_cores_available_for;
use crate::ops::storage;
use crate::{ensure, KernelError};
use burn::tensor::{DType, Device, Tensor as BTensor};
use burn_cubecl::cubecl::cmma::{self, MatrixIdent, MatrixLayout};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

const PLANES: usize = 4;
const PLANE_DIM: usize = 32;
/// Independent accumulators per plane, so one `mma` never waits for the previous one.
const CHAINS: usize = 4;

#[cube(launch)]
fn mma_peak_kernel<F: Float>(out: &mut Tensor<f32>, iters: u32, #[define(F)] _dtype: ElemType) {
    let unit = UNIT_POS as usize;
    let plane = UNIT_POS_Y as usize;
    let mut a_sh = Shared::<[F]>::new_aligned_slice(256usize, 128usize);
    let mut b_sh = Shared::<[F]>::new_aligned_slice(256usize, 128usize);
    let mut st = Shared::<[f32]>::new_aligned_slice(comptime!(PLANES * 256), 128usize);
    let mut i = unit;
    while i < 256 {
        a_sh[i] = F::from_int(1);
        b_sh[i] = F::from_int(1);
        i += comptime!(PLANES * PLANE_DIM);
    }
    sync_cube();
    let mut a = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::A, 16usize, 16usize, 16usize, MatrixLayout::RowMajor) };
    cmma::load(&mut a, a_sh.slice(0usize, 256usize), 16u32);
    let mut b = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::B, 16usize, 16usize, 16usize, MatrixLayout::RowMajor) };
    cmma::load(&mut b, b_sh.slice(0usize, 256usize), 16u32);
    let mut accs = Sequence::<cmma::Matrix<f32>>::new();
    #[unroll]
    for _c in 0..CHAINS {
        accs.push(cmma::Matrix::<f32>::from_value(MatrixIdent::Accumulator, 16usize, 16usize, 16usize, MatrixLayout::Undefined, 0.0f32));
    }
    for _it in 0..iters {
        #[unroll]
        for c in 0..CHAINS {
            let acc = accs.index(c);
            cmma::execute(&a, &b, acc, acc);
        }
    }
    // every chain feeds the output, so none can be dropped
    let mut total = 0.0f32;
    #[unroll]
    for c in 0..CHAINS {
        cmma::store(st.slice_mut(plane * 256, plane * 256 + 256), accs.index(c), 16u32, MatrixLayout::RowMajor);
        sync_cube();
        total += st[plane * 256 + UNIT_POS_X as usize];
        sync_cube();
    }
    out[CUBE_POS_X as usize * comptime!(PLANES * PLANE_DIM) + unit] = total;
}

/// Launches `cubes` cubes of 4 planes, each plane running `iters` x 4 `mma`s, and returns the
/// output (for the caller to sync on) and the floating-point operations done. An error where
/// the device has no tensor cores for `dtype`.
pub fn mma_peak(device: &Device, dtype: DType, cubes: usize, iters: usize) -> Result<(BTensor<1>, f64), KernelError> {
    const OP: &str = "mma_peak";
    let probe = crate::bridge::float_in(OP, "probe", BTensor::<1>::zeros([1], device))?;
    ensure!(tensor_cores_available_for(&probe.client, dtype), OP, "no 16x16x16 tensor-core instruction for {dtype:?} on this device");
    ensure!(cubes > 0 && cubes <= 65535 && iters > 0 && iters <= u32::MAX as usize, OP, "cubes {cubes} and iters {iters} out of range");
    let out = empty_device_contiguous_dtype(probe.client.clone(), probe.device.clone(), [cubes * PLANES * PLANE_DIM].into(), DType::F32);
    mma_peak_kernel::launch(
        &probe.client,
        CubeCount::Static(cubes as u32, 1, 1),
        CubeDim::new_2d(PLANE_DIM as u32, PLANES as u32),
        out.clone().into_tensor_arg(),
        iters as u32,
        storage(dtype),
    );
    let flops = (cubes * PLANES * CHAINS * iters) as f64 * 2.0 * 16.0 * 16.0 * 16.0;
    Ok((crate::bridge::float_out(out), flops))
}
