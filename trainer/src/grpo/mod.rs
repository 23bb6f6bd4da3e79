//! GRPO, truly on-policy. Each step:
//!  1. draw `prompts_per_step` problems from the task (generator keyed by (seed, step));
//!  2. sample `group_size` completions of each with the sampler, on the current weights;
//!  3. reward each completion; advantage A = (r - group mean) / (group std + 1e-6);
//!  4. recompute the rollout tokens' logprobs with the trainer (the training path of the same
//!     model, autodiff on) and compare them with the sampler's: KL k1/k3, |Δlogprob|, the
//!     fraction of tokens whose bits are equal, importance ratios. In matched mode any token
//!     that differs stops the run (or warns) and the auditor names the first op that diverged;
//!  5. loss = -Σ_t c_t·A·logprob_t / N_tokens (+ optional k3 KL to the initial policy), with
//!     c_t = 1 on-policy, or the TIS/MIS/PPO-clip weight of the ablation; backward, clip, AdamW;
//!  6. hand the new weights to the sampler and check their fingerprint equals the trainer's.
//! All randomness is keyed by (seed, step), so a resumed run repeats an uninterrupted one bit
//! for bit.

use crate::checkpoint::{self, RunState};
use crate::config::Config;
use crate::optim::{learning_rate, AdamW};
use crate::error::RunError;
use crate::policy::Policy;
use crate::run::run_dir;
use crate::tasks::Task;
use crate::telemetry::{PhaseTimes, StepMetrics, Telemetry};
use burn::tensor::DType;
use sampler::{Engine, SamplingParams};
use shared_kernels::bridge::ReadBack;
use shared_kernels::model::Qwen3;
use shared_kernels::ops::fingerprint::{fingerprint_launch, fold_data};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::time::Instant;

mod episodes;
mod ranks;
mod shard;
mod rollouts;
mod routing;
mod score;
mod update;

pub use crate::objective::Correction;

pub struct Trainer {
    pub cfg: Config,
    pub policy: Policy,
    pub opt: AdamW,
    pub engine: Engine,
    pub task: Task,
    pub reference: Option<Qwen3>,
    pub telemetry: Telemetry,
    pub run_dir: PathBuf,
    /// GRPO steps completed.
    pub step: usize,
    /// The eval split's problems (`task.eval_path`; empty without one).
    pub eval_problems: Vec<crate::tasks::Problem>,
    /// Data parallel: this rank's end of the group (`None`: one rank).
    pub comm: Option<std::sync::Arc<dyn crate::distributed::Communicator>>,
}

/// The weights as `dtype` (the sampling dtype), fingerprinted: each tensor's device fingerprint
/// (`ops::fingerprint`: 64 bits over every value and its position), all launched first and read
/// back in one copy, then SHA-256 over (name, element count, fingerprint) per tensor, 16 hex
/// digits. Hashing every value on the host read all weights back twice a step:
/// a third of a configs/h200.toml step, seconds at 0.6B parameters.
pub fn weights_fingerprint(model: &Qwen3, dtype: DType) -> Result<String, RunError> {
    let failed = |e: String| RunError::Other(format!("weight fingerprint: {e}"));
    let mut launched = Vec::new();
    for (name, w) in model.named_tensors() {
        launched.push((name, fingerprint_launch(w.flat().cast(dtype)).map_err(|e| failed(e.to_string()))?));
    }
    let partials = launched.iter().map(|(_, f)| f.partials.clone()).collect();
    let data = ReadBack::start::<1>(vec![], partials).map_err(|e| failed(e.to_string()))?.wait().map_err(failed)?;
    let mut h = Sha256::new();
    for ((name, f), d) in launched.iter().zip(data) {
        let (a, b) = fold_data(d).map_err(failed)?;
        h.update(name.as_bytes());
        h.update((f.elements as u64).to_le_bytes());
        h.update(a.to_le_bytes());
        h.update(b.to_le_bytes());
    }
    Ok(h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect())
}

pub use crate::optim::new_adamw;

impl Trainer {
    pub fn new(cfg: Config, policy: Policy, opt: AdamW, step: usize) -> Result<Self, RunError> {
        Self::new_rank(cfg, policy, opt, step, None)
    }

    /// [`Self::new`] as one rank of a data-parallel group: every rank's resolved config must be
    /// rank 0's (compared by hash before anything runs); ranks past 0 keep their metrics in
    /// `rank-N` under the run folder (rank 0 writes the run's own, and its checkpoints).
    pub fn new_rank(cfg: Config, mut policy: Policy, opt: AdamW, step: usize, comm: Option<std::sync::Arc<dyn crate::distributed::Communicator>>) -> Result<Self, RunError> {
        let mut run_dir = run_dir(&cfg);
        if let Some(c) = &comm {
            // the memory sizes (and recomputation) each rank chose for its own device change no
            // bit: not compared
            let mut compared = cfg.clone();
            (compared.train.micro_batch_tokens, compared.sampler.kv_budget_mib, compared.train.recompute_layers) = (crate::config::Sizing::Auto, crate::config::Sizing::Auto, crate::config::Sizing::Auto);
            let hash: String = Sha256::digest(toml::to_string(&compared).map_err(|e| RunError::Other(format!("config: {e}")))?.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect();
            crate::distributed::check_equal(c.as_ref(), "the resolved config's hash", &hash).map_err(ranks::comm_error)?;
            let blocks = cfg.train.gradient_blocks;
            if blocks > 0 && blocks % c.world() != 0 {
                let message = format!("{blocks} gradient blocks cannot be split evenly over {} ranks: use a multiple of the number of ranks (a power of two), or 0 for one block per rank", c.world());
                return Err(crate::config::ConfigError::Invalid { key: "train.gradient_blocks".into(), message }.into());
            }
            if c.rank() > 0 {
                run_dir = run_dir.join(format!("rank-{}", c.rank()));
            }
        }
        let task = crate::run::load_task(&cfg)?;
        let telemetry = Telemetry::open(&run_dir, cfg.log.tensorboard, step).map_err(|e| RunError::Other(format!("{}: {e}", run_dir.display())))?;
        let engine = if policy.model.lora.is_some() {
            // LoRA: the frozen base is held once. The engine takes the policy's only handle (its
            // resident copy replaces the loaded weights tensor by tensor), and the trainer then
            // computes on the engine's base with its own adapters: the same values, as bits.
            let mut model = policy.model;
            let kernels = model.kernels;
            let adapters: std::collections::BTreeMap<String, shared_kernels::model::Weight> = model.named_tensors().into_iter().filter(|(n, _)| shared_kernels::model::Qwen3::is_adapter(n)).collect();
            model.kernels = cfg.ablation.sampler_kernels.kernel_set();
            let engine = crate::run::sampler_engine(&cfg, &policy.tokenizer, model)?;
            let mut shared = engine.model().map_weights(&mut |name, w| adapters.get(name).cloned().unwrap_or(w));
            shared.kernels = kernels;
            policy.model = shared;
            engine
        } else {
            crate::run::sampler_engine(&cfg, &policy.tokenizer, sampler_model(&cfg, &policy.model))?
        };
        let reference = (cfg.train.kl_coef > 0.0).then(|| policy.model.clone());
        let eval_problems = if cfg.train.eval_every > 0 { crate::eval::load_eval_problems(&cfg, &task)? } else { Vec::new() };
        let mut trainer = Self { cfg, policy, opt, engine, task, reference, telemetry, run_dir, step, eval_problems, comm };
        // ZeRO-1: a rank keeps the optimizer state of its own parameters only (a resumed rank
        // loaded all of it)
        if let Some(shards) = trainer.shards() {
            trainer.opt.retain(&|n| shards.owns(n));
        }
        // every piece of fixed state before the first rollout: step 1 then holds nothing that
        // step 0 did not (AdamW's moments appeared at the first update and ran a card out of
        // memory there)
        let shards = trainer.shards();
        let model = &trainer.policy.model;
        trainer.opt.allocate_state(model, &|n| crate::backward::trained(model, n) && shards.as_ref().is_none_or(|s| s.owns(n)));
        Ok(trainer)
    }

    pub(super) fn params(&self, seed: u64) -> SamplingParams {
        let s = &self.cfg.sampler;
        SamplingParams { temperature: s.temperature, top_k: s.top_k, top_p: s.top_p, max_new_tokens: s.max_new_tokens, stop_tokens: self.policy.stop_tokens.clone(), stop: s.stop.clone(), seed, noise_key: None, processed_logprobs: s.logprobs_mode == crate::config::LogprobsMode::Processed, top_logprobs: 0 }
    }

    /// One GRPO step (see the module docs): its phases in order.
    pub fn step(&mut self) -> Result<StepMetrics, RunError> {
        let started = Instant::now();
        let step = self.step;
        let updates_before = self.opt.t;
        let inject = |phase: &str| crate::out_of_memory::injected(phase, step).map_err(RunError::Other);
        let rollouts = inject("sample").and_then(|_| self.rollouts(step)).map_err(|e| self.failed(step, "sampling the rollouts", updates_before, e))?;
        // a mixture-of-experts model's routing, on the weights that sampled; the update (and a
        // tracked scoring pass) then trains with the load-balancing loss it asks for
        let (moe, router_aux) = self.routing_telemetry(step, &rollouts).map_err(|e| self.failed(step, "the routing pass (mixture-of-experts telemetry)", updates_before, e))?.map_or((None, None), |(m, a)| (Some(m), a));
        let training_aux = router_aux.is_some();
        self.policy.model.set_router_aux(router_aux);
        let (scored, tracked) = inject("score").and_then(|_| self.score(step, &rollouts)).map_err(|e| self.failed(step, "the scoring pass", updates_before, e))?;
        let lr = learning_rate(self.cfg.train.lr, step, self.cfg.train.warmup_steps, self.cfg.train.steps, self.cfg.train.min_lr_ratio);
        let updating = Instant::now();
        let updated = inject("update").and_then(|_| self.update(step, &rollouts, tracked, &scored, lr));
        if training_aux {
            self.policy.model.set_router_aux(None);
        }
        let (loss, grad_norm, corr, verified) = updated.map_err(|e| self.failed(step, "the update's forward and backward passes", updates_before, e))?;
        let (agreement, entropy) = verified.unwrap_or_else(|| (scored.agreement.clone(), scored.entropy));
        let update_s = updating.elapsed().as_secs_f64();
        let syncing = Instant::now();
        let (sampler_hash, trainer_hash) = self.sync_weights(step).map_err(|e| self.failed(step, "handing the weights to the sampler", updates_before, e))?;
        // the evaluation sees the step's new weights (the engine holds them now)
        let c = &self.cfg;
        let eval = if c.train.eval_every > 0 && (step + 1) % c.train.eval_every == 0 {
            Some(crate::eval::evaluate(c, &self.policy, &self.task, &mut self.engine, &self.eval_problems, step)?)
        } else {
            None
        };
        let phases = &rollouts.engine_phases;
        let timing = PhaseTimes {
            gen_s: rollouts.sample_s,
            logprob_s: scored.logprob_s,
            update_s,
            sync_s: syncing.elapsed().as_secs_f64(),
            gen_engine_steps: phases.steps,
            gen_launch_s: phases.launch_s,
            gen_wait_s: phases.wait_s,
            gen_prefix_copy_s: phases.prefix_copy_s,
            gen_schedule_s: phases.schedule_s,
            gen_preempted: phases.preempted,
            gen_replayed_steps: phases.replayed_steps,
            gen_failed_captures: phases.failed_captures,
        };
        self.step += 1;
        let (completions, rewards) = (&rollouts.completions, &rollouts.rewards);
        let generated: usize = completions.iter().map(|c| c.tokens.len()).sum();
        let mean = rewards.iter().sum::<f64>() / rewards.len() as f64;
        let metrics = StepMetrics {
            step,
            reward_mean: mean,
            reward_std: (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / rewards.len() as f64).sqrt(),
            response_len_mean: generated as f64 / completions.len() as f64,
            agreement,
            loss,
            grad_norm,
            entropy,
            lr,
            is_ratio_min: corr.ratio_min,
            is_ratio_mean: corr.ratio_mean,
            is_ratio_max: corr.ratio_max,
            is_weight_min: corr.weight_min,
            is_weight_mean: corr.weight_mean,
            is_weight_max: corr.weight_max,
            truncated_frac: corr.truncated_frac,
            masked_frac: corr.masked_frac,
            kl_ref: scored.kl_ref,
            tokens_per_s: generated as f64 / rollouts.sample_s.max(1e-9),
            step_s: started.elapsed().as_secs_f64(),
            timing,
            sampler_weights_fingerprint: sampler_hash,
            trainer_weights_fingerprint: trainer_hash,
            eval,
            dynamic_sampling: rollouts.groups.map(|(groups_kept, groups_sampled)| crate::telemetry::DynamicSampling { groups_kept, groups_sampled }),
            episodes: rollouts.episodes.as_deref().map(crate::telemetry::EpisodeMeans::of),
            moe,
        };
        self.telemetry.record(&metrics).map_err(|e| RunError::Other(format!("metrics: {e}")))?;
        Ok(metrics)
    }

    /// Phase 6: the sampler gets the new weights; both fingerprints must agree.
    pub(super) fn sync_weights(&mut self, step: usize) -> Result<(String, String), RunError> {
        let sampling_dtype = self.policy.model.dtype;
        if self.policy.model.lora.is_some() {
            self.engine.set_adapters(&self.policy.model).map_err(RunError::Other)?; // the base is shared
        } else {
            self.engine.set_model(sampler_model(&self.cfg, &self.policy.model)).map_err(RunError::Other)?;
        }
        let trainer_hash = weights_fingerprint(&self.policy.model, sampling_dtype)?;
        let sampler_hash = weights_fingerprint(self.engine.model(), sampling_dtype)?;
        if trainer_hash != sampler_hash {
            return Err(RunError::Other(format!("step {step}: sampler weights {sampler_hash} differ from trainer weights {trainer_hash}")));
        }
        // every rank's weights are rank 0's, as bits
        if let Some(c) = self.comm() {
            crate::distributed::check_equal(c, &format!("the weights' fingerprint after step {step}"), &trainer_hash).map_err(ranks::comm_error)?;
        }
        Ok((sampler_hash, trainer_hash))
    }

    /// A reward program that crashed, hung or answered badly stops the step before its update,
    /// so the weights and the optimizer are as the previous step left them (and sound, unlike
    /// after a non-finite loss). On one process they are saved as the checkpoint of `step`, so
    /// `--resume` retries the step once the program is fixed instead of redoing the steps since
    /// the last checkpoint (or the SFT warm start). With several ranks the others wait in a
    /// collective and the checkpoint is one too, so it is not attempted there.
    pub(super) fn save_before_failed_step(&self, step: usize) {
        if self.comm.is_some() {
            return;
        }
        match self.checkpoint() {
            Ok(dir) => eprintln!("step {step} failed before its update: the run's state before it is saved in {}; fix the cause, then continue with --resume", dir.display()),
            Err(e) => eprintln!("step {step} failed before its update, and saving the run's state before it failed too: {e}"),
        }
    }

    /// A step that failed in `phase`: a device allocation that did not fit becomes one plain
    /// error naming the phase, the bytes asked and free, and the keys to lower; while no
    /// optimizer step of this step has run (`updates_before`), the state before the step is
    /// saved first, so `--resume --set train.micro_batch_tokens=...` continues with the same bits.
    fn failed(&self, step: usize, phase: &str, updates_before: u64, e: RunError) -> RunError {
        let Some(asked) = crate::out_of_memory::reported(&e.to_string()) else { return e };
        let sizes = crate::out_of_memory::sizes(asked);
        let (t, s) = (&self.cfg.train, &self.cfg.sampler);
        let now = |v: String| if v == "0" { "0, the whole step".to_string() } else { v };
        let keys = format!(
            "lower train.micro_batch_tokens (now {}) or sampler.kv_budget_mib (now {}), or set train.recompute_layers = true; or leave both \"auto\" if another process took the memory",
            now(t.pass_tokens().to_string()),
            s.kv_budget_mib.set().map_or("auto".to_string(), |m| m.to_string())
        );
        let saved = if self.opt.t == updates_before && self.comm.is_none() {
            match self.checkpoint() {
                Ok(dir) => format!("the state before step {step} is saved in {}: continue with --resume --set train.micro_batch_tokens=N (the same bits for any N)", dir.display()),
                Err(save) => format!("saving the state before step {step} failed too: {save}"),
            }
        } else if self.comm.is_some() {
            "continue from the last checkpoint with --resume".to_string()
        } else {
            "the optimizer had begun this step, so the last checkpoint is the state to resume from".to_string()
        };
        RunError::Other(format!("step {step}: out of device memory in {phase} ({sizes}): {keys}; {saved}"))
    }

    /// Writes a checkpoint of this step (rank 0 writes it; with a sharded optimizer every rank
    /// must call this, as the state is gathered from its owners). Returns its folder.
    pub fn checkpoint(&self) -> Result<PathBuf, RunError> {
        let state = RunState { step: self.step, adam_t: self.opt.t, git_revision: crate::run_environment::git_revision() };
        if let Some(shards) = self.shards() {
            return self.checkpoint_sharded(&shards, &state);
        }
        if self.comm().is_some_and(|c| c.rank() > 0) {
            return Ok(checkpoint::checkpoints_dir(&run_dir(&self.cfg)).join(format!("step-{:06}", self.step)));
        }
        let saved_already = checkpoint::list(&self.run_dir).iter().any(|p| p.ends_with(format!("step-{:06}", self.step)));
        let started = std::time::Instant::now();
        let path = checkpoint::save(&self.run_dir, &self.policy.model, &self.opt, &state, &self.policy.tokenizer_json, self.cfg.train.keep_checkpoints)?;
        if !saved_already {
            let bytes: u64 = std::fs::read_dir(&path).map(|d| d.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0);
            eprintln!("checkpoint {}: {:.2} GB written in {:.1} s", path.display(), bytes as f64 / 1e9, started.elapsed().as_secs_f64());
        }
        Ok(path)
    }
}

/// The sampler's copy of the policy: the same weights in the sampling dtype, on the kernel set
/// the ablation names.
pub fn sampler_model(c: &Config, model: &Qwen3) -> Qwen3 {
    let mut m = model.clone();
    m.kernels = c.ablation.sampler_kernels.kernel_set();
    m
}
