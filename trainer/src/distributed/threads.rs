//! A data-parallel GRPO run with its ranks as threads of this process (the in-process
//! communicator, [`super::local`]): what the CPU tests run to check the ranks' contract, and a
//! way to try data parallel on one device. Each rank builds its policy as `lockstep train`
//! does (the same seeds, so the same weights, checked by the config hash and every step's
//! fingerprint), runs its SFT warm start, and trains `train.steps` GRPO steps.

use super::{local::local_group, Communicator};
use crate::config::Config;
use crate::grpo::{new_adamw, Trainer};
use crate::policy::load_policy;
use crate::run::load_task;
use crate::telemetry::StepMetrics;
use std::sync::Arc;
use std::time::Duration;

/// Every rank's step metrics, or its error (a rank that fails ends its thread; the others then
/// fail at their next collective, naming it).
pub fn train_in_threads(cfg: &Config, world: usize, timeout: Duration) -> Vec<Result<Vec<StepMetrics>, String>> {
    train_ranks(&vec![cfg.clone(); world], timeout)
}

/// [`train_in_threads`] with each rank's own config (one per rank; tests give ranks different
/// ones to see them refused).
pub fn train_ranks(configs: &[Config], timeout: Duration) -> Vec<Result<Vec<StepMetrics>, String>> {
    train_ranks_from(configs, timeout, false, None)
}

/// [`train_ranks`] as `lockstep train` runs a rank: checkpoints every `train.checkpoint_every`
/// steps and at the end (rank 0 writes them), `resume` from the run's latest checkpoint, and at
/// most `max_steps` steps in this call.
pub fn train_ranks_from(configs: &[Config], timeout: Duration, resume: bool, max_steps: Option<usize>) -> Vec<Result<Vec<StepMetrics>, String>> {
    let handles: Vec<_> = local_group(configs.len(), timeout)
        .into_iter()
        .zip(configs.iter().cloned())
        .map(|(comm, cfg)| {
            std::thread::spawn(move || {
                let rank = comm.rank();
                let comm: Arc<dyn Communicator> = Arc::new(comm);
                rank_run(&cfg, comm, resume, max_steps).map_err(|e| format!("rank {rank}: {e}"))
            })
        })
        .collect();
    handles.into_iter().enumerate().map(|(r, h)| h.join().unwrap_or_else(|_| Err(format!("rank {r}: panicked")))).collect()
}

/// `train --ranks-in-threads N`: every rank's steps, one line each, then an error if a rank failed.
pub fn train_from_cli(cfg: Config, world: usize, resume: bool, max_steps: Option<usize>, allow_config_change: bool) -> Result<(), crate::error::RunError> {
    if world == 0 {
        return Err(crate::error::invalid("--ranks-in-threads", "must be at least 1".into()));
    }
    let timeout = super::launch::collective_timeout()?;
    let _run_lock = crate::run_lock::lock(&crate::run::run_dir(&cfg))?;
    // the ranks share this process's device: each plans with its share of it (before the run
    // folder is touched, as `lockstep train` plans)
    let device = shared_kernels::device::default_device();
    let sized = crate::memory_plan::resolve(&cfg, &device, crate::memory_plan::Purpose::Train, world, world)?;
    // the run folder's one guard, as `lockstep train` passes it; the records keep the config
    // as the user gave it ("auto" sizes unresolved)
    crate::run_folder::open(&cfg, resume, allow_config_change)?;
    let results = train_ranks_from(&vec![sized; world], timeout, resume, max_steps);
    if resume && results.iter().all(|r| r.is_ok()) {
        crate::run_folder::record(&cfg)?;
    }
    let mut failed = Vec::new();
    for (rank, result) in results.iter().enumerate() {
        match result {
            Ok(steps) => {
                for m in steps {
                    println!(
                        "rank {rank} step {:>4}  reward {:.4}  bit_equal {:.4}  kl_k1 {:.2e}  loss {:.10}  grad_norm {:.10}  weights {}",
                        m.step, m.reward_mean, m.agreement.bit_equal_frac, m.agreement.kl_k1, m.loss, m.grad_norm, m.trainer_weights_fingerprint
                    );
                }
            }
            Err(e) => failed.push(e.clone()),
        }
    }
    if failed.is_empty() { Ok(()) } else { Err(crate::error::RunError::Other(failed.join("; "))) }
}

fn rank_run(cfg: &Config, comm: Arc<dyn Communicator>, resume: bool, max_steps: Option<usize>) -> Result<Vec<StepMetrics>, crate::error::RunError> {
    let device = shared_kernels::device::default_device();
    let (policy, opt, step) = if resume {
        let dir = crate::run::run_dir(cfg);
        let latest = crate::checkpoint::list(&dir).pop().ok_or_else(|| crate::error::RunError::Other(format!("no checkpoint in {}", dir.display())))?;
        let (policy, opt, step, _) = crate::run::resume_state(cfg, &latest, &device, |_| Ok(()))?;
        (policy, opt, step)
    } else {
        let mut policy = load_policy(cfg, None, &device)?;
        if cfg.train.sft_steps > 0 {
            let task = load_task(cfg)?;
            crate::sft::warm_start(cfg, &mut policy, &task, &std::sync::atomic::AtomicBool::new(false), |_, _| {})?;
        }
        (policy, new_adamw(cfg), 0)
    };
    let mut trainer = Trainer::new_rank(cfg.clone(), policy, opt, step, Some(comm))?;
    let end = max_steps.map_or(cfg.train.steps, |m| (step + m).min(cfg.train.steps));
    let mut out = Vec::new();
    while trainer.step < end {
        out.push(trainer.step()?);
        if cfg.train.checkpoint_every > 0 && trainer.step % cfg.train.checkpoint_every == 0 {
            trainer.checkpoint()?;
        }
    }
    if cfg.train.final_checkpoint {
        trainer.checkpoint()?;
    }
    Ok(out)
}
