//! The model's sizes as the memory plan's arithmetic needs them: the fixed parts, the KV cache
//! and one trainer pass's activation estimate.

use crate::config::Config;
use shared_kernels::model::ModelConfig;

/// What the plan is for: `lockstep train` holds the optimizer state and the activations of a
/// pass, `lockstep sample` only the weights and the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    Train,
    Sample,
}

pub struct Part {
    pub what: &'static str,
    pub bytes: u64,
}

pub(crate) const GB: f64 = 1e9;

/// Bytes in GB, or MB below one GB.
pub(crate) fn size(bytes: u64) -> String {
    if bytes as f64 >= GB { format!("{:.1} GB", bytes as f64 / GB) } else { format!("{:.1} MB", bytes as f64 / 1e6) }
}

/// The model's sizes as the plan's arithmetic needs them (in f64: a config with absurd sizes,
/// refused by name elsewhere, must not overflow here; `as u64` saturates).
pub(crate) struct Shape {
    pub(crate) params: f64,
    largest: f64,
    embedding: f64,
    tied: bool,
    pub(crate) layers: f64,
    pub(crate) hidden: f64,
    pub(crate) intermediate: f64,
    pub(crate) heads: f64,
    /// Query heads per KV head.
    pub(crate) group: usize,
    pub(crate) head_dim: f64,
    pub(crate) vocab: usize,
    pub(crate) dtype: f64,
    /// One KV block's bytes (every layer's K and V for `BLOCK` positions).
    pub(crate) per_block: f64,
    /// The LoRA adapters' parameters (0 without `[lora]`): then only they are trained.
    pub(crate) adapter_params: f64,
    /// Mixture-of-experts layers (0 for a dense model) and, per token in one of them, the MLP's
    /// values in place of a dense MLP's `4 x intermediate`: each of its k experts' gathered
    /// input, gate, up, activation, down and weighted output (4 x hidden + 3 x expert width),
    /// and the router's logits; `experts` and `expert_row` (an expert row's values) size the
    /// rows the experts' training layout may add per sequence (up to a fold granule less one).
    pub(crate) sparse_layers: f64,
    pub(crate) sparse_mlp_token: f64,
    pub(crate) experts: f64,
    pub(crate) expert_row: f64,
}

impl Shape {
    pub(crate) fn of(c: &Config, m: &ModelConfig, dtype_bytes: u64) -> Self {
        let n = |x: usize| x as f64;
        let sizes: Vec<f64> = m.expected_tensors().iter().map(|(_, shape)| shape.iter().map(|&d| n(d)).product::<f64>()).collect();
        let block = shared_kernels::ops::attention::BLOCK as f64;
        let dtype = dtype_bytes as f64;
        Self {
            params: sizes.iter().sum(),
            largest: sizes.iter().copied().fold(0.0, f64::max),
            embedding: n(m.vocab_size) * n(m.hidden_size),
            tied: m.tie_word_embeddings,
            layers: n(m.num_layers),
            hidden: n(m.hidden_size),
            intermediate: n(m.intermediate_size),
            heads: n(m.num_heads),
            group: m.num_heads / m.num_kv_heads.max(1),
            head_dim: n(m.head_dim),
            vocab: m.vocab_size,
            dtype,
            per_block: 2.0 * n(m.num_layers) * block * n(m.num_kv_heads) * n(m.head_dim) * dtype,
            adapter_params: Self::adapter_params(c, m),
            sparse_layers: m.moe.as_ref().map_or(0.0, |moe| n((0..m.num_layers).filter(|&i| moe.is_sparse(i)).count())),
            sparse_mlp_token: m.moe.as_ref().map_or(0.0, |moe| n(moe.top_k) * (4.0 * n(m.hidden_size) + 3.0 * n(moe.expert_intermediate)) + n(moe.num_experts)),
            experts: m.moe.as_ref().map_or(0.0, |moe| n(moe.num_experts)),
            expert_row: m.moe.as_ref().map_or(0.0, |moe| 2.0 * n(m.hidden_size) + 3.0 * n(moe.expert_intermediate)),
        }
    }

    /// One token's values through every layer (model dtype): 8 x hidden for attention, norms
    /// and residuals, and the MLP's (dense: 4 x intermediate; sparse: `sparse_mlp_token`).
    pub(crate) fn token_values(&self) -> f64 {
        self.layers * 8.0 * self.hidden + (self.layers - self.sparse_layers) * 4.0 * self.intermediate + self.sparse_layers * self.sparse_mlp_token
    }

    /// The widest layer's values for one token (what `train.recompute_layers` keeps besides the
    /// layer inputs).
    pub(crate) fn layer_values(&self) -> f64 {
        let dense = if self.sparse_layers < self.layers { 4.0 * self.intermediate } else { 0.0 };
        8.0 * self.hidden + dense.max(if self.sparse_layers > 0.0 { self.sparse_mlp_token } else { 0.0 })
    }

    /// r x (in + out) per adapted projection (each expert's on a sparse layer) and layer:
    /// `[lora]`'s shape, or `lora.path`'s.
    fn adapter_params(c: &Config, m: &ModelConfig) -> f64 {
        if !c.lora.enabled() {
            return 0.0;
        }
        let from_file = (!c.lora.path.is_empty()).then(|| shared_kernels::model::lora_files::read_adapter_config(std::path::Path::new(&c.lora.path)).ok()).flatten();
        let Some(spec) = from_file.or_else(|| c.lora.spec().ok()) else { return 0.0 };
        let sites = (0..m.num_layers).flat_map(|i| shared_kernels::model::lora::sites(m, &spec, i));
        sites.map(|s| spec.rank * (s.dims.0 + s.dims.1)).sum::<usize>() as f64
    }

    /// KV blocks one request of `sampler.context` positions takes.
    pub(crate) fn request_blocks(c: &Config) -> f64 {
        (c.sampler.context as f64 / shared_kernels::ops::attention::BLOCK as f64).ceil()
    }

    /// The KV cache's bytes for a budget of `budget` bytes, as
    /// `sampler::EngineConfig::from_budget` sizes it (whole blocks).
    pub(crate) fn kv_bytes(&self, budget: f64) -> f64 {
        let blocks = if budget > 0.0 { (budget / self.per_block.max(1.0)).floor() } else { 0.0 };
        self.per_block * blocks
    }

    /// The cache for `max_batch` requests of `context` positions each (more is never used).
    pub(crate) fn kv_full_bytes(&self, c: &Config) -> f64 {
        self.per_block * c.sampler.max_batch as f64 * Self::request_blocks(c)
    }

    /// Every fixed part but the KV cache.
    pub(crate) fn fixed_parts(&self, c: &Config, purpose: Purpose, ranks: usize) -> Vec<Part> {
        let sat = |x: f64| x as u64;
        let (params, dtype) = (self.params, self.dtype);
        if purpose == Purpose::Sample {
            // the engine takes the loaded weights and keeps them resident: one copy
            return vec![Part { what: "weights", bytes: sat(params * dtype) }];
        }
        if self.adapter_params > 0.0 {
            // LoRA: the frozen base once (the trainer computes on the engine's resident copy);
            // the adapters in both, and only they carry masters, moments and gradients
            let a = self.adapter_params;
            let mut fixed = vec![Part { what: "frozen base weights (shared by sampler and trainer)", bytes: sat(params * dtype) }, Part { what: "LoRA adapters (trainer and sampler)", bytes: sat(2.0 * a * dtype) }];
            if dtype < 4.0 {
                fixed.push(Part { what: "adapters' f32 masters", bytes: sat(a * 4.0) });
            }
            fixed.push(Part { what: "adapters' AdamW moments", bytes: sat(a * 8.0) });
            fixed.push(Part { what: "adapters' f32 gradients", bytes: sat(a * 4.0) });
            if c.train.kl_coef > 0.0 {
                fixed.push(Part { what: "KL reference adapters", bytes: sat(a * dtype) });
            }
            return fixed;
        }
        let mut fixed = vec![Part { what: "weights (trainer)", bytes: sat(params * dtype) }, Part { what: "weights (sampler's resident copy)", bytes: sat(params * dtype) }];
        let owned = if ranks > 1 && c.train.shard_optimizer { (params / ranks as f64 + self.largest).min(params) } else { params };
        if dtype < 4.0 {
            fixed.push(Part { what: "f32 master weights", bytes: sat(owned * 4.0) });
        }
        fixed.push(Part { what: "AdamW moments", bytes: sat(owned * 8.0) });
        let tied = if self.tied { self.embedding * 4.0 } else { 0.0 };
        fixed.push(Part { what: "f32 gradients", bytes: sat(params * 4.0 + tied) });
        if c.train.gradient_blocks > 1 {
            // finished blocks' sums held by the pairwise tree: log2(blocks) on one rank (fewer on more)
            let held = c.train.gradient_blocks.trailing_zeros() as f64;
            fixed.push(Part { what: "gradient blocks' partial sums (train.gradient_blocks)", bytes: sat(held * (params * 4.0 + tied)) });
        }
        if c.train.kl_coef > 0.0 {
            fixed.push(Part { what: "KL reference model", bytes: sat(params * dtype) });
        }
        fixed
    }

    /// The most tokens a step's pass can hold: every rollout at full `sampler.context`.
    pub(crate) fn step_tokens(c: &Config) -> f64 {
        c.train.prompts_per_step as f64 * c.train.group_size as f64 * c.sampler.context as f64
    }

    /// The tokens a pass of `micro_batch_tokens` (0: the whole step) holds at most: at least one
    /// full sequence (a longer one runs alone), at most the step.
    pub(crate) fn clamp_pass(&self, c: &Config, micro_batch_tokens: usize) -> f64 {
        let step = Self::step_tokens(c);
        if micro_batch_tokens == 0 { step } else { (micro_batch_tokens as f64).max(c.sampler.context as f64).min(step) }
    }

    /// One trainer pass of `pass_tokens` tokens: per token and layer 8 x hidden + 4 x
    /// intermediate values in the model's dtype, a sparse layer's experts instead of the
    /// intermediate ([`Shape::token_values`]; with `train.recompute_layers`, each layer's input
    /// plus one layer's values), the experts' padded layout, one LM-head chunk's logits and
    /// their gradient, and a few `[heads, t, t]` f32 score tensors of the dense attention
    /// backward where it runs.
    pub(crate) fn activation_bytes(&self, c: &Config, pass_tokens: f64) -> f64 {
        let per_token = if c.train.recompute_layers.on() { (self.layers * self.hidden + self.layer_values()) * self.dtype } else { self.token_values() * self.dtype };
        // a sparse layer's padded expert layout: up to a granule less one row per expert and
        // sequence (sequences of sampler.context tokens at the shortest)
        let sequences = (pass_tokens / (c.sampler.context as f64).max(1.0)).ceil().max(1.0);
        let granule = shared_kernels::grad_fold::FOLD_ROWS as f64;
        let padding_layers = if c.train.recompute_layers.on() { self.sparse_layers.min(1.0) } else { self.sparse_layers };
        let padding = padding_layers * self.experts * sequences * (granule - 1.0) * self.expert_row * self.dtype;
        let head_rows = (shared_kernels::ops::logits::head_logprobs::head_chunk_rows(self.vocab) as f64).min(pass_tokens);
        let head = head_rows * self.vocab as f64 * (self.dtype + 8.0);
        let t = c.sampler.context as f64;
        // CUDA's 16-bit attention backward (the tensor-core kernels) keeps two statistics a row
        // and head, not the scores; elsewhere a few `[heads, t, t]` f32 tensors (docs/scale.md)
        let dense_scores = !(cfg!(feature = "cuda") && self.dtype < 4.0);
        let scores = if dense_scores { (5.0 * self.heads * t * t * 4.0).min(5.0 * 2f64.powi(31)) } else { 0.0 };
        pass_tokens * per_token + head + scores + padding
    }

    /// The widest activation a token has (`[tokens, width]` tensors): the 32-bit index range
    /// and a runtime's binding limit bound the tokens of a pass by it.
    pub(crate) fn widest(m: &ModelConfig) -> usize {
        m.intermediate_size.max(m.hidden_size).max(m.num_heads * m.head_dim)
    }
}
