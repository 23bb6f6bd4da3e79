//! The engine's weights: its resident (and, for the invariant kernels, fused) copy, replaced
//! whole after a full-parameter update or only in its LoRA adapters after a LoRA one.

use super::Engine;
use shared_kernels::model::Qwen3;

impl Engine {
    /// Replace the weights (after an optimizer step); only between rollouts.
    pub fn set_model(&mut self, model: Qwen3) -> Result<(), String> {
        if !self.is_idle() {
            return Err("set_model while requests are running".into());
        }
        // copied on the engine's stream, so its launches bind no other thread's buffers
        let stream = self.stream;
        self.model = stream.enter(|| decode_ready(model))?;
        // a graph reads the weights it was captured with
        self.graphs.clear();
        Ok(())
    }

    /// Replace the LoRA adapters only (after an optimizer step of a LoRA run), with resident
    /// copies of `from`'s; the frozen base stays as it is. Only between rollouts.
    pub fn set_adapters(&mut self, from: &Qwen3) -> Result<(), String> {
        if !self.is_idle() {
            return Err("set_adapters while requests are running".into());
        }
        if self.model.lora != from.lora {
            return Err(format!("set_adapters: the engine's adapters are {:?}, the new ones {:?}", self.model.lora, from.lora));
        }
        let adapters: std::collections::HashMap<String, shared_kernels::model::Weight> = from.named_tensors().into_iter().filter(|(n, _)| Qwen3::is_adapter(n)).collect();
        let stream = self.stream;
        let device = self.model.embed.device();
        let mut failed = None;
        self.model = stream.enter(|| {
            self.model.map_weights(&mut |name, w| {
                let Some(new) = adapters.get(name) else { return w };
                match device.memory_persistent_allocations(new.clone(), |n| resident(n)) {
                    Ok(copy) => copy,
                    Err(e) => {
                        failed.get_or_insert(e);
                        w
                    }
                }
            })
        });
        if let Some(e) = failed {
            return Err(format!("copying the adapters for the engine: {e}"));
        }
        self.graphs.clear();
        Ok(())
    }
}

/// A copy of `w` in a buffer of its own (in the persistent pool where the caller allocates so).
fn resident(w: shared_kernels::model::Weight) -> Result<shared_kernels::model::Weight, String> {
    use shared_kernels::bridge::own_buffer;
    use shared_kernels::model::Weight;
    Ok(match w {
        Weight::Vector(v) => Weight::Vector(own_buffer(v).map_err(|e| e.to_string())?),
        Weight::Matrix(m) => Weight::Matrix(own_buffer(m).map_err(|e| e.to_string())?),
    })
}

/// The engine's copy of the weights: in cubecl's persistent pool (see [`Qwen3::into_resident`]),
/// and, for the invariant kernel set, with fused projections (fewer launches, same bits) unless
/// `LOCKSTEP_DECODE_FUSION=off` (benchmarks compare the two); the ablation's kernel sets keep
/// the unfused forward they were measured with.
pub(super) fn decode_ready(model: Qwen3) -> Result<Qwen3, String> {
    let fuse = shared_kernels::kernel_choice::KernelChoice::current().map_err(|e| e.to_string())?.decode_fusion;
    let fuse = fuse && model.kernels.lockstep_layers();
    model.into_resident(fuse).map_err(|e| format!("copying the weights for the engine: {e}"))
}
