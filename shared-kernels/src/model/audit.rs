//! When a sampler logprob and a trainer logprob differ in bits, find where: replay the token
//! through both paths with every op's output recorded, and report the first op whose row for
//! that token differs. The trainer side is replayed inside the whole batch that diverged (the
//! same launch sizes: a divergence that only exists at large launches shows there), the sampler
//! side as a prefill of the prefix and one decode step.

use burn::tensor::{DType, Tensor};
use super::{Forward, KvCache, ModelError, Qwen3, Rows, Trace};

fn row_bits(t: &Tensor<2>, row: usize) -> Vec<f32> {
    let [_, width] = t.dims();
    t.clone().slice([row..row + 1, 0..width]).cast(DType::F32).into_data().convert::<f32>().try_to_vec::<f32>().expect("f32")
}

/// The first op (in forward order) at which `sampler`'s stepping path and `trainer`'s training
/// path disagree on the token at `position` of `sequence` (its logits predict position + 1).
pub fn first_divergence(trainer: &Qwen3, sampler: &Qwen3, sequence: &[u32], position: usize) -> Result<String, ModelError> {
    first_divergence_in_batch(trainer, sampler, std::slice::from_ref(&sequence.to_vec()), 0, position, None)
}

/// [`first_divergence`] for sequence `s` of `batch`, the trainer replaying the whole batch;
/// `sampler_logprob` (the bits the sampler returned, and the distribution they were scored under) lets the report say whether the replay
/// reproduced the difference at the logprob when no op before it differs.
pub fn first_divergence_in_batch(trainer: &Qwen3, sampler: &Qwen3, batch: &[Vec<u32>], s: usize, position: usize, sampler_logprob: Option<(f32, super::LogprobDistribution)>) -> Result<String, ModelError> {
    let sequence = &batch[s];
    let row = batch[..s].iter().map(Vec::len).sum::<usize>() + position;
    let mut train_trace = Trace { only_row: Some(row), ..Trace::default() };
    trainer.run(Forward::rows(&Rows::whole(batch)).traced(&mut train_trace))?;
    let device = sampler.embed.device();
    let mut cache = KvCache::new(&sampler.config, 1, sequence.len(), sampler.dtype, &device);
    if position > 0 {
        let mut prefix = Rows::default();
        for (p, &t) in sequence[..position].iter().enumerate() {
            prefix.push(t, 0, p as u32);
        }
        sampler.forward(&prefix, Some(&mut cache))?;
    }
    let mut step = Rows::default();
    step.push(sequence[position], 0, position as u32);
    let mut step_trace = Trace::default();
    sampler.run(Forward::rows(&step).cache(&mut cache).traced(&mut step_trace))?;
    let rows = batch.iter().map(Vec::len).sum::<usize>();
    let launch = format!("trainer replayed in its batch of {} sequences, {rows} rows", batch.len());
    for ((name, a), (_, b)) in train_trace.entries.iter().zip(&step_trace.entries) {
        let (x, y) = (row_bits(a, 0), row_bits(b, 0));
        let differing = x.iter().zip(&y).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
        if differing > 0 {
            let max = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
            return Ok(format!("first divergence at `{name}`: {differing}/{} values differ (max |diff| {max:.3e}; {launch})", x.len()));
        }
    }
    let Some((sampled, distribution)) = sampler_logprob else {
        return Ok(format!("no op output differs for this token ({launch}): the difference arises after the logits (sampling/logprob kernels)"));
    };
    // the trainer's logprob of this token, again inside the whole batch
    let lp = trainer.sequence_logprobs(batch, distribution).ok().and_then(|scores| scores.per_sequence[s].get(position).copied());
    Ok(match lp {
        Some(t) if t.to_bits() == sampled.to_bits() => format!("could not reproduce: replayed at the step's launch sizes ({launch}), every op and the logprob equal the sampler's bits; the difference is in state the replay does not rebuild (the step's weights or launch order)"),
        Some(t) => format!("no op output up to the final norm differs ({launch}); the logprob does: trainer {t:e} vs sampler {sampled:e} (the LM head + logprob kernels at the batch's sizes)"),
        None => format!("no op output differs for this token ({launch}); the logprob replay failed"),
    })
}
