//! The one policy model: a Qwen3/Qwen2/Llama-style decoder on lockstep's kernels, with HF checkpoint
//! and tokenizer loading. The trainer and the sampler both run [`Qwen3::run`] (`forward.rs`).

pub mod audit;
pub mod cache;
pub mod config;
pub mod error;
pub mod forward;
pub mod kernel_set;
pub mod layer;
pub mod load;
pub mod lora;
pub mod lora_files;
pub mod lora_merge;
pub mod mapped;
pub mod moe;
pub mod moe_train;
pub mod names;
pub mod pass;
pub mod qwen3;
pub mod recompute;
pub mod rope_scaling;
pub mod save;
pub mod scoring;
pub mod tokenizer;
pub mod weights;

pub use config::ModelConfig;
pub use error::ModelError;
pub use cache::{KvCache, Rows};
pub use forward::{Forward, Logits, Tokens};
pub use pass::Trace;
pub use kernel_set::KernelSet;
pub use layer::{FusedProjections, Layer};
pub use qwen3::{Qwen3, Weight};
pub use load::LoadPhases;
pub use lora::{LoraInit, LoraSpec, Projection};
pub use scoring::{LogprobDistribution, Scores};
pub use recompute::{LayerInputs, TrackedLogprobs};
pub use rope_scaling::{Rope, RopeScaling};
pub use tokenizer::load_tokenizer;
pub use save::{save_checkpoint, save_model};
pub use weights::{load_checkpoint, tiny_config, tiny_moe_config, Checkpoint};
