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

use shared_kernels::model::audit::first_divergence_in_batch;
use crate::checkpoint::{self, RunState};
use crate::losses::{aggregation_divisor, group_advantages, overlong_penalty, surrogate_coefficients};
use crate::config::Config;
use crate::optim::{accumulate, clip, learning_rate, micro_batches, tracked_copy, weighted_backward, with_folded, AdamW};
use shared_kernels::grad_fold::GradFold;
use crate::rng::SplitMix;
use crate::run::{encode, run_dir, Policy, RunError};
use crate::tasks::Task;
use crate::telemetry::{Agreement, PhaseTimes, StepMetrics, Telemetry};
use burn::tensor::DType;
use sampler::{Engine, Request, SamplingParams};
use shared_kernels::bridge::ReadBack;
use shared_kernels::ops::fingerprint::{fingerprint_launch, fold_data};
use sha2::{Digest, Sha256};
use shared_kernels::model::{KernelSet, Qwen3};
use std::path::PathBuf;
use std::time::Instant;

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
}

/// The weights as `dtype` (the sampling dtype), fingerprinted: each tensor's device fingerprint
/// (`ops::fingerprint`: 64 bits over every value and its position), all launched first and read
/// back in one copy, then SHA-256 over (name, element count, fingerprint) per tensor, 16 hex
/// digits. Hashing every value on the host (sessions 1-10) read all weights back twice a step:
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

pub fn new_adamw(c: &Config) -> AdamW {
    AdamW::new(c.train.beta1, c.train.beta2, c.train.adam_eps, c.train.weight_decay)
}

impl Trainer {
    pub fn new(cfg: Config, policy: Policy, opt: AdamW, step: usize) -> Result<Self, RunError> {
        let task = crate::run::load_task(&cfg)?;
        let run_dir = run_dir(&cfg);
        let telemetry = Telemetry::open(&run_dir, cfg.log.tensorboard, step).map_err(|e| RunError::Other(format!("{}: {e}", run_dir.display())))?;
        let engine_cfg = crate::run::engine_config(&cfg, &policy.model)?;
        let engine = Engine::new(sampler_model(&cfg, &policy.model), engine_cfg).map_err(RunError::Other)?;
        let reference = (cfg.train.kl_coef > 0.0).then(|| policy.model.clone());
        let eval_problems = if cfg.train.eval_every > 0 { crate::eval::load_eval_problems(&cfg)? } else { Vec::new() };
        Ok(Self { cfg, policy, opt, engine, task, reference, telemetry, run_dir, step, eval_problems })
    }

    fn params(&self, seed: u64) -> SamplingParams {
        let s = &self.cfg.sampler;
        SamplingParams { temperature: s.temperature, top_k: s.top_k, top_p: s.top_p, max_new_tokens: s.max_new_tokens, stop_tokens: self.policy.stop_tokens.clone(), seed }
    }

    /// One GRPO step (see the module docs): its phases in order.
    pub fn step(&mut self) -> Result<StepMetrics, RunError> {
        let started = Instant::now();
        let step = self.step;
        let rollouts = self.rollouts(step)?;
        let (scored, tracked) = self.score(step, &rollouts)?;
        let lr = learning_rate(self.cfg.train.lr, step, self.cfg.train.warmup_steps, self.cfg.train.steps, self.cfg.train.min_lr_ratio);
        let updating = Instant::now();
        let (loss, grad_norm, corr, verified) = self.update(step, &rollouts, tracked, &scored, lr)?;
        let (agreement, entropy) = verified.unwrap_or_else(|| (scored.agreement.clone(), scored.entropy));
        let update_s = updating.elapsed().as_secs_f64();
        let syncing = Instant::now();
        let (sampler_hash, trainer_hash) = self.sync_weights(step)?;
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
        };
        self.telemetry.record(&metrics).map_err(|e| RunError::Other(format!("metrics: {e}")))?;
        Ok(metrics)
    }

    /// Phases 1-3: the step's problems (keyed by seed and step), `group_size` completions each
    /// from the sampler, their rewards and group-normalised advantages. With
    /// `train.dynamic_sampling_rounds` (DAPO's dynamic sampling), groups whose rewards are all
    /// equal (no signal) are dropped and up to that many refill rounds draw more prompts, from
    /// streams keyed by (seed, round), until `prompts_per_step` groups remain.
    fn rollouts(&mut self, step: usize) -> Result<Rollouts, RunError> {
        let c = self.cfg.clone();
        let (p, g) = (c.train.prompts_per_step, c.train.group_size);
        let mut kept = self.sample_round(step, 0)?;
        if c.train.dynamic_sampling_rounds == 0 {
            return Ok(kept);
        }
        let mut sample_s = kept.sample_s;
        let mut engine_phases = std::mem::take(&mut kept.engine_phases);
        let first_round = kept.clone();
        let mut sampled = kept.requests.len() / g;
        kept.retain_groups(g, |rewards| rewards.iter().any(|&r| r != rewards[0]));
        for round in 1..=c.train.dynamic_sampling_rounds {
            if kept.requests.len() / g >= p {
                break;
            }
            let mut more = self.sample_round(step, round)?;
            sample_s += more.sample_s;
            engine_phases.steps += more.engine_phases.steps;
            engine_phases.launch_s += more.engine_phases.launch_s;
            engine_phases.wait_s += more.engine_phases.wait_s;
            engine_phases.prefix_copy_s += more.engine_phases.prefix_copy_s;
            engine_phases.schedule_s += more.engine_phases.schedule_s;
            engine_phases.preempted += more.engine_phases.preempted;
            sampled += more.requests.len() / g;
            more.retain_groups(g, |rewards| rewards.iter().any(|&r| r != rewards[0]));
            kept.extend(more);
        }
        kept.truncate_groups(g, p);
        let groups_kept = kept.requests.len() / g;
        if kept.requests.is_empty() {
            // every group was degenerate: the first round stands (zero advantages, no update)
            kept = first_round;
        }
        kept.groups = Some((groups_kept, sampled));
        kept.sample_s = sample_s;
        kept.engine_phases = engine_phases;
        Ok(kept)
    }

    /// One round of rollouts: `prompts_per_step` problems of round `round`'s stream (round 0:
    /// the step's own, keyed by (seed, step)), sampled, rewarded, with group advantages.
    fn sample_round(&mut self, step: usize, round: usize) -> Result<Rollouts, RunError> {
        let c = self.cfg.clone();
        let (p, g) = (c.train.prompts_per_step, c.train.group_size);
        // refill rounds draw from their own keyed streams, apart from the step's
        let seed = if round == 0 { c.train.seed } else { c.train.seed ^ (round as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) };
        let mut rng = SplitMix::keyed(seed, step as u64, "prompts");
        let first = (step * p) as u64;
        let problems: Vec<_> = (0..p).map(|k| self.task.problem_at(seed, first + k as u64, &mut rng)).collect::<Result<_, _>>()?;
        let mut requests = Vec::new();
        for (pi, problem) in problems.iter().enumerate() {
            let prompt = encode(&self.policy.tokenizer, &problem.prompt)?;
            for gi in 0..g {
                let id = (step as u64) << 32 | (round * p * g + pi * g + gi) as u64;
                requests.push(Request { id, prompt: prompt.clone(), params: self.params(c.train.seed) });
            }
        }
        let sampling = Instant::now();
        let results = self.engine.generate(requests.clone());
        let sample_s = sampling.elapsed().as_secs_f64();
        let engine_phases = self.engine.take_phase_times();
        let mut completions = Vec::with_capacity(results.len());
        for r in results {
            completions.push(r.map_err(|e| RunError::Other(format!("step {step}: sampler: {e}")))?);
        }
        // a non-finite logprob is a fault (weights or device), never a sample: named, not trained on
        for (r, comp) in requests.iter().zip(&completions) {
            if let Some(p) = comp.logprobs.iter().position(|l| !l.is_finite()) {
                return Err(RunError::Other(format!("step {step}: request {}: the sampler's logprob at completion position {p} (token {}) is {}; stopping before the update (the last checkpoint is intact)", r.id, comp.tokens[p], comp.logprobs[p])));
            }
        }
        let mut texts = Vec::with_capacity(completions.len());
        for comp in &completions {
            let body: Vec<u32> = comp.tokens.iter().copied().filter(|t| !self.policy.stop_tokens.contains(t)).collect();
            texts.push(self.policy.tokenizer.decode(&body, true).map_err(|e| RunError::Other(format!("decode: {e}")))?);
        }
        let raw: Vec<f64> = if c.task.reward == "command" {
            let rollouts: Vec<crate::reward_command::Rollout<'_>> = texts.iter().enumerate().map(|(i, t)| crate::reward_command::Rollout { prompt: &problems[i / g].prompt, completion: t, answer: &problems[i / g].answer }).collect();
            crate::reward_command::rewards(&c.task.reward_command, c.task.reward_timeout_s, &rollouts).map_err(|e| RunError::Other(format!("step {step}: {e} (stopping before the update; the last checkpoint is intact)")))?
        } else {
            texts.iter().enumerate().map(|(i, t)| self.task.reward_for(&c.task, &problems[i / g], t) as f64).collect()
        };
        let rewards: Vec<f64> = raw.iter().zip(&completions).map(|(r, comp)| r - overlong_penalty(comp.tokens.len(), c.sampler.max_new_tokens, c.train.overlong_buffer, c.train.overlong_penalty)).collect();
        let advantages = group_advantages(&rewards, g, &c.train.advantage);
        let sequences: Vec<Vec<u32>> = requests.iter().zip(&completions).map(|(r, comp)| [r.prompt.clone(), comp.tokens.clone()].concat()).collect();
        if shared_kernels::knobs::var("LOCKSTEP_FAULT_SAMPLER_LOGPROB").and_then(|v| v.parse::<usize>().ok()) == Some(step) {
            if let Some(lp) = completions.first_mut().and_then(|c| c.logprobs.first_mut()) {
                *lp = f32::from_bits(lp.to_bits() ^ 1); // fault injection (faults.rs): one bit
            }
        }
        Ok(Rollouts { requests, completions, rewards, advantages, sequences, sample_s, engine_phases, groups: None })
    }

    /// Phase 4: trainer logprobs on the training path, compared with the sampler's as bits (a
    /// difference stops or warns, with the auditor's report), and each scored token's loss
    /// weight. One pass with autodiff on when the step is one micro-batch and one update (its
    /// graph then serves the update), else a scoring pass per micro-batch without autodiff.
    fn score(&self, step: usize, r: &Rollouts) -> Result<(Scored, Option<Tracked>), RunError> {
        let c = &self.cfg;
        let (requests, completions, sequences) = (&r.requests, &r.completions, &r.sequences);
        let lengths: Vec<usize> = sequences.iter().map(Vec::len).collect();
        let batches = micro_batches(&lengths, c.train.micro_batch_tokens);
        let scoring = Instant::now();
        // In matched mode the sampler's logprobs are the old policy's, as bits (the contract):
        // with micro-batches no separate scoring pass runs. The update's tracked forward of each
        // micro-batch is compared with them as bits before the optimizer step, and a difference
        // stops the run there (so `train.on_mismatch = "stop"` only: "warn" keeps the pass).
        if self.verifies_in_update(batches.len()) {
            // completion positions hold the sampler's values (the loss weights read only those);
            // prompt positions NaN, so any use of them would poison the update and stop it
            let trainer_lp: Vec<Vec<f32>> = sequences
                .iter()
                .enumerate()
                .map(|(s, seq)| {
                    let start = requests[s].prompt.len() - 1;
                    let mut lp = vec![f32::NAN; seq.len() - 1];
                    lp[start..].copy_from_slice(&completions[s].logprobs);
                    lp
                })
                .collect();
            return self.weigh(r, batches, trainer_lp, 0.0, Agreement::default(), scoring, true).map(|s| (s, None));
        }
        let single = (batches.len() == 1 && !self.ppo()).then(|| tracked_copy(&self.policy.model));
        let (trainer_lp, single, entropy) = match single {
            Some(tracked) => {
                let (lp, flat) = tracked.training_logprobs(sequences, c.sampler.temperature, c.train.recompute_layers).map_err(|e| pass_error(step, e))?;
                let entropy = tracked.last_entropy.get().unwrap_or(0.0);
                (lp, Some((tracked, flat)), entropy)
            }
            None => {
                let (lp, entropy) = logprobs_by_batch(&self.policy.model, sequences, &batches, c.sampler.temperature).map_err(|e| pass_error(step, e))?;
                (lp, None, entropy)
            }
        };
        let mut sampler_all = Vec::new();
        let mut trainer_all = Vec::new();
        for (s, comp) in completions.iter().enumerate() {
            let start = requests[s].prompt.len() - 1;
            sampler_all.extend_from_slice(&comp.logprobs);
            trainer_all.extend_from_slice(&trainer_lp[s][start..]);
        }
        let agreement = Agreement::of(&sampler_all, &trainer_all);
        if c.ablation.sampler_kernels == "matched" && agreement.bit_equal_frac < 1.0 {
            let within = |s: usize| batches.iter().find(|b| b.contains(&s)).cloned().unwrap_or(0..sequences.len());
            let message = self.mismatch_report(step, r, &trainer_lp, 0, &agreement, within)?;
            if c.train.on_mismatch == "stop" {
                return Err(RunError::Other(message));
            }
            tracing::warn!("{message}");
        }
        self.weigh(r, batches, trainer_lp, entropy, agreement, scoring, false).map(|s| (s, single))
    }

    /// Whether this step's trainer logprobs are checked inside the update instead of a
    /// scoring pass of their own (see [`Self::score`]).
    fn verifies_in_update(&self, micro_batches: usize) -> bool {
        let c = &self.cfg;
        c.ablation.sampler_kernels == "matched" && c.train.on_mismatch == "stop" && !self.ppo() && micro_batches > 1
    }

    /// The error (or warning) for trainer logprobs `lp` of sequences `first..` that differ in
    /// bits from the sampler's: how many, the first one, and the auditor's report replayed
    /// inside the micro-batch `within(s)` it ran in (the same launch sizes).
    fn mismatch_report(&self, step: usize, r: &Rollouts, lp: &[Vec<f32>], first: usize, agreement: &Agreement, within: impl Fn(usize) -> std::ops::Range<usize>) -> Result<String, RunError> {
        let n = lp.len();
        let (requests, completions, sequences) = (&r.requests[first..first + n], &r.completions[first..first + n], &r.sequences);
        let (k, t) = first_mismatch(completions, lp, requests);
        let s = first + k;
        let sampled = completions[k].logprobs[t];
        let within = within(s);
        let report = first_divergence_in_batch(&self.policy.model, self.engine.model(), &sequences[within.clone()], s - within.start, r.requests[s].prompt.len() - 1 + t, Some((sampled, self.cfg.sampler.temperature)))?;
        Ok(format!("step {step}: sampler and trainer logprobs differ in bits for {} of {} tokens (request {}, token {t}); {report}", agreement.tokens - (agreement.bit_equal_frac * agreement.tokens as f64).round() as usize, agreement.tokens, r.requests[s].id))
    }

    /// Loss weights per scored row from the trainer logprobs (prompt tokens get 0), and the
    /// reference model's KL term when `train.kl_coef` asks for one.
    #[allow(clippy::too_many_arguments)]
    fn weigh(&self, r: &Rollouts, batches: Vec<std::ops::Range<usize>>, trainer_lp: Vec<Vec<f32>>, entropy: f64, agreement: Agreement, scoring: Instant, verify_in_update: bool) -> Result<Scored, RunError> {
        let c = &self.cfg;
        let (requests, completions, sequences) = (&r.requests, &r.completions, &r.sequences);
        let coef_sampler_tokens: usize = completions.iter().map(|comp| comp.logprobs.len()).sum();
        let (coef, corr) = self.coefficients(requests, completions, &trainer_lp, &r.advantages)?;
        let ref_lp = match &self.reference {
            Some(m) => Some(logprobs_by_batch(m, sequences, &batches, c.sampler.temperature)?.0),
            None => None,
        };
        let logprob_s = scoring.elapsed().as_secs_f64();
        let n_tokens = coef_sampler_tokens.max(1) as f64;
        let mut weights = Vec::with_capacity(coef.len());
        let mut kl_ref = 0.0;
        let mut at = 0;
        for (s, seq) in sequences.iter().enumerate() {
            let start = requests[s].prompt.len() - 1;
            let divisor = aggregation_divisor(&c.train.loss_aggregation, completions[s].tokens.len(), completions.len(), n_tokens, c.sampler.max_new_tokens);
            for t in 0..seq.len() - 1 {
                let mut w = 0.0;
                if t >= start {
                    w = -coef[at] / divisor;
                    if let Some(rl) = &ref_lp {
                        let d = (rl[s][t] - trainer_lp[s][t]) as f64;
                        kl_ref += (d.exp() - d - 1.0) / n_tokens;
                        w += c.train.kl_coef * (1.0 - d.exp()) / n_tokens;
                    }
                    at += 1;
                }
                weights.push(w as f32);
            }
        }
        Ok(Scored { batches, trainer_lp, entropy, agreement, corr, weights, kl_ref, logprob_s, verify_in_update })
    }

    fn ppo(&self) -> bool {
        self.cfg.train.ppo_epochs * self.cfg.train.mini_batches > 1
    }

    /// Phase 5: the update: PPO epochs, or one policy-gradient step whose weight gradients are
    /// folded over the tokens in order across micro-batches (its bits do not depend on
    /// `train.micro_batch_tokens`). Returns the loss, the gradient norm and the ratio statistics.
    /// With `scored.verify_in_update`, also the agreement and entropy its forward measured.
    fn update(&mut self, step: usize, r: &Rollouts, single: Option<Tracked>, scored: &Scored, lr: f64) -> Result<(f64, f64, Correction, Option<(Agreement, f64)>), RunError> {
        if self.ppo() {
            return self.ppo_updates(step, &r.sequences, &r.requests, &r.completions, &r.advantages, lr).map(|(l, g, c)| (l, g, c, None));
        }
        let c = self.cfg.clone();
        let (sequences, weights, trainer_lp) = (&r.sequences, &scored.weights, &scored.trainer_lp);
        let mut fold = GradFold::new();
        let mut verified = None;
        let (loss_value, grads) = match single {
            Some((tracked, flat)) => weighted_backward(&tracked, flat, weights, &mut fold, &format!("step {step}"), "train.lr")?,
            None => {
                // the update a micro-batch at a time: its tracked forward must give the scoring
                // pass's bits (batch invariance); gradients not folded are summed in f32 in order
                let (mut loss, mut total, mut row) = (0.0, std::collections::BTreeMap::new(), 0);
                let (mut sampler_all, mut trainer_all, mut entropy_sum) = (Vec::new(), Vec::new(), 0.0);
                for range in &scored.batches {
                    let tracked = tracked_copy(&self.policy.model);
                    let (lp, flat) = tracked.training_logprobs(&sequences[range.clone()], c.sampler.temperature, c.train.recompute_layers).map_err(|e| pass_error(step, e))?;
                    if scored.verify_in_update {
                        // the contract, checked here instead of a scoring pass: every completion
                        // token's logprob equals the sampler's as bits, before any weight moves
                        let (mut q, mut p) = (Vec::new(), Vec::new());
                        for (k, s) in range.clone().enumerate() {
                            q.extend_from_slice(&r.completions[s].logprobs);
                            p.extend_from_slice(&lp[k][r.requests[s].prompt.len() - 1..]);
                        }
                        let part = Agreement::of(&q, &p);
                        if part.bit_equal_frac < 1.0 {
                            let within = range.clone();
                            let report = self.mismatch_report(step, r, &lp, range.start, &part, |_| within.clone())?;
                            let at = scored.batches.iter().position(|b| b == range).unwrap_or(0);
                            return Err(RunError::Other(format!("{report} (found by the update's check of micro-batch {} of {}, before the optimizer step)", at + 1, scored.batches.len())));
                        }
                        let rows: usize = lp.iter().map(Vec::len).sum();
                        entropy_sum += tracked.last_entropy.get().unwrap_or(0.0) * rows as f64;
                        sampler_all.extend(q);
                        trainer_all.extend(p);
                    } else if let Some((k, _)) = lp.iter().zip(&trainer_lp[range.clone()]).enumerate().find(|(_, (a, b))| a.iter().map(|x| x.to_bits()).ne(b.iter().map(|x| x.to_bits()))) {
                        return Err(RunError::Other(format!("step {step}: sequence {}'s logprobs in its tracked micro-batch ({} sequences) differ in bits from the scoring pass", range.start + k, range.len())));
                    }
                    let rows: usize = lp.iter().map(Vec::len).sum();
                    let (part, grads) = weighted_backward(&tracked, flat, &weights[row..row + rows], &mut fold, &format!("step {step}"), "train.lr")?;
                    loss += part;
                    accumulate(&mut total, grads);
                    row += rows;
                }
                if scored.verify_in_update {
                    verified = Some((Agreement::of(&sampler_all, &trainer_all), entropy_sum / row.max(1) as f64));
                }
                (loss, total)
            }
        };
        let mut grads = with_folded(grads, fold);
        let grad_norm = clip(&mut grads, c.train.grad_clip);
        if !grad_norm.is_finite() {
            return Err(RunError::Other(format!("step {step}: the gradient norm is {grad_norm}; stopping before the update (the last checkpoint is intact)")));
        }
        self.policy.model = self.opt.step(&self.policy.model, &grads, lr);
        Ok((loss_value, grad_norm, scored.corr.clone(), verified))
    }

    /// Phase 6: the sampler gets the new weights; both fingerprints must agree.
    fn sync_weights(&mut self, step: usize) -> Result<(String, String), RunError> {
        let sampling_dtype = self.policy.model.dtype;
        self.engine.set_model(sampler_model(&self.cfg, &self.policy.model)).map_err(RunError::Other)?;
        let trainer_hash = weights_fingerprint(&self.policy.model, sampling_dtype)?;
        let sampler_hash = weights_fingerprint(self.engine.model(), sampling_dtype)?;
        if trainer_hash != sampler_hash {
            return Err(RunError::Other(format!("step {step}: sampler weights {sampler_hash} differ from trainer weights {trainer_hash}")));
        }
        Ok((sampler_hash, trainer_hash))
    }

    /// PPO epochs over the step's rollouts: `train.ppo_epochs` passes, each `train.mini_batches`
    /// optimizer steps on consecutive slices of the rollouts, with the clipped surrogate against
    /// the sampler's logprobs (in matched mode the old policy's, as bits, so no recompute pass);
    /// each mini-batch's weight gradients folded over its micro-batches as in the single update.
    /// Returns the first update's loss, the last one's gradient norm, and the ratio statistics
    /// over every update (`masked_frac`: the clipped fraction of tokens).
    fn ppo_updates(&mut self, step: usize, sequences: &[Vec<u32>], requests: &[Request], completions: &[sampler::Completion], adv: &[f64], lr: f64) -> Result<(f64, f64, Correction), RunError> {
        let c = self.cfg.clone();
        let (n, m) = (sequences.len(), c.train.mini_batches);
        let ranges: Vec<std::ops::Range<usize>> = (0..m).map(|b| b * n / m..(b + 1) * n / m).filter(|r| !r.is_empty()).collect();
        let sequence_level = c.train.ratio_level == "sequence";
        let mut corr = Correction { ratio_min: f64::INFINITY, ratio_max: 0.0, ..Default::default() };
        let (mut seen, mut first_loss, mut grad_norm) = (0usize, None, 0.0);
        for _epoch in 0..c.train.ppo_epochs {
            for range in &ranges {
                let mini = &sequences[range.clone()];
                let lengths: Vec<usize> = mini.iter().map(Vec::len).collect();
                let mini_tokens = range.clone().map(|s| completions[s].tokens.len()).sum::<usize>().max(1) as f64;
                let mut fold = GradFold::new();
                let (mut loss, mut total) = (0.0, std::collections::BTreeMap::new());
                for b in micro_batches(&lengths, c.train.micro_batch_tokens) {
                    let tracked = tracked_copy(&self.policy.model);
                    let (lp, flat) = tracked.training_logprobs(&mini[b.clone()], c.sampler.temperature, c.train.recompute_layers).map_err(|e| pass_error(step, e))?;
                    let mut weights = Vec::new();
                    for (k, seq_lp) in lp.iter().enumerate() {
                        let s = range.start + b.start + k;
                        let start = requests[s].prompt.len() - 1;
                        let old = &completions[s].logprobs;
                        let (coefs, ratios, clipped) = surrogate_coefficients(&seq_lp[start..], old, adv[s], c.train.clip_low, c.train.clip_high, sequence_level);
                        for &r in &ratios {
                            corr.ratio_min = corr.ratio_min.min(r);
                            corr.ratio_max = corr.ratio_max.max(r);
                            corr.ratio_mean += r;
                        }
                        corr.masked_frac += clipped as f64;
                        seen += ratios.len();
                        // GSPO averages sequences (its coefficients carry 1 / length already)
                        let divisor = if sequence_level { range.len() as f64 } else { aggregation_divisor(&c.train.loss_aggregation, old.len(), range.len(), mini_tokens, c.sampler.max_new_tokens) };
                        weights.extend(std::iter::repeat_n(0.0f32, start));
                        weights.extend(coefs.iter().map(|&x| (-x / divisor) as f32));
                    }
                    let (part, grads) = weighted_backward(&tracked, flat, &weights, &mut fold, &format!("step {step}"), "train.lr")?;
                    loss += part;
                    accumulate(&mut total, grads);
                }
                let mut grads = with_folded(total, fold);
                grad_norm = clip(&mut grads, c.train.grad_clip);
                if !grad_norm.is_finite() {
                    return Err(RunError::Other(format!("step {step}: the gradient norm is {grad_norm} in a PPO mini-batch; stopping before the update (the last checkpoint is intact)")));
                }
                first_loss.get_or_insert(loss);
                self.policy.model = self.opt.step(&self.policy.model, &grads, lr);
            }
        }
        let seen = seen.max(1) as f64;
        corr.ratio_mean /= seen;
        corr.masked_frac /= seen;
        if !corr.ratio_min.is_finite() {
            corr.ratio_min = 1.0;
        }
        (corr.weight_min, corr.weight_mean, corr.weight_max) = (corr.ratio_min, corr.ratio_mean, corr.ratio_max);
        Ok((first_loss.unwrap_or(0.0), grad_norm, corr))
    }

    /// Per completion token: the policy-gradient coefficient c_t·A (c_t from the correction).
    fn coefficients(&self, requests: &[Request], completions: &[sampler::Completion], trainer_lp: &[Vec<f32>], adv: &[f64]) -> Result<(Vec<f64>, Correction), RunError> {
        let a = &self.cfg.ablation;
        let mut out = Vec::new();
        let mut corr = Correction { ratio_min: f64::INFINITY, ratio_max: 0.0, weight_min: f64::INFINITY, weight_max: 0.0, ..Default::default() };
        let mut n = 0usize;
        for (s, comp) in completions.iter().enumerate() {
            let start = requests[s].prompt.len() - 1;
            let log_ratios: Vec<f64> = comp.logprobs.iter().enumerate().map(|(t, &q)| trainer_lp[s][start + t] as f64 - q as f64).collect();
            let seq_log_ratio: f64 = log_ratios.iter().sum();
            let seq_mean_log_ratio = seq_log_ratio / log_ratios.len().max(1) as f64;
            for &lr_t in &log_ratios {
                let ratio = match (a.level.as_str(), a.correction.as_str()) {
                    ("sequence", "ppo_clip") => seq_mean_log_ratio.exp(),
                    ("sequence", _) => seq_log_ratio.exp(),
                    _ => lr_t.exp(),
                };
                corr.ratio_min = corr.ratio_min.min(ratio);
                corr.ratio_max = corr.ratio_max.max(ratio);
                corr.ratio_mean += ratio;
                n += 1;
                let weight = match a.correction.as_str() {
                    "tis" => {
                        if ratio > a.tis_cap {
                            corr.truncated_frac += 1.0;
                        }
                        ratio.min(a.tis_cap)
                    }
                    "mis" => {
                        if ratio < 1.0 / a.mis_threshold || ratio > a.mis_threshold {
                            corr.masked_frac += 1.0;
                            0.0
                        } else {
                            ratio
                        }
                    }
                    "ppo_clip" => {
                        let clipped = (adv[s] > 0.0 && ratio > 1.0 + a.ppo_clip) || (adv[s] < 0.0 && ratio < 1.0 - a.ppo_clip);
                        if clipped {
                            corr.masked_frac += 1.0;
                            0.0
                        } else {
                            ratio
                        }
                    }
                    _ => 1.0,
                };
                corr.weight_min = corr.weight_min.min(weight);
                corr.weight_max = corr.weight_max.max(weight);
                corr.weight_mean += weight;
                out.push(weight * adv[s]);
            }
        }
        let n = n.max(1) as f64;
        corr.ratio_mean /= n;
        corr.weight_mean /= n;
        if !corr.weight_min.is_finite() {
            corr.weight_min = 1.0;
        }
        corr.truncated_frac /= n;
        corr.masked_frac /= n;
        if !corr.ratio_min.is_finite() {
            corr.ratio_min = 1.0;
        }
        Ok((out, corr))
    }

    pub fn checkpoint(&self) -> Result<PathBuf, RunError> {
        let state = RunState { step: self.step, adam_t: self.opt.t, git_revision: crate::run::git_revision() };
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

/// A step's rollouts: requests, completions, rewards and advantages, and the scored sequences
/// (prompt + completion).
#[derive(Clone)]
struct Rollouts {
    requests: Vec<Request>,
    completions: Vec<sampler::Completion>,
    rewards: Vec<f64>,
    advantages: Vec<f64>,
    sequences: Vec<Vec<u32>>,
    sample_s: f64,
    engine_phases: sampler::EnginePhaseTimes,
    /// Dynamic sampling: (groups kept, groups sampled over every round).
    groups: Option<(usize, usize)>,
}

impl Rollouts {
    /// Keeps the groups (`g` consecutive rollouts) whose rewards pass `keep`, in order.
    fn retain_groups(&mut self, g: usize, keep: impl Fn(&[f64]) -> bool) {
        fn by_group<T>(v: &mut Vec<T>, keep: &[bool], g: usize) {
            let mut i = 0;
            v.retain(|_| {
                i += 1;
                keep[(i - 1) / g]
            });
        }
        let keep: Vec<bool> = self.rewards.chunks(g).map(&keep).collect();
        by_group(&mut self.requests, &keep, g);
        by_group(&mut self.completions, &keep, g);
        by_group(&mut self.rewards, &keep, g);
        by_group(&mut self.advantages, &keep, g);
        by_group(&mut self.sequences, &keep, g);
    }

    fn extend(&mut self, more: Rollouts) {
        self.requests.extend(more.requests);
        self.completions.extend(more.completions);
        self.rewards.extend(more.rewards);
        self.advantages.extend(more.advantages);
        self.sequences.extend(more.sequences);
    }

    /// The first `groups` groups of `g` rollouts.
    fn truncate_groups(&mut self, g: usize, groups: usize) {
        let n = (groups * g).min(self.requests.len());
        self.requests.truncate(n);
        self.completions.truncate(n);
        self.rewards.truncate(n);
        self.advantages.truncate(n);
        self.sequences.truncate(n);
    }
}

/// The tracked one-pass forward (model copy, flat logprobs) whose graph the update reuses.
type Tracked = (Qwen3, shared_kernels::model::TrackedLogprobs);

/// A step's scoring: trainer logprobs, their agreement with the sampler's, the loss weights
/// per scored row.
struct Scored {
    batches: Vec<std::ops::Range<usize>>,
    trainer_lp: Vec<Vec<f32>>,
    entropy: f64,
    agreement: Agreement,
    corr: Correction,
    weights: Vec<f32>,
    kl_ref: f64,
    logprob_s: f64,
    /// No scoring pass ran: `trainer_lp` holds the sampler's values, which the update's
    /// tracked forward checks as bits (and `agreement`, `entropy` come from there).
    verify_in_update: bool,
}

#[derive(Clone, Default)]
pub struct Correction {
    pub ratio_min: f64,
    pub ratio_mean: f64,
    pub ratio_max: f64,
    /// The weights after truncation or masking.
    pub weight_min: f64,
    pub weight_mean: f64,
    pub weight_max: f64,
    pub truncated_frac: f64,
    pub masked_frac: f64,
}

/// Logprobs of every sequence on `model`'s training path without autodiff, a micro-batch at a
/// time, and the mean token entropy over all of them.
fn logprobs_by_batch(model: &Qwen3, sequences: &[Vec<u32>], batches: &[std::ops::Range<usize>], temperature: f32) -> Result<(Vec<Vec<f32>>, f64), shared_kernels::model::ModelError> {
    let (mut all, mut entropy_sum, mut rows) = (Vec::with_capacity(sequences.len()), 0.0, 0usize);
    for range in batches {
        let (lp, _) = model.sequence_logprobs(&sequences[range.clone()], temperature)?;
        let n: usize = lp.iter().map(Vec::len).sum();
        entropy_sum += model.last_entropy.get().unwrap_or(0.0) * n as f64;
        rows += n;
        all.extend(lp);
    }
    Ok((all, entropy_sum / rows.max(1) as f64))
}

/// A trainer pass that failed, with the keys that bound its device memory.
fn pass_error(step: usize, e: shared_kernels::model::ModelError) -> RunError {
    RunError::Other(format!("step {step}: {e} (if the device ran out of memory: lower train.micro_batch_tokens, or sampler.kv_budget_mib / sampler.max_batch, which size the sampler's KV cache held during training)"))
}

fn first_mismatch(completions: &[sampler::Completion], trainer_lp: &[Vec<f32>], requests: &[Request]) -> (usize, usize) {
    for (s, comp) in completions.iter().enumerate() {
        let start = requests[s].prompt.len() - 1;
        for (t, &q) in comp.logprobs.iter().enumerate() {
            if q.to_bits() != trainer_lp[s][start + t].to_bits() {
                return (s, t);
            }
        }
    }
    (0, 0)
}

/// The sampler's copy of the policy: the same weights in the sampling dtype, on the kernel set
/// the ablation names.
pub fn sampler_model(c: &Config, model: &Qwen3) -> Qwen3 {
    let mut m = model.clone();
    m.kernels = match c.ablation.sampler_kernels.as_str() {
        "fast" => KernelSet::Fast,
        "split_k" => KernelSet::SplitK,
        _ => KernelSet::Matched,
    };
    m
}
