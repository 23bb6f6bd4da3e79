//! AdamW over the model's f32 master weights, global-norm gradient clipping, and the learning
//! rate schedule (linear warm-up, cosine decay to `min_lr_ratio`).

use burn::tensor::{DType, Tensor, TensorData};
use shared_kernels::model::{Qwen3, Weight};
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
}

impl AdamW {
    pub fn new(beta1: f64, beta2: f64, eps: f64, weight_decay: f64) -> Self {
        Self { beta1, beta2, eps, weight_decay, t: 0, moments: BTreeMap::new() }
    }

    /// One update of `model` (plain device, f32) with `grads` (flat, by name), already clipped.
    pub fn step(&mut self, model: &Qwen3, grads: &BTreeMap<String, Tensor<1>>, lr: f64) -> Qwen3 {
        self.t += 1;
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(self.t as i32);
        let c2 = 1.0 - b2.powi(self.t as i32);
        let moments = &mut self.moments;
        let (eps, wd) = (self.eps, self.weight_decay);
        model.map_weights(&mut |name, w| {
            let Some(g) = grads.get(name) else { return w };
            let flat = w.flat();
            let (m, v) = moments.remove(name).unwrap_or_else(|| (flat.zeros_like(), flat.zeros_like()));
            let m = m.mul_scalar(b1) + g.clone().mul_scalar(1.0 - b1);
            let v = v.mul_scalar(b2) + (g.clone() * g.clone()).mul_scalar(1.0 - b2);
            let update = m.clone().div_scalar(c1) / (v.clone().div_scalar(c2).sqrt().add_scalar(eps));
            let next = flat.clone() - (update + flat.mul_scalar(wd)).mul_scalar(lr);
            moments.insert(name.to_string(), (m, v));
            w.with_flat(next)
        })
    }
}

/// sqrt(sum of squares) over all gradients.
pub fn global_norm(grads: &BTreeMap<String, Tensor<1>>) -> f64 {
    let parts: Vec<Tensor<1>> = grads.values().map(|g| (g.clone() * g.clone()).sum()).collect();
    if parts.is_empty() {
        return 0.0;
    }
    let total = Tensor::cat(parts, 0).sum().cast(DType::F32).into_data().convert::<f32>().try_to_vec::<f32>().expect("f32");
    (total[0] as f64).sqrt()
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

/// Moments as host vectors (for checkpoints) and back.
pub fn moments_to_host(opt: &AdamW) -> BTreeMap<String, (Vec<f32>, Vec<f32>)> {
    let host = |t: &Tensor<1>| t.clone().into_data().convert::<f32>().try_to_vec::<f32>().expect("f32");
    opt.moments.iter().map(|(k, (m, v))| (k.clone(), (host(m), host(v)))).collect()
}

pub fn moments_from_host(host: BTreeMap<String, (Vec<f32>, Vec<f32>)>, device: &burn::tensor::Device) -> BTreeMap<String, (Tensor<1>, Tensor<1>)> {
    let dev = |v: Vec<f32>| {
        let n = v.len();
        Tensor::<1>::from_data(TensorData::new(v, [n]), device)
    };
    host.into_iter().map(|(k, (m, v))| (k, (dev(m), dev(v)))).collect()
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
