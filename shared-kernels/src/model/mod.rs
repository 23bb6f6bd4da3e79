//! The one policy model: a Qwen3/Qwen2/Llama-style decoder on lockstep's kernels, with HF checkpoint
//! and tokenizer loading. The trainer and the sampler both run [`Qwen3::run`] (`forward.rs`).

pub mod audit;
pub mod cache;
pub mod config;
pub mod forward;
pub mod kernel_set;
pub mod layer;
pub mod load;
pub mod mapped;
pub mod names;
pub mod qwen3;
pub mod recompute;
pub mod rope_scaling;
pub mod save;
pub mod scoring;
pub mod tokenizer;
pub mod weights;

pub use config::ModelConfig;
pub use cache::{KvCache, Rows};
pub use forward::{Forward, Logits, Tokens, Trace};
pub use kernel_set::KernelSet;
pub use layer::{FusedProjections, Layer};
pub use qwen3::{Qwen3, Weight};
pub use load::LoadPhases;
pub use scoring::{LogprobDistribution, Scores};
pub use recompute::{LayerInputs, TrackedLogprobs};
pub use rope_scaling::{Rope, RopeScaling};
pub use tokenizer::load_tokenizer;
pub use save::{save_checkpoint, save_model};
pub use weights::{load_checkpoint, tiny_config, Checkpoint};

use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{file}: config key `{key}`: {message}")]
    Config { file: String, key: String, message: String },
    /// A problem with the whole file (unparsable, missing), not with one key or tensor.
    #[error("{file}: {message}")]
    Malformed { file: String, message: String },
    #[error("{file}: tensor `{tensor}`: {message}")]
    Weights { file: String, tensor: String, message: String },
    #[error("{file}: tokenizer: {message}")]
    Tokenizer { file: String, message: String },
    #[error("token id {id} at position {position} of sequence {sequence} is out of range (vocabulary size {vocab})")]
    TokenOutOfRange { id: u32, sequence: usize, position: usize, vocab: usize },
    #[error("{0}")]
    Input(String),
    #[error("{file}: {message}")]
    Io { file: String, message: String },
    #[error(transparent)]
    Kernel(#[from] crate::KernelError),
}

impl ModelError {
    /// An OS error on `path`, said as the user reads it: a folder where a file is expected
    /// (memory-mapping one read "No such device (os error 19)"), a permission, a full disk.
    pub fn io(path: &Path, e: std::io::Error) -> Self {
        use std::io::ErrorKind;
        let message = if path.is_dir() {
            format!("is a folder where a file is expected ({e})")
        } else {
            match e.kind() {
                ErrorKind::PermissionDenied => format!("permission denied: this user cannot read or write it ({e})"),
                ErrorKind::StorageFull => format!("the disk is full ({e})"),
                ErrorKind::NotFound => format!("does not exist ({e})"),
                _ => e.to_string(),
            }
        };
        ModelError::Io { file: path.display().to_string(), message }
    }

    pub fn malformed(file: impl std::fmt::Display, message: impl Into<String>) -> Self {
        ModelError::Malformed { file: file.to_string(), message: message.into() }
    }
}
