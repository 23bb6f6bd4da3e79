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

/// A config error naming `key` (exit 2).
pub fn invalid(key: &str, message: String) -> RunError {
    RunError::Config(crate::config::ConfigError::Invalid { key: key.into(), message })
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

/// The task `[task]` names, its prompts rendered with the chat template when
/// `task.prompt_format = "chat"` (`task.chat_template`, else the checkpoint's own).
pub fn load_task(c: &Config) -> Result<crate::tasks::Task, RunError> {
    let task = crate::tasks::Task::from_config(&c.task)?;
    if c.task.prompt_format != crate::config::PromptFormat::Chat {
        return Ok(task);
    }
    let over = (!c.task.chat_template.is_empty()).then(|| Path::new(&c.task.chat_template));
    // the key to change: the template file when one is given, else the chat format itself
    let key = if over.is_some() { "task.chat_template" } else { "task.prompt_format" };
    let template = crate::chat::ChatTemplate::from_checkpoint(Path::new(&c.model.path), over).map_err(|e| invalid(key, e))?;
    let chat = crate::chat::ChatPrompts::new(template, &c.task.system_prompt, &c.task.chat_args).map_err(|e| invalid("task.chat_args", e))?;
    Ok(task.with_chat(chat, &c.task.path)?)
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

pub fn run_dir(c: &Config) -> PathBuf {
    Path::new(&c.log.runs_dir).join(&c.log.run_name)
}

/// The lockstep commit this binary was built from (trainer/build.rs), "unknown" when it was
/// built outside a git checkout.
pub fn git_revision() -> String {
    env!("BUILD_GIT_REVISION").to_string()
}

/// Writes the resolved config (every key, defaults filled in) and the git revision, the input
/// files' record and the arithmetic environment's.
pub fn save_resolved(c: &Config, dir: &Path) -> Result<(), RunError> {
    std::fs::create_dir_all(dir).map_err(|e| RunError::Other(format!("log.runs_dir: cannot make the run folder {}: {e}", dir.display())))?;
    let text = format!("# resolved config; git revision {}\n{}", git_revision(), toml::to_string(c).expect("config serialises"));
    shared_kernels::model::save::write_atomic(&dir.join("config.resolved.toml"), text.as_bytes())?;
    crate::input_files::save(c, dir)?;
    crate::run_environment::save(dir)
}

/// Keys a resume may change without changing a bit of the run (display only).
/// `sampler.kv_reserve` only decides when requests are admitted, which batch invariance makes
/// irrelevant to every bit; the memory sizes neither (a resume after running out of memory
/// may lower them).
const RESUME_NEUTRAL_KEYS: [&str; 6] = ["log.progress", "log.tensorboard", "train.final_checkpoint", "sampler.kv_reserve", "train.micro_batch_tokens", "sampler.kv_budget_mib"];

/// `(key, before, now)` for every key whose value differs between the config a run was started
/// with (its `config.resolved.toml`) and `now`, keys that cannot change a bit left out.
pub fn config_changes(before: &Config, now: &Config) -> Vec<(String, String, String)> {
    fn flatten(prefix: &str, v: &toml::Value, out: &mut std::collections::BTreeMap<String, String>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    flatten(&key, v, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.to_string());
            }
        }
    }
    let table = |c: &Config| {
        let mut out = std::collections::BTreeMap::new();
        flatten("", &toml::Value::try_from(c).expect("config serialises"), &mut out);
        out
    };
    let (a, b) = (table(before), table(now));
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| !RESUME_NEUTRAL_KEYS.contains(&k.as_str()) && a.get(*k) != b.get(*k))
        .map(|k| (k.clone(), a.get(k).cloned().unwrap_or_else(|| "(unset)".into()), b.get(k).cloned().unwrap_or_else(|| "(unset)".into())))
        .collect()
}

/// The config a run was started with, from its `config.resolved.toml` (None when it has none,
/// or the file cannot be read).
pub fn resolved_config(dir: &Path) -> Result<Option<Config>, RunError> {
    let path = dir.join("config.resolved.toml");
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(None) };
    toml::from_str(&text).map(Some).map_err(|e| RunError::Other(format!("{}: {e}", path.display())))
}

/// A resume continues bit for bit only under the config the run started with: a differing one
/// is refused naming every key (`key: before -> now`) unless `allow`, which keeps the earlier
/// config beside the new one and logs the change in the run's `config-changes.log`.
pub fn check_resume_config(dir: &Path, cfg: &Config, step: usize, allow: bool) -> Result<(), RunError> {
    crate::input_files::check_resume(cfg, dir, allow)?;
    crate::run_environment::check_resume(dir, allow)?;
    let before = match resolved_config(dir) {
        Ok(before) => before,
        // (a file from another version of lockstep that this one cannot read)
        Err(e) if allow => {
            eprintln!("warning: {e}; continuing (--allow-config-change)");
            None
        }
        Err(e) => return Err(RunError::Other(format!("{e}: the run's starting config cannot be compared with this one; pass --allow-config-change to resume anyway"))),
    };
    let Some(before) = before else {
        // a run folder without its starting config cannot be checked: say so rather than
        // resume unchecked (the file is written before the first step of every run)
        if allow {
            eprintln!("warning: {} is missing; the resumed run's config is not checked against its start (--allow-config-change)", dir.join("config.resolved.toml").display());
            return Ok(());
        }
        return Err(RunError::Other(format!("{} is missing: the run's starting config cannot be compared with this one; pass --allow-config-change to resume anyway", dir.join("config.resolved.toml").display())));
    };
    let changes = config_changes(&before, cfg);
    if changes.is_empty() {
        return Ok(());
    }
    let list = changes.iter().map(|(k, a, b)| format!("{k}: {a} -> {b}")).collect::<Vec<_>>().join(", ");
    if !allow {
        return Err(invalid(&changes[0].0, format!("differs from the run's config.resolved.toml ({list}); a resume with another config is not bit-identical to an uninterrupted run. Resume with the run's config, or pass --allow-config-change")));
    }
    let kept = dir.join(format!("config.resolved.before-step-{step}.toml"));
    std::fs::copy(dir.join("config.resolved.toml"), &kept).map_err(|e| RunError::Other(format!("{}: {e}", kept.display())))?;
    let note = format!("step {step}: resumed with a changed config (--allow-config-change): {list}; the earlier config is {}\n", kept.display());
    use std::io::Write;
    std::fs::OpenOptions::new().create(true).append(true).open(dir.join("config-changes.log")).and_then(|mut f| f.write_all(note.as_bytes())).map_err(|e| RunError::Other(format!("config-changes.log: {e}")))?;
    eprintln!("warning: {}", note.trim_end());
    Ok(())
}

/// The sampler engine's configuration from the `[sampler]` section, slots limited by
/// `sampler.kv_budget_mib` when set.
pub fn engine_config(c: &Config, model: &Qwen3) -> Result<sampler::EngineConfig, RunError> {
    let s = &c.sampler;
    let mut e = sampler::EngineConfig::from_budget(model, s.kv_budget_bytes(), s.context, s.max_batch, s.chunk_size)
        .map_err(|e| RunError::Config(crate::config::ConfigError::Invalid { key: "sampler.kv_budget_mib".into(), message: e }))?;
    e.share_prompt_prefix = s.share_prompt_prefix;
    e.overlap = s.overlap_steps;
    e.reserve = s.kv_reserve;
    Ok(e)
}

/// The sampler's engine on `model` (the policy's weights as the sampler runs them), configured
/// from `c`, with the policy's tokenizer as the decoder `sampler.stop` strings are matched on
/// (special tokens skipped, as the reward's text is decoded).
pub fn sampler_engine(c: &Config, tokenizer: &Tokenizer, model: Qwen3) -> Result<sampler::Engine, RunError> {
    let config = engine_config(c, &model)?;
    // `model` moves in: where the caller holds no other handle on its weights, the engine's
    // resident copy replaces them tensor by tensor instead of doubling them
    let mut engine = sampler::Engine::new(model, config).map_err(RunError::Other)?;
    let tokenizer = tokenizer.clone();
    engine.set_decoder(std::sync::Arc::new(move |ids: &[u32]| tokenizer.decode(ids, true).ok()));
    Ok(engine)
}

/// A run resumed from the checkpoint folder `latest`: the policy (from the saved f32 weights),
/// AdamW with its moments, step count and f32 masters, and the step to continue at.
/// `check(step)` runs after the checkpoint is read and before the policy is built (a changed
/// config is refused naming its keys before the shapes are compared).
pub fn resume_state(cfg: &Config, latest: &Path, device: &Device, check: impl FnOnce(usize) -> Result<(), RunError>) -> Result<(Policy, crate::optim::AdamW, usize, f64), RunError> {
    let loading = std::time::Instant::now();
    let loaded = crate::checkpoint::load(latest, device)?;
    let load_s = loading.elapsed().as_secs_f64();
    if loaded.state.step > cfg.train.steps {
        return Err(invalid("train.steps", format!("is {} but the checkpoint {} is at step {}", cfg.train.steps, latest.display(), loaded.state.step)));
    }
    check(loaded.state.step)?;
    let policy = load_policy(cfg, Some(&loaded.model), device)?;
    let mut opt = crate::grpo::new_adamw(cfg);
    opt.moments = loaded.moments;
    opt.t = loaded.state.adam_t;
    opt.restore_masters(&policy.model, &loaded.model);
    Ok((policy, opt, loaded.state.step, load_s))
}
