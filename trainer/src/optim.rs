//! AdamW over f32 master weights (the model's own weights in f32; a separate f32 copy when the
//! model runs in bf16, cast to bf16 after every update), global-norm gradient clipping, and the learning
//! rate schedule (linear warm-up, cosine decay to `min_lr_ratio`).

use burn::tensor::{DType, Tensor, TensorData};
use shared_kernels::grad_fold::{node_id, GradFold};
use shared_kernels::model::{Qwen3, TrackedLogprobs, Weight};
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
pub struct AdamW {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Updates taken so far (bias correction).
    pub t: u64,
    /// First and second moments, flat f32, by weight name.
    pub moments: BTreeMap<String, (Tensor<1>, Tensor<1>)>,
    /// f32 master copies of weights the model holds in a narrower dtype, flat, by weight name.
    pub masters: BTreeMap<String, Tensor<1>>,
}

impl AdamW {
    pub fn new(beta1: f64, beta2: f64, eps: f64, weight_decay: f64) -> Self {
        Self { beta1, beta2, eps, weight_decay, t: 0, moments: BTreeMap::new(), masters: BTreeMap::new() }
    }

    /// One update of `model` (plain device) with `grads` (flat, by name), already clipped. The
    /// arithmetic is f32; a bf16 model gets its f32 masters updated and then cast.
    pub fn step(&mut self, model: &Qwen3, grads: &BTreeMap<String, Tensor<1>>, lr: f64) -> Qwen3 {
        self.step_owned(model, grads, lr, &|_| true)
    }

    /// [`Self::step`] of the weights `owned` names only (ZeRO-1: this rank's shard); the others
    /// are left as they are, and no moments or masters are kept for them.
    pub fn step_owned(&mut self, model: &Qwen3, grads: &BTreeMap<String, Tensor<1>>, lr: f64, owned: &dyn Fn(&str) -> bool) -> Qwen3 {
        self.t += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(self.t as i32);
        let c2 = 1.0 - b2.powi(self.t as i32);
        let (moments, masters) = (&mut self.moments, &mut self.masters);
        let (eps, wd) = (self.eps, self.weight_decay);
        model.map_weights(&mut |name, w| {
            let Some(g) = grads.get(name).filter(|_| owned(name)) else { return w };
            let g = g.clone().cast(DType::F32);
            let own = w.flat();
            let narrow = own.dtype() != DType::F32;
            let flat = if narrow { masters.remove(name).unwrap_or_else(|| own.clone().cast(DType::F32)) } else { own.clone() };
            let (m, v) = moments.remove(name).unwrap_or_else(|| (flat.zeros_like(), flat.zeros_like()));
            let m = m.mul_scalar(b1) + g.clone().mul_scalar(1.0 - b1);
            let v = v.mul_scalar(b2) + (g.clone() * g.clone()).mul_scalar(1.0 - b2);
            let update = m.clone().div_scalar(c1) / (v.clone().div_scalar(c2).sqrt().add_scalar(eps));
            let next = flat.clone() - (update + flat.mul_scalar(wd)).mul_scalar(lr);
            moments.insert(name.to_string(), (m, v));
            if narrow {
                masters.insert(name.to_string(), next.clone());
                return w.with_flat(next.cast(own.dtype()));
            }
            w.with_flat(next)
        })
    }

    /// The moments (zeros) and f32 masters of every `owned` weight that has none yet, as
    /// [`Self::step_owned`] would make them at its first update: the same values, allocated
    /// before the run's first rollout instead, so no later step needs memory the first did not.
    pub fn allocate_state(&mut self, model: &Qwen3, owned: &dyn Fn(&str) -> bool) {
        for (name, w) in model.named_tensors() {
            if !owned(&name) {
                continue;
            }
            let own = w.flat();
            let narrow = own.dtype() != DType::F32;
            if narrow && !self.masters.contains_key(&name) {
                self.masters.insert(name.clone(), own.clone().cast(DType::F32));
            }
            if !self.moments.contains_key(&name) {
                let like = if narrow { self.masters[&name].clone() } else { own };
                self.moments.insert(name, (like.zeros_like(), like.zeros_like()));
            }
        }
    }

    /// Drops the moments and masters of weights not `owned` (ZeRO-1, after a resume loaded all).
    pub fn retain(&mut self, owned: &dyn Fn(&str) -> bool) {
        self.moments.retain(|name, _| owned(name));
        self.masters.retain(|name, _| owned(name));
    }

    /// `model` with every weight replaced by its f32 master where one exists: what a checkpoint
    /// saves, so a resumed bf16 run continues from the masters, not from their bf16 casts.
    pub fn with_masters(&self, model: &Qwen3) -> Qwen3 {
        model.map_weights(&mut |name, w| match self.masters.get(name) {
            Some(master) => w.with_flat(master.clone()),
            None => w,
        })
    }

    /// After a resume: the f32 masters of a narrow-dtype `model`, taken from `saved`, the f32
    /// policy the checkpoint holds (shared, not copied).
    pub fn restore_masters(&mut self, model: &Qwen3, saved: &Qwen3) {
        self.masters.clear();
        if model.dtype == DType::F32 {
            return;
        }
        for (name, w) in saved.named_tensors() {
            self.masters.insert(name, w.flat());
        }
    }
}

/// sqrt(sum of squares) over all gradients, summed in lockstep's fixed order (burn's `sum()`
/// uses float atomics on CUDA, and this norm scales every clipped update).
pub fn global_norm(grads: &BTreeMap<String, Tensor<1>>) -> f64 {
    let parts: Vec<Tensor<1>> = grads.values().map(|g| fixed_order_sum(g.clone() * g.clone())).collect();
    if parts.is_empty() {
        return 0.0;
    }
    let total = fixed_order_sum(Tensor::cat(parts, 0)).into_data().convert::<f32>().try_to_vec::<f32>().expect("f32");
    (total[0] as f64).sqrt()
}

/// `shared_kernels::sum_all` on a gradient (f32 or bf16; never empty: parameters have elements).
pub fn fixed_order_sum(t: Tensor<1>) -> Tensor<1> {
    shared_kernels::sum_all(t).expect("sum_all of a gradient: a non-empty float tensor on the model's device")
}

/// Scales every gradient by min(1, clip / norm); returns the norm before clipping.
pub fn clip(grads: &mut BTreeMap<String, Tensor<1>>, clip: f64) -> f64 {
    let norm = global_norm(grads);
    if clip > 0.0 && norm > clip {
        let scale = clip / norm;
        for g in grads.values_mut() {
            *g = g.clone().mul_scalar(scale);
        }
    }
    norm
}

/// Linear warm-up over `warmup` steps, then cosine decay to `lr * min_ratio` at `total`.
pub fn learning_rate(base: f64, step: usize, warmup: usize, total: usize, min_ratio: f64) -> f64 {
    if step < warmup {
        return base * (step + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1) as f64;
    let progress = ((step - warmup) as f64 / span).min(1.0);
    let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
    base * (min_ratio + (1.0 - min_ratio) * cosine)
}

/// The weights as tracked leaves on `device`'s autodiff twin, for a training forward.
pub fn tracked_copy(model: &Qwen3) -> Qwen3 {
    model.map_weights(&mut |_, w| w.map(|v| Tensor::from_inner(v).require_grad(), |m| Tensor::from_inner(m).require_grad()))
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
pub fn weighted_backward(tracked: &Qwen3, logprobs: TrackedLogprobs, weights: &[f32], fold: &mut GradFold, what: &str, suspects: &str) -> Result<(f64, BTreeMap<String, Tensor<1>>), crate::run::RunError> {
    use crate::run::RunError;
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

/// The f32-master contract for a model held in `narrow` (bf16 on the GPU; CPU's Vulkan runtime
/// has no bf16 or f16, so `lockstep check --dtypes bf16` runs this on the H200): three Adam
/// steps of ~1e-5, far below bf16 resolution at |w| ~ 0.3, must leave the narrow weights equal to
/// their masters' cast while the masters move, and the masters must survive a checkpoint.
pub fn master_weight_check(narrow: DType, device: &burn::tensor::Device, seed: u64) -> Result<(), String> {
    use shared_kernels::model::{tiny_config, Checkpoint};
    let ck = Checkpoint::random(tiny_config(17, true), 0.3, seed);
    let mut model = Qwen3::from_checkpoint(&ck, narrow, device).map_err(|e| e.to_string())?;
    let start = model.clone();
    let grads: BTreeMap<String, Tensor<1>> = model.named_tensors().into_iter().map(|(n, w)| (n, w.flat().cast(DType::F32).ones_like())).collect();
    let mut opt = AdamW::new(0.9, 0.999, 1e-8, 0.0);
    for _ in 0..3 {
        model = opt.step(&model, &grads, 1e-5);
    }
    let host = |t: Tensor<1>| t.cast(DType::F32).into_data().convert::<f32>().try_to_vec::<f32>().expect("f32");
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for ((name, w0), (_, w)) in start.named_tensors().into_iter().zip(model.named_tensors()) {
        if w.flat().dtype() != narrow {
            return Err(format!("{name}: became {:?}", w.flat().dtype()));
        }
        let master = opt.masters.get(&name).ok_or_else(|| format!("{name} has no f32 master"))?;
        if master.dtype() != DType::F32 {
            return Err(format!("{name}: master is {:?}", master.dtype()));
        }
        if bits(host(master.clone().cast(narrow))) != bits(host(w.flat())) {
            return Err(format!("{name}: the weights are not their masters' cast"));
        }
        let (m, w_start) = (host(master.clone()), host(w0.flat()));
        let moved = m.iter().zip(&w_start).filter(|(a, b)| (**a - **b).abs() > 2e-5).count();
        if moved <= m.len() / 2 {
            return Err(format!("{name}: only {moved} of {} masters accumulated 3 steps of 1e-5", m.len()));
        }
    }
    let saved = Qwen3::from_checkpoint(&opt.with_masters(&model).to_checkpoint(), DType::F32, device).map_err(|e| e.to_string())?;
    let mut resumed = AdamW::new(0.9, 0.999, 1e-8, 0.0);
    resumed.restore_masters(&model, &saved);
    for (name, master) in &opt.masters {
        if bits(host(master.clone())) != bits(host(resumed.masters[name].clone())) {
            return Err(format!("{name}: master changed through a checkpoint round trip"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::learning_rate;

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

    #[test]
    fn schedule_warms_up_then_decays_to_the_floor() {
        assert!((learning_rate(1.0, 0, 4, 100, 0.1) - 0.25).abs() < 1e-12);
        assert!((learning_rate(1.0, 3, 4, 100, 0.1) - 1.0).abs() < 1e-12);
        assert!((learning_rate(1.0, 4, 4, 100, 0.1) - 1.0).abs() < 1e-12);
        assert!((learning_rate(1.0, 100, 4, 100, 0.1) - 0.1).abs() < 1e-12);
        assert!(learning_rate(1.0, 50, 4, 100, 0.1) < 1.0);
    }
}
