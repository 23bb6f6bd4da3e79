//! Checkpoints in Hugging Face layout: `config.json`, `model.safetensors` (or shards with
//! `model.safetensors.index.json`), `tokenizer.json`. Saving writes the same layout so
//! transformers can load a trained policy; files are written aside and renamed into place.

use super::{ModelConfig, ModelError};
use burn::tensor::{DType, Device, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Host copy of every tensor, f32, by HF name, with its shape.
pub struct Checkpoint {
    pub config: ModelConfig,
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
}

pub(super) fn weights_err(file: &Path, tensor: &str, message: impl Into<String>) -> ModelError {
    ModelError::Weights { file: file.display().to_string(), tensor: tensor.to_string(), message: message.into() }
}

pub(super) fn to_f32(file: &Path, name: &str, view: &safetensors::tensor::TensorView<'_>) -> Result<Vec<f32>, ModelError> {
    let bytes = view.data();
    let words = |n: usize| bytes.chunks_exact(n);
    Ok(match view.dtype() {
        Dtype::F32 => words(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Dtype::BF16 => words(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::F16 => words(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        other => return Err(weights_err(file, name, format!("dtype {other:?} is not supported (f32, bf16, f16)"))),
    })
}

/// The safetensors files of a checkpoint folder: the index's shards, or `model.safetensors`.
pub(super) fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::malformed(index.display(), format!("not valid JSON: {e}")))?;
        let map = json.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| weights_err(&index, "weight_map", "missing or not an object"))?;
        let mut files: Vec<PathBuf> = map.values().filter_map(|v| v.as_str()).map(|f| dir.join(f)).collect();
        files.sort();
        files.dedup();
        return Ok(files);
    }
    let single = dir.join("model.safetensors");
    if !single.exists() {
        return Err(ModelError::malformed(single.display(), "not found (nor model.safetensors.index.json)"));
    }
    Ok(vec![single])
}

/// Reads config and weights from an HF checkpoint folder, checking every expected tensor's
/// presence and shape.
pub fn load_checkpoint(dir: &Path) -> Result<Checkpoint, ModelError> {
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    let mut found: HashMap<String, (PathBuf, Vec<usize>, Vec<f32>)> = HashMap::new();
    for file in weight_files(dir)? {
        let bytes = std::fs::read(&file).map_err(|e| ModelError::io(&file, e))?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| ModelError::malformed(file.display(), format!("corrupt safetensors: {e}")))?;
        for (name, view) in st.tensors() {
            let values = to_f32(&file, &name, &view)?;
            found.insert(name, (file.clone(), view.shape().to_vec(), values));
        }
    }
    if let Some(name) = super::names::unexpected_decoder_tensor(&config, found.keys().map(String::as_str)) {
        return Err(weights_err(&found[name].0, name, super::names::UNEXPECTED));
    }
    let mut tensors = BTreeMap::new();
    for (name, shape) in super::names::expected_tensors(&config) {
        let Some((file, got, values)) = found.remove(&name) else {
            return Err(weights_err(dir, &name, "missing from the checkpoint"));
        };
        if got != shape {
            return Err(weights_err(&file, &name, format!("shape {got:?}, expected {shape:?} from config.json")));
        }
        if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
            return Err(weights_err(&file, &name, format!("non-finite value at flat index {bad}")));
        }
        tensors.insert(name, (shape, values));
    }
    Ok(Checkpoint { config, tensors })
}

impl Checkpoint {
    pub fn tensor<const D: usize>(&self, name: &str, dtype: DType, device: &Device) -> Tensor<D> {
        let (shape, values) = &self.tensors[name];
        let shape: [usize; D] = shape.clone().try_into().expect("rank checked by expected_tensors");
        Tensor::<D>::from_data(TensorData::new(values.clone(), shape), device).cast(dtype)
    }
}

impl Checkpoint {
    /// A randomly initialised checkpoint for `config` (N(0, std) projections via a uniform of
    /// equal variance, norms near 1), reproducible from `seed`: the tests' and quickstart's model.
    pub fn random(config: ModelConfig, std: f32, seed: u64) -> Self {
        let mut state = seed ^ 0x5851_f42d_4c95_7f2d;
        let mut next = move || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z >> 40) as f32 / 16_777_216.0 * 2.0 - 1.0
        };
        let half_width = std * 3.0f32.sqrt();
        let mut tensors = BTreeMap::new();
        for (name, shape) in super::names::expected_tensors(&config) {
            let n: usize = shape.iter().product();
            let values = if name.ends_with("norm.weight") {
                (0..n).map(|_| 1.0 + 0.1 * next()).collect()
            } else {
                (0..n).map(|_| next() * half_width).collect()
            };
            tensors.insert(name, (shape, values));
        }
        Checkpoint { config, tensors }
    }
}

/// A tiny Qwen3-MoE config for tests: 8 experts of width 32, 2 per token (renormalised), layer 0
/// dense (`mlp_only_layers`), layer 1 sparse.
pub fn tiny_moe_config(vocab: usize) -> ModelConfig {
    let json = serde_json::json!({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": true,
        "decoder_sparse_step": 1, "mlp_only_layers": [0], "router_aux_loss_coef": 0.001,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": false, "torch_dtype": "float32"
    });
    ModelConfig::from_json(&json.to_string(), "tiny_moe_config").expect("valid tiny MoE config")
}

/// A tiny Qwen3 config for tests and the quickstart.
pub fn tiny_config(vocab: usize, tied: bool) -> ModelConfig {
    let json = serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": tied, "torch_dtype": "float32"
    });
    ModelConfig::from_json(&json.to_string(), "tiny_config").expect("valid tiny config")
}
