//! The run folder's guard, one for every entry point that trains (`train`, each rank under
//! `--gpus` / torchrun through it, `--ranks-in-threads`): a fresh start over a run's checkpoints
//! is refused, a resume needs a checkpoint and the run's own config (or
//! `--allow-config-change`), and the run's records (config, inputs, environment) are written.

use crate::config::Config;
use crate::error::RunError;
use crate::run::{check_resume_config, run_dir, save_resolved};
use std::path::PathBuf;

/// Checks `cfg`'s run folder for a fresh start or a `resume`, and writes a fresh run's records
/// (a resumed run's: [`record`], once its checkpoint has loaded); returns the checkpoint to
/// resume from. The caller holds the folder's lock (`run_lock`) and is the
/// one process that writes the run's files (rank 0).
pub fn open(cfg: &Config, resume: bool, allow_config_change: bool) -> Result<Option<PathBuf>, RunError> {
    let dir = run_dir(cfg);
    if allow_config_change && !resume {
        return Err(RunError::Other("--allow-config-change applies to --resume only".into()));
    }
    let existing = crate::checkpoint::list(&dir);
    if resume {
        let Some(latest) = existing.last() else {
            return Err(RunError::Other(format!("--resume: no checkpoint in {}", crate::checkpoint::checkpoints_dir(&dir).display())));
        };
        let step = latest.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_prefix("step-")).and_then(|n| n.parse::<usize>().ok()).unwrap_or(0);
        // a run already past the steps asked for is named as such, before any config change
        if step > cfg.train.steps {
            return Err(crate::error::invalid("train.steps", format!("is {} but the checkpoint {} is at step {step}", cfg.train.steps, latest.display())));
        }
        // the records are rewritten by `record` once the checkpoint has loaded: a resume
        // refused later (a checkpoint of another shape) leaves them as they were
        check_resume_config(&dir, cfg, step, allow_config_change)?;
        return Ok(Some(latest.clone()));
    }
    if !existing.is_empty() {
        return Err(RunError::Other(format!("{} already has checkpoints; pass --resume, or choose another log.run_name", dir.display())));
    }
    let _ = std::fs::remove_file(dir.join("metrics.jsonl"));
    // the run folder is made before the warm start, so an unwritable log.runs_dir fails now
    // and not after minutes of SFT
    save_resolved(cfg, &dir)?;
    Ok(None)
}

/// Writes the run's records (config, inputs, environment) for a resume whose checkpoint loaded.
pub fn record(cfg: &Config) -> Result<(), RunError> {
    save_resolved(cfg, &run_dir(cfg))
}
