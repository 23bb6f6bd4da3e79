//! AdamW over f32 master weights (the model's own weights in f32; a separate f32 copy when the
//! model runs in bf16, cast to bf16 after every update), global-norm gradient clipping, and the learning
//! rate schedule (linear warm-up, cosine decay to `min_lr_ratio`).

use burn::tensor::{DType, Tensor};

use shared_kernels::model::Qwen3;
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

/// AdamW with `[train]`'s betas, epsilon and weight decay.
pub fn new_adamw(c: &crate::config::Config) -> AdamW {
    AdamW::new(c.train.beta1, c.train.beta2, c.train.adam_eps, c.train.weight_decay)
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
    fn schedule_warms_up_then_decays_to_the_floor() {
        assert!((learning_rate(1.0, 0, 4, 100, 0.1) - 0.25).abs() < 1e-12);
        assert!((learning_rate(1.0, 3, 4, 100, 0.1) - 1.0).abs() < 1e-12);
        assert!((learning_rate(1.0, 4, 4, 100, 0.1) - 1.0).abs() < 1e-12);
        assert!((learning_rate(1.0, 100, 4, 100, 0.1) - 0.1).abs() < 1e-12);
        assert!(learning_rate(1.0, 50, 4, 100, 0.1) < 1.0);
    }
}
