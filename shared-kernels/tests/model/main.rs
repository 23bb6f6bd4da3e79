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
    let seed = std::env::var("LOCKSTEP_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(7)
    });
    eprintln!("LOCKSTEP_TEST_SEED={seed}");
    seed
}
