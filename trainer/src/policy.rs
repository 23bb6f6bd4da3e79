//! The policy a run trains and samples: the embedded tiny model or an HF checkpoint, cast to
//! `model.dtype`, with its tokenizer and the tokens that end a completion; the shape checks
//! that run before any weight loads.

use crate::config::Config;
use crate::error::{invalid, RunError};
use crate::vocab;
use burn::tensor::{DType, Device};
use shared_kernels::model::{load_tokenizer, tiny_config, Checkpoint, ModelConfig, Qwen3};
use std::path::Path;
use tokenizers::Tokenizer;

pub struct Policy {
    pub model: Qwen3,
    pub tokenizer: Tokenizer,
    pub tokenizer_json: String,
    /// The end of a completion the SFT warm start teaches: tokenizer_config.json's
    /// `eos_token` (a chat model's end of turn), else the first of the usual names.
    pub eos: u32,
    /// Every token that ends sampling: `eos` and generation_config.json's `eos_token_id`s
    /// (Qwen3: `<|im_end|>` and `<|endoftext|>`), config.json's without that file.
    pub stop_tokens: Vec<u32>,
}

pub fn dtype(c: &Config) -> DType {
    if c.model.dtype == "bf16" { DType::BF16 } else { DType::F32 }
}

/// The embedded model's config for this run's `[model]` section and the char vocabulary (the
/// base characters and those the task adds).
pub fn embedded_config(c: &Config) -> Result<ModelConfig, RunError> {
    let vocab = vocab::char_tokenizer(vocab::extra_chars(&c.task.name)).get_vocab_size(true);
    let mut mc = tiny_config(vocab, true);
    let m = &c.model;
    let mut raw = mc.raw.clone();
    raw["hidden_size"] = m.hidden_size.into();
    raw["num_hidden_layers"] = m.num_layers.into();
    raw["num_attention_heads"] = m.num_heads.into();
    raw["num_key_value_heads"] = m.num_kv_heads.into();
    raw["head_dim"] = m.head_dim.into();
    raw["intermediate_size"] = m.intermediate_size.into();
    raw["max_position_embeddings"] = c.sampler.context.max(64).into();
    mc = ModelConfig::from_json(&raw.to_string(), "[model] section").map_err(RunError::Model)?;
    Ok(mc)
}

/// The shape of the model `[model]` names: the embedded one's, or the checkpoint's config.json.
pub fn model_shape(c: &Config) -> Result<ModelConfig, RunError> {
    if c.model.path.is_empty() {
        return embedded_config(c);
    }
    let dir = Path::new(&c.model.path);
    if dir.is_file() {
        return Err(invalid("model.path", format!("{:?} is a file; name the checkpoint's folder (the one holding config.json and the safetensors)", c.model.path)));
    }
    if !dir.exists() {
        return Err(invalid("model.path", format!("{:?} does not exist", c.model.path)));
    }
    Ok(ModelConfig::from_file(&dir.join("config.json"))?)
}

/// Every tensor the run allocates from its sizes within the 32-bit index range of the kernels,
/// checked before anything is allocated (huge sizes through --set aborted the process or
/// poisoned the device): the weights and one layer's KV cache.
pub(crate) fn check_sizes(c: &Config, m: &ModelConfig) -> Result<(), RunError> {
    let limit = u32::MAX as u128;
    let embedded = c.model.path.is_empty();
    let key = |name: &str, hf: &str| if embedded { format!("model.{name}") } else { format!("{hf} in {}/config.json", c.model.path) };
    let weights = [
        ("embedding (vocab x hidden)", m.vocab_size as u128 * m.hidden_size as u128, key("hidden_size", "hidden_size")),
        ("MLP (intermediate x hidden)", m.intermediate_size as u128 * m.hidden_size as u128, key("intermediate_size", "intermediate_size")),
        ("attention (heads x head_dim x hidden)", (m.num_heads * m.head_dim) as u128 * m.hidden_size as u128, key("num_heads", "num_attention_heads")),
    ];
    for (what, elements, k) in weights {
        if elements > limit {
            return Err(invalid(&k, format!("makes the {what} weight {elements} elements, beyond the kernels' 32-bit index range ({limit})")));
        }
    }
    // before any weight loads: the engine would refuse it only after the checkpoint is read
    if c.sampler.context > m.max_position_embeddings {
        return Err(invalid("sampler.context", format!("{} is past the model's {} positions ({}); lower sampler.context (a prompt and sampler.max_new_tokens must fit in it)", c.sampler.context, m.max_position_embeddings, key("max_position_embeddings", "max_position_embeddings"))));
    }
    // positions past 2^24 are no model's context, and the RoPE tables for them alone would not fit
    if c.sampler.context > 1 << 24 {
        return Err(invalid("sampler.context", format!("is {}; at most {} positions", c.sampler.context, 1 << 24)));
    }
    let kv = c.sampler.max_batch as u128 * c.sampler.context as u128 * (m.num_kv_heads * m.head_dim) as u128;
    // (a KV budget sizes the cache's blocks instead; the engine checks that case)
    if kv > limit && c.sampler.kv_budget_bytes() == 0 && !c.sampler.kv_budget_mib.is_auto() {
        return Err(invalid("sampler.context", format!("x sampler.max_batch ({} x {}) gives a KV cache of {kv} elements per layer, beyond the kernels' 32-bit index range ({limit}); lower either, or size the cache with sampler.kv_budget_mib", c.sampler.context, c.sampler.max_batch)));
    }
    Ok(())
}

/// Loads the policy named by `[model]`, or `from` (a checkpoint's saved f32 policy, cast to `model.dtype`) when resuming.
pub fn load_policy(c: &Config, from: Option<&Qwen3>, device: &Device) -> Result<Policy, RunError> {
    let dtype = dtype(c);
    if !shared_kernels::device::supports_dtype(device, dtype) {
        return Err(invalid("model.dtype", format!("is {:?} but this device ({}) has no {dtype:?} support; use \"f32\"", c.model.dtype, shared_kernels::device::runtime_name())));
    }
    let shape = model_shape(c)?;
    check_sizes(c, &shape)?;
    let (model, tokenizer_json) = if c.model.path.is_empty() {
        let config = embedded_config(c)?;
        let ck = match from {
            Some(saved) => {
                if saved.config.expected_tensors() != config.expected_tensors() {
                    return Err(RunError::Other("the checkpoint holds a model of another shape than the [model] section describes".into()));
                }
                saved.cast(dtype)
            }
            None => Qwen3::from_checkpoint(&Checkpoint::random(config, c.model.init_std, c.model.init_seed), dtype, device)?,
        };
        (ck, vocab::char_tokenizer_json(vocab::extra_chars(&c.task.name)))
    } else {
        let dir = Path::new(&c.model.path);
        let tok_path = dir.join("tokenizer.json");
        let tokenizer_json = std::fs::read_to_string(&tok_path).map_err(|e| RunError::Other(format!("{}: {e}", tok_path.display())))?;
        load_tokenizer(&tok_path)?;
        let model = match from {
            Some(saved) => saved.cast(dtype),
            None => {
                let (model, phases) = shared_kernels::model::load::load_timed(dir, dtype, device, Default::default())?;
                eprintln!("weights: {phases}");
                model
            }
        };
        (model, tokenizer_json)
    };
    // adapters: a run's own (resumed) come from its checkpoint; otherwise lora.path's or fresh
    let model = if c.lora.enabled() && from.is_none() { attach_adapters(c, model, device)? } else { model };
    let tokenizer: Tokenizer = tokenizer_json.parse().map_err(|e| RunError::Other(format!("tokenizer: {e}")))?;
    if tokenizer.get_vocab_size(true) > model.config.vocab_size {
        return Err(RunError::Other(format!("the tokenizer has {} tokens but the model's vocabulary is {}", tokenizer.get_vocab_size(true), model.config.vocab_size)));
    }
    let dir = Path::new(&c.model.path);
    let configured = if c.model.path.is_empty() { None } else { configured_eos(dir)? };
    let configured = match configured {
        Some(t) => Some(tokenizer.token_to_id(&t).ok_or_else(|| RunError::Other(format!("{}: eos_token {t:?} is not a token of tokenizer.json", dir.join("tokenizer_config.json").display())))?),
        None => None,
    };
    let eos = configured
        .or_else(|| ["<eos>", "<|endoftext|>", "<|im_end|>", "</s>"].iter().find_map(|t| tokenizer.token_to_id(t)))
        .ok_or_else(|| RunError::Other("the tokenizer has no end-of-sequence token (tokenizer_config.json's eos_token, <eos>, <|endoftext|>, <|im_end|> or </s>)".into()))?;
    if eos as usize >= model.config.vocab_size {
        return Err(RunError::Other(format!("the tokenizer's end-of-sequence token has id {eos}, outside the model's vocabulary of {}", model.config.vocab_size)));
    }
    let mut stop_tokens = vec![eos];
    if !c.model.path.is_empty() {
        for id in generation_stop_ids(dir)? {
            if id as usize >= model.config.vocab_size {
                return Err(RunError::Other(format!("{}: eos_token_id {id} is outside the model's vocabulary of {}", stop_ids_file(dir).display(), model.config.vocab_size)));
            }
            if !stop_tokens.contains(&id) {
                stop_tokens.push(id);
            }
        }
    }
    for id in crate::special_stops::special_stop_ids(&tokenizer, &c.sampler.stop).map_err(|e| invalid("sampler.stop", e))? {
        if !stop_tokens.contains(&id) {
            stop_tokens.push(id);
        }
    }
    Ok(Policy { model, tokenizer, tokenizer_json, eos, stop_tokens })
}

/// `model` with `[lora]`'s adapters: a PEFT folder's (`lora.path`, whose shape the set keys
/// must agree with) or fresh ones (lora_A as `lora.init` draws it, lora_B zero).
fn attach_adapters(c: &Config, model: Qwen3, device: &Device) -> Result<Qwen3, RunError> {
    use shared_kernels::model::lora_files;
    let l = &c.lora;
    let (spec, adapters) = if l.path.is_empty() {
        let spec = l.spec().map_err(|e| invalid("lora.target_modules", e))?;
        let adapters = shared_kernels::model::lora::fresh_adapters(&model.config, &spec, l.init_mode(), l.init_seed, model.dtype, device);
        (spec, adapters)
    } else {
        let dir = Path::new(&l.path);
        if !lora_files::is_adapter_folder(dir) {
            return Err(invalid("lora.path", format!("{} holds no {} (a PEFT adapter folder: adapter_config.json and adapter_model.safetensors)", dir.display(), lora_files::ADAPTER_CONFIG)));
        }
        let (spec, adapters, _) = lora_files::load_adapters(dir, &model.config, model.dtype, device)?;
        let defaults = crate::config::LoraSection::default();
        let differs = |key: &str, set: String, file: String| invalid(key, format!("is {set} but the adapter in {} has {file} (leave the key unset to take the adapter's)", dir.display()));
        if l.rank != 0 && l.rank != spec.rank {
            return Err(differs("lora.rank", l.rank.to_string(), format!("r = {}", spec.rank)));
        }
        if l.alpha != defaults.alpha && l.alpha != spec.alpha {
            return Err(differs("lora.alpha", l.alpha.to_string(), format!("lora_alpha = {}", spec.alpha)));
        }
        if l.use_rslora != spec.rslora {
            return Err(differs("lora.use_rslora", l.use_rslora.to_string(), format!("use_rslora = {}", spec.rslora)));
        }
        if l.target_modules != defaults.target_modules && l.targets().ok().as_ref() != Some(&spec.targets) {
            return Err(differs("lora.target_modules", format!("{:?}", l.target_modules), format!("{:?}", spec.targets.iter().map(|p| p.module()).collect::<Vec<_>>())));
        }
        (spec, adapters)
    };
    Ok(model.with_adapters(spec, adapters)?)
}

/// tokenizer_config.json's `eos_token` (a string or `{"content": ..}`), if the file has one.
fn configured_eos(dir: &Path) -> Result<Option<String>, RunError> {
    let path = dir.join("tokenizer_config.json");
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(None) };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| RunError::Other(format!("{}: not valid JSON: {e}", path.display())))?;
    Ok(match v.get("eos_token") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Object(o)) => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
        _ => None,
    })
}

/// The file whose `eos_token_id` ends sampling: generation_config.json, or config.json where
/// there is none (transformers' `generate` derives its generation config from config.json then).
fn stop_ids_file(dir: &Path) -> std::path::PathBuf {
    let generation = dir.join("generation_config.json");
    if generation.exists() { generation } else { dir.join("config.json") }
}

/// [`stop_ids_file`]'s `eos_token_id` (one id or a list), if it has one.
fn generation_stop_ids(dir: &Path) -> Result<Vec<u32>, RunError> {
    let path = stop_ids_file(dir);
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(vec![]) };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| RunError::Other(format!("{}: not valid JSON: {e}", path.display())))?;
    let bad = |x: &serde_json::Value| RunError::Other(format!("{}: eos_token_id {x} is not a token id", path.display()));
    let id = |x: &serde_json::Value| x.as_u64().filter(|&n| n <= u32::MAX as u64).map(|n| n as u32).ok_or_else(|| bad(x));
    match v.get("eos_token_id") {
        None | Some(serde_json::Value::Null) => Ok(vec![]),
        Some(serde_json::Value::Array(ids)) => ids.iter().map(id).collect(),
        Some(x) => Ok(vec![id(x)?]),
    }
}

/// `text` as token ids; text the tokenizer can only map to its unknown token is an error naming
/// the characters (silently training on `<unk>` would change the task).
pub fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, RunError> {
    let enc = tok.encode(text, false).map_err(|e| RunError::Other(format!("tokenizing {text:?}: {e}")))?;
    const UNKNOWN: [&str; 3] = ["<unk>", "[UNK]", "<|unk|>"];
    // an unknown token whose text is not itself the unknown token's name
    let unknown: Vec<&str> = enc.get_tokens().iter().zip(enc.get_offsets()).filter(|(t, _)| UNKNOWN.contains(&t.as_str())).map(|(_, &(a, b))| text.get(a..b).unwrap_or("?")).filter(|s| !UNKNOWN.contains(s)).collect();
    if !unknown.is_empty() {
        return Err(RunError::Other(format!("tokenizing {text:?}: the tokenizer has no token for {:?} (it would become its unknown token)", unknown)));
    }
    Ok(enc.get_ids().to_vec())
}

