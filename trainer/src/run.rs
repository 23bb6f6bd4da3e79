//! Setting up a run: the task, the run folder with the resolved config and the git revision,
//! the resume check, the sampler's engine and a resumed run's state. The policy is loaded by
//! `policy.rs`; the error type is `error.rs`'s (both re-exported here for the binary).

use crate::config::Config;
pub use crate::error::{invalid, RunError};
pub use crate::policy::{dtype, embedded_config, encode, load_policy, model_shape, Policy};
use burn::tensor::Device;
use shared_kernels::model::Qwen3;
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

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

pub fn run_dir(c: &Config) -> PathBuf {
    Path::new(&c.log.runs_dir).join(&c.log.run_name)
}

pub use crate::run_environment::git_revision;

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
/// irrelevant to every bit; the memory sizes and the recomputation switch neither (a resume
/// after running out of memory may lower them); how often checkpoints are written and how many
/// are kept change no step's bits (a checkpoint resumes to them). An episode's tokens do not depend on how many programs run at once, and
/// its deadline only decides whether it fails; saved trajectories are an output.
const RESUME_NEUTRAL_KEYS: [&str; 13] = ["log.progress", "log.tensorboard", "train.final_checkpoint", "train.checkpoint_every", "train.keep_checkpoints", "sampler.kv_reserve", "train.micro_batch_tokens", "sampler.kv_budget_mib", "train.recompute_layers", "serve.", "environment.concurrency", "environment.timeout_s", "environment.save_trajectories"];

/// Whether `key` is resume-neutral: listed, or under a listed section (`serve.`: the server's
/// keys never reach a training run).
fn resume_neutral(key: &str) -> bool {
    RESUME_NEUTRAL_KEYS.iter().any(|n| key == *n || (n.ends_with('.') && key.starts_with(n)))
}

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
        .filter(|k| !resume_neutral(k) && a.get(*k) != b.get(*k))
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
    let loaded = crate::checkpoint::load(latest, device, &crate::policy::model_shape(cfg)?)?;
    let load_s = loading.elapsed().as_secs_f64();
    if loaded.state.step > cfg.train.steps {
        return Err(invalid("train.steps", format!("is {} but the checkpoint {} is at step {}", cfg.train.steps, latest.display(), loaded.state.step)));
    }
    check(loaded.state.step)?;
    let mut opt = crate::optim::new_adamw(cfg);
    let policy = match loaded.policy {
        crate::checkpoint::SavedPolicy::Model(saved) => {
            let policy = load_policy(cfg, Some(&saved), device)?;
            opt.restore_masters(&policy.model, &saved);
            policy
        }
        // LoRA: the base as the run began (model.path or the embedded model), the saved adapters
        crate::checkpoint::SavedPolicy::Adapters { spec, adapters, masters } => {
            if !cfg.lora.enabled() {
                return Err(invalid("lora.rank", format!("is 0 but the checkpoint {} holds LoRA adapters (rank {}): resume with the run's [lora] section", latest.display(), spec.rank)));
            }
            let mut policy = load_policy(cfg, None, device)?;
            let dtype = policy.model.dtype;
            let adapters = adapters.into_iter().map(|mut l| {
                for (_, a) in l.named_mut(0) {
                    (a.a, a.b) = (a.a.clone().cast(dtype), a.b.clone().cast(dtype));
                }
                l
            }).collect();
            policy.model = policy.model.with_adapters(spec, adapters)?;
            opt.masters.clear();
            if dtype != burn::tensor::DType::F32 {
                opt.masters = masters.into_iter().collect();
            }
            policy
        }
    };
    opt.moments = loaded.moments;
    opt.t = loaded.state.adam_t;
    Ok((policy, opt, loaded.state.step, load_s))
}

#[cfg(test)]
mod tests {
    use super::config_changes;
    use crate::config::Config;

    #[test]
    fn a_resume_may_change_only_keys_that_change_no_bit() {
        let before = Config::load_training(None, &[]).unwrap();
        let neutral = ["train.checkpoint_every=1", "train.keep_checkpoints=5", "train.final_checkpoint=false", "train.micro_batch_tokens=512", "sampler.kv_budget_mib=64", "train.recompute_layers=true", "log.progress=false", "serve.port=9"];
        let overrides: Vec<String> = neutral.iter().map(|s| s.to_string()).collect();
        let now = Config::load_training(None, &overrides).unwrap();
        assert_eq!(config_changes(&before, &now), vec![], "{neutral:?}");
        let now = Config::load_training(None, &[overrides, vec!["train.lr=0.5".into(), "sampler.temperature=0.5".into()]].concat()).unwrap();
        let keys: Vec<String> = config_changes(&before, &now).into_iter().map(|(k, _, _)| k).collect();
        assert_eq!(keys, ["sampler.temperature", "train.lr"]);
    }
}
