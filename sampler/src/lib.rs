//! lockstep's rollout sampler: continuous batching over a KV cache on the same model forward
//! and kernels as the trainer, so every returned logprob has the trainer's bits.
//!
//! - [`Engine`]: the synchronous core. `add` requests at any time, `step` runs one batched
//!   forward (prefill chunks of new requests + one decode token of every running one) and
//!   returns the requests that finished. `generate` is the blocking batch API for the trainer.
//! - [`EngineHandle`]: a tokio front; `submit(request).await` from many tasks at once.
//!
//! The returned logprob of a token is `log_softmax(logits / T)[token]` over the full vocabulary
//! (T = 0, greedy, is scored at T = 1), before top-k/top-p truncation. The trainer scores
//! tokens with the same definition through the same kernel functions.

mod engine;
mod front;
pub mod invariance;
mod request;

pub use engine::{completes_stop_string, Decoder, Engine, EngineConfig, EnginePhaseTimes, Occupancy, StepStats};
pub use front::{EngineHandle, EngineMetrics, LatencyHistogram, StreamEvent, LATENCY_BUCKETS};
pub use request::{Completion, FinishReason, Request, SampleError, SamplingParams, Timings};
