//! When a sampler logprob and a trainer logprob differ in bits, find where: replay the token
//! through both paths with every op's output recorded, and report the first op whose row for
//! that token differs.

use burn::tensor::{DType, Tensor};
use super::{KvCache, ModelError, Qwen3, Rows};

fn row_bits(t: &Tensor<2>, row: usize) -> Vec<f32> {
    let [_, width] = t.dims();
    t.clone().slice([row..row + 1, 0..width]).cast(DType::F32).into_data().convert::<f32>().try_to_vec::<f32>().expect("f32")
}

/// The first op (in forward order) at which `sampler`'s stepping path and `trainer`'s training
/// path disagree on the token at `position` of `sequence` (its logits predict position + 1).
pub fn first_divergence(trainer: &Qwen3, sampler: &Qwen3, sequence: &[u32], position: usize) -> Result<String, ModelError> {
    let mut train_trace = Vec::new();
    trainer.forward_traced(&Rows::whole(&[sequence.to_vec()]), None, Some(&mut train_trace))?;
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
    let mut step_trace = Vec::new();
    sampler.forward_traced(&step, Some(&mut cache), Some(&mut step_trace))?;
    for ((name, a), (_, b)) in train_trace.iter().zip(&step_trace) {
        let (x, y) = (row_bits(a, position), row_bits(b, 0));
        let differing = x.iter().zip(&y).filter(|(p, q)| p.to_bits() != q.to_bits()).count();
        if differing > 0 {
            let max = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
            return Ok(format!("first divergence at `{name}`: {differing}/{} values differ (max |diff| {max:.3e})", x.len()));
        }
    }
    Ok("no op output differs for this token (the difference arises after the logits: sampling/logprob kernels)".into())
}
