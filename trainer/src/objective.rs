//! The objective of a GRPO step in one place, as the papers define it: group-relative advantages
//! (GRPO, Dr. GRPO), DAPO's overlong penalty, the ablation's corrections (TIS, MIS, PPO-clip
//! against the sampler), the clipped surrogate's coefficients of PPO epochs (PPO, DAPO's
//! clip-higher, GSPO's sequence ratio), the loss aggregation divisors (token mean, sequence mean,
//! constant) and the per-token loss weights with the reference model's KL term. Plain functions
//! of numbers: `grpo/score.rs` gets the trainer's logprobs and calls them, `grpo/update.rs`
//! backpropagates `sum(weight x logprob)` (`backward.rs`).
//!
//! The policy-gradient loss is `sum_t w_t logprob_t` with `w_t = -c_t A / divisor` (+ the KL
//! term), so its gradient is the one of `-(1/divisor) sum_t c_t A logprob_t`.

use crate::config::{AblationSection, Advantage, Correction as CorrectionKind, LossAggregation, RatioLevel, TrainSection};

/// Group-relative advantages: `group_std` (GRPO) divides by the group's std (+ 1e-6),
/// `group_mean` (Dr. GRPO) only subtracts the group mean.
pub fn group_advantages(rewards: &[f64], group: usize, kind: Advantage) -> Vec<f64> {
    let mut out = vec![0.0f64; rewards.len()];
    for (k, chunk) in rewards.chunks(group).enumerate() {
        let mean = chunk.iter().sum::<f64>() / chunk.len() as f64;
        let std = (chunk.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / chunk.len() as f64).sqrt();
        for (j, r) in chunk.iter().enumerate() {
            out[k * group + j] = if kind == Advantage::GroupMean { r - mean } else { (r - mean) / (std + 1e-6) };
        }
    }
    out
}

/// The ablation's correction of a step, for telemetry: the sampler-to-trainer ratios and the
/// weights they became (after truncation or masking), and the share of tokens truncated or masked.
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

/// Per completion token the policy-gradient coefficient c_t·A, c_t from `ablation.correction`
/// (1 with none; TIS the ratio capped at `tis_cap`; MIS the ratio, or 0 outside
/// [1/threshold, threshold]; PPO-clip the ratio, or 0 where the clip holds), the ratio r =
/// exp(trainer - sampler logprob) per token or per sequence (`ablation.level`). `positions[s][t]`
/// is the row of sequence s's logprobs that scores its sampled token t (one turn: the rows from
/// prompt_len - 1 on; an episode's: its sampled turns' rows only).
pub fn correction_coefficients(a: &AblationSection, positions: &[Vec<usize>], completions: &[sampler::Completion], trainer_lp: &[Vec<f32>], adv: &[f64]) -> (Vec<f64>, Correction) {
    let mut out = Vec::new();
    let mut corr = Correction { ratio_min: f64::INFINITY, ratio_max: 0.0, weight_min: f64::INFINITY, weight_max: 0.0, ..Default::default() };
    let mut n = 0usize;
    for (s, comp) in completions.iter().enumerate() {
        let log_ratios: Vec<f64> = comp.logprobs.iter().zip(&positions[s]).map(|(&q, &row)| trainer_lp[s][row] as f64 - q as f64).collect();
        let seq_log_ratio: f64 = log_ratios.iter().sum();
        let seq_mean_log_ratio = seq_log_ratio / log_ratios.len().max(1) as f64;
        for &lr_t in &log_ratios {
            let ratio = match (a.level, a.correction) {
                (RatioLevel::Sequence, CorrectionKind::PpoClip) => seq_mean_log_ratio.exp(),
                (RatioLevel::Sequence, _) => seq_log_ratio.exp(),
                (RatioLevel::Token, _) => lr_t.exp(),
            };
            corr.ratio_min = corr.ratio_min.min(ratio);
            corr.ratio_max = corr.ratio_max.max(ratio);
            corr.ratio_mean += ratio;
            n += 1;
            let weight = match a.correction {
                CorrectionKind::Tis => {
                    if ratio > a.tis_cap {
                        corr.truncated_frac += 1.0;
                    }
                    ratio.min(a.tis_cap)
                }
                CorrectionKind::Mis => {
                    if ratio < 1.0 / a.mis_threshold || ratio > a.mis_threshold {
                        corr.masked_frac += 1.0;
                        0.0
                    } else {
                        ratio
                    }
                }
                CorrectionKind::PpoClip => {
                    let clipped = (adv[s] > 0.0 && ratio > 1.0 + a.ppo_clip) || (adv[s] < 0.0 && ratio < 1.0 - a.ppo_clip);
                    if clipped {
                        corr.masked_frac += 1.0;
                        0.0
                    } else {
                        ratio
                    }
                }
                CorrectionKind::None => 1.0,
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
    (out, corr)
}

/// The loss weight of every position a sequence's logprobs score (`seq_lens[s] - 1` of them;
/// 0 except at the sampled tokens' rows `positions[s]`, so prompts, tool results and template
/// text weigh nothing): `-coef / divisor` ([`aggregation_divisor`]), and with a reference
/// model (`ref_lp`) the gradient of `train.kl_coef` x the k3 KL estimate, `kl_coef (1 - e^d) /
/// n` for d = reference - trainer logprob. `completion_lens[s]` is completion s's token count,
/// `n_tokens` the step's sampled tokens. Returns the weights and the mean k3 KL to the reference.
#[allow(clippy::too_many_arguments)]
pub fn token_weights(train: &TrainSection, max_new_tokens: usize, seq_lens: &[usize], positions: &[Vec<usize>], n_tokens: f64, coef: &[f64], trainer_lp: &[Vec<f32>], ref_lp: Option<&[Vec<f32>]>) -> (Vec<f32>, f64) {
    let mut weights = Vec::with_capacity(coef.len());
    let mut kl_ref = 0.0;
    let mut at = 0;
    for (s, &len) in seq_lens.iter().enumerate() {
        let divisor = aggregation_divisor(train.loss_aggregation, positions[s].len(), positions.len(), n_tokens, max_new_tokens);
        let mut rows = vec![0.0f64; len - 1];
        for &t in &positions[s] {
            let mut w = -coef[at] / divisor;
            if let Some(rl) = ref_lp {
                let d = (rl[s][t] - trainer_lp[s][t]) as f64;
                kl_ref += (d.exp() - d - 1.0) / n_tokens;
                w += train.kl_coef * (1.0 - d.exp()) / n_tokens;
            }
            rows[t] = w;
            at += 1;
        }
        weights.extend(rows.iter().map(|&w| w as f32));
    }
    (weights, kl_ref)
}

/// The rows of a single-turn sequence's logprobs that score its completion's `completion_len`
/// tokens: from `prompt_len - 1` on.
pub fn completion_rows(prompt_len: usize, completion_len: usize) -> Vec<usize> {
    (prompt_len - 1..prompt_len - 1 + completion_len).collect()
}

/// What a sequence's token terms are divided by (`train.loss_aggregation`): every rollout token
/// of the step (`token_mean`), the sequence's own length times the sequences (`sequence_mean`),
/// or rollouts x max_new_tokens (`constant`, Dr. GRPO).
pub fn aggregation_divisor(kind: LossAggregation, seq_tokens: usize, sequences: usize, step_tokens: f64, max_new_tokens: usize) -> f64 {
    match kind {
        LossAggregation::SequenceMean => (seq_tokens.max(1) * sequences.max(1)) as f64,
        LossAggregation::Constant => (sequences.max(1) * max_new_tokens.max(1)) as f64,
        LossAggregation::TokenMean => step_tokens.max(1.0),
    }
}

/// Clipped-surrogate coefficients of one completion: for each token the derivative of
/// `min(r A, clip(r, 1 - low, 1 + high) A)` with respect to its logprob, `r A` inside the clip
/// range and 0 where the clip holds (`r` = exp(new - old)). `sequence` (GSPO): one ratio for
/// the completion, exp of the mean log-ratio, whose derivative spreads as `r A / len` over its
/// tokens. Returns the coefficients, the ratios and how many tokens were clipped.
pub fn surrogate_coefficients(new: &[f32], old: &[f32], adv: f64, low: f64, high: f64, sequence: bool) -> (Vec<f64>, Vec<f64>, usize) {
    let log_ratios: Vec<f64> = new.iter().zip(old).map(|(&n, &o)| n as f64 - o as f64).collect();
    let clipped = |r: f64| (adv > 0.0 && r > 1.0 + high) || (adv < 0.0 && r < 1.0 - low);
    if sequence {
        let len = log_ratios.len().max(1) as f64;
        let r = (log_ratios.iter().sum::<f64>() / len).exp();
        let (coef, n) = if clipped(r) { (0.0, log_ratios.len()) } else { (r * adv / len, 0) };
        return (vec![coef; log_ratios.len()], vec![r; log_ratios.len()], n);
    }
    let ratios: Vec<f64> = log_ratios.iter().map(|l| l.exp()).collect();
    let coefs = ratios.iter().map(|&r| if clipped(r) { 0.0 } else { r * adv }).collect();
    let n = ratios.iter().filter(|&&r| clipped(r)).count();
    (coefs, ratios, n)
}

/// DAPO's soft overlong punishment of a completion of `len` tokens: 0 up to max_new - buffer,
/// then growing linearly to `penalty` at max_new (0 when `buffer` is 0).
pub fn overlong_penalty(len: usize, max_new: usize, buffer: usize, penalty: f64) -> f64 {
    if buffer == 0 || len + buffer <= max_new {
        return 0.0;
    }
    penalty * ((len + buffer - max_new) as f64 / buffer as f64).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clipped_surrogate_keeps_ratios_inside_the_range_and_zeroes_the_clipped_ones() {
        let ln = |r: f64| r.ln() as f32;
        // the first PPO update in matched mode: new = old as bits, ratio exactly 1, coefficient A
        let (c, r, n) = surrogate_coefficients(&[-1.5, -0.25], &[-1.5, -0.25], 2.0, 0.2, 0.28, false);
        assert_eq!((c, r, n), (vec![2.0, 2.0], vec![1.0, 1.0], 0));
        // clip-higher: A > 0 clips above 1.28 only, A < 0 below 0.8 only
        let (c, _, n) = surrogate_coefficients(&[ln(1.25), ln(1.3), ln(0.5)], &[0.0; 3], 1.0, 0.2, 0.28, false);
        assert!((c[0] - 1.25).abs() < 1e-6 && c[1] == 0.0 && (c[2] - 0.5).abs() < 1e-6 && n == 1, "{c:?}");
        let (c, _, n) = surrogate_coefficients(&[ln(0.79), ln(1.3)], &[0.0; 2], -1.0, 0.2, 0.28, false);
        assert!(c[0] == 0.0 && (c[1] + 1.3).abs() < 1e-6 && n == 1, "{c:?}");
        // GSPO: one ratio, exp(mean log-ratio) = sqrt(1.21 * 1.0) = 1.1, spread as r A / len
        let (c, r, n) = surrogate_coefficients(&[ln(1.21), 0.0], &[0.0, 0.0], 1.0, 0.2, 0.2, true);
        assert!((r[0] - 1.1).abs() < 1e-6 && r[0] == r[1] && (c[0] - 0.55).abs() < 1e-6 && c[0] == c[1] && n == 0, "{c:?} {r:?}");
        let (c, _, n) = surrogate_coefficients(&[ln(1.69), 0.0], &[0.0, 0.0], 1.0, 0.2, 0.2, true);
        assert!(c == vec![0.0, 0.0] && n == 2, "the sequence's ratio 1.3 is clipped: {c:?}");
    }

    /// An agent episode: rows 2, 3 and 7 of a 10-token sequence score sampled tokens; the
    /// prompt, tool-result and template rows in between weigh nothing, and the correction's
    /// ratios are read at the sampled rows.
    #[test]
    fn only_the_sampled_rows_of_an_episode_carry_loss_and_ratios() {
        let train = TrainSection::default();
        let positions = vec![vec![2, 3, 7]];
        let (w, _) = token_weights(&train, 8, &[10], &positions, 3.0, &[1.0, 2.0, 3.0], &[vec![0.0; 9]], None);
        let want: Vec<f32> = (0..9).map(|r| match r { 2 => -1.0 / 3.0, 3 => -2.0 / 3.0, 7 => -1.0, _ => 0.0 } as f32).collect();
        assert_eq!(w, want);
        let comp = sampler::Completion { id: 0, prompt_len: 3, tokens: vec![5, 6, 7], logprobs: vec![-1.0, -2.0, -3.0], top_logprobs: Vec::new(), routing: Vec::new(), finish: sampler::FinishReason::Stop, timings: Default::default() };
        let mut trainer_lp = vec![f32::NAN; 9];
        for (&row, lp) in [2usize, 3, 7].iter().zip([-1.0f32, -2.0, -3.0 + 0.5]) {
            trainer_lp[row] = lp;
        }
        let ablation = AblationSection { correction: CorrectionKind::Tis, ..Default::default() };
        let (coef, corr) = correction_coefficients(&ablation, &positions, &[comp], &[trainer_lp], &[1.0]);
        assert_eq!(coef[..2], [1.0, 1.0]);
        assert!((coef[2] - ablation.tis_cap.min(0.5f64.exp())).abs() < 1e-6 && corr.ratio_min == 1.0, "{coef:?}");
    }

    #[test]
    fn advantages_aggregation_and_the_overlong_penalty_follow_their_papers() {
        let a = group_advantages(&[1.0, 0.0, 0.0, 2.0, 2.0, 2.0], 3, Advantage::GroupStd);
        let std = (2.0f64 / 9.0).sqrt();
        assert!((a[0] - (2.0 / 3.0) / (std + 1e-6)).abs() < 1e-9 && a[4] == 0.0 && a[5] == 0.0, "{a:?}");
        let b = group_advantages(&[1.0, 0.0, 0.0], 3, Advantage::GroupMean);
        assert!((b[0] - 2.0 / 3.0).abs() < 1e-12 && (b[1] + 1.0 / 3.0).abs() < 1e-12);
        // 4 sequences, 40 rollout tokens, this one 5 long, max_new 16
        assert_eq!(aggregation_divisor(LossAggregation::TokenMean, 5, 4, 40.0, 16), 40.0);
        assert_eq!(aggregation_divisor(LossAggregation::SequenceMean, 5, 4, 40.0, 16), 20.0);
        assert_eq!(aggregation_divisor(LossAggregation::Constant, 5, 4, 40.0, 16), 64.0);
        assert_eq!(overlong_penalty(12, 16, 4, 1.0), 0.0);
        assert_eq!(overlong_penalty(14, 16, 4, 1.0), 0.5);
        assert_eq!(overlong_penalty(16, 16, 4, 0.5), 0.5);
        assert_eq!(overlong_penalty(16, 16, 0, 1.0), 0.0);
    }

    /// The policy-gradient step's direction, with prompts and completions of different lengths in
    /// one batch: with loss weights -A/N on each completion's rows (those predicting its tokens),
    /// the loss equals -sum(A * logprob) / N read from the per-sequence logprobs (the flat rows
    /// the backward weighs are those rows, in order), and one backward plus one AdamW step raises
    /// that sum (a flipped sign lowers it: checked by hand once).
    #[test]
    fn a_policy_gradient_step_raises_the_advantage_weighted_logprobs() {
        use crate::backward::{tracked_copy, weighted_backward, with_folded};
        use crate::optim::AdamW;
        use shared_kernels::grad_fold::GradFold;
        use rand::{Rng, SeedableRng};
        use shared_kernels::model::{tiny_config, Checkpoint, Qwen3};
        let device = shared_kernels::device::default_device();
        let seed = shared_kernels::testing::rows::test_seed();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let model = Qwen3::from_checkpoint(&Checkpoint::random(tiny_config(97, true), 0.08, rng.random()), burn::tensor::DType::F32, &device).unwrap();
        let (mut sequences, mut prompt_lens, mut advantages) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..6 {
            let (p, c) = (rng.random_range(2..12), rng.random_range(1..14));
            sequences.push((0..p + c).map(|_| rng.random_range(0..97u32)).collect::<Vec<_>>());
            prompt_lens.push(p);
            advantages.push(rng.random_range(-1.5..1.5f64));
        }
        let tokens: usize = sequences.iter().zip(&prompt_lens).map(|(s, p)| s.len() - p).sum();
        let objective = |lp: &[Vec<f32>]| -> f64 {
            lp.iter().zip(&prompt_lens).zip(&advantages).map(|((rows, &p), a)| rows[p - 1..].iter().map(|&x| a * x as f64).sum::<f64>()).sum::<f64>() / tokens as f64
        };
        let mut weights = Vec::new();
        for ((s, &p), a) in sequences.iter().zip(&prompt_lens).zip(&advantages) {
            weights.extend((0..s.len() - 1).map(|t| if t + 1 >= p { (-a / tokens as f64) as f32 } else { 0.0 }));
        }
        let tracked = tracked_copy(&model);
        let (before, logprobs) = tracked.training_logprobs(&sequences, 1.0, false).unwrap();
        let mut fold = GradFold::new();
        let (loss, grads) = weighted_backward(&tracked, logprobs, &weights, &mut fold, "test", "train.lr").unwrap();
        assert!((loss + objective(&before)).abs() < 1e-5, "the loss is -objective: {loss} vs {} (seed {seed})", objective(&before));
        let stepped = AdamW::new(0.9, 0.99, 1e-8, 0.0).step(&model, &with_folded(grads, fold), 1e-4);
        let (after, _) = tracked_copy(&stepped).training_logprobs(&sequences, 1.0, false).unwrap();
        let (j0, j1) = (objective(&before), objective(&after));
        let lengths: Vec<(usize, usize)> = sequences.iter().zip(&prompt_lens).map(|(s, &p)| (p, s.len() - p)).collect();
        assert!(j1 > j0 + 1e-6, "sum(A * logprob) / N fell or held: {j0} -> {j1} (seed {seed}, prompt/completion lengths {lengths:?}, advantages {advantages:?})");
    }
}
