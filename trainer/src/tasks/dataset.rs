//! A user's dataset as problems: JSON lines or Parquet rows, prompt and answer at configurable
//! (dotted) keys, a prompt as text or a chat message list; walked in epochs of keyed permutations.

use super::{Problem, TaskError};
use crate::config::TaskSection;
use crate::rng::SplitMix;
use std::path::Path;

/// Epoch `epoch`'s order of `n` problems: a Fisher-Yates shuffle keyed by (seed, epoch).
pub fn epoch_permutation(seed: u64, epoch: u64, n: usize) -> Vec<usize> {
    let mut rng = SplitMix::keyed(seed, epoch, "dataset epoch");
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    order
}

/// `v` at a dotted key path ("reward_model.ground_truth").
fn at_path<'a>(v: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.').try_fold(v, |v, key| v.get(key))
}

/// A dataset file's problems: Parquet by the `.parquet` extension (a row's number stands for
/// its line in errors), JSON lines otherwise.
pub(super) fn load_dataset(path: &Path, c: &TaskSection) -> Result<Vec<Problem>, TaskError> {
    let file = path.display().to_string();
    let records = load_records(path)?;
    let mut out = Vec::new();
    for (line, v) in records {
        out.push(problem_of(&v, c).map_err(|message| TaskError { file: file.clone(), line, message })?);
        out.last_mut().expect("just pushed").line = line;
    }
    if out.is_empty() {
        return Err(TaskError { file, line: 0, message: "no problems in the file".into() });
    }
    Ok(out)
}

/// A dataset file's records with their lines (Parquet: row numbers), as JSON values.
pub(super) fn load_records(path: &Path) -> Result<Vec<(usize, serde_json::Value)>, TaskError> {
    let file = path.display().to_string();
    let records: Vec<(usize, serde_json::Value)> = if path.extension().is_some_and(|e| e == "parquet") {
        crate::parquet_rows::rows(path).map_err(|(line, message)| TaskError { file: file.clone(), line, message })?
    } else {
        let lines = crate::jsonl::lines(path).map_err(|(line, message)| TaskError { file: file.clone(), line, message })?;
        let mut out = Vec::new();
        for (line, text) in lines {
            let v = serde_json::from_str(&text).map_err(|e| TaskError { file: file.clone(), line, message: format!("not valid JSON: {e}") })?;
            out.push((line, v));
        }
        out
    };
    Ok(records)
}

/// One record's problem: the prompt under `task.prompt_key`, the answer under
/// `task.answer_key` (dotted paths).
fn problem_of(v: &serde_json::Value, c: &TaskSection) -> Result<Problem, String> {
    use serde_json::Value as J;
    let chat = c.prompt_format == crate::config::PromptFormat::Chat;
    // strings, or numbers (datasets often store a numeric answer as one), as written
    let answer = match at_path(v, &c.answer_key) {
        Some(J::String(s)) => s.clone(),
        Some(n @ J::Number(_)) => n.to_string(),
        Some(other) => return Err(format!("`{}` (task.answer_key) is {}, not a string or a number", c.answer_key, kind(other))),
        None => return Err(format!("missing string field `{}` (task.answer_key)", c.answer_key)),
    };
    let (prompt, messages) = match at_path(v, &c.prompt_key) {
        Some(J::String(s)) => (s.clone(), None),
        Some(J::Array(list)) if chat => {
            for (i, m) in list.iter().enumerate() {
                if !(m.get("role").is_some_and(J::is_string) && m.get("content").is_some()) {
                    return Err(format!("`{}` message {i} has no string \"role\" and \"content\"", c.prompt_key));
                }
                if let Some(what) = m.get("content").and_then(crate::parquet_rows::unreadable) {
                    return Err(format!("`{}` message {i}'s \"content\" is {what}", c.prompt_key));
                }
            }
            (String::new(), Some(J::Array(list.clone())))
        }
        Some(J::Array(_)) => return Err(format!("`{}` (task.prompt_key) is a list of chat messages: set task.prompt_format = \"chat\" to render it with the checkpoint's chat template", c.prompt_key)),
        Some(other) => return Err(format!("`{}` (task.prompt_key) is {}, not a string{}", c.prompt_key, kind(other), if chat { " or a list of messages" } else { "" })),
        None => return Err(format!("missing string field `{}` (task.prompt_key)", c.prompt_key)),
    };
    Ok(Problem { prompt, answer, numbers: vec![], target: 0, line: 0, messages })
}

fn kind(v: &serde_json::Value) -> String {
    if let Some(what) = crate::parquet_rows::unreadable(v) {
        return what.to_string();
    }
    let name = match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    };
    name.to_string()
}
