//! An environment task's records (`task.name = "environment"`): each line of `task.path`, a
//! JSON object handed to the environment program as it is; an optional `"demo"` (a whole
//! episode as chat messages) is what the SFT warm start imitates, one assistant turn at a time.

use super::{Problem, TaskError};
use serde_json::Value;
use std::path::Path;

/// The records of `path` (JSON lines or Parquet), each a JSON object; an error names the line.
pub fn load(path: &Path) -> Result<Vec<(usize, Value)>, TaskError> {
    let file = path.display().to_string();
    if path.as_os_str().is_empty() {
        return Err(TaskError { file: "task.path".into(), line: 0, message: "task.name = \"environment\" reads its episodes' records from task.path (JSON lines); none is set".into() });
    }
    let records = super::dataset::load_records(path)?;
    for (line, v) in &records {
        if !v.is_object() {
            return Err(TaskError { file: file.clone(), line: *line, message: format!("an environment record must be a JSON object (it is handed to environment.command as is), got {v}") });
        }
        if let Some(demo) = v.get("demo") {
            demo_turns(demo).map_err(|message| TaskError { file: file.clone(), line: *line, message })?;
        }
    }
    if records.is_empty() {
        return Err(TaskError { file, line: 0, message: "no records in the file".into() });
    }
    Ok(records)
}

/// The indices of a demo's assistant messages, after checking it is a list of
/// `{"role", "content"}` messages with at least one assistant turn after another message.
fn demo_turns(demo: &Value) -> Result<Vec<usize>, String> {
    let Some(list) = demo.as_array() else { return Err(format!("`demo` must be a list of {{\"role\", \"content\"}} messages, got {demo}")) };
    for (i, m) in list.iter().enumerate() {
        if !(m.get("role").is_some_and(Value::is_string) && m.get("content").is_some_and(Value::is_string)) {
            return Err(format!("`demo` message {i} must be {{\"role\": string, \"content\": string}}, got {m}"));
        }
    }
    let turns: Vec<usize> = (1..list.len()).filter(|&i| list[i]["role"] == "assistant").collect();
    if turns.is_empty() {
        return Err("`demo` has no assistant message after the first message: nothing to imitate".into());
    }
    Ok(turns)
}

/// An SFT example from record `(line, v)`'s demo: the messages before one of its assistant
/// turns (picked by `pick`) as the prompt's messages, that turn's content as the answer.
pub fn demo_problem(file: &str, line: usize, v: &Value, pick: &mut dyn FnMut(u64) -> u64) -> Result<Problem, TaskError> {
    let Some(demo) = v.get("demo") else {
        return Err(TaskError { file: file.to_string(), line, message: "train.sft_steps > 0 imitates each record's `demo` (the episode as chat messages), and this record has none".into() });
    };
    let turns = demo_turns(demo).map_err(|message| TaskError { file: file.to_string(), line, message })?;
    let at = turns[pick(turns.len() as u64) as usize];
    let list = demo.as_array().expect("checked");
    let answer = list[at]["content"].as_str().expect("checked").to_string();
    Ok(Problem { prompt: String::new(), answer, numbers: vec![], target: 0, line, messages: Some(Value::Array(list[..at].to_vec())) })
}
