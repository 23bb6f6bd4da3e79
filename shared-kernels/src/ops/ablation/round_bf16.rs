//! The ablation's `bf16_logits` sampler: f32 logits rounded to the nearest bf16 (ties to even),
//! as an inference engine with a bf16 LM head hands its sampler, while the trainer keeps the f32
//! logits. A bit-level kernel (the top 16 bits of the f32, rounded) rather than a dtype cast:
//! WGSL has no bf16, and the rounding must be the same on every runtime.

use crate::bridge::{float_in, float_out};
use crate::ops::cube_count_for;
use crate::ops::reduce::cube_linear;
use crate::{ensure, KernelError};
use burn::tensor::{DType, Tensor as BTensor};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

#[cube(launch)]
fn round_kernel(x: &Tensor<f32>, y: &mut Tensor<f32>, n_arg: u32) {
    let i = cube_linear() * 256 + UNIT_POS_X as usize;
    if i < n_arg as usize {
        let bits = u32::reinterpret(x[i]);
        let exponent = bits & 0x7F80_0000u32;
        let mantissa = bits & 0x007F_FFFFu32;
        if exponent == 0x7F80_0000u32 && mantissa != 0u32 {
            // NaN: stays a (quiet) NaN
            y[i] = f32::reinterpret(bits | 0x0040_0000u32);
        } else {
            // round to nearest, ties to the even 16-bit value; a carry into the exponent is the
            // correct rounding (up to infinity past bf16's largest finite value)
            let lsb = (bits >> 16u32) & 1u32;
            y[i] = f32::reinterpret((bits + 0x7FFFu32 + lsb) & 0xFFFF_0000u32);
        }
    }
}

/// `x` (f32) with every value rounded to the nearest bf16, kept in f32.
pub fn round_to_bf16<const D: usize>(x: BTensor<D>) -> Result<BTensor<D>, KernelError> {
    const OP: &str = "round_to_bf16";
    let x = float_in(OP, "x", x)?;
    ensure!(x.dtype == DType::F32, OP, "rounds f32 values to bf16; got {:?} (a bf16 model's logits are bf16 already)", x.dtype);
    let n = x.meta.shape().num_elements();
    let y = empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), x.meta.shape().clone(), DType::F32);
    round_kernel::launch(&y.client, cube_count_for(n, 256), CubeDim::new_1d(256), x.into_tensor_arg(), y.clone().into_tensor_arg(), n as u32);
    Ok(float_out(y))
}

/// The host reference: round to nearest even on the bits (NaN kept a NaN).
pub fn round_to_bf16_reference(v: f32) -> f32 {
    let bits = v.to_bits();
    if v.is_nan() {
        return f32::from_bits(bits | 0x0040_0000);
    }
    let lsb = (bits >> 16) & 1;
    f32::from_bits(bits.wrapping_add(0x7FFF + lsb) & 0xFFFF_0000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_rounds_to_the_nearest_bf16_ties_to_even() {
        // 1 + 2^-8 is halfway between bf16's 1 and 1 + 2^-7: ties go to the even (1)
        assert_eq!(round_to_bf16_reference(1.0 + 2f32.powi(-8)).to_bits(), 1f32.to_bits());
        // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up to the even
        assert_eq!(round_to_bf16_reference(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
        assert_eq!(round_to_bf16_reference(1.0 + 2f32.powi(-8) + 2f32.powi(-20)), 1.0 + 2f32.powi(-7));
        assert_eq!(round_to_bf16_reference(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(round_to_bf16_reference(f32::INFINITY), f32::INFINITY);
        assert_eq!(round_to_bf16_reference(f32::MAX), f32::INFINITY);
        assert!(round_to_bf16_reference(f32::NAN).is_nan());
        // against the half crate's conversion on random values
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..100_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = f32::from_bits(state as u32);
            if v.is_finite() {
                assert_eq!(round_to_bf16_reference(v).to_bits(), half::bf16::from_f32(v).to_f32().to_bits(), "{v:e}");
            }
        }
    }
}
