//! The training path's scoring: the logprob (at a temperature) of every token after the first of
//! each whole sequence, given its prefix, and the mean token entropy. The LM head runs fused
//! with the logprob in chunks of rows ([`crate::head_logprobs`]): the `[rows, vocab]` logits
//! never exist at once.

use super::forward::Tokens;
use super::{ModelError, Qwen3, Rows};
use crate::WeightLayout::OutIn;
use burn::tensor::{Int, Tensor, TensorData};

/// The distribution a token is scored under: `softmax(logits / temperature)` (temperature 0
/// scored at 1), restricted to its top-k / top-p set and renormalised when those truncate
/// (processed logprobs, what a sampler with `processed_logprobs` returns); `top_k` 0 and
/// `top_p` 1 keep the full distribution. An `f32` is the full distribution at that temperature.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogprobDistribution {
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
}

impl LogprobDistribution {
    /// The full softmax at `temperature` (raw logprobs).
    pub fn full(temperature: f32) -> Self {
        Self { temperature, top_k: 0, top_p: 1.0 }
    }
}

impl From<f32> for LogprobDistribution {
    fn from(temperature: f32) -> Self {
        Self::full(temperature)
    }
}

/// What scoring returns.
pub struct Scores {
    /// Each sequence's logprobs of its tokens after the first (length len - 1).
    pub per_sequence: Vec<Vec<f32>>,
    /// The same values as one device tensor, in the same order (tracked on an autodiff device).
    pub flat: Tensor<1>,
    /// Mean token entropy over the scored tokens (a metric).
    pub mean_entropy: f64,
}

impl Qwen3 {
    /// The training path's logprobs of `sequences` (see the module doc).
    pub fn sequence_logprobs(&self, sequences: &[Vec<u32>], distribution: impl Into<LogprobDistribution>) -> Result<Scores, ModelError> {
        let rows = self.training_rows(sequences)?;
        let x = self.final_hidden(&rows, Tokens::Host, None, None, None, None)?;
        self.score_rows(x, &rows, sequences, distribution.into())
    }

    /// The training path's rows for `sequences`: every sequence whole, padded to whole fold
    /// granules (a micro-batch of whole sequences then starts on a granule, so the folded
    /// weight gradients' bits do not see the micro-batching).
    pub(crate) fn training_rows(&self, sequences: &[Vec<u32>]) -> Result<Rows, ModelError> {
        if let Some(i) = sequences.iter().position(|s| s.len() < 2) {
            return Err(ModelError::Input(format!("sequence {i} has fewer than 2 tokens: nothing to score")));
        }
        Ok(Rows::whole_padded(sequences, crate::grad_fold::FOLD_ROWS, self.config.max_position_embeddings))
    }

    /// The LM head and logprobs on the final-normed training rows `x` of `sequences`.
    pub(crate) fn score_rows(&self, x: Tensor<2>, rows: &Rows, sequences: &[Vec<u32>], distribution: LogprobDistribution) -> Result<Scores, ModelError> {
        let LogprobDistribution { temperature, top_k, top_p } = distribution;
        let granule = crate::grad_fold::FOLD_ROWS;
        let device = x.device();
        // every row runs through the head (a sequence's last row and the padding with a
        // stand-in target 0, then dropped), so the head's weight gradient walks every row
        let mut targets = Vec::with_capacity(rows.len());
        let mut keep = Vec::with_capacity(rows.len());
        for seq in sequences {
            for p in 0..seq.len() {
                if p + 1 < seq.len() {
                    keep.push(targets.len() as i32);
                    targets.push(seq[p + 1] as i32);
                } else {
                    targets.push(0);
                }
            }
            targets.extend(std::iter::repeat_n(0, super::cache::padding_rows(seq.len(), granule)));
        }
        debug_assert_eq!(targets.len(), rows.len());
        let (n, m) = (targets.len(), keep.len());
        let tg = Tensor::<1, Int>::from_data(TensorData::new(targets, [n]), &device);
        let temps = Tensor::<1>::from_data(TensorData::new(vec![temperature; n], [n]), &device);
        // greedy (T = 0) is scored on the full distribution at T = 1, as the sampler returns it
        let truncation = crate::Truncation::uniform(temperature, top_k, top_p, n, self.config.vocab_size, &device);
        let scored = if self.kernels.is_matched() {
            crate::truncated_head_logprobs(x, self.head(), tg, temps, truncation.as_ref())?
        } else {
            // the ablation's kernels: their own matmul for the head, then the logprob
            crate::truncated_token_logprobs(self.kernels.matmul(x, self.head(), OutIn)?, tg, temps, truncation.as_ref())?
        };
        let index = |on: &burn::tensor::Device| Tensor::<1, Int>::from_data(TensorData::new(keep.clone(), [m]), on);
        // the entropy is a metric, on the plain device even when the logprobs are tracked
        let entropy = scored.entropy.clone().select(0, index(&scored.entropy.device()));
        let flat = scored.logprobs.select(0, index(&device));
        // a device failure (out of memory, most often) is an error naming the pass, not a panic
        let read = |t: Tensor<1>, what: &str| -> Result<Vec<f32>, ModelError> {
            let data = t.try_into_data().map_err(|e| ModelError::Input(format!("the training path's forward over {} sequences ({n} rows) failed on the device while reading its {what}: {e}", sequences.len())))?;
            data.convert::<f32>().try_to_vec::<f32>().map_err(|e| ModelError::Input(format!("{what} read-back: {e:?}")))
        };
        let host_entropy = read(entropy, "entropy")?;
        let mean_entropy = host_entropy.iter().map(|&v| v as f64).sum::<f64>() / m.max(1) as f64;
        let host = read(flat.clone(), "logprob")?;
        let mut per_sequence = Vec::with_capacity(sequences.len());
        let mut at = 0;
        for seq in sequences {
            per_sequence.push(host[at..at + seq.len() - 1].to_vec());
            at += seq.len() - 1;
        }
        Ok(Scores { per_sequence, flat, mean_entropy })
    }
}
