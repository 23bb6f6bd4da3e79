//! Reading a config: the TOML file, `--set section.key=value` overrides, errors naming the
//! file, line and dotted key.

use super::{Config, ConfigError};
use std::path::Path;

impl Config {
    /// Reads `path` (if given), applies `overrides` ("section.key=value", value in TOML syntax,
    /// bare words taken as strings), and validates.
    pub fn load(path: Option<&Path>, overrides: &[String]) -> Result<Self, ConfigError> {
        let (text, file) = match path {
            Some(p) => (std::fs::read_to_string(p).map_err(|e| ConfigError::Read { file: p.display().to_string(), message: e.to_string() })?, p.display().to_string()),
            None => (String::new(), "<defaults>".to_string()),
        };
        let mut doc: toml::Table = text.parse().map_err(|e: toml::de::Error| ConfigError::Parse { file: file.clone(), message: e.to_string() })?;
        for spec in overrides {
            apply_override(&mut doc, spec)?;
        }
        if overrides.is_empty() {
            // parse the original text, so errors point at its lines
            let config: Config = toml::from_str(&text).map_err(|e| ConfigError::Parse { file, message: with_key(&text, &e) })?;
            config.validate()?;
            return Ok(config);
        }
        let merged = toml::to_string(&doc).expect("table serialises");
        let config: Config = toml::from_str(&merged).map_err(|e| merged_error(&file, &text, &merged, overrides, &e))?;
        config.validate()?;
        Ok(config)
    }
}

impl Config {
    /// [`Config::load`] for `lockstep train`, with [`Config::validate_training`]'s checks.
    pub fn load_training(path: Option<&Path>, overrides: &[String]) -> Result<Self, ConfigError> {
        let config = Self::load(path, overrides)?;
        config.validate_training()?;
        Ok(config)
    }
}

/// The parse error `e` of `source` with the dotted key it is at (a mode's unknown spelling, a
/// wrong type) in front.
fn with_key(source: &str, e: &toml::de::Error) -> String {
    match e.span().and_then(|span| key_at(source, span.start)) {
        Some(key) => format!("config key `{key}`: {e}"),
        None => e.to_string(),
    }
}

/// An error of the document merged from the file and the overrides, told where its value came
/// from: the `--set` that wrote the key, or else the file at its own line (the merged
/// document's line numbers are nobody's).
fn merged_error(file: &str, text: &str, merged: &str, overrides: &[String], e: &toml::de::Error) -> ConfigError {
    let key = e.span().and_then(|span| key_at(merged, span.start));
    if let Some(key) = &key {
        // the last override of the key (or of a table holding it, or an entry of it) set it
        let within = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}.")) || b.starts_with(&format!("{a}."));
        if let Some(spec) = overrides.iter().rev().find(|spec| within(spec.split('=').next().unwrap_or("").trim(), key)) {
            return ConfigError::Override { spec: spec.clone(), message: format!("config key `{key}`: {}", e.message()) };
        }
    }
    if let Err(file_error) = toml::from_str::<Config>(text) {
        return ConfigError::Parse { file: file.to_string(), message: with_key(text, &file_error) };
    }
    let message = match key {
        Some(key) => format!("config key `{key}`: {}", e.message()),
        None => e.message().to_string(),
    };
    ConfigError::Parse { file: format!("{file} (with --set overrides)"), message }
}

/// The `section.key` of the TOML line holding byte `offset` of `source` (a key line under a
/// `[section]` header, as config files and the serialised overrides are written).
fn key_at(source: &str, offset: usize) -> Option<String> {
    let offset = offset.min(source.len());
    let line_start = source[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line = source[line_start..].lines().next()?;
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    let section = source[..line_start].lines().rev().find_map(|l| l.trim().strip_prefix('[')?.strip_suffix(']').map(str::trim))?;
    Some(format!("{section}.{key}"))
}

fn apply_override(doc: &mut toml::Table, spec: &str) -> Result<(), ConfigError> {
    let err = |message: String| ConfigError::Override { spec: spec.to_string(), message };
    let (path, raw) = spec.split_once('=').ok_or_else(|| err("expected section.key=value".into()))?;
    let (section, key) = path.trim().split_once('.').ok_or_else(|| err("expected section.key=value".into()))?;
    // a table-valued key takes its entries as deeper paths: task.chat_args.enable_thinking=false
    let (key, inner) = match key.split_once('.') {
        Some((key, inner)) => (key, inner.split('.').collect::<Vec<_>>()),
        None => (key, vec![]),
    };
    if key.is_empty() || inner.iter().any(|k| k.is_empty()) {
        return Err(err("expected section.key=value".into()));
    }
    let mut value: toml::Value = match format!("v = {}", raw.trim()).parse::<toml::Table>() {
        Ok(mut t) => t.remove("v").expect("parsed key"),
        Err(_) => toml::Value::String(raw.trim().to_string()),
    };
    // a string key takes the text as written: `log.run_name=nan` is the name "nan", not NaN
    let defaults = toml::Value::try_from(Config::default()).ok();
    if !inner.is_empty() && defaults.as_ref().and_then(|d| d.get(section)?.get(key)).is_some_and(|v| !v.is_table()) {
        return Err(err(format!("`{section}.{key}` takes a value, not entries")));
    }
    let wants_string = inner.is_empty() && defaults.as_ref().and_then(|d| d.get(section)?.get(key)).is_some_and(toml::Value::is_str);
    // (a list stays a list: `lora.target_modules` takes a string or a list of them)
    if wants_string && !value.is_str() && !value.is_array() {
        value = toml::Value::String(raw.trim().to_string());
    }
    let table = doc.entry(section.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let mut table = table.as_table_mut().ok_or_else(|| err(format!("`{section}` is not a section")))?;
    let mut at = vec![section, key];
    let mut name = key;
    for next in inner {
        let entry = table.entry(name.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = entry.as_table_mut().ok_or_else(|| err(format!("`{}` is not a table", at.join("."))))?;
        at.push(next);
        name = next;
    }
    table.insert(name.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Config;

    #[test]
    fn an_unknown_mode_names_its_dotted_key_and_the_allowed_spellings() {
        for (set, key) in [("train.on_mismatch=maybe", "train.on_mismatch"), ("ablation.sampler_kernels=fastest", "ablation.sampler_kernels"), ("ablation.correction=is", "ablation.correction"), ("train.steps=many", "train.steps")] {
            let e = Config::load(None, &[set.into()]).unwrap_err().to_string();
            assert!(e.contains(&format!("config key `{key}`")), "{set}: {e}");
        }
        let e = Config::load(None, &["train.on_mismatch=maybe".into()]).unwrap_err().to_string();
        assert!(e.contains("stop") && e.contains("warn"), "{e}");
        let dir = shared_kernels::testing::Scratch::new("config");
        let file = dir.join("c.toml");
        std::fs::write(&file, "[train]\nsteps = 2\n\n[ablation]\ncorrection = \"tiss\"\n").unwrap();
        let e = Config::load(Some(&file), &[]).unwrap_err().to_string();
        assert!(e.contains("c.toml") && e.contains("line 5") && e.contains("config key `ablation.correction`") && e.contains("ppo_clip"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_bad_value_names_the_set_that_wrote_it_or_the_files_own_line() {
        let dir = shared_kernels::testing::Scratch::new("config-origin");
        let file = dir.join("c.toml");
        std::fs::write(&file, "# a comment\n[sampler]\nseed = -1\n").unwrap();
        // the file's value: its own line 3, whatever the overrides add above it
        let e = Config::load(Some(&file), &["train.steps=3".into(), "log.run_name=x".into()]).unwrap_err().to_string();
        assert!(e.contains("c.toml") && e.contains("line 3") && e.contains("config key `sampler.seed`") && !e.contains("--set"), "{e}");
        // an override's value: the override, not a line of the merged document
        std::fs::write(&file, "[sampler]\nseed = 4\n").unwrap();
        let e = Config::load(Some(&file), &["train.steps=-3".into()]).unwrap_err().to_string();
        assert!(e.starts_with("--set train.steps=-3: config key `train.steps`") && !e.contains("line"), "{e}");
        let e = Config::load(None, &["sampler.seed=5".into(), "task.chat_args.x=1".into(), "sampler.top_p=x".into()]).unwrap_err().to_string();
        assert!(e.starts_with("--set sampler.top_p=x: config key `sampler.top_p`"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_string_key_takes_an_override_as_written_even_when_it_reads_as_a_number() {
        let c = Config::load(None, &["log.run_name=nan".into(), "log.runs_dir=1e3".into(), "train.steps=3".into()]).unwrap();
        assert_eq!((c.log.run_name.as_str(), c.log.runs_dir.as_str(), c.train.steps), ("nan", "1e3", 3));
        // a key that takes a string or a list (lora.target_modules) keeps a list as a list
        let c = Config::load(None, &["lora.target_modules=[\"q_proj\", \"v_proj\"]".into(), "lora.rank=4".into()]).unwrap();
        assert_eq!(c.lora.target_modules, crate::config::TargetModules::Many(vec!["q_proj".into(), "v_proj".into()]));
        let c = Config::load(None, &["lora.target_modules=q_proj".into(), "lora.rank=4".into()]).unwrap();
        assert_eq!(c.lora.target_modules, crate::config::TargetModules::One("q_proj".into()));
    }

    #[test]
    fn a_table_valued_key_takes_its_entries_as_deeper_paths() {
        let c = Config::load(None, &["task.chat_args={ a = 1 }".into(), "task.chat_args.enable_thinking=false".into(), "task.chat_args.style.tone=plain".into()]).unwrap();
        let args = toml::Value::try_from(&c.task.chat_args).unwrap();
        assert_eq!(args.get("a").and_then(|v| v.as_integer()), Some(1));
        assert_eq!(args.get("enable_thinking").and_then(|v| v.as_bool()), Some(false));
        assert_eq!(args.get("style").and_then(|s| s.get("tone")).and_then(|v| v.as_str()), Some("plain"));
        // a deeper path under a key that is not a table, or an empty step, names the override
        for spec in ["train.lr.x=1", "task.chat_args..a=1", "train.=1"] {
            let e = Config::load(None, &[spec.into()]).unwrap_err().to_string();
            assert!(e.contains(spec.split('=').next().unwrap()), "{spec}: {e}");
        }
    }
}
