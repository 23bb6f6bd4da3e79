//! The model's one error type: a checkpoint, config or tokenizer file named with its key or
//! tensor, token ids out of range, OS errors said as the user reads them, and kernel failures.

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
