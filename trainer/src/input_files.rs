//! The files a run reads besides its weights, recorded by size and content hash in the run
//! folder at its start (`inputs.resolved.json`), so that a `--resume` which would read other
//! inputs is refused as a changed config is: the same config over an edited dataset, chat
//! template, tokenizer or reward program is not the uninterrupted run. Recorded: `task.path`,
//! `task.eval_path`, `task.chat_template`; the checkpoint folder's tokenizer and template files
//! (a resume reads them from `model.path`, the weights from the run's checkpoint); the files
//! `task.reward_command` and `environment.command` name (their words that are files, e.g.
//! `python3 grade.py`'s script).

use crate::config::Config;
use crate::error::{invalid, RunError};
use std::io::Read;
use std::path::Path;

const FILE: &str = "inputs.resolved.json";

/// The files of `model.path` a run reads besides the weights (absent ones are recorded as
/// absent: a `chat_template.jinja` added later changes the prompts).
const CHECKPOINT_FILES: [&str; 4] = ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"];

/// FNV-1a's start value.
pub(crate) const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// `hash` (FNV-1a, from [`FNV_START`]) extended by `bytes`.
pub(crate) fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// FNV-1a over the file's bytes (stable across builds and machines, unlike std's hasher) and
/// its length, or `None` when it cannot be read.
fn fingerprint(path: &Path) -> Option<(u64, String)> {
    let mut file = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path).ok()?);
    let (mut hash, mut len, mut buf) = (FNV_START, 0u64, vec![0u8; 1 << 20]);
    loop {
        let n = file.read(&mut buf).ok()?;
        if n == 0 {
            return Some((len, format!("{hash:016x}")));
        }
        hash = fnv1a(hash, &buf[..n]);
        len += n as u64;
    }
}

/// The record of one file: its name, length and hash, or `absent`.
fn entry(file: &str) -> serde_json::Value {
    match fingerprint(Path::new(file)) {
        Some((bytes, hash)) => serde_json::json!({"file": file, "bytes": bytes, "fnv1a64": hash}),
        None => serde_json::json!({"file": file, "absent": true}),
    }
}

/// The keys whose value is the file itself.
fn file_keys(c: &Config) -> [(&'static str, &String); 3] {
    [("task.path", &c.task.path), ("task.eval_path", &c.task.eval_path), ("task.chat_template", &c.task.chat_template)]
}

/// The words of `task.reward_command` that name files (the script an interpreter runs, an
/// executable given by path).
fn reward_files(c: &Config) -> Vec<String> {
    if c.task.reward != "command" {
        return Vec::new();
    }
    command_files(&c.task.reward_command)
}

/// The words of a shell command that name files.
fn command_files(command: &str) -> Vec<String> {
    let words = shlex::split(command).unwrap_or_else(|| command.split_whitespace().map(str::to_string).collect());
    words.into_iter().filter(|w| Path::new(w).is_file()).collect()
}

/// Every recorded input of `c`, by record name (`task.path`, `model.path:tokenizer.json`,
/// `task.reward_command:grade.py`, `environment.command:env.py`): the config key is the part
/// before `:`.
fn current(c: &Config) -> serde_json::Map<String, serde_json::Value> {
    let mut out = serde_json::Map::new();
    for (key, file) in file_keys(c).into_iter().filter(|(_, f)| !f.is_empty()) {
        out.insert(key.to_string(), entry(file));
    }
    if !c.model.path.is_empty() {
        for name in CHECKPOINT_FILES {
            out.insert(format!("model.path:{name}"), entry(&Path::new(&c.model.path).join(name).display().to_string()));
        }
    }
    for file in reward_files(c) {
        out.insert(format!("task.reward_command:{file}"), entry(&file));
    }
    // an environment program, like a reward program, is part of what the run computes
    for file in command_files(&c.environment.command) {
        out.insert(format!("environment.command:{file}"), entry(&file));
    }
    out
}

/// Records the run's inputs in `dir` (written whole or not at all).
pub fn save(c: &Config, dir: &Path) -> Result<(), RunError> {
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(current(c))).expect("json serialises");
    shared_kernels::model::save::write_atomic(&dir.join(FILE), text.as_bytes())?;
    Ok(())
}

fn describe(e: &serde_json::Value) -> String {
    if e.get("absent").is_some() {
        "absent".into()
    } else {
        format!("{} bytes with hash {}", e["bytes"], e["fnv1a64"].as_str().unwrap_or("?"))
    }
}

/// Refuses a resume whose input files differ from those the run started with, naming the key
/// and the file, unless `allow` (then a warning). A record the config no longer points at (an
/// other `task.path`, `model.path` or command) is a config change, which the config check names;
/// a run folder without the record (an earlier version's) is not checked.
pub fn check_resume(c: &Config, dir: &Path, allow: bool) -> Result<(), RunError> {
    let Ok(text) = std::fs::read_to_string(dir.join(FILE)) else { return Ok(()) };
    let before: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text).map_err(|e| RunError::Other(format!("{}: {e}", dir.join(FILE).display())))?;
    let now = current(c);
    let reward_words = shlex::split(&c.task.reward_command).unwrap_or_default();
    for (name, was) in &before {
        let key = name.split(':').next().unwrap_or(name);
        let file = was["file"].as_str().unwrap_or_default();
        let pointed_at = match key {
            "model.path" => Path::new(file).parent() == Some(Path::new(&c.model.path)),
            "task.reward_command" => c.task.reward == "command" && reward_words.iter().any(|w| w == file),
            _ => file_keys(c).iter().any(|(k, f)| *k == key && f.as_str() == file),
        };
        if !pointed_at {
            continue;
        }
        let is = now.get(name).cloned().unwrap_or_else(|| entry(file));
        if describe(&is) != describe(was) {
            let what = format!("{file} is {} where the run started on {}", describe(&is), describe(was));
            let message = format!("{what} ({FILE}): resuming on other inputs is not the uninterrupted run. Restore the file, or pass --allow-config-change");
            if !allow {
                return Err(invalid(key, message));
            }
            eprintln!("warning: {key}: {what}; continuing (--allow-config-change)");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edited_dataset_refuses_the_resume_naming_the_key_unless_allowed() {
        let dir = shared_kernels::testing::Scratch::new("input-files");
        let data = dir.join("task.jsonl");
        std::fs::write(&data, "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n").unwrap();
        let mut c = Config::default();
        c.task.path = data.display().to_string();
        save(&c, &dir).unwrap();
        check_resume(&c, &dir, false).unwrap();
        // one byte changed, the same length: the hash tells
        std::fs::write(&data, "{\"prompt\": \"1+1=\", \"answer\": \"3\"}\n").unwrap();
        let err = check_resume(&c, &dir, false).unwrap_err().to_string();
        assert!(err.contains("config key `task.path`") && err.contains("task.jsonl") && err.contains("--allow-config-change"), "{err}");
        check_resume(&c, &dir, true).unwrap();
        std::fs::remove_file(&data).unwrap();
        assert!(check_resume(&c, &dir, false).unwrap_err().to_string().contains("absent"));
        // a run folder from before the record: nothing to compare
        std::fs::remove_file(dir.join(FILE)).unwrap();
        check_resume(&c, &dir, false).unwrap();
    }

    #[test]
    fn the_checkpoint_folders_template_and_tokenizer_and_the_reward_script_are_compared() {
        let dir = shared_kernels::testing::Scratch::new("input-files-derived");
        let ck = dir.join("ck");
        std::fs::create_dir_all(&ck).unwrap();
        std::fs::write(ck.join("tokenizer.json"), "{}").unwrap();
        std::fs::write(ck.join("tokenizer_config.json"), "{\"chat_template\": \"{{ messages[0].content }}\"}").unwrap();
        let script = dir.join("grade.py");
        std::fs::write(&script, "print(1)\n").unwrap();
        let mut c = Config::default();
        c.model.path = ck.display().to_string();
        c.task.reward = "command".into();
        c.task.reward_command = format!("python3 '{}' --strict", script.display());
        save(&c, &dir).unwrap();
        check_resume(&c, &dir, false).unwrap();
        let refused = |what: &str| {
            let err = check_resume(&c, &dir, false).unwrap_err().to_string();
            assert!(err.contains(what) && err.contains("--allow-config-change"), "{err}");
        };
        // a template added beside the config (transformers' newer layout) renders other prompts
        std::fs::write(ck.join("chat_template.jinja"), "{{ messages[0].content }}!").unwrap();
        refused("config key `model.path`");
        std::fs::remove_file(ck.join("chat_template.jinja")).unwrap();
        check_resume(&c, &dir, false).unwrap();
        std::fs::write(ck.join("tokenizer_config.json"), "{\"chat_template\": \"{{ messages[1].content }}\"}").unwrap();
        refused("tokenizer_config.json");
        std::fs::write(ck.join("tokenizer_config.json"), "{\"chat_template\": \"{{ messages[0].content }}\"}").unwrap();
        // the reward program edited
        std::fs::write(&script, "print(0)\n").unwrap();
        refused("config key `task.reward_command`");
        check_resume(&c, &dir, true).unwrap();
        std::fs::write(&script, "print(1)\n").unwrap();
        check_resume(&c, &dir, false).unwrap();
        // another command is a config change (named by the config check), not an input's
        c.task.reward_command = "echo 1".into();
        check_resume(&c, &dir, false).unwrap();
    }
}
