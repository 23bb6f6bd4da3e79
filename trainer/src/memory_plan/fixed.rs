//! The plan's fixed part and its checks: [`MemoryPlan`] (each piece of state the run holds,
//! the activation estimate of one trainer pass), refusals naming the keys to change, and the
//! kernels' index range for a trainer pass.

use super::shape::{size, Part, Purpose, Shape, GB};
use crate::config::Config;
use crate::error::{invalid, RunError};
use shared_kernels::model::ModelConfig;

pub struct MemoryPlan {
    pub fixed: Vec<Part>,
    /// One trainer pass's activations (an estimate; 0 for sampling).
    pub activations: u64,
    /// The KV cache's bytes (also among `fixed`): where it is a large share, the sampler keys
    /// are the ones to name.
    kv_bytes: u64,
    /// One layer's K (or V) cache tensor, and the largest weight tensor as the run holds it (f32
    /// when training: masters, moments, gradients), for runtimes that bind at most so many bytes.
    pub(super) kv_layer_bytes: u64,
    largest_weight: (String, u64),
    /// The keys that size those two: the KV budget or the context, the checkpoint or the
    /// embedded model's shape.
    kv_key: &'static str,
    model_key: &'static str,
}

impl MemoryPlan {
    pub fn of(c: &Config, m: &ModelConfig, dtype_bytes: u64, purpose: Purpose) -> Self {
        Self::of_rank(c, m, dtype_bytes, purpose, 1)
    }

    /// [`Self::of`] for one of `ranks` data-parallel ranks: with `train.shard_optimizer`, a
    /// rank holds the masters and moments of its share of the parameters (at most 1/ranks of
    /// them plus the largest parameter, `distributed::zero`). `"auto"` sizes count as their
    /// unresolved meaning (the whole step, a full KV cache): [`resolve`] sets them first.
    pub fn of_rank(c: &Config, m: &ModelConfig, dtype_bytes: u64, purpose: Purpose, ranks: usize) -> Self {
        let sat = |x: f64| x as u64;
        let shape = Shape::of(c, m, dtype_bytes);
        let budget = c.sampler.kv_budget_bytes() as f64;
        let kv = if budget > 0.0 { shape.kv_bytes(budget) } else { shape.kv_full_bytes(c) };
        let mut fixed = shape.fixed_parts(c, purpose, ranks);
        let activations = if purpose == Purpose::Train { sat(shape.activation_bytes(c, shape.clamp_pass(c, c.train.pass_tokens()))) } else { 0 };
        fixed.push(Part { what: "KV cache", bytes: sat(kv) });
        let held = if purpose == Purpose::Train { shape.dtype.max(4.0) } else { shape.dtype };
        let largest_weight = m.expected_tensors().into_iter().map(|(name, dims)| (name, sat(dims.iter().map(|&d| d as f64).product::<f64>() * held))).max_by_key(|(_, b)| *b).unwrap_or_default();
        let budgeted = c.sampler.kv_budget_bytes() > 0;
        Self { fixed, activations, kv_bytes: sat(kv), kv_layer_bytes: sat(kv / (2.0 * shape.layers.max(1.0))), largest_weight, kv_key: if budgeted { "sampler.kv_budget_mib" } else { "sampler.context" }, model_key: if c.model.path.is_empty() { "model.hidden_size" } else { "model.path" } }
    }

    pub fn fixed_bytes(&self) -> u64 {
        self.fixed.iter().map(|p| p.bytes).fold(0, u64::saturating_add)
    }

    /// Whether the KV cache is over a quarter of the fixed part.
    fn kv_dominates(&self) -> bool {
        self.kv_bytes as f64 > 0.25 * self.fixed_bytes().max(1) as f64
    }

    /// One line: each fixed part, the estimate, and the device's size where known.
    pub fn summary(&self, capacity: Option<u64>) -> String {
        let parts: Vec<String> = self.fixed.iter().map(|p| format!("{} {}", p.what, size(p.bytes))).collect();
        let device = capacity.map_or("the device's size unknown".to_string(), |c| format!("of the device's {}", size(c)));
        let activations = if self.activations > 0 { format!(" + ~{} of activations per trainer pass (estimate)", size(self.activations)) } else { String::new() };
        format!("memory plan: {} fixed ({}){activations}, {device}", size(self.fixed_bytes()), parts.join(", "))
    }

    /// Err when a tensor the run must hold is larger than the runtime can bind to a kernel
    /// (`limit`, [`shared_kernels::device::max_tensor_bytes`]): a config error naming the keys.
    pub fn check_tensor_limit(&self, limit: Option<u64>) -> Result<(), RunError> {
        let Some(limit) = limit else { return Ok(()) };
        let runtime = shared_kernels::device::runtime_name();
        if self.kv_layer_bytes > limit {
            return Err(invalid(self.kv_key, format!("gives each layer a {} KV cache tensor, but this runtime ({runtime}) binds at most {} to a kernel; lower sampler.context or sampler.max_batch, or cap sampler.kv_budget_mib", size(self.kv_layer_bytes), size(limit))));
        }
        let (name, bytes) = &self.largest_weight;
        if *bytes > limit {
            return Err(invalid(self.model_key, format!("the model's tensor `{name}` takes {}, but this runtime ({runtime}) binds at most {} to a kernel: run this model on CUDA, or a smaller one", size(*bytes), size(limit))));
        }
        Ok(())
    }

    /// Err when the fixed part alone passes `capacity` (a config error naming the keys to change);
    /// Ok(Some(warning)) when the fixed part and the activation estimate together pass it.
    pub fn check(&self, capacity: Option<u64>) -> Result<Option<String>, RunError> {
        let Some(capacity) = capacity else { return Ok(None) };
        let fixed = self.fixed_bytes();
        if fixed > capacity {
            let (key, advice) = if self.kv_dominates() {
                ("sampler.kv_budget_mib", "cap the KV cache with sampler.kv_budget_mib, or lower sampler.max_batch or sampler.context")
            } else {
                ("model.path", "use a smaller model (model.path), bf16 (model.dtype), or lower sampler.max_batch / sampler.context; or train on several GPUs (--gpus N: train.shard_optimizer splits the optimizer state over them)")
            };
            return Err(invalid(key, format!("the run needs {:.1} GB of device memory before any activation but the device holds {:.1} GB: {}; {advice}", fixed as f64 / GB, capacity as f64 / GB, self.summary(Some(capacity)))));
        }
        if fixed.saturating_add(self.activations) > capacity {
            // a KV cache that dominates the fixed part is the larger lever: it stays resident
            // through the update (an 80 GB card with an H200 config's pool ran out there)
            let kv_advice = if self.kv_dominates() { format!(", or sampler.kv_budget_mib (the KV cache's {}, held through the update)", size(self.kv_bytes)) } else { String::new() };
            return Ok(Some(format!("{:.1} GB fixed + ~{:.1} GB of activations may not fit the device's {:.1} GB: lower train.micro_batch_tokens (tokens per trainer pass){kv_advice}", fixed as f64 / GB, self.activations as f64 / GB, capacity as f64 / GB)));
        }
        Ok(None)
    }
}

/// A trainer pass's widest activation (`[tokens, intermediate]`) within the kernels' 32-bit
/// index range, checked before sampling: otherwise a huge step would be refused by the launch
/// guards only after its rollouts were generated.
pub(crate) fn check_pass_size(c: &Config, m: &ModelConfig) -> Result<(), RunError> {
    let (context, micro) = (c.sampler.context as u128, c.train.pass_tokens() as u128);
    let rollouts = c.train.prompts_per_step as u128 * c.train.group_size as u128;
    let pass_tokens = if micro > 0 { micro.max(context).min(rollouts * context) } else { rollouts * context };
    let width = Shape::widest(m) as u128;
    let limit = u32::MAX as u128;
    if pass_tokens * width > limit {
        let key = if micro > 0 { "train.micro_batch_tokens" } else { "train.prompts_per_step" };
        return Err(invalid(key, format!("a trainer pass of up to {pass_tokens} tokens x {width} activations is {} elements, beyond the kernels' 32-bit index range ({limit}); set train.micro_batch_tokens to at most {} (or fewer rollouts: train.prompts_per_step x train.group_size x sampler.context)", pass_tokens * width, (limit / width).max(1))));
    }
    // the SFT warm start runs its batch in one pass of at least 2 tokens a sequence (a prompt
    // token and the end of sequence): a batch past the range even then is refused before the
    // host builds it (a billion sequences aborted the process allocating them)
    let sft_tokens = 2 * c.train.sft_batch as u128;
    if c.train.sft_steps > 0 && sft_tokens * width > limit {
        return Err(invalid("train.sft_batch", format!("{} sequences of at least 2 tokens make an SFT pass of {} x {width} activation elements, beyond the kernels' 32-bit index range ({limit}); at most {} sequences fit", c.train.sft_batch, sft_tokens, (limit / width / 2).max(1))));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::super::shape::GB;
    use crate::config::Sizing;

    fn qwen3_8b() -> ModelConfig {
        let json = serde_json::json!({
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096,
            "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960, "tie_word_embeddings": false
        });
        ModelConfig::from_json(&json.to_string(), "test").unwrap()
    }

    /// Qwen3-0.6B's shape (tied embedding, the 8B's vocabulary and head size).
    fn qwen3_0_6b() -> ModelConfig {
        let mut m = qwen3_8b();
        (m.hidden_size, m.intermediate_size, m.num_layers, m.num_heads) = (1024, 3072, 28, 16);
        m.tie_word_embeddings = true;
        m
    }

    #[test]
    fn full_parameter_8b_on_one_h200_is_refused_naming_the_model_fits_sharded_on_two_and_sampling_it_fits() {
        let mut c = Config::default();
        c.model.dtype = "bf16".into();
        c.sampler.max_batch = 64;
        c.sampler.context = 2048;
        let h200 = 150_000_000_000;
        let plan = MemoryPlan::of(&c, &qwen3_8b(), 2, Purpose::Train);
        // 8.19e9 parameters x (2 + 2 + 4 + 8 + 4) bytes = 163.8 GB, and a 19.3 GB KV cache
        assert!((plan.fixed_bytes() as f64 / GB - 183.1).abs() < 1.0, "{}", plan.summary(Some(h200)));
        let err = plan.check(Some(h200)).unwrap_err().to_string();
        assert!(err.contains("model.path") && err.contains("device holds 150.0 GB") && err.contains("AdamW moments 65.5 GB"), "{err}");
        let sampling = MemoryPlan::of(&c, &qwen3_8b(), 2, Purpose::Sample);
        assert!(sampling.check(Some(h200)).unwrap().is_none(), "{}", sampling.summary(Some(h200)));
        // on 2 ranks with the optimizer state sharded: (8.19e9 / 2 + the 0.62e9 embedding) x 12
        // bytes of masters and moments, 56.6 GB instead of 98.3: the fixed part fits
        let two = MemoryPlan::of_rank(&c, &qwen3_8b(), 2, Purpose::Train, 2);
        assert!((two.fixed_bytes() as f64 / GB - 141.4).abs() < 1.0, "{}", two.summary(Some(h200)));
        assert!(two.check(Some(h200)).is_ok(), "{}", two.summary(Some(h200)));
        c.train.shard_optimizer = false;
        assert_eq!(MemoryPlan::of_rank(&c, &qwen3_8b(), 2, Purpose::Train, 2).fixed_bytes(), plan.fixed_bytes());
    }

    #[test]
    fn lora_on_8b_holds_the_frozen_base_once_and_fits_an_80_gb_card() {
        let mut c = Config::default();
        c.model.dtype = "bf16".into();
        (c.sampler.max_batch, c.sampler.context) = (128, 2112);
        c.sampler.kv_budget_mib = Sizing::Set(20_000.0);
        c.lora.rank = 32;
        let plan = MemoryPlan::of(&c, &qwen3_8b(), 2, Purpose::Train);
        // 8.19e9 x 2 bytes of base once; 87.3e6 adapter parameters (r 32 on every projection of
        // 36 layers) x (2 copies x 2 + 4 + 8 + 4) bytes; a 20,000 MiB pool (20.97 GB)
        let summary = plan.summary(Some(80_000_000_000));
        assert!((plan.fixed_bytes() as f64 / GB - 39.1).abs() < 0.3, "{summary}");
        assert!(summary.contains("frozen base weights (shared by sampler and trainer) 16.4 GB") && !summary.contains("AdamW moments 65"), "{summary}");
        assert!(plan.check(Some(80_000_000_000)).is_ok(), "{summary}");
        c.lora.rank = 0;
        assert!(MemoryPlan::of(&c, &qwen3_8b(), 2, Purpose::Train).check(Some(80_000_000_000)).is_err(), "full-parameter 8B fits 80 GB?");
    }

    #[test]
    fn a_kv_cache_that_cannot_fit_names_the_sampler_keys_and_a_budget_fixes_it() {
        let mut c = Config::default();
        c.model.dtype = "bf16".into();
        c.sampler.max_batch = 4096;
        c.sampler.context = 32768;
        let err = MemoryPlan::of(&c, &qwen3_8b(), 2, Purpose::Sample).check(Some(150_000_000_000)).unwrap_err().to_string();
        assert!(err.contains("sampler.kv_budget_mib") && err.contains("KV cache"), "{err}");
        c.sampler.kv_budget_mib = Sizing::Set(60_000.0);
        assert!(MemoryPlan::of(&c, &qwen3_8b(), 2, Purpose::Sample).check(Some(150_000_000_000)).unwrap().is_none());
    }

    #[test]
    fn large_passes_warn_with_the_micro_batch_key_and_unknown_devices_pass() {
        let mut c = Config::default();
        c.model.dtype = "bf16".into();
        c.train.prompts_per_step = 32;
        c.train.group_size = 16;
        c.sampler.context = 4096;
        c.sampler.kv_budget_mib = Sizing::Set(10_000.0);
        let small = qwen3_0_6b();
        let plan = MemoryPlan::of(&c, &small, 2, Purpose::Train);
        let warning = plan.check(Some(80_000_000_000)).unwrap().expect("a warning");
        assert!(warning.contains("train.micro_batch_tokens"), "{warning}");
        c.train.micro_batch_tokens = Sizing::Set(8192);
        assert!(MemoryPlan::of(&c, &small, 2, Purpose::Train).check(Some(80_000_000_000)).unwrap().is_none());
        assert!(plan.check(None).unwrap().is_none());
        // absurd sizes (refused by name before loading) do not overflow the plan
        c.sampler.context = usize::MAX / 2;
        c.sampler.max_batch = usize::MAX / 2;
        c.sampler.kv_budget_mib = Sizing::Set(0.0);
        let huge = MemoryPlan::of(&c, &small, 2, Purpose::Train);
        assert!(huge.check(Some(80_000_000_000)).is_err());
    }

    #[test]
    fn an_h200_kv_pool_on_an_80_gb_card_warns_naming_the_kv_budget_too() {
        // configs/qwen3-0.6b.toml's pool (62,000 MiB) beside a 16,384-token pass on an H100
        // 80GB: 77.6 GB fixed + ~24.5 GB (a run ran out of memory in the update there)
        let mut c = Config::default();
        c.model.dtype = "bf16".into();
        c.train.prompts_per_step = 4;
        c.train.group_size = 16;
        c.sampler.context = 1088;
        c.sampler.kv_budget_mib = Sizing::Set(62_000.0);
        c.train.micro_batch_tokens = Sizing::Set(16_384);
        let small = qwen3_0_6b();
        let warning = MemoryPlan::of(&c, &small, 2, Purpose::Train).check(Some(85_000_000_000)).unwrap().expect("a warning");
        assert!(warning.contains("train.micro_batch_tokens") && warning.contains("sampler.kv_budget_mib (the KV cache's 65.0 GB"), "{warning}");
        // a small pool leaves only the pass to name
        c.sampler.kv_budget_mib = Sizing::Set(2_000.0);
        c.train.micro_batch_tokens = Sizing::Set(200_000);
        let warning = MemoryPlan::of(&c, &small, 2, Purpose::Train).check(Some(85_000_000_000)).unwrap().expect("a warning");
        assert!(warning.contains("train.micro_batch_tokens") && !warning.contains("kv_budget"), "{warning}");
    }

    #[test]
    fn a_tensor_past_the_runtimes_binding_limit_names_the_key_that_sizes_it() {
        // Qwen3-8B in bf16: one layer's K cache of 64 x 2,048 positions is 268 MB, the
        // embedding 1.24 GB (2.49 GB as f32 masters when training)
        let mut c = Config::default();
        c.model.path = "/some/checkpoint".into();
        c.sampler.max_batch = 64;
        c.sampler.context = 2048;
        let plan = MemoryPlan::of(&c, &qwen3_8b(), 2, Purpose::Sample);
        let err = plan.check_tensor_limit(Some(128 << 20)).unwrap_err().to_string();
        assert!(err.contains("sampler.context") && err.contains("268.4 MB") && err.contains("KV cache"), "{err}");
        c.sampler.kv_budget_mib = Sizing::Set(100.0);
        let err = MemoryPlan::of(&c, &qwen3_8b(), 2, Purpose::Sample).check_tensor_limit(Some(128 << 20)).unwrap_err().to_string();
        assert!(err.contains("model.path") && err.contains(".weight`") && err.contains("1.2 GB"), "{err}");
        let err = MemoryPlan::of(&c, &qwen3_8b(), 2, Purpose::Train).check_tensor_limit(Some(2 << 30)).unwrap_err().to_string();
        assert!(err.contains("2.5 GB"), "{err}");
        assert!(MemoryPlan::of(&c, &qwen3_8b(), 2, Purpose::Train).check_tensor_limit(Some(4 << 30)).is_ok());
        assert!(plan.check_tensor_limit(None).is_ok());
        // the embedded model's shape is named by its own keys
        c.model.path.clear();
        let err = MemoryPlan::of(&c, &qwen3_8b(), 2, Purpose::Sample).check_tensor_limit(Some(128 << 20)).unwrap_err().to_string();
        assert!(err.contains("model.hidden_size"), "{err}");
    }

    #[test]
    fn a_trainer_pass_past_the_index_range_is_refused_before_sampling_naming_the_key() {
        // 64 x 16 rollouts of 8,192 positions in one pass: 8.4 M tokens x 12,288 = 1.0e11 elements
        let mut c = Config::default();
        c.train.prompts_per_step = 64;
        c.train.group_size = 16;
        c.sampler.context = 8192;
        let err = check_pass_size(&c, &qwen3_8b()).unwrap_err().to_string();
        assert!(err.contains("train.prompts_per_step") && err.contains("349525"), "{err}");
        c.train.micro_batch_tokens = Sizing::Set(16384);
        assert!(check_pass_size(&c, &qwen3_8b()).is_ok());
        c.train.micro_batch_tokens = Sizing::Set(1 << 20);
        let err = check_pass_size(&c, &qwen3_8b()).unwrap_err().to_string();
        assert!(err.contains("train.micro_batch_tokens"), "{err}");
    }
}
