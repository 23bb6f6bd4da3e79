//! The device fingerprint of a tensor: exactly the host definition (integer sums, so compared
//! as values, no tolerance) for sizes around its chunking (bf16 too on CUDA); and any changed
//! element or order changes it.

use burn::tensor::{DType, Distribution, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shared_kernels::bridge::ReadBack;
use shared_kernels::ops::fingerprint::{fingerprint_launch, fingerprint_reference, fold_data};

fn on_device(t: Tensor<1>) -> (u32, u32) {
    let launched = fingerprint_launch(t).unwrap();
    let data = ReadBack::start::<1>(vec![], vec![launched.partials]).unwrap().wait().unwrap().remove(0);
    fold_data(data).unwrap()
}

fn host_values(t: &Tensor<1>) -> Vec<f32> {
    t.clone().cast(DType::F32).into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

#[test]
fn the_device_fingerprint_is_the_host_definition_at_every_size_and_dtype() {
    let device = crate::device();
    let mut rng = StdRng::seed_from_u64(crate::seed());
    for n in [1usize, 255, 16384, 16385, 40_000 + rng.random_range(0..9000)] {
        // bf16 kernels need CUDA (wgsl has no bf16): the battery checks it there
        let dtypes: &[DType] = if shared_kernels::device::runtime_name() == "cuda" { &[DType::F32, DType::BF16] } else { &[DType::F32] };
        for &dtype in dtypes {
            let t = Tensor::<1>::random([n], Distribution::Normal(0.0, 1.0), &device).cast(dtype);
            let want = fingerprint_reference(&host_values(&t));
            assert_eq!(on_device(t), want, "n = {n}, {dtype:?}");
        }
    }
}

#[test]
fn a_changed_element_or_a_swap_changes_the_fingerprint() {
    let device = crate::device();
    let mut rng = StdRng::seed_from_u64(crate::seed());
    let n = 30_000;
    let values: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let base = on_device(Tensor::<1>::from_floats(values.as_slice(), &device));
    let mut one_bit = values.clone();
    let at = rng.random_range(0..n);
    one_bit[at] = f32::from_bits(one_bit[at].to_bits() ^ 1);
    assert_ne!(on_device(Tensor::<1>::from_floats(one_bit.as_slice(), &device)), base, "last bit of element {at}");
    let mut swapped = values.clone();
    swapped.swap(0, n - 1);
    assert_ne!(on_device(Tensor::<1>::from_floats(swapped.as_slice(), &device)), base, "first and last swapped");
}
