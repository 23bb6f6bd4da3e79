//! A 64-bit fingerprint of a tensor's values, computed on the device, for the per-step check
//! that the sampler holds the trainer's weights (and for run-to-run comparisons of them).
//!
//! Element i with value v (taken exactly as f32) mixes to x_i = fmix32(bits(v) ^ (i * φ)); the
//! fingerprint is the pair (Σ x_i, Σ fmix32(x_i ^ c)) of wrapping u32 sums. Wrapping integer
//! sums are the same in any order, so how the work is split never matters, and the host can
//! check a launch against [`fingerprint_reference`]. Not a cryptographic hash: it guards against
//! weights that differ, not against an adversary. Host work per model is a few kilobytes of
//! partial sums, where hashing every weight on the host took seconds per step at 0.6B parameters.

use crate::ops::cube_count_for;
use crate::ops::reduce::{cube_linear, tree_count};
use crate::ops::storage;
use crate::bridge::{dims, float_in};
use crate::KernelError;
use burn::tensor::{DType, Tensor as BTensor};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

/// Elements per cube; each cube writes one pair of partial sums.
const CHUNK: usize = 16384;
const UNITS: usize = 256;
const GOLDEN: u32 = 0x9e37_79b9;
const SECOND: u32 = 0x85eb_ca6b;

#[cube]
fn fmix32(value: u32) -> u32 {
    let mut h = value;
    h ^= h >> 16u32;
    h *= 0x85eb_ca6bu32;
    h ^= h >> 13u32;
    h *= 0xc2b2_ae35u32;
    h ^ (h >> 16u32)
}

#[cube(launch)]
fn fingerprint_kernel<F: Float>(x: &Tensor<F>, partials: &mut Tensor<u32>, n_arg: u32, #[define(F)] _d: ElemType) {
    let n = n_arg as usize;
    let cube = cube_linear();
    let start = cube * CHUNK;
    let mut end = start + CHUNK;
    if end > n {
        end = n;
    }
    let mut a = 0u32;
    let mut b = 0u32;
    let mut i = start + UNIT_POS_X as usize;
    while i < end {
        let bits = u32::reinterpret(f32::cast_from(x[i]));
        let mixed = fmix32(bits ^ ((i as u32) * GOLDEN));
        a += mixed;
        b += fmix32(mixed ^ SECOND);
        i += UNITS;
    }
    let mut shared = Shared::<[u32]>::new_slice(UNITS);
    let sum_a = tree_count(&mut shared, a, UNITS);
    let sum_b = tree_count(&mut shared, b, UNITS);
    if UNIT_POS_X == 0u32 {
        partials[2 * cube] = sum_a;
        partials[2 * cube + 1] = sum_b;
    }
}

/// A launched fingerprint: the partial sums on the device. Read them (e.g. with
/// [`crate::bridge::ReadBack`], many tensors in one read) and fold them with [`fold_partials`].
pub struct FingerprintPartials {
    pub partials: BTensor<1, burn::tensor::Int>,
    pub elements: usize,
}

/// Launches the fingerprint of `x` (f32, bf16 or f16; any shape, taken in row-major order).
pub fn fingerprint_launch<const D: usize>(x: BTensor<D>) -> Result<FingerprintPartials, KernelError> {
    const OP: &str = "fingerprint";
    let x = float_in(OP, "x", x)?;
    let n: usize = dims(&x).iter().product();
    crate::ensure!(n < u32::MAX as usize, OP, "{n} elements exceed the u32 index range");
    let cubes = n.div_ceil(CHUNK).max(1);
    let partials = empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), [2 * cubes].into(), DType::U32);
    fingerprint_kernel::launch(&x.client, cube_count_for(cubes, 1), CubeDim::new_1d(UNITS as u32), x.clone().into_tensor_arg(), partials.clone().into_tensor_arg(), n as u32, storage(x.dtype));
    Ok(FingerprintPartials { partials: crate::bridge::int_out(partials), elements: n })
}

/// The fingerprint from a launch's partial sums as read back (`FingerprintPartials::partials`).
pub fn fold_data(data: burn::tensor::TensorData) -> Result<(u32, u32), String> {
    let words: Vec<u32> = data.convert::<i64>().try_to_vec::<i64>().map_err(|e| format!("fingerprint partials: {e:?}"))?.iter().map(|&w| w as u32).collect();
    Ok(fold_partials(&words))
}

/// The fingerprint from the partial sums a launch wrote.
pub fn fold_partials(partials: &[u32]) -> (u32, u32) {
    partials.chunks(2).fold((0u32, 0u32), |(a, b), p| (a.wrapping_add(p[0]), b.wrapping_add(p.get(1).copied().unwrap_or(0))))
}

fn fmix32_host(value: u32) -> u32 {
    let mut h = value;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// The fingerprint computed on the host from the values as f32 (the definition the kernel
/// must meet exactly).
pub fn fingerprint_reference(values: &[f32]) -> (u32, u32) {
    values.iter().enumerate().fold((0u32, 0u32), |(a, b), (i, v)| {
        let mixed = fmix32_host(v.to_bits() ^ (i as u32).wrapping_mul(GOLDEN));
        (a.wrapping_add(mixed), b.wrapping_add(fmix32_host(mixed ^ SECOND)))
    })
}
