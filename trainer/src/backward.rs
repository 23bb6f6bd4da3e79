//! The weighted backward of a training forward: the weights as tracked leaves, `sum(w x
//! logprob)` summed in lockstep's fixed order and checked finite, its weight gradients (folded
//! over tokens in one order, so their bits do not depend on the micro-batching), per-layer
//! recomputation, and the micro-batches a step's sequences are cut into.

use crate::optim::fixed_order_sum;
use burn::tensor::{DType, Tensor, TensorData};
use shared_kernels::grad_fold::{node_id, GradFold};
use shared_kernels::model::{Qwen3, TrackedLogprobs, Weight};
use std::collections::BTreeMap;

/// The weights as tracked leaves on `device`'s autodiff twin, for a training forward. With LoRA
/// adapters only they are tracked: the base weights join the graph frozen (no gradient is
/// computed for them, and they are shared, not copied).
pub fn tracked_copy(model: &Qwen3) -> Qwen3 {
    let lora = model.lora.is_some();
    model.map_weights(&mut |name, w| {
        if lora && !Qwen3::is_adapter(name) {
            return w.map(Tensor::from_inner, Tensor::from_inner);
        }
        w.map(|v| Tensor::from_inner(v).require_grad(), |m| Tensor::from_inner(m).require_grad())
    })
}

/// Whether `name` is a weight the run trains: every weight, or with LoRA the adapters only.
pub fn trained(model: &Qwen3, name: &str) -> bool {
    model.lora.is_none() || Qwen3::is_adapter(name)
}

/// Gradients of `tracked` (from `tracked_copy`) as flat f32 tensors by name.
pub fn gradients(tracked: &Qwen3, grads: &burn::tensor::Gradients) -> BTreeMap<String, Tensor<1>> {
    let mut out = BTreeMap::new();
    for (name, w) in tracked.named_tensors() {
        let g = match &w {
            Weight::Vector(v) => v.grad(grads),
            Weight::Matrix(m) => m.grad(grads).map(|g| {
                let n = g.shape().num_elements();
                g.reshape([n])
            }),
        };
        if let Some(g) = g {
            out.insert(name, g.cast(DType::F32));
        }
    }
    out
}

/// What a non-finite loss points at, for the error: the weights the run started from (a
/// checkpoint's values, or the embedded model's `model.init_std`) and the learning rate `lr_key`.
pub fn nonfinite_suspects(model_path: &str, lr_key: &str) -> String {
    if model_path.is_empty() {
        format!("the embedded model's scale (a large model.init_std), or a {lr_key} that diverged")
    } else {
        format!("the checkpoint's weights (model.path = {model_path:?}: values so large that its activations overflow, or inf / NaN in its tensors), or a {lr_key} that diverged")
    }
}

/// `sum(weights * logprobs)` of a tracked forward (`flat` from `tracked.sequence_logprobs`):
/// the loss value in lockstep's fixed-order sum, checked finite, and the weights' gradients
/// (burn's sum only seeds the backward). `what` names the step in errors, `suspects` what a
/// non-finite loss comes from ([`nonfinite_suspects`]).
/// The weights' gradients that lockstep's ops sum over tokens are folded into `fold` (their
/// bits then do not depend on the micro-batching, `shared_kernels::grad_fold`); the rest (the
/// ablation kernels' weights) come back by name.
pub fn weighted_backward(tracked: &Qwen3, logprobs: TrackedLogprobs, weights: &[f32], fold: &mut GradFold, what: &str, suspects: &str) -> Result<(f64, BTreeMap<String, Tensor<1>>), crate::error::RunError> {
    use crate::error::RunError;
    let TrackedLogprobs { flat, layers, .. } = logprobs;
    let device = flat.device();
    let w = Tensor::<1>::from_data(TensorData::new(weights.to_vec(), [weights.len()]), &device.clone().inner());
    let weighted = flat * Tensor::from_inner(w);
    let data = fixed_order_sum(weighted.clone().inner()).try_into_data().map_err(|e| RunError::Other(format!("{what}: the device failed computing the loss: {e}")))?;
    let value = data.convert::<f32>().try_to_vec::<f32>().expect("f32")[0] as f64;
    if !value.is_finite() {
        return Err(RunError::Other(format!("{what}: the loss is {value}; stopping before the update (the last checkpoint is intact). Non-finite logprobs come from the weights: {suspects}")));
    }
    let backward = |fold: &mut GradFold, scalar: Tensor<1>| {
        let _attached = fold.attach(weight_nodes(tracked));
        scalar.backward()
    };
    let grads = backward(fold, weighted.sum());
    let mut out = gradients(tracked, &grads);
    let Some(layers) = layers else { return Ok((value, out)) };
    // recomputation: each layer re-run from its input, last first, seeded with its output's
    // gradient (d sum(y * g) / dy = g exactly); every weight's gradient comes from one stage
    let rerun = |e: shared_kernels::model::ModelError| RunError::Other(format!("{what}: re-running a layer for the backward (train.recompute_layers): {e}"));
    let missing = || RunError::Other(format!("{what}: the recomputed backward lost a layer's input gradient"));
    let mut g = layers.last().grad(&grads).ok_or_else(missing)?;
    drop(grads);
    for i in (0..layers.len()).rev() {
        let (x, y) = tracked.rerun_layer(&layers, i).map_err(rerun)?;
        let grads = backward(fold, (y * Tensor::from_inner(g)).sum());
        merge_gradients(&mut out, gradients(tracked, &grads));
        g = x.grad(&grads).ok_or_else(missing)?;
    }
    let e = tracked.rerun_embedding(&layers).map_err(rerun)?;
    let grads = backward(fold, (e * Tensor::from_inner(g)).sum());
    merge_gradients(&mut out, gradients(tracked, &grads));
    Ok((value, out))
}

/// Adds the gradients of one recomputed stage into `out` (a tied embedding gets the head's and
/// the embedding's: two terms, so their order cannot change a bit).
fn merge_gradients(out: &mut BTreeMap<String, Tensor<1>>, stage: BTreeMap<String, Tensor<1>>) {
    for (name, g) in stage {
        let sum = match out.remove(&name) {
            Some(other) => other + g,
            None => g,
        };
        out.insert(name, sum);
    }
}

/// (name, autodiff node id) of every tracked weight of `tracked` (from [`tracked_copy`]).
pub fn weight_nodes(tracked: &Qwen3) -> Vec<(String, u64)> {
    tracked
        .named_tensors()
        .into_iter()
        .filter_map(|(name, w)| {
            let id = match &w {
                Weight::Vector(v) => node_id(v),
                Weight::Matrix(m) => node_id(m),
            };
            id.map(|id| (name, id))
        })
        .collect()
}

/// `grads` (burn's, by name) with the folded gradients added in (a weight with both, a tied
/// embedding under the ablation kernels, gets burn's plus the folded one).
pub fn with_folded(mut grads: BTreeMap<String, Tensor<1>>, fold: GradFold) -> BTreeMap<String, Tensor<1>> {
    for (name, g) in fold.into_grads() {
        let sum = match grads.remove(&name) {
            Some(other) => other + g,
            None => g,
        };
        grads.insert(name, sum);
    }
    grads
}

/// Adds `grads` (one micro-batch's) into `total` in f32, in name order; the first micro-batch's
/// gradients are taken as they are.
pub fn accumulate(total: &mut BTreeMap<String, Tensor<1>>, grads: BTreeMap<String, Tensor<1>>) {
    for (name, g) in grads {
        let sum = match total.remove(&name) {
            Some(acc) => acc + g,
            None => g,
        };
        total.insert(name, sum);
    }
}

/// Consecutive sequences `[start, end)` of at most `budget` tokens together (a longer sequence
/// alone); `budget` 0 = all of them in one.
pub fn micro_batches(lengths: &[usize], budget: usize) -> Vec<std::ops::Range<usize>> {
    if budget == 0 || lengths.is_empty() {
        return vec![0..lengths.len()];
    }
    let mut out = Vec::new();
    let (mut start, mut tokens) = (0, 0);
    for (i, &len) in lengths.iter().enumerate() {
        if i > start && tokens + len > budget {
            out.push(start..i);
            (start, tokens) = (i, 0);
        }
        tokens += len;
    }
    out.push(start..lengths.len());
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn micro_batches_cut_whole_sequences_in_order_within_the_budget() {
        use super::micro_batches;
        assert_eq!(micro_batches(&[5, 5, 5], 0), vec![0..3]);
        assert_eq!(micro_batches(&[5, 5, 5], 10), vec![0..2, 2..3]);
        assert_eq!(micro_batches(&[5, 5, 5], 9), vec![0..1, 1..2, 2..3]);
        assert_eq!(micro_batches(&[20, 3, 3, 20], 8), vec![0..1, 1..3, 3..4]);
        assert_eq!(micro_batches(&[3, 3, 3], 100), vec![0..3]);
    }

    /// Per-layer recomputation must not change a bit: the logprobs, the loss and every weight
    /// gradient (folded or burn's) equal the one-graph backward's, tied and untied, on the
    /// matched kernels and on the ablation's, at fresh random sizes.
    #[test]
    fn recomputed_layers_give_the_one_graph_gradients_as_bits() {
        use super::{tracked_copy, weighted_backward, with_folded, GradFold};
        use rand::{Rng, SeedableRng};
        use shared_kernels::model::{tiny_config, Checkpoint, KernelSet, Qwen3};
        let device = shared_kernels::device::default_device();
        let seed = shared_kernels::testing::rows::test_seed();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for (tied, kernels) in [(true, KernelSet::Matched), (false, KernelSet::Matched), (true, KernelSet::Fast)] {
            let mut model = Qwen3::from_checkpoint(&Checkpoint::random(tiny_config(97, tied), 0.08, rng.random()), burn::tensor::DType::F32, &device).unwrap();
            model.kernels = kernels;
            let sequences: Vec<Vec<u32>> = (0..rng.random_range(2..5)).map(|_| (0..rng.random_range(3..60)).map(|_| rng.random_range(0..97)).collect()).collect();
            let rows: usize = sequences.iter().map(|s| s.len() - 1).sum();
            let weights: Vec<f32> = (0..rows).map(|_| rng.random_range(-1.0..1.0)).collect();
            let run = |recompute: bool| {
                let tracked = tracked_copy(&model);
                let (lp, logprobs) = tracked.training_logprobs(&sequences, 1.0, recompute).unwrap();
                assert_eq!(logprobs.layers.is_some(), recompute);
                let mut fold = GradFold::new();
                let (loss, grads) = weighted_backward(&tracked, logprobs, &weights, &mut fold, "test", "train.lr").unwrap();
                let grads: Vec<(String, Vec<u32>)> = with_folded(grads, fold).into_iter().map(|(name, g)| (name, g.into_data().convert::<f32>().try_to_vec::<f32>().unwrap().iter().map(|x| x.to_bits()).collect())).collect();
                let lp: Vec<u32> = lp.concat().iter().map(|x| x.to_bits()).collect();
                (lp, loss.to_bits(), grads)
            };
            let (plain, recomputed) = (run(false), run(true));
            let what = format!("seed {seed}, tied {tied}, {kernels:?}, lengths {:?}", sequences.iter().map(Vec::len).collect::<Vec<_>>());
            assert_eq!(plain.0, recomputed.0, "logprobs differ ({what})");
            assert_eq!(plain.1, recomputed.1, "loss differs ({what})");
            assert_eq!(plain.2.len(), recomputed.2.len(), "gradients of other weights ({what})");
            for ((name, a), (other, b)) in plain.2.iter().zip(&recomputed.2) {
                assert_eq!(name, other);
                let differing = a.iter().zip(b).filter(|(x, y)| x != y).count();
                assert_eq!(differing, 0, "{name}: {differing} of {} gradient values differ in bits ({what})", a.len());
            }
        }
    }
}
