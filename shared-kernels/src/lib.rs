//! lockstep's batch-invariant kernels.
//!
//! Every reduction here has one fixed order per output row, chosen from the op's own sizes
//! (hidden size, head dim, vocabulary) and never from how many rows share the launch or how a
//! sequence was chunked. That is the whole trick behind "sampler logprob == trainer logprob, as
//! bits": the sampler and the trainer call these same launchers.
//!
//! One op family per file under [`ops`]. Launchers take and return burn tensors that live on a
//! cubecl device (wgpu/lavapipe in CI, CUDA on the H200); nothing goes through the host.

pub mod autodiff;
pub mod bridge;
pub mod device;
pub mod error;
pub mod grad_fold;
pub mod graph;
pub mod kernel_cache;
pub mod kernel_choice;
pub mod model;
pub mod knobs;
#[cfg(test)]
mod layout_check;
pub mod ops;
pub mod reference;
pub mod testing;

pub use bridge::contiguous;
pub use error::KernelError;
pub use ops::{
    attention::{attention, causal_attention, write_kv_cache, KvCacheShape},
    attention::decode::inputs::{attention_inputs, attention_inputs_with_planes, fixed_plane_size, QkNorm},
    bias::bias_add,
    embedding::embedding,
    logits::head_logprobs::{head_logprobs, head_logprobs_chunked, head_chunk_rows, truncated_head_logprobs},
    logits::logprob::{token_logprobs, truncated_token_logprobs, TokenLogprobs},
    logits::truncation::Truncation,
    logits::sampling::{sample, sample_with, SamplingInputs, SamplingRow, row_rng_key},
    matmul::{matmul, WeightLayout},
    pointwise::{add, swiglu, swiglu_halves},
    reduce::sum_all,
    rmsnorm::{add_rmsnorm, rmsnorm},
    rope::{rope, RopeTables},
};
