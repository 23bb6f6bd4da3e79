//! Setting up a run: the policy (embedded tiny model or an HF checkpoint), its tokenizer, the
//! task, the run folder with the resolved config and the git revision.

use crate::config::Config;
use crate::vocab;
use burn::tensor::{DType, Device};
use shared_kernels::model::{load_tokenizer, tiny_config, Checkpoint, ModelConfig, Qwen3};
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Model(#[from] shared_kernels::model::ModelError),
    #[error(transparent)]
    Task(#[from] crate::tasks::TaskError),
    #[error("{0}")]
    Other(String),
}

pub struct Policy {
    pub model: Qwen3,
    pub tokenizer: Tokenizer,
    pub tokenizer_json: String,
    pub eos: u32,
}

pub fn dtype(c: &Config) -> DType {
    if c.model.dtype == "bf16" { DType::BF16 } else { DType::F32 }
}

/// The embedded model's config for this run's `[model]` section and the char vocabulary.
pub fn embedded_config(c: &Config) -> Result<ModelConfig, RunError> {
    let vocab = vocab::char_tokenizer().get_vocab_size(true);
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

/// Loads the policy named by `[model]`, or the checkpoint folder `from` when resuming.
pub fn load_policy(c: &Config, from: Option<&Checkpoint>, device: &Device) -> Result<Policy, RunError> {
    let dtype = dtype(c);
    let (model, tokenizer_json) = if c.model.path.is_empty() {
        let config = embedded_config(c)?;
        let ck = match from {
            Some(ck) => {
                if ck.config.expected_tensors() != config.expected_tensors() {
                    return Err(RunError::Other("the checkpoint holds a model of another shape than the [model] section describes".into()));
                }
                Qwen3::from_checkpoint(ck, dtype, device)?
            }
            None => Qwen3::from_checkpoint(&Checkpoint::random(config, c.model.init_std, c.model.init_seed), dtype, device)?,
        };
        (ck, vocab::char_tokenizer_json())
    } else {
        let dir = Path::new(&c.model.path);
        let tok_path = dir.join("tokenizer.json");
        let tokenizer_json = std::fs::read_to_string(&tok_path).map_err(|e| RunError::Other(format!("{}: {e}", tok_path.display())))?;
        load_tokenizer(&tok_path)?;
        let model = match from {
            Some(ck) => Qwen3::from_checkpoint(ck, dtype, device)?,
            None => Qwen3::load(dir, dtype, device)?,
        };
        (model, tokenizer_json)
    };
    let tokenizer: Tokenizer = tokenizer_json.parse().map_err(|e| RunError::Other(format!("tokenizer: {e}")))?;
    if tokenizer.get_vocab_size(true) > model.config.vocab_size {
        return Err(RunError::Other(format!("the tokenizer has {} tokens but the model's vocabulary is {}", tokenizer.get_vocab_size(true), model.config.vocab_size)));
    }
    let eos = ["<eos>", "<|endoftext|>", "<|im_end|>", "</s>"]
        .iter()
        .find_map(|t| tokenizer.token_to_id(t))
        .ok_or_else(|| RunError::Other("the tokenizer has no end-of-sequence token (<eos>, <|endoftext|>, <|im_end|> or </s>)".into()))?;
    Ok(Policy { model, tokenizer, tokenizer_json, eos })
}

pub fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, RunError> {
    Ok(tok.encode(text, false).map_err(|e| RunError::Other(format!("tokenizing {text:?}: {e}")))?.get_ids().to_vec())
}

pub fn run_dir(c: &Config) -> PathBuf {
    Path::new(&c.log.runs_dir).join(&c.log.run_name)
}

pub fn git_revision() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Writes the resolved config (every key, defaults filled in) and the git revision.
pub fn save_resolved(c: &Config, dir: &Path) -> Result<(), RunError> {
    std::fs::create_dir_all(dir).map_err(|e| RunError::Other(format!("{}: {e}", dir.display())))?;
    let text = format!("# resolved config; git revision {}\n{}", git_revision(), toml::to_string(c).expect("config serialises"));
    shared_kernels::model::weights::write_atomic(&dir.join("config.resolved.toml"), text.as_bytes())?;
    Ok(())
}

/// The sampler engine's configuration from the `[sampler]` section, slots limited by
/// `sampler.kv_budget_mib` when set.
pub fn engine_config(c: &Config, model: &Qwen3) -> Result<sampler::EngineConfig, RunError> {
    let s = &c.sampler;
    let mut e = sampler::EngineConfig::from_budget(model, (s.kv_budget_mib * 1048576.0) as usize, s.context, s.max_batch, s.chunk_size)
        .map_err(|e| RunError::Config(crate::config::ConfigError::Invalid { key: "sampler.kv_budget_mib".into(), message: e }))?;
    e.share_prompt_prefix = s.share_prompt_prefix;
    e.overlap = s.overlap_steps;
    Ok(e)
}
