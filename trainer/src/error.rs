//! The run's one error type, at the bottom of the trainer: a config key, a model or task file,
//! or a sentence; `invalid` makes the config error that exits 2.

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Model(#[from] shared_kernels::model::ModelError),
    #[error(transparent)]
    Task(#[from] crate::tasks::TaskError),
    #[error("{0}")]
    Other(String),
}

/// A config error naming `key` (exit 2).
pub fn invalid(key: &str, message: String) -> RunError {
    RunError::Config(crate::config::ConfigError::Invalid { key: key.into(), message })
}

