//! Model tests on the CI runtime: the sampler/trainer contract as bits, parity with
//! transformers, checkpoint round trips and loading errors.

mod checkpoint;
mod contract;
mod parity;

use burn::tensor::Device;

pub fn device() -> Device {
    shared_kernels::device::default_device()
}

pub fn seed() -> u64 {
    shared_kernels::testing::rows::test_seed()
}
