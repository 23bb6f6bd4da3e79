//! Kernel tests on the CI runtime (wgpu on lavapipe): batch invariance and run-to-run as bits,
//! chunked-prefill/decode equality as bits, accuracy against f64 references with tolerances,
//! and launcher errors. One test binary so CI links once.

mod accuracy;
mod attention_chunking;
mod errors;
mod gradients;
mod invariance;

use burn::tensor::Device;

pub fn device() -> Device {
    shared_kernels::device::default_device()
}

/// A fresh seed per test run (printed, so a failure can be replayed with LOCKSTEP_TEST_SEED).
pub fn seed() -> u64 {
    let seed = std::env::var("LOCKSTEP_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(7)
    });
    eprintln!("LOCKSTEP_TEST_SEED={seed}");
    seed
}
