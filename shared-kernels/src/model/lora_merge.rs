//! A model's LoRA adapters folded into its base weights, for export: W' = W + s (B A) in f32,
//! cast to the model's dtype. The merged model's outputs are the adapted model's up to
//! rounding, not its bits (the sampler and trainer compute the adapters unmerged, `lora.rs`).

use super::lora::Projection;
use super::{ModelError, Qwen3};
use burn::tensor::DType;

impl Qwen3 {
    /// The model with its adapters folded into the base weights, W' = W + s (B A), computed in
    /// f32 and cast to the model's dtype, and no adapters: for export (transformers, other
    /// engines). Its outputs are the adapted model's up to rounding, not its bits.
    pub fn merged(&self) -> Result<Qwen3, ModelError> {
        let mut out = self.clone();
        out.fused.clear();
        for (i, layer) in out.layers.iter_mut().enumerate() {
            let Some(adapters) = layer.adapters.take() else { continue };
            for (p, a) in &adapters.by_projection {
                let w = match p {
                    Projection::Q => Some(&mut layer.q_proj),
                    Projection::K => Some(&mut layer.k_proj),
                    Projection::V => Some(&mut layer.v_proj),
                    Projection::O => Some(&mut layer.o_proj),
                    Projection::Gate => layer.gate_proj.as_mut(),
                    Projection::Up => layer.up_proj.as_mut(),
                    Projection::Down => layer.down_proj.as_mut(),
                };
                let w = w.ok_or_else(|| ModelError::Input(format!("layer {i} has an adapter on {} but no such projection", p.module())))?;
                fold(w, a, adapters.scale);
            }
            for (e, expert_adapters) in adapters.experts.iter().enumerate() {
                let expert = layer.moe.as_mut().and_then(|m| m.experts.get_mut(e)).ok_or_else(|| ModelError::Input(format!("layer {i} has adapters on expert {e} but no such expert")))?;
                for (p, a) in expert_adapters {
                    let w = match p {
                        Projection::Gate => &mut expert.gate,
                        Projection::Up => &mut expert.up,
                        Projection::Down => &mut expert.down,
                        other => return Err(ModelError::Input(format!("layer {i} expert {e} has an adapter on {}", other.module()))),
                    };
                    fold(w, a, adapters.scale);
                }
            }
        }
        out.lora = None;
        Ok(out)
    }
}

/// `w += scale (B A)`, in f32, cast back to `w`'s dtype.
fn fold(w: &mut burn::tensor::Tensor<2>, a: &super::lora::Adapter, scale: f32) {
    let dtype = w.dtype();
    let delta = a.b.clone().cast(DType::F32).matmul(a.a.clone().cast(DType::F32)).mul_scalar(scale);
    *w = (w.clone().cast(DType::F32) + delta).cast(dtype);
}
