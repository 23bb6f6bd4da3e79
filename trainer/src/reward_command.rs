//! Rewards from the user's own program (`task.reward = "command"`): once per GRPO step,
//! `task.reward_command` runs through `sh -c` with one JSON line per rollout on its stdin
//! (`{"index", "prompt", "completion", "answer"}`) and must print one line per rollout on its
//! stdout, in order: a number, or an object with a numeric `"reward"`. It has
//! `task.reward_timeout_s` seconds (`crate::child`: its own process group, ended with it); a
//! crash, a hang, a short answer or a malformed line is an error naming the key, the line and
//! the program's stderr, never a hang or a panic.

use std::time::Duration;

/// One rollout as the program sees it.
pub struct Rollout<'a> {
    pub prompt: &'a str,
    pub completion: &'a str,
    pub answer: &'a str,
}

/// The rewards `command` gives `rollouts`, in order.
pub fn rewards(command: &str, timeout_s: f64, rollouts: &[Rollout<'_>]) -> Result<Vec<f64>, String> {
    let key = "task.reward_command";
    let mut input = String::new();
    for (i, r) in rollouts.iter().enumerate() {
        input += &serde_json::json!({"index": i, "prompt": r.prompt, "completion": r.completion, "answer": r.answer}).to_string();
        input.push('\n');
    }
    let finished = crate::child::run(command, input.into_bytes(), Duration::from_secs_f64(timeout_s.clamp(0.0, crate::child::MAX_TIMEOUT_S)));
    let (status, out, err) = match finished {
        Ok(f) => (f.status, f.stdout, String::from_utf8_lossy(&f.stderr).into_owned()),
        Err(crate::child::Failure::Start(e)) => return Err(format!("{key} {command:?} could not start: {e}")),
        Err(crate::child::Failure::TimedOut { stderr }) => {
            let tail = String::from_utf8_lossy(&stderr).lines().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join(" | ");
            return Err(format!("{key} {command:?} gave no answer within task.reward_timeout_s = {timeout_s} s for {} rollouts; it and every process it started were stopped; its stderr: {tail}", rollouts.len()));
        }
    };
    let err_tail: String = err.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join(" | ");
    if !status.success() {
        return Err(format!("{key} {command:?} failed ({status}); its stderr: {err_tail}"));
    }
    let out = String::from_utf8(out).map_err(|e| format!("{key} {command:?} printed bytes that are not UTF-8 (at byte {}), not one reward a line; its stderr: {err_tail}", e.utf8_error().valid_up_to()))?;
    let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.len() != rollouts.len() {
        return Err(format!("{key} {command:?} printed {} reward lines for {} rollouts (one line per rollout, in order); its stderr: {err_tail}", lines.len(), rollouts.len()));
    }
    lines
        .iter()
        .enumerate()
        .map(|(i, line)| {
            let value: serde_json::Value = serde_json::from_str(line.trim()).map_err(|e| format!("{key}: output line {}: {line:?} is not JSON ({e})", i + 1))?;
            let reward = match &value {
                serde_json::Value::Number(n) => n.as_f64(),
                serde_json::Value::Object(o) => o.get("reward").and_then(|r| r.as_f64()),
                _ => None,
            };
            match reward {
                Some(r) if r.is_finite() => Ok(r),
                _ => Err(format!("{key}: output line {} is {line:?}: expected a finite number or {{\"reward\": number}}", i + 1)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn batch() -> Vec<Rollout<'static>> {
        vec![Rollout { prompt: "1+1=", completion: "2", answer: "2" }, Rollout { prompt: "2+2=", completion: "five", answer: "4" }]
    }

    #[test]
    fn a_program_reads_json_lines_and_answers_one_reward_each() {
        // the completion's length, as a bare number and as an object
        let script = r#"python3 -c 'import sys, json
for line in sys.stdin:
    r = json.loads(line)
    print(len(r["completion"]) if r["index"] % 2 == 0 else json.dumps({"reward": len(r["completion"]) + 0.5}))'"#;
        assert_eq!(rewards(script, 30.0, &batch()).unwrap(), vec![1.0, 4.5]);
    }

    #[test]
    fn crashes_hangs_and_malformed_answers_are_errors_naming_the_key() {
        let err = rewards("echo oops >&2; exit 3", 30.0, &batch()).unwrap_err();
        assert!(err.contains("task.reward_command") && err.contains("oops"), "{err}");
        let started = Instant::now();
        let err = rewards("sleep 30", 0.5, &batch()).unwrap_err();
        assert!(err.contains("task.reward_timeout_s") && started.elapsed() < Duration::from_secs(10), "{err}");
        let err = rewards("echo 1", 30.0, &batch()).unwrap_err();
        assert!(err.contains("1 reward lines for 2 rollouts"), "{err}");
        let err = rewards("echo 1; echo nan", 30.0, &batch()).unwrap_err();
        assert!(err.contains("output line 2"), "{err}");
        let err = rewards("printf '1\\n{\"score\": 2}\\n'", 30.0, &batch()).unwrap_err();
        assert!(err.contains("output line 2") && err.contains("reward"), "{err}");
        // bytes that are not text are named as such, not counted as zero lines
        let err = rewards("printf '1\\n\\377\\376\\n'", 30.0, &batch()).unwrap_err();
        assert!(err.contains("not UTF-8") && err.contains("at byte 2"), "{err}");
        // a program that never reads its input and exits at once is still answered in full
        assert_eq!(rewards("echo 0; echo 1", 30.0, &batch()).unwrap(), vec![0.0, 1.0]);
    }
}
