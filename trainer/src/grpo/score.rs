//! GRPO phase 4: the trainer's logprobs of the rollouts, their agreement with the sampler's as
//! bits, and each scored token's loss weight.

use super::rollouts::Rollouts;
use crate::objective::{correction_coefficients, token_weights, Correction};
use super::Trainer;
use crate::config::{OnMismatch, SamplerKernels};
use crate::backward::{micro_batches, tracked_copy};
use crate::error::RunError;
use crate::telemetry::Agreement;
use shared_kernels::model::audit::first_divergence_in_batch;
use shared_kernels::model::Qwen3;
use std::time::Instant;

impl Trainer {
    /// Phase 4: trainer logprobs on the training path, compared with the sampler's as bits (a
    /// difference stops or warns, with the auditor's report), and each scored token's loss
    /// weight. One pass with autodiff on when the step is one micro-batch and one update (its
    /// graph then serves the update), else a scoring pass per micro-batch without autodiff.
    pub(super) fn score(&self, step: usize, r: &Rollouts) -> Result<(Scored, Option<Tracked>), RunError> {
        let c = &self.cfg;
        let (completions, sequences) = (&r.completions, &r.sequences);
        let (batches, blocks) = self.own_micro_batches(sequences);
        // the path is every rank's (and one rank's) choice: by the whole step's micro-batches
        let step_batches = self.step_micro_batches(sequences);
        let scoring = Instant::now();
        // In matched mode the sampler's logprobs are the old policy's, as bits (the contract):
        // with micro-batches no separate scoring pass runs. The update's tracked forward of each
        // micro-batch is compared with them as bits before the optimizer step, and a difference
        // stops the run there (so `train.on_mismatch = "stop"` only: "warn" keeps the pass).
        if self.verifies_in_update(step_batches) {
            // completion positions hold the sampler's values (the loss weights read only those);
            // prompt positions NaN, so any use of them would poison the update and stop it
            let trainer_lp: Vec<Vec<f32>> = sequences
                .iter()
                .enumerate()
                .map(|(s, seq)| {
                    let mut lp = vec![f32::NAN; seq.len() - 1];
                    for (&row, &q) in r.positions[s].iter().zip(&completions[s].logprobs) {
                        lp[row] = q;
                    }
                    lp
                })
                .collect();
            return self.weigh(r, batches, blocks, trainer_lp, 0.0, Agreement::default(), scoring, true).map(|s| (s, None));
        }
        let single = (batches.len() == 1 && self.gradient_blocks() == 1 && !self.ppo() && self.comm.is_none()).then(|| tracked_copy(&self.policy.model));
        let (trainer_lp, single, entropy) = match single {
            Some(tracked) => {
                let (lp, flat) = tracked.training_logprobs(sequences, c.sampler.logprob_distribution(), c.train.recompute_layers.on()).map_err(|e| pass_error(step, e))?;
                let entropy = flat.mean_entropy;
                (lp, Some((tracked, flat)), entropy)
            }
            None => {
                let (lp, entropy) = self.logprobs_all(&self.policy.model, sequences, &batches, &format!("trainer logprobs of step {step}")).map_err(|e| match e {
                    Pass::Model(e) => pass_error(step, e),
                    Pass::Run(e) => e,
                })?;
                (lp, None, entropy)
            }
        };
        let mut sampler_all = Vec::new();
        let mut trainer_all = Vec::new();
        for (s, comp) in completions.iter().enumerate() {
            sampler_all.extend_from_slice(&comp.logprobs);
            trainer_all.extend(r.positions[s].iter().map(|&row| trainer_lp[s][row]));
        }
        let agreement = Agreement::of(&sampler_all, &trainer_all);
        if c.ablation.sampler_kernels == SamplerKernels::Matched && agreement.bit_equal_frac < 1.0 {
            let within = |s: usize| batches.iter().find(|b| b.contains(&s)).cloned().unwrap_or(0..sequences.len());
            let message = self.mismatch_report(step, r, &trainer_lp, 0, &agreement, within)?;
            if c.train.on_mismatch == OnMismatch::Stop {
                return Err(RunError::Other(message));
            }
            tracing::warn!("{message}");
        }
        self.weigh(r, batches, blocks, trainer_lp, entropy, agreement, scoring, false).map(|s| (s, single))
    }

    /// Whether this step's trainer logprobs are checked inside the update instead of a
    /// scoring pass of their own (see [`Self::score`]).
    pub(super) fn verifies_in_update(&self, micro_batches: usize) -> bool {
        let c = &self.cfg;
        c.ablation.sampler_kernels == SamplerKernels::Matched && c.train.on_mismatch == OnMismatch::Stop && !self.ppo() && micro_batches > 1
    }

    /// The error (or warning) for trainer logprobs `lp` of sequences `first..` that differ in
    /// bits from the sampler's: how many, the first one, and the auditor's report replayed
    /// inside the micro-batch `within(s)` it ran in (the same launch sizes).
    pub(super) fn mismatch_report(&self, step: usize, r: &Rollouts, lp: &[Vec<f32>], first: usize, agreement: &Agreement, within: impl Fn(usize) -> std::ops::Range<usize>) -> Result<String, RunError> {
        let n = lp.len();
        let (completions, sequences) = (&r.completions[first..first + n], &r.sequences);
        let (k, t) = first_mismatch(completions, lp, &r.positions[first..first + n]);
        let s = first + k;
        let sampled = completions[k].logprobs[t];
        let within = within(s);
        let report = first_divergence_in_batch(&self.policy.model, self.engine.model(), &sequences[within.clone()], s - within.start, r.positions[s][t], Some((sampled, self.cfg.sampler.logprob_distribution())))?;
        Ok(format!("step {step}: sampler and trainer logprobs differ in bits for {} of {} tokens (request {}, token {t}); {report}", agreement.tokens - (agreement.bit_equal_frac * agreement.tokens as f64).round() as usize, agreement.tokens, r.requests[s].id))
    }

    /// Loss weights per scored row from the trainer logprobs (prompt tokens get 0), and the
    /// reference model's KL term when `train.kl_coef` asks for one.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn weigh(&self, r: &Rollouts, batches: Vec<std::ops::Range<usize>>, blocks: Vec<std::ops::Range<usize>>, trainer_lp: Vec<Vec<f32>>, entropy: f64, agreement: Agreement, scoring: Instant, verify_in_update: bool) -> Result<Scored, RunError> {
        let c = &self.cfg;
        let (completions, sequences) = (&r.completions, &r.sequences);
        let (coef, corr) = correction_coefficients(&c.ablation, &r.positions, completions, &trainer_lp, &r.advantages);
        let ref_lp = match &self.reference {
            Some(m) => Some(self.logprobs_all(m, sequences, &batches, "reference logprobs").map_err(|e| match e {
                Pass::Model(e) => RunError::Model(e),
                Pass::Run(e) => e,
            })?.0),
            None => None,
        };
        let logprob_s = scoring.elapsed().as_secs_f64();
        let n_tokens = completions.iter().map(|comp| comp.logprobs.len()).sum::<usize>().max(1) as f64;
        let seq_lens: Vec<usize> = sequences.iter().map(Vec::len).collect();
        let (weights, kl_ref) = token_weights(&c.train, c.sampler.max_new_tokens, &seq_lens, &r.positions, n_tokens, &coef, &trainer_lp, ref_lp.as_deref());
        Ok(Scored { batches, blocks, trainer_lp, entropy, agreement, corr, weights, kl_ref, logprob_s, verify_in_update })
    }

    pub(super) fn ppo(&self) -> bool {
        self.cfg.train.ppo_epochs * self.cfg.train.mini_batches > 1
    }

    /// This rank's gradient blocks of the step's sequences (whole prompt groups) and their
    /// micro-batches (`train.micro_batch_tokens`, never across a block's end), as ranges of
    /// `sequences`: on one rank with one block, the whole step's micro-batches.
    pub(super) fn own_micro_batches(&self, sequences: &[Vec<u32>]) -> (Vec<std::ops::Range<usize>>, Vec<std::ops::Range<usize>>) {
        let blocks = self.own_blocks(sequences.len(), self.cfg.train.group_size);
        let mut batches = Vec::new();
        for block in blocks.iter().filter(|b| !b.is_empty()) {
            let lengths: Vec<usize> = sequences[block.clone()].iter().map(Vec::len).collect();
            batches.extend(micro_batches(&lengths, self.cfg.train.pass_tokens()).into_iter().map(|b| b.start + block.start..b.end + block.start));
        }
        (batches, blocks)
    }

    /// How many micro-batches the whole step has over all ranks' gradient blocks (the same
    /// number on every rank and for any number of ranks).
    fn step_micro_batches(&self, sequences: &[Vec<u32>]) -> usize {
        let (g, blocks) = (self.cfg.train.group_size, self.gradient_blocks());
        (0..blocks)
            .map(|k| crate::distributed::share(sequences.len() / g, blocks, k))
            .filter(|units| !units.is_empty())
            .map(|units| {
                let lengths: Vec<usize> = sequences[units.start * g..units.end * g].iter().map(Vec::len).collect();
                micro_batches(&lengths, self.cfg.train.pass_tokens()).len()
            })
            .sum()
    }

    /// [`logprobs_by_batch`] over this rank's `batches`, then every rank's rows gathered: every
    /// sequence's logprobs on every rank, and the mean entropy over all of them.
    pub(super) fn logprobs_all(&self, model: &Qwen3, sequences: &[Vec<u32>], batches: &[std::ops::Range<usize>], what: &str) -> Result<(Vec<Vec<f32>>, f64), Pass> {
        let (lp, entropy) = logprobs_by_batch(model, sequences, batches, self.cfg.sampler.logprob_distribution()).map_err(Pass::Model)?;
        if self.comm.is_none() {
            return Ok((lp, entropy));
        }
        let rows: usize = lp.iter().map(Vec::len).sum();
        let parts = self.gather_f64s(&format!("{what}: entropy"), vec![entropy * rows as f64, rows as f64]).map_err(Pass::Run)?;
        let (sum, n) = parts.iter().fold((0.0, 0.0), |(s, n), p| (s + p[0], n + p[1]));
        Ok((self.gather_rows(what, lp).map_err(Pass::Run)?, sum / n.max(1.0)))
    }
}

/// A trainer pass's failure: the model's (named with the memory keys by the caller) or the
/// ranks' exchange.
pub(super) enum Pass {
    Model(shared_kernels::model::ModelError),
    Run(RunError),
}

/// The tracked one-pass forward (model copy, flat logprobs) whose graph the update reuses.
pub(super) type Tracked = (Qwen3, shared_kernels::model::TrackedLogprobs);

/// A step's scoring: trainer logprobs, their agreement with the sampler's, the loss weights
/// per scored row.
pub(super) struct Scored {
    pub(super) batches: Vec<std::ops::Range<usize>>,
    /// This rank's gradient blocks (ranges of the step's sequences, some perhaps empty): each
    /// block's micro-batches fold from zero, and the blocks are added in the pairwise tree.
    pub(super) blocks: Vec<std::ops::Range<usize>>,
    pub(super) trainer_lp: Vec<Vec<f32>>,
    pub(super) entropy: f64,
    pub(super) agreement: Agreement,
    pub(super) corr: Correction,
    pub(super) weights: Vec<f32>,
    pub(super) kl_ref: f64,
    pub(super) logprob_s: f64,
    /// No scoring pass ran: `trainer_lp` holds the sampler's values, which the update's
    /// tracked forward checks as bits (and `agreement`, `entropy` come from there).
    pub(super) verify_in_update: bool,
}

/// Logprobs of every sequence on `model`'s training path without autodiff, a micro-batch at a
/// time, and the mean token entropy over all of them.
pub(super) fn logprobs_by_batch(model: &Qwen3, sequences: &[Vec<u32>], batches: &[std::ops::Range<usize>], distribution: shared_kernels::model::LogprobDistribution) -> Result<(Vec<Vec<f32>>, f64), shared_kernels::model::ModelError> {
    let (mut all, mut entropy_sum, mut rows) = (Vec::with_capacity(sequences.len()), 0.0, 0usize);
    for range in batches {
        let scores = model.sequence_logprobs(&sequences[range.clone()], distribution)?;
        let lp = scores.per_sequence;
        let n: usize = lp.iter().map(Vec::len).sum();
        entropy_sum += scores.mean_entropy * n as f64;
        rows += n;
        all.extend(lp);
    }
    Ok((all, entropy_sum / rows.max(1) as f64))
}

/// A trainer pass that failed, with the keys that bound its device memory.
pub(super) fn pass_error(step: usize, e: shared_kernels::model::ModelError) -> RunError {
    RunError::Other(format!("step {step}: {e} (if the device ran out of memory: lower train.micro_batch_tokens, or sampler.kv_budget_mib / sampler.max_batch, which size the sampler's KV cache held during training)"))
}

fn first_mismatch(completions: &[sampler::Completion], trainer_lp: &[Vec<f32>], positions: &[Vec<usize>]) -> (usize, usize) {
    for (s, comp) in completions.iter().enumerate() {
        for (t, (&q, &row)) in comp.logprobs.iter().zip(&positions[s]).enumerate() {
            if q.to_bits() != trainer_lp[s][row].to_bits() {
                return (s, t);
            }
        }
    }
    (0, 0)
}
