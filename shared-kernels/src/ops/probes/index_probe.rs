//! Index arithmetic at the top of the 32-bit range, for tests and the battery: cubecl's
//! `FastDivmod` (which burn's select, gather, slice and copy kernels use to turn a flat index
//! into coordinates) run on given dividends. Upstream 0.11.3 wrapped once the quotient reached
//! 2^(32 - ceil(log2 divisor)) (the trainer's select on [17k, 151936] logits read row r - 16384
//! for rows past 16384); the workspace patches it (`shared-kernels/patches/cubecl-std`). The
//! dividends are plain numbers, so the arithmetic of a 2^32-element tensor is checked without
//! one.

use crate::ops::reduce::cube_linear;
use crate::ops::cube_count_for;
use crate::{ensure, KernelError};
use burn::tensor::{Int as BInt, Tensor as BTensor, TensorData};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use cubecl::std::FastDivmod;

const UNITS: usize = 256;

#[cube(launch)]
fn divmod_kernel(dividends: &Tensor<u32>, divisor: FastDivmod<u32>, quotients: &mut Tensor<u32>, remainders: &mut Tensor<u32>, n: u32) {
    let i = cube_linear() * comptime!(UNITS) + UNIT_POS_X as usize;
    if i < n as usize {
        let (q, r) = divisor.div_mod(dividends[i]);
        quotients[i] = q;
        remainders[i] = r;
    }
}

/// `(dividend / divisor, dividend % divisor)` for each dividend, computed on `device` by
/// cubecl's `FastDivmod<u32>`, and whether its multiply-shift path ran (it needs 64-bit
/// integers on the device; without them cubecl divides plainly).
pub fn fast_divmod(dividends: &[u32], divisor: u32, device: &burn::tensor::Device) -> Result<(Vec<u32>, Vec<u32>, bool), KernelError> {
    const OP: &str = "fast_divmod";
    ensure!(divisor > 0 && !dividends.is_empty(), OP, "want a positive divisor and some dividends");
    let n = dividends.len();
    let input = BTensor::<1, BInt>::from_data(TensorData::new(dividends.to_vec(), [n]), burn::tensor::TensorCreationOptions::new(device.clone()).with_dtype(burn::tensor::DType::U32));
    let input = crate::bridge::int_in(OP, "dividends", input)?;
    ensure!(input.dtype == burn::tensor::DType::U32, OP, "dividends are {:?} on this device, want u32", input.dtype);
    let client = input.client.clone();
    let fast = client.properties().features.supports_type(cubecl::ir::UIntKind::U64);
    let out = || empty_device_contiguous_dtype(client.clone(), input.device.clone(), [n].into(), burn::tensor::DType::U32);
    let (q, r) = (out(), out());
    divmod_kernel::launch(&client, cube_count_for(n, UNITS), CubeDim::new_1d(UNITS as u32), input.into_tensor_arg(), divisor, q.clone().into_tensor_arg(), r.clone().into_tensor_arg(), n as u32);
    let read = |t| -> Result<Vec<u32>, KernelError> {
        crate::bridge::int_out::<1>(t).into_data().convert::<u32>().try_to_vec::<u32>().map_err(|e| KernelError::new(OP, format!("read-back: {e:?}")))
    };
    Ok((read(q)?, read(r)?, fast))
}

/// The multiply-shift division the patched kernel runs, on the host, with cubecl's parameters
/// (`find_params_u32`: shift = ceil(log2 d), m = 2^32 (2^shift - d) / d + 1): `(patched,
/// upstream)` quotients. Devices without 64-bit integers (lavapipe) run cubecl's plain division
/// instead, so CI checks the arithmetic here; the H200 battery runs the kernel itself.
pub fn multiply_shift_host(dividend: u32, divisor: u32) -> (u32, u32) {
    let d = divisor as u64;
    let shift = d.next_power_of_two().trailing_zeros();
    let m = (((1u64 << 32) * ((1u64 << shift) - d)) / d + 1) as u32;
    let t = ((dividend as u64 * m as u64) >> 32) as u32;
    let patched = if shift == 0 { dividend } else { (t + ((dividend - t) >> 1)) >> (shift - 1) };
    let upstream = (t.wrapping_add(dividend) as u64 >> shift) as u32;
    (patched, upstream)
}

/// Dividends that cross every boundary a u32 index meets for `divisor`: around each power of
/// two from 2^16, around each quotient 2^k, and the top of the range.
pub fn boundary_dividends(divisor: u32) -> Vec<u32> {
    let d = divisor as u64;
    let mut v = Vec::new();
    let mut push = |x: u64| {
        if x > u32::MAX as u64 + d {
            return;
        }
        for delta in [0i64, -1, 1, -(d as i64), d as i64 - 1] {
            let y = x as i64 + delta;
            if (0..=u32::MAX as i64).contains(&y) {
                v.push(y as u32);
            }
        }
    };
    for k in 16..=32u32 {
        push(1u64 << k);
    }
    for k in 0..32u32 {
        push((1u64 << k) * d);
    }
    push(u32::MAX as u64);
    v
}
