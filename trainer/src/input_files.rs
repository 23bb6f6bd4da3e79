//! The data files a run reads (`task.path`, `task.eval_path`, `task.chat_template`), recorded
//! by size and content hash in the run folder at its start (`inputs.resolved.json`), so that a
//! `--resume` which would read other data is refused as a changed config is: the same config
//! over an edited dataset is not the uninterrupted run.

use crate::config::Config;
use crate::run::{invalid, RunError};
use std::io::Read;
use std::path::Path;

const FILE: &str = "inputs.resolved.json";

/// FNV-1a over the file's bytes (stable across builds and machines, unlike std's hasher) and
/// its length, or `None` when it cannot be read.
fn fingerprint(path: &Path) -> Option<(u64, String)> {
    let mut file = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path).ok()?);
    let (mut hash, mut len, mut buf) = (0xcbf2_9ce4_8422_2325u64, 0u64, vec![0u8; 1 << 20]);
    loop {
        let n = file.read(&mut buf).ok()?;
        if n == 0 {
            return Some((len, format!("{hash:016x}")));
        }
        for &b in &buf[..n] {
            hash = (hash ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        len += n as u64;
    }
}

fn keys(c: &Config) -> [(&'static str, &String); 3] {
    [("task.path", &c.task.path), ("task.eval_path", &c.task.eval_path), ("task.chat_template", &c.task.chat_template)]
}

/// Each set input key with its file, length and hash.
fn current(c: &Config) -> serde_json::Map<String, serde_json::Value> {
    keys(c)
        .iter()
        .filter(|(_, file)| !file.is_empty())
        .filter_map(|(key, file)| fingerprint(Path::new(file.as_str())).map(|(bytes, hash)| (key.to_string(), serde_json::json!({"file": file, "bytes": bytes, "fnv1a64": hash}))))
        .collect()
}

/// Records the run's inputs in `dir` (written whole or not at all).
pub fn save(c: &Config, dir: &Path) -> Result<(), RunError> {
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(current(c))).expect("json serialises");
    shared_kernels::model::save::write_atomic(&dir.join(FILE), text.as_bytes())?;
    Ok(())
}

/// Refuses a resume whose input files differ from those the run started with, naming the key
/// and the file, unless `allow` (then a warning). A run folder without the record (an earlier
/// version's) is not checked.
pub fn check_resume(c: &Config, dir: &Path, allow: bool) -> Result<(), RunError> {
    let Ok(text) = std::fs::read_to_string(dir.join(FILE)) else { return Ok(()) };
    let before: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text).map_err(|e| RunError::Other(format!("{}: {e}", dir.join(FILE).display())))?;
    let now = current(c);
    for (key, was) in &before {
        // a key that now names another file is a config change, which the config check names
        if keys(c).iter().any(|(k, file)| k == key && was["file"] != file.as_str()) {
            continue;
        }
        let is = now.get(key);
        if is != Some(was) {
            let what = match is {
                Some(is) => format!("{} is {} bytes with hash {} where the run started on {} bytes with hash {}", is["file"], is["bytes"], is["fnv1a64"], was["bytes"], was["fnv1a64"]),
                None => format!("{} cannot be read", was["file"]),
            };
            let message = format!("{what} ({FILE}): resuming on other data is not the uninterrupted run. Restore the file, or pass --allow-config-change");
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
        assert!(check_resume(&c, &dir, false).unwrap_err().to_string().contains("cannot be read"));
        // a run folder from before the record: nothing to compare
        std::fs::remove_file(dir.join(FILE)).unwrap();
        check_resume(&c, &dir, false).unwrap();
    }
}
