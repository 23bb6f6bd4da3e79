//! Activation recomputation per decoder layer (`train.recompute_layers`): the training forward
//! keeps only each layer's input `[rows, hidden]`, not the layer's activations; the backward
//! then re-runs one layer at a time with autodiff and seeds it with the gradient of that
//! layer's output (the trainer's `optim::weighted_backward`). The forward runs the same kernels
//! on the same rows, so the re-run layer gives the first pass's bits, and each weight receives
//! the same gradient contributions in the same order as in the one-graph backward: the update's
//! bits do not depend on the setting (the trainer's `backward.rs` test
//! `recomputed_layers_give_the_one_graph_gradients_as_bits`).

use super::forward::int_tensor;
use super::pass::Stream;
use super::{LogprobDistribution, ModelError, Qwen3, Rows};
use crate::embedding;
use burn::tensor::{Int, Tensor};

/// What the backward of a recomputed forward needs: the rows and every layer's input, held
/// without a graph, and the leaf the head's graph starts from.
pub struct LayerInputs {
    rows: Rows,
    tokens: Tensor<1, Int>,
    slots: Tensor<1, Int>,
    positions: Tensor<1, Int>,
    /// `inputs[i]`: the residual stream entering layer `i` (untracked).
    inputs: Vec<Tensor<2>>,
    /// The last layer's output as a tracked leaf: the final norm and the head start here.
    last: Tensor<2>,
}

/// A tracked training forward: the flat logprobs (a graph back to the weights, or with
/// recomputation to [`LayerInputs::last`] and the head's weights) and, with recomputation, the
/// layer inputs the backward re-runs from.
pub struct TrackedLogprobs {
    pub flat: Tensor<1>,
    pub layers: Option<LayerInputs>,
    /// Mean token entropy over the scored tokens (a metric).
    pub mean_entropy: f64,
}

impl LayerInputs {
    /// Decoder layers held.
    pub fn len(&self) -> usize {
        self.inputs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty()
    }

    /// The tracked leaf at the last layer's output (its gradient seeds the last layer's re-run).
    pub fn last(&self) -> &Tensor<2> {
        &self.last
    }
}

impl Qwen3 {
    /// The training path's logprobs of `sequences` (as [`Qwen3::sequence_logprobs`]) on a model
    /// whose weights are tracked, with the graph the backward needs: whole, or with `recompute`
    /// only the head's, plus each layer's input.
    pub fn training_logprobs(&self, sequences: &[Vec<u32>], distribution: impl Into<LogprobDistribution>, recompute: bool) -> Result<(Vec<Vec<f32>>, TrackedLogprobs), ModelError> {
        let distribution = distribution.into();
        if !recompute {
            let s = self.sequence_logprobs(sequences, distribution)?;
            return Ok((s.per_sequence, TrackedLogprobs { flat: s.flat, layers: None, mean_entropy: s.mean_entropy }));
        }
        let rows = self.training_rows(sequences)?;
        self.check_rows(&rows)?;
        let device = self.embed.device();
        let ints = |v: &[u32]| int_tensor(v, &device);
        let (tokens, slots, positions) = (ints(&rows.tokens), ints(&rows.slots), ints(&rows.positions));
        // the layers on untracked weights: no graph is recorded, only their inputs kept (not
        // `detach`, which keeps a leaf's require_grad, so the layers' graph would be kept too)
        fn untracked<const D: usize>(t: Tensor<D>) -> Tensor<D> {
            if t.is_autodiff() { Tensor::from_inner(t.inner()) } else { t }
        }
        let plain = self.map_weights(&mut |_, w| w.map(untracked, untracked));
        let mut h = embedding(plain.embed.clone(), tokens.clone())?;
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut pass = plain.training_pass(&rows, slots.clone(), positions.clone());
        for i in 0..self.layers.len() {
            inputs.push(h.clone());
            h = plain.layers_forward(Stream { h, normed: None }, i..i + 1, None, &mut pass)?.h;
        }
        let last = h.detach().require_grad();
        let x = self.kernels.rmsnorm(last.clone(), self.norm.clone(), self.config.rms_norm_eps as f32)?;
        let s = self.score_rows(x, &rows, sequences, distribution)?;
        let layers = LayerInputs { rows, tokens, slots, positions, inputs, last };
        Ok((s.per_sequence, TrackedLogprobs { flat: s.flat, layers: Some(layers), mean_entropy: s.mean_entropy }))
    }

    /// Layer `i` re-run with autodiff from its kept input: (the input as a tracked leaf, the
    /// layer's output). The caller seeds the output with its gradient and reads the leaf's.
    pub fn rerun_layer(&self, layers: &LayerInputs, i: usize) -> Result<(Tensor<2>, Tensor<2>), ModelError> {
        let x = layers.inputs[i].clone().detach().require_grad();
        let mut pass = self.training_pass(&layers.rows, layers.slots.clone(), layers.positions.clone());
        let y = self.layers_forward(Stream { h: x.clone(), normed: None }, i..i + 1, None, &mut pass)?.h;
        Ok((x, y))
    }

    /// The embedding re-run with autodiff (its weight's gradient comes from layer 0's input's).
    pub fn rerun_embedding(&self, layers: &LayerInputs) -> Result<Tensor<2>, ModelError> {
        Ok(embedding(self.embed.clone(), layers.tokens.clone())?)
    }
}
