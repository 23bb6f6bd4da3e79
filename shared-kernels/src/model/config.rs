//! The model's shape, read from a Hugging Face `config.json` (Qwen3 and Llama keys).

use super::rope_scaling::Rope;
use super::ModelError;
use serde_json::Value;
use std::path::Path;

/// Architectures this forward implements, by their `architectures[0]` name.
pub const SUPPORTED: [&str; 2] = ["Qwen3ForCausalLM", "LlamaForCausalLM"];

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
        for key in ["attention_bias", "mlp_bias"] {
            if raw.get(key).and_then(Value::as_bool) == Some(true) {
                return Err(err(key, "biases in attention/MLP projections are not supported".into()));
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
        Ok(Self {
            qk_norm: arch == "Qwen3ForCausalLM",
            architecture: arch,
            vocab_size: usize_key("vocab_size")?,
            hidden_size,
            intermediate_size: usize_key("intermediate_size")?,
            num_layers: usize_key("num_hidden_layers")?,
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

    /// Every tensor the checkpoint must hold, with its shape, in HF names (checkpoint order).
    pub fn expected_tensors(&self) -> Vec<(String, Vec<usize>)> {
        super::names::expected_tensors(self)
    }
}
