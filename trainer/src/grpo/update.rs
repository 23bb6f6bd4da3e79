//! GRPO phase 5: the update: one policy-gradient step folded over micro-batches, or PPO epochs
//! of mini-batches; the ablation's correction coefficients.

use super::rollouts::Rollouts;
use super::score::{pass_error, Scored, Tracked};
use super::Trainer;
use crate::config::RatioLevel;
use crate::objective::{aggregation_divisor, surrogate_coefficients, Correction};
use crate::backward::{accumulate, micro_batches, nonfinite_suspects, tracked_copy, weighted_backward, with_folded};
use crate::optim::clip;
use crate::error::RunError;
use crate::telemetry::Agreement;
use shared_kernels::grad_fold::GradFold;
use crate::distributed::tree::PairwiseSum;

impl Trainer {
    /// Phase 5: the update: PPO epochs, or one policy-gradient step whose weight gradients are
    /// folded over the tokens in order across micro-batches (its bits do not depend on
    /// `train.micro_batch_tokens`). Returns the loss, the gradient norm and the ratio statistics.
    /// With `scored.verify_in_update`, also the agreement and entropy its forward measured.
    pub(super) fn update(&mut self, step: usize, r: &Rollouts, single: Option<Tracked>, scored: &Scored, lr: f64) -> Result<(f64, f64, Correction, Option<(Agreement, f64)>), RunError> {
        if self.ppo() {
            return self.ppo_updates(step, &r.sequences, &r.positions, &r.completions, &r.advantages, lr).map(|(l, g, c)| (l, g, c, None));
        }
        let c = self.cfg.clone();
        let (sequences, weights, trainer_lp) = (&r.sequences, &scored.weights, &scored.trainer_lp);
        let mut verified = None;
        let partial = match single {
            Some((tracked, flat)) => {
                let mut fold = GradFold::new();
                let (loss, grads) = weighted_backward(&tracked, flat, weights, &mut fold, &format!("step {step}"), &nonfinite_suspects(&c.model.path, "train.lr"))?;
                Some((loss, with_folded(grads, fold)))
            }
            None => {
                // the update a micro-batch at a time: its tracked forward must give the scoring
                // pass's bits (batch invariance). Each gradient block folds its micro-batches
                // from zero (gradients not folded are summed in f32 in order), and the blocks
                // are added in the pairwise tree.
                // this rank's rows start after the earlier ranks' sequences' (one row a token but the first)
                let first = scored.batches.first().map_or(0, |b| b.start);
                let mut row = sequences[..first].iter().map(|s| s.len() - 1).sum::<usize>();
                let first_row = row;
                let (mut sampler_all, mut trainer_all, mut entropy_sum) = (Vec::new(), Vec::new(), 0.0);
                let mut blocks = PairwiseSum::default();
                for block in &scored.blocks {
                    let (mut fold, mut loss, mut total) = (GradFold::new(), 0.0, std::collections::BTreeMap::new());
                    let in_block: Vec<&std::ops::Range<usize>> = scored.batches.iter().filter(|b| block.contains(&b.start)).collect();
                    for range in &in_block {
                        let range = (*range).clone();
                        let tracked = tracked_copy(&self.policy.model);
                        let (lp, flat) = tracked.training_logprobs(&sequences[range.clone()], c.sampler.logprob_distribution(), c.train.recompute_layers.on()).map_err(|e| pass_error(step, e))?;
                        if scored.verify_in_update {
                            // the contract, checked here instead of a scoring pass: every completion
                            // token's logprob equals the sampler's as bits, before any weight moves
                            let (mut q, mut p) = (Vec::new(), Vec::new());
                            for (k, s) in range.clone().enumerate() {
                                q.extend_from_slice(&r.completions[s].logprobs);
                                p.extend(r.positions[s].iter().map(|&row| lp[k][row]));
                            }
                            let part = Agreement::of(&q, &p);
                            if part.bit_equal_frac < 1.0 {
                                let within = range.clone();
                                let report = self.mismatch_report(step, r, &lp, range.start, &part, |_| within.clone())?;
                                let at = scored.batches.iter().position(|b| *b == range).unwrap_or(0);
                                return Err(RunError::Other(format!("{report} (found by the update's check of micro-batch {} of {}, before the optimizer step)", at + 1, scored.batches.len())));
                            }
                            let rows: usize = lp.iter().map(Vec::len).sum();
                            entropy_sum += flat.mean_entropy * rows as f64;
                            sampler_all.extend(q);
                            trainer_all.extend(p);
                        } else if let Some((k, _)) = lp.iter().zip(&trainer_lp[range.clone()]).enumerate().find(|(_, (a, b))| a.iter().map(|x| x.to_bits()).ne(b.iter().map(|x| x.to_bits()))) {
                            return Err(RunError::Other(format!("step {step}: sequence {}'s logprobs in its tracked micro-batch ({} sequences) differ in bits from the scoring pass", range.start + k, range.len())));
                        }
                        let rows: usize = lp.iter().map(Vec::len).sum();
                        let (part, grads) = weighted_backward(&tracked, flat, &weights[row..row + rows], &mut fold, &format!("step {step}"), &nonfinite_suspects(&c.model.path, "train.lr"))?;
                        loss += part;
                        accumulate(&mut total, grads);
                        row += rows;
                    }
                    blocks.push((!in_block.is_empty()).then(|| (loss, with_folded(total, fold))), &mut add_partials);
                }
                if scored.verify_in_update {
                    // every rank's checked tokens (one rank: its own are all)
                    let what = format!("step {step}: checked logprobs");
                    let sampler_all: Vec<f32> = self.gather_rows(&what, vec![sampler_all])?.concat();
                    let trainer_all: Vec<f32> = self.gather_rows(&what, vec![trainer_all])?.concat();
                    let rows = self.sum_f64(&format!("{what}: rows"), Some((row - first_row) as f64))?.unwrap_or(0.0);
                    let entropy_sum = self.sum_f64(&format!("{what}: entropy"), Some(entropy_sum))?.unwrap_or(0.0);
                    verified = Some((Agreement::of(&sampler_all, &trainer_all), entropy_sum / rows.max(1.0)));
                }
                blocks.finish(&mut add_partials)
            }
        };
        let (loss_value, grads) = self.sum_partials(step, "", partial)?;
        let mut grads = grads;
        let grad_norm = clip(&mut grads, c.train.grad_clip);
        if !grad_norm.is_finite() {
            return Err(RunError::Other(format!("step {step}: the gradient norm is {grad_norm}; stopping before the update (the last checkpoint is intact). Non-finite gradients come from the weights: {}", nonfinite_suspects(&c.model.path, "train.lr"))));
        }
        self.optimizer_step(step, &grads, lr)?;
        Ok((loss_value, grad_norm, scored.corr.clone(), verified))
    }

    /// PPO epochs over the step's rollouts: `train.ppo_epochs` passes, each `train.mini_batches`
    /// optimizer steps on consecutive slices of the rollouts, with the clipped surrogate against
    /// the sampler's logprobs (in matched mode the old policy's, as bits, so no recompute pass);
    /// each mini-batch's weight gradients folded over its micro-batches as in the single update.
    /// Returns the first update's loss, the last one's gradient norm, and the ratio statistics
    /// over every update (`masked_frac`: the clipped fraction of tokens).
    pub(super) fn ppo_updates(&mut self, step: usize, sequences: &[Vec<u32>], positions: &[Vec<usize>], completions: &[sampler::Completion], adv: &[f64], lr: f64) -> Result<(f64, f64, Correction), RunError> {
        let c = self.cfg.clone();
        let (n, m) = (sequences.len(), c.train.mini_batches);
        let ranges: Vec<std::ops::Range<usize>> = (0..m).map(|b| b * n / m..(b + 1) * n / m).filter(|r| !r.is_empty()).collect();
        let sequence_level = c.train.ratio_level == RatioLevel::Sequence;
        let mut corr = Correction { ratio_min: f64::INFINITY, ratio_max: 0.0, ..Default::default() };
        let (mut seen, mut first_loss, mut grad_norm) = (0usize, None, 0.0);
        for _epoch in 0..c.train.ppo_epochs {
            for range in &ranges {
                let mini_tokens = range.clone().map(|s| completions[s].tokens.len()).sum::<usize>().max(1) as f64;
                let divide_by = range.len() as f64;
                // this rank's gradient blocks of the mini-batch's sequences (data parallel: its
                // share), each folded from zero, added in the pairwise tree
                let mut blocks = PairwiseSum::default();
                for block in self.own_blocks(range.len(), 1) {
                    if block.is_empty() {
                        blocks.push(None, &mut add_partials);
                        continue;
                    }
                    let range = &(range.start + block.start..range.start + block.end);
                    let mini = &sequences[range.clone()];
                    let lengths: Vec<usize> = mini.iter().map(Vec::len).collect();
                    let mut fold = GradFold::new();
                    let (mut loss, mut total) = (0.0, std::collections::BTreeMap::new());
                    for b in micro_batches(&lengths, c.train.pass_tokens()).into_iter().filter(|b| !b.is_empty()) {
                        let tracked = tracked_copy(&self.policy.model);
                        let (lp, flat) = tracked.training_logprobs(&mini[b.clone()], c.sampler.logprob_distribution(), c.train.recompute_layers.on()).map_err(|e| pass_error(step, e))?;
                        let mut weights = Vec::new();
                        for (k, seq_lp) in lp.iter().enumerate() {
                            let s = range.start + b.start + k;
                            let old = &completions[s].logprobs;
                            let new: Vec<f32> = positions[s].iter().map(|&row| seq_lp[row]).collect();
                            let (coefs, ratios, clipped) = surrogate_coefficients(&new, old, adv[s], c.train.clip_low, c.train.clip_high, sequence_level);
                            for &r in &ratios {
                                corr.ratio_min = corr.ratio_min.min(r);
                                corr.ratio_max = corr.ratio_max.max(r);
                                corr.ratio_mean += r;
                            }
                            corr.masked_frac += clipped as f64;
                            seen += ratios.len();
                            // GSPO averages sequences (its coefficients carry 1 / length already)
                            let divisor = if sequence_level { divide_by } else { aggregation_divisor(c.train.loss_aggregation, old.len(), divide_by as usize, mini_tokens, c.sampler.max_new_tokens) };
                            let mut rows = vec![0.0f32; seq_lp.len()];
                            for (&row, &x) in positions[s].iter().zip(&coefs) {
                                rows[row] = (-x / divisor) as f32;
                            }
                            weights.extend(rows);
                        }
                        let (part, grads) = weighted_backward(&tracked, flat, &weights, &mut fold, &format!("step {step}"), &nonfinite_suspects(&c.model.path, "train.lr"))?;
                        loss += part;
                        accumulate(&mut total, grads);
                    }
                    blocks.push(Some((loss, with_folded(total, fold))), &mut add_partials);
                }
                let (loss, mut grads) = self.sum_partials(step, "PPO ", blocks.finish(&mut add_partials))?;
                grad_norm = clip(&mut grads, c.train.grad_clip);
                if !grad_norm.is_finite() {
                    return Err(RunError::Other(format!("step {step}: the gradient norm is {grad_norm} in a PPO mini-batch; stopping before the update (the last checkpoint is intact). Non-finite gradients come from the weights: {}", nonfinite_suspects(&c.model.path, "train.lr"))));
                }
                first_loss.get_or_insert(loss);
                self.optimizer_step(step, &grads, lr)?;
            }
        }
        // every rank's ratio statistics
        let parts = self.gather_f64s(&format!("step {step}: PPO ratios"), vec![corr.ratio_min, corr.ratio_max, corr.ratio_mean, corr.masked_frac, seen as f64])?;
        if parts.len() > 1 {
            corr.ratio_min = parts.iter().map(|p| p[0]).fold(f64::INFINITY, f64::min);
            corr.ratio_max = parts.iter().map(|p| p[1]).fold(0.0, f64::max);
            corr.ratio_mean = parts.iter().map(|p| p[2]).sum();
            corr.masked_frac = parts.iter().map(|p| p[3]).sum();
            seen = parts.iter().map(|p| p[4]).sum::<f64>() as usize;
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

    /// A rank's (loss, weight gradients) summed over the ranks in the pairwise tree (a rank
    /// with none passes `None`).
    fn sum_partials(&self, step: usize, kind: &str, partial: Option<Partial>) -> Result<Partial, RunError> {
        let (loss, grads) = partial.map_or((None, None), |(l, g)| (Some(l), Some(g)));
        let loss = self.sum_f64(&format!("step {step}: {kind}loss"), loss)?.unwrap_or(0.0);
        Ok((loss, self.sum_gradients(&format!("step {step}: {kind}gradients"), grads)?))
    }
}

/// A loss and its weight gradients by name: a gradient block's, a rank's, or the step's.
type Partial = (f64, std::collections::BTreeMap<String, burn::tensor::Tensor<1>>);

fn add_partials(a: Partial, b: Partial) -> Partial {
    let (loss, mut grads) = a;
    accumulate(&mut grads, b.1);
    (loss + b.0, grads)
}

