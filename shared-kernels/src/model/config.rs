//! The model's shape, read from a Hugging Face `config.json` (Qwen3, Qwen2, Llama and Mistral keys).

use super::rope_scaling::Rope;
use super::ModelError;
use serde_json::Value;
use std::path::Path;

/// Architectures this forward implements, by their `architectures[0]` name: Qwen3 (q/k norms),
/// Qwen3-MoE (q/k norms, sparse MLPs: `moe.rs`), Qwen2 (q/k/v biases), Llama and Mistral
/// (neither; Mistral without a sliding window).
pub const SUPPORTED: [&str; 5] = ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"];

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    /// RoPE's base and scaling (`rope_scaling` / `rope_parameters`).
    pub rope: Rope,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Qwen3 normalises q and k per head before RoPE; Llama does not.
    pub qk_norm: bool,
    /// q/k/v projections with biases (Qwen2 always; others with `attention_bias`).
    pub qkv_bias: bool,
    /// o_proj with a bias (`attention_bias` outside Qwen2, whose o_proj has none).
    pub o_bias: bool,
    /// Qwen3-MoE: the experts and which layers are sparse.
    pub moe: Option<MoeConfig>,
    /// The file as read, so a saved checkpoint keeps every key transformers wrote.
    pub raw: Value,
}

impl ModelConfig {
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        Self::from_json(&text, &path.display().to_string())
    }

    /// `origin` names the file in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<Self, ModelError> {
        let raw: Value = serde_json::from_str(text).map_err(|e| ModelError::malformed(origin, format!("not valid JSON: {e}")))?;
        let err = |key: &str, message: String| ModelError::Config { file: origin.to_string(), key: key.to_string(), message };
        let arch = raw
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .ok_or_else(|| err("architectures", "missing; expected e.g. [\"Qwen3ForCausalLM\"]".into()))?
            .to_string();
        if !SUPPORTED.contains(&arch.as_str()) {
            return Err(err("architectures", format!("`{arch}` is not supported; lockstep implements {SUPPORTED:?}")));
        }
        let usize_key = |key: &str| -> Result<usize, ModelError> {
            match raw.get(key) {
                Some(v) => v.as_u64().filter(|&n| n > 0).map(|n| n as usize).ok_or_else(|| err(key, format!("must be a positive integer, got {v}"))),
                None => Err(err(key, "missing".into())),
            }
        };
        let float_key = |key: &str, default: f64| -> Result<f64, ModelError> {
            match raw.get(key) {
                Some(v) => v.as_f64().filter(|f| f.is_finite() && *f > 0.0).ok_or_else(|| err(key, format!("must be a positive number, got {v}"))),
                None => Ok(default),
            }
        };
        let flag = |key: &str| -> Result<bool, ModelError> {
            match raw.get(key) {
                None | Some(Value::Null) => Ok(false),
                Some(v) => v.as_bool().ok_or_else(|| err(key, format!("must be true or false, got {v}"))),
            }
        };
        // quantized weights (GPTQ, AWQ, FP8 with scales, bitsandbytes) are stored under other
        // tensor names and dtypes; say so rather than report a missing weight
        if let Some(q) = raw.get("quantization_config").filter(|v| !v.is_null()) {
            let method = q.get("quant_method").and_then(|m| m.as_str()).unwrap_or("unnamed");
            return Err(err("quantization_config", format!("a {method}-quantized checkpoint; lockstep trains and samples full-precision weights (bf16, f16 or f32): give the unquantized checkpoint")));
        }
        if flag("mlp_bias")? {
            return Err(err("mlp_bias", "biases in the MLP projections are not supported".into()));
        }
        let attention_bias = flag("attention_bias")?;
        let qwen2 = arch == "Qwen2ForCausalLM";
        // SiLU-gated MLPs only: another activation would be computed as SiLU, silently wrong
        if let Some(act) = raw.get("hidden_act").or_else(|| raw.get("hidden_activation")).filter(|v| !v.is_null()) {
            if act.as_str() != Some("silu") {
                return Err(err("hidden_act", format!("{act}: only \"silu\" (SwiGLU) is supported")));
            }
        }
        // every layer attends to its whole prefix: a sliding window would be ignored
        if flag("use_sliding_window")? {
            return Err(err("use_sliding_window", "sliding-window attention is not supported (every layer attends to the whole prefix)".into()));
        }
        if let Some(kinds) = raw.get("layer_types").and_then(Value::as_array) {
            if let Some(other) = kinds.iter().find(|k| k.as_str() != Some("full_attention")) {
                return Err(err("layer_types", format!("{other}: only \"full_attention\" layers are supported")));
            }
        }
        if arch == "MistralForCausalLM" {
            if let Some(w) = raw.get("sliding_window").filter(|v| !v.is_null()) {
                return Err(err("sliding_window", format!("{w}: Mistral's sliding-window attention is not supported (Mistral checkpoints with `sliding_window: null`, v0.2 on, are)")));
            }
        }
        let hidden_size = usize_key("hidden_size")?;
        let num_heads = usize_key("num_attention_heads")?;
        let num_kv_heads = match raw.get("num_key_value_heads") {
            Some(_) => usize_key("num_key_value_heads")?,
            None => num_heads,
        };
        let head_dim = match raw.get("head_dim").filter(|v| !v.is_null()) {
            Some(_) => usize_key("head_dim")?,
            None => hidden_size / num_heads,
        };
        if num_heads % num_kv_heads != 0 {
            return Err(err("num_key_value_heads", format!("{num_kv_heads} does not divide num_attention_heads {num_heads}")));
        }
        if head_dim % 2 != 0 {
            return Err(err("head_dim", format!("must be even for RoPE, got {head_dim}")));
        }
        let max_position_embeddings = usize_key("max_position_embeddings")?;
        let rope = Rope::from_config(&raw, max_position_embeddings).map_err(|e| err(&e.key, e.message))?;
        let num_layers = usize_key("num_hidden_layers")?;
        let moe = (arch == "Qwen3MoeForCausalLM").then(|| MoeConfig::from_raw(&raw, num_layers, &err)).transpose()?;
        // a dense layer of a MoE model uses intermediate_size; one with none has no dense layer
        let every_layer_sparse = moe.as_ref().is_some_and(|m| (0..num_layers).all(|i| m.is_sparse(i)));
        Ok(Self {
            qk_norm: arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM",
            moe,
            qkv_bias: qwen2 || attention_bias,
            o_bias: attention_bias && !qwen2,
            architecture: arch,
            vocab_size: usize_key("vocab_size")?,
            hidden_size,
            intermediate_size: if every_layer_sparse { raw.get("intermediate_size").and_then(Value::as_u64).unwrap_or(0) as usize } else { usize_key("intermediate_size")? },
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: float_key("rms_norm_eps", 1e-6)?,
            rope,
            max_position_embeddings,
            tie_word_embeddings: raw.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
            raw,
        })
    }
}

/// The MoE keys of a Qwen3-MoE `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// Each expert's SwiGLU width (`moe_intermediate_size`).
    pub expert_intermediate: usize,
    pub norm_topk_prob: bool,
    /// Every `decoder_sparse_step`-th layer is sparse (layer i with (i + 1) % step == 0) ...
    pub sparse_step: usize,
    /// ... unless listed here (those keep the dense MLP of `intermediate_size`).
    pub mlp_only_layers: Vec<usize>,
    /// The load-balancing loss's weight (training).
    pub router_aux_loss_coef: f64,
}

impl MoeConfig {
    /// The MoE keys of `raw`; `err(key, message)` names a bad one.
    pub fn from_raw(raw: &Value, num_layers: usize, err: &dyn Fn(&str, String) -> ModelError) -> Result<Self, ModelError> {
        let positive = |key: &str, default: Option<usize>| -> Result<usize, ModelError> {
            match raw.get(key).filter(|v| !v.is_null()) {
                Some(v) => v.as_u64().filter(|&n| n > 0).map(|n| n as usize).ok_or_else(|| err(key, format!("must be a positive integer, got {v}"))),
                None => default.ok_or_else(|| err(key, "missing (a Qwen3-MoE config.json has it)".into())),
            }
        };
        // checkpoints on the Hub write `num_experts`; transformers 5 saves `num_local_experts`
        let num_experts = match (raw.get("num_experts").filter(|v| !v.is_null()), raw.get("num_local_experts").filter(|v| !v.is_null())) {
            (None, Some(_)) => positive("num_local_experts", None)?,
            (Some(_), Some(b)) if raw.get("num_experts") != Some(b) => return Err(err("num_local_experts", format!("{b} disagrees with num_experts {}", raw["num_experts"]))),
            _ => positive("num_experts", None)?,
        };
        let top_k = positive("num_experts_per_tok", None)?;
        if top_k > num_experts {
            return Err(err("num_experts_per_tok", format!("{top_k} experts per token of {num_experts}")));
        }
        let mlp_only_layers = match raw.get("mlp_only_layers").filter(|v| !v.is_null()) {
            None => Vec::new(),
            Some(Value::Array(list)) => list.iter().map(|v| v.as_u64().map(|n| n as usize).filter(|&n| n < num_layers).ok_or_else(|| err("mlp_only_layers", format!("{v} is not a layer index below num_hidden_layers {num_layers}")))).collect::<Result<_, _>>()?,
            Some(v) => return Err(err("mlp_only_layers", format!("must be a list of layer indices, got {v}"))),
        };
        let norm_topk_prob = match raw.get("norm_topk_prob") {
            None | Some(Value::Null) => false,
            Some(v) => v.as_bool().ok_or_else(|| err("norm_topk_prob", format!("must be true or false, got {v}")))?,
        };
        let router_aux_loss_coef = match raw.get("router_aux_loss_coef").filter(|v| !v.is_null()) {
            None => 0.001,
            Some(v) => v.as_f64().filter(|f| f.is_finite() && *f >= 0.0).ok_or_else(|| err("router_aux_loss_coef", format!("must be a number >= 0, got {v}")))?,
        };
        Ok(Self { num_experts, top_k, expert_intermediate: positive("moe_intermediate_size", None)?, norm_topk_prob, sparse_step: positive("decoder_sparse_step", Some(1))?, mlp_only_layers, router_aux_loss_coef })
    }

    /// Whether layer `layer` has the sparse MLP.
    pub fn is_sparse(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer) && (layer + 1) % self.sparse_step == 0
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    fn config(arch: &str, extra: serde_json::Value) -> Result<ModelConfig, String> {
        let mut json = serde_json::json!({
            "architectures": [arch], "vocab_size": 32, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 256, "rope_theta": 10000.0
        });
        json.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        ModelConfig::from_json(&json.to_string(), "config.json").map_err(|e| e.to_string())
    }

    #[test]
    fn each_family_reads_its_norms_and_biases() {
        let shape = |c: ModelConfig| (c.qk_norm, c.qkv_bias, c.o_bias);
        assert_eq!(shape(config("Qwen3ForCausalLM", serde_json::json!({"attention_bias": false})).unwrap()), (true, false, false));
        // Qwen2's q/k/v always carry biases, its o_proj never
        assert_eq!(shape(config("Qwen2ForCausalLM", serde_json::json!({"use_sliding_window": false, "sliding_window": 131072})).unwrap()), (false, true, false));
        assert_eq!(shape(config("LlamaForCausalLM", serde_json::json!({"attention_bias": true})).unwrap()), (false, true, true));
        assert_eq!(shape(config("MistralForCausalLM", serde_json::json!({"sliding_window": null})).unwrap()), (false, false, false));
        // a Qwen3-MoE config as the Hub's checkpoints write it and as transformers 5 saves it
        for key in ["num_experts", "num_local_experts"] {
            let c = config("Qwen3MoeForCausalLM", serde_json::json!({key: 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32})).unwrap();
            assert_eq!(c.moe.map(|m| (m.num_experts, m.top_k)), Some((8, 2)), "{key}");
        }
    }

    #[test]
    fn what_the_forward_would_compute_wrongly_is_refused_by_key() {
        let cases = [
            ("Qwen2ForCausalLM", serde_json::json!({"use_sliding_window": true}), "config key `use_sliding_window`"),
            ("Qwen3ForCausalLM", serde_json::json!({"layer_types": ["full_attention", "sliding_attention"]}), "config key `layer_types`"),
            ("MistralForCausalLM", serde_json::json!({"sliding_window": 4096}), "config key `sliding_window`: 4096"),
            ("LlamaForCausalLM", serde_json::json!({"hidden_act": "gelu"}), "config key `hidden_act`: \"gelu\""),
            ("LlamaForCausalLM", serde_json::json!({"mlp_bias": true}), "config key `mlp_bias`"),
            ("Qwen3ForCausalLM", serde_json::json!({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}), "config key `quantization_config`: a fp8-quantized"),
            ("LlamaForCausalLM", serde_json::json!({"attention_bias": "yes"}), "config key `attention_bias`: must be true or false"),
            ("GemmaForCausalLM", serde_json::json!({}), "config key `architectures`: `GemmaForCausalLM` is not supported"),
            ("Qwen3MoeForCausalLM", serde_json::json!({"num_experts": 4, "num_experts_per_tok": 8, "moe_intermediate_size": 32}), "config key `num_experts_per_tok`: 8 experts per token of 4"),
            ("Qwen3MoeForCausalLM", serde_json::json!({"num_experts_per_tok": 2, "moe_intermediate_size": 32}), "config key `num_experts`: missing"),
            ("Qwen3MoeForCausalLM", serde_json::json!({"num_experts": 4, "num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}), "config key `num_local_experts`: 8 disagrees with num_experts 4"),
            ("Qwen3MoeForCausalLM", serde_json::json!({"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "mlp_only_layers": [5]}), "config key `mlp_only_layers`: 5 is not a layer index"),
        ];
        for (arch, extra, want) in cases {
            let e = config(arch, extra.clone()).unwrap_err();
            assert!(e.starts_with(&format!("config.json: {want}")), "{arch} {extra}: {e}");
        }
    }
}
