//! Kernel tests on the CI runtime (wgpu on lavapipe): batch invariance and run-to-run as bits,
//! chunked-prefill/decode equality as bits, accuracy against f64 references with tolerances,
//! and launcher errors. One test binary so CI links once.

mod accuracy;
mod attention_chunking;
mod cache_copy;
mod errors;
mod fingerprint;
mod fused;
mod graph_capture;
mod gradients;
mod head_logprobs;
mod index_range;
mod invariance;
mod split_k;
mod top_tokens;
mod truncation;
mod weight_grad;

use burn::tensor::Device;

pub fn device() -> Device {
    shared_kernels::device::default_device()
}

pub fn seed() -> u64 {
    shared_kernels::testing::rows::test_seed()
}
