//! The Hugging Face tensor names, spelled once. Loading, saving, the expected-tensor list, the
//! weight walk (hence the weight fingerprint and the optimizer's state) all read this table, in
//! this order: the embedding, each layer's tensors in [`LayerTensor::ALL`] order, the final
//! norm, the untied LM head.

use super::ModelConfig;

pub const EMBED: &str = "model.embed_tokens.weight";
pub const FINAL_NORM: &str = "model.norm.weight";
/// Present only when the head is not tied to [`EMBED`].
pub const LM_HEAD: &str = "lm_head.weight";

/// One tensor of a decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerTensor {
    InputNorm,
    QProj,
    /// q/k/v biases: Qwen2, or `attention_bias` (which also gives o_proj one).
    QBias,
    KProj,
    KBias,
    VProj,
    VBias,
    OProj,
    OBias,
    /// Qwen3 only (per-head RMSNorm of q and k before RoPE).
    QNorm,
    KNorm,
    PostNorm,
    GateProj,
    UpProj,
    DownProj,
}

impl LayerTensor {
    /// Checkpoint order.
    pub const ALL: [LayerTensor; 15] = [
        LayerTensor::InputNorm,
        LayerTensor::QProj,
        LayerTensor::QBias,
        LayerTensor::KProj,
        LayerTensor::KBias,
        LayerTensor::VProj,
        LayerTensor::VBias,
        LayerTensor::OProj,
        LayerTensor::OBias,
        LayerTensor::QNorm,
        LayerTensor::KNorm,
        LayerTensor::PostNorm,
        LayerTensor::GateProj,
        LayerTensor::UpProj,
        LayerTensor::DownProj,
    ];

    /// The name's part after `model.layers.{i}.`.
    pub fn suffix(self) -> &'static str {
        match self {
            LayerTensor::InputNorm => "input_layernorm.weight",
            LayerTensor::QProj => "self_attn.q_proj.weight",
            LayerTensor::KProj => "self_attn.k_proj.weight",
            LayerTensor::VProj => "self_attn.v_proj.weight",
            LayerTensor::OProj => "self_attn.o_proj.weight",
            LayerTensor::QBias => "self_attn.q_proj.bias",
            LayerTensor::KBias => "self_attn.k_proj.bias",
            LayerTensor::VBias => "self_attn.v_proj.bias",
            LayerTensor::OBias => "self_attn.o_proj.bias",
            LayerTensor::QNorm => "self_attn.q_norm.weight",
            LayerTensor::KNorm => "self_attn.k_norm.weight",
            LayerTensor::PostNorm => "post_attention_layernorm.weight",
            LayerTensor::GateProj => "mlp.gate_proj.weight",
            LayerTensor::UpProj => "mlp.up_proj.weight",
            LayerTensor::DownProj => "mlp.down_proj.weight",
        }
    }

    /// The full name in layer `layer`.
    pub fn name(self, layer: usize) -> String {
        format!("model.layers.{layer}.{}", self.suffix())
    }

    /// Whether a model of shape `c` has this tensor.
    pub fn present(self, c: &ModelConfig) -> bool {
        match self {
            LayerTensor::QNorm | LayerTensor::KNorm => c.qk_norm,
            LayerTensor::QBias | LayerTensor::KBias | LayerTensor::VBias => c.qkv_bias,
            LayerTensor::OBias => c.o_bias,
            _ => true,
        }
    }

    /// Whether layer `layer` of a model of shape `c` has this tensor (a sparse MoE layer has
    /// the router and experts instead of the dense gate/up/down).
    pub fn present_in(self, c: &ModelConfig, layer: usize) -> bool {
        let dense_mlp = matches!(self, LayerTensor::GateProj | LayerTensor::UpProj | LayerTensor::DownProj);
        self.present(c) && !(dense_mlp && c.moe.as_ref().is_some_and(|m| m.is_sparse(layer)))
    }

    /// Its shape in HF layout (`[out, in]` for projections).
    pub fn shape(self, c: &ModelConfig) -> Vec<usize> {
        let (h, f, d) = (c.hidden_size, c.intermediate_size, c.head_dim);
        let (q, kv) = (c.num_heads * d, c.num_kv_heads * d);
        match self {
            LayerTensor::InputNorm | LayerTensor::PostNorm => vec![h],
            LayerTensor::QProj => vec![q, h],
            LayerTensor::KProj | LayerTensor::VProj => vec![kv, h],
            LayerTensor::OProj => vec![h, q],
            LayerTensor::QNorm | LayerTensor::KNorm => vec![d],
            LayerTensor::QBias => vec![q],
            LayerTensor::KBias | LayerTensor::VBias => vec![kv],
            LayerTensor::OBias => vec![h],
            LayerTensor::GateProj | LayerTensor::UpProj => vec![f, h],
            LayerTensor::DownProj => vec![h, f],
        }
    }
}

impl ModelConfig {
    /// Every tensor the checkpoint must hold, with its shape, in HF names (checkpoint order).
    pub fn expected_tensors(&self) -> Vec<(String, Vec<usize>)> {
        expected_tensors(self)
    }
}

/// Every tensor a checkpoint of shape `c` holds, with its shape, in checkpoint order.
pub fn expected_tensors(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let mut out = vec![(EMBED.to_string(), vec![c.vocab_size, c.hidden_size])];
    for i in 0..c.num_layers {
        out.extend(LayerTensor::ALL.iter().filter(|t| t.present_in(c, i)).map(|t| (t.name(i), t.shape(c))));
        if let Some(m) = c.moe.as_ref().filter(|m| m.is_sparse(i)) {
            out.extend(super::moe::sparse_tensors(c, m, i));
        }
    }
    out.push((FINAL_NORM.to_string(), vec![c.hidden_size]));
    if !c.tie_word_embeddings {
        out.push((LM_HEAD.to_string(), vec![c.vocab_size, c.hidden_size]));
    }
    out
}

/// The first tensor of `names` inside the decoder (`model.` or `lm_head.`) that a checkpoint of
/// shape `c` does not have: a q_norm in a Llama config, a bias config.json does not announce, a
/// layer past `num_hidden_layers`. The forward would skip it and compute another model than the
/// checkpoint's, so it is an error. Ignored as transformers ignores them: a tied checkpoint's
/// `lm_head.weight` (the embedding is used), old checkpoints' rotary `inv_freq` buffers, and
/// tensors outside the decoder (a value or score head).
/// Why [`unexpected_decoder_tensor`]'s tensor is refused.
pub const UNEXPECTED: &str = "in the checkpoint but not in the model config.json describes (the forward would skip it and compute another model): check the architecture, its bias and norm keys, and num_hidden_layers";

pub fn unexpected_decoder_tensor<'a>(c: &ModelConfig, names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let expected: std::collections::HashSet<String> = expected_tensors(c).into_iter().map(|(n, _)| n).collect();
    names.into_iter().filter(|n| n.starts_with("model.") || n.starts_with("lm_head.")).filter(|n| !expected.contains(*n)).filter(|n| !(c.tie_word_embeddings && *n == LM_HEAD) && !n.ends_with("rotary_emb.inv_freq")).min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(arch: &str, tied: bool) -> ModelConfig {
        let json = serde_json::json!({
            "architectures": [arch], "vocab_size": 32, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 256, "tie_word_embeddings": tied
        });
        ModelConfig::from_json(&json.to_string(), "config.json").unwrap()
    }

    #[test]
    fn decoder_tensors_the_config_does_not_describe_are_found_and_harmless_extras_pass() {
        let qwen3: Vec<String> = expected_tensors(&config("Qwen3ForCausalLM", true)).into_iter().map(|(n, _)| n).collect();
        fn with<'a>(base: &'a [String], extra: &[&'a str]) -> Vec<&'a str> {
            base.iter().map(String::as_str).chain(extra.iter().copied()).collect()
        }
        let names = |extra: &[&'static str]| with(&qwen3, extra);
        let tied = config("Qwen3ForCausalLM", true);
        assert_eq!(unexpected_decoder_tensor(&tied, names(&[])), None);
        // what transformers also ignores: a tied model's lm_head, rotary buffers, heads outside the decoder
        assert_eq!(unexpected_decoder_tensor(&tied, names(&["lm_head.weight", "model.layers.0.self_attn.rotary_emb.inv_freq", "v_head.summary.weight", "score.weight"])), None);
        // a Qwen3 checkpoint read as Llama: its q_norm / k_norm would be skipped
        assert_eq!(unexpected_decoder_tensor(&config("LlamaForCausalLM", true), names(&[])), Some("model.layers.0.self_attn.k_norm.weight"));
        // a layer past num_hidden_layers, a bias config.json does not announce, an untied head
        assert_eq!(unexpected_decoder_tensor(&tied, names(&["model.layers.2.mlp.up_proj.weight"])), Some("model.layers.2.mlp.up_proj.weight"));
        assert_eq!(unexpected_decoder_tensor(&tied, names(&["model.layers.1.self_attn.q_proj.bias"])), Some("model.layers.1.self_attn.q_proj.bias"));
        let untied = config("Qwen3ForCausalLM", false);
        assert_eq!(unexpected_decoder_tensor(&untied, names(&["lm_head.weight", "lm_head.bias"])), Some("lm_head.bias"));
    }
}
