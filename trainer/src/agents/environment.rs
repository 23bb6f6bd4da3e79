//! The environment programs: `environment.command` run once per episode (`crate::child`: its
//! own process group, ended with it, its deadline `environment.timeout_s`), at most
//! `environment.concurrency` at once, each given its record on stdin and its session's URL in
//! its environment. An episode ends with the program's last stdout line, `{"reward": r}`.

use crate::config::EnvironmentSection;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One episode to play.
pub struct Episode {
    pub session: String,
    /// The record's line in `task.path`.
    pub line: usize,
    pub record: serde_json::Value,
}

/// What a finished program reported.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub reward: f64,
    /// Optional rewards per turn, as the program gave them (recorded, not trained on).
    pub turn_rewards: Vec<f64>,
}

/// Plays `episodes` against the server at `base` (e.g. `http://127.0.0.1:PORT`): each one's
/// report or error, in order, and the seconds its program ran.
pub fn play(cfg: &EnvironmentSection, base: &str, model: &str, episodes: &[Episode]) -> Vec<(Result<Report, String>, f64)> {
    let queue: Mutex<VecDeque<usize>> = Mutex::new((0..episodes.len()).collect());
    let results: Mutex<Vec<Option<(Result<Report, String>, f64)>>> = Mutex::new(vec![None; episodes.len()]);
    std::thread::scope(|scope| {
        for _ in 0..cfg.concurrency.min(episodes.len()) {
            scope.spawn(|| loop {
                let Some(i) = queue.lock().expect("queue").pop_front() else { break };
                let started = Instant::now();
                let report = run_one(cfg, base, model, &episodes[i]);
                results.lock().expect("results")[i] = Some((report, started.elapsed().as_secs_f64()));
            });
        }
    });
    results.into_inner().expect("results").into_iter().map(|r| r.expect("every episode ran")).collect()
}

fn run_one(cfg: &EnvironmentSection, base: &str, model: &str, e: &Episode) -> Result<Report, String> {
    let key = "environment.command";
    let url = format!("{base}/sessions/{}/v1", e.session);
    let env = [("LOCKSTEP_BASE_URL", url.clone()), ("OPENAI_BASE_URL", url), ("OPENAI_API_KEY", "lockstep".to_string()), ("LOCKSTEP_SESSION", e.session.clone()), ("LOCKSTEP_MODEL", model.to_string()), ("LOCKSTEP_RECORD_LINE", e.line.to_string())];
    let input = format!("{}\n", e.record).into_bytes();
    let finished = crate::child::run_with_env(&cfg.command, &env, input, Duration::from_secs_f64(cfg.timeout_s));
    let tail = |bytes: &[u8]| String::from_utf8_lossy(bytes).lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join(" | ");
    let f = match finished {
        Ok(f) => f,
        Err(crate::child::Failure::Start(err)) => return Err(format!("{key} {:?} could not start: {err}", cfg.command)),
        Err(crate::child::Failure::TimedOut { stderr }) => return Err(format!("{key} ran past environment.timeout_s = {} s; it and every process it started were stopped; its stderr: {}", cfg.timeout_s, tail(&stderr))),
    };
    if !f.status.success() {
        return Err(format!("{key} failed ({}); its stderr: {}", f.status, tail(&f.stderr)));
    }
    let out = String::from_utf8_lossy(&f.stdout);
    let Some(last) = out.lines().rev().find(|l| !l.trim().is_empty()) else {
        return Err(format!("{key} printed nothing: its last stdout line must be {{\"reward\": number}}; its stderr: {}", tail(&f.stderr)));
    };
    parse_report(last.trim()).map_err(|m| format!("{key}: its last stdout line {last:?} {m}; its stderr: {}", tail(&f.stderr)))
}

/// The report in a program's last line: `{"reward": r}` with a finite `r`, optionally
/// `"turn_rewards": [finite numbers]` (a bare number is taken as the reward too).
pub fn parse_report(line: &str) -> Result<Report, String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("is not JSON ({e})"))?;
    let reward = match &v {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::Object(o) => o.get("reward").and_then(serde_json::Value::as_f64),
        _ => None,
    };
    let Some(reward) = reward.filter(|r| r.is_finite()) else { return Err("has no finite \"reward\" (expected {\"reward\": number})".into()) };
    let turn_rewards = match v.get("turn_rewards") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(list)) => list.iter().map(|x| x.as_f64().filter(|r| r.is_finite())).collect::<Option<Vec<f64>>>().ok_or("has \"turn_rewards\" that are not all finite numbers")?,
        Some(other) => return Err(format!("has \"turn_rewards\" = {other}, not a list of numbers")),
    };
    Ok(Report { reward, turn_rewards })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_a_finite_reward_with_optional_turn_rewards() {
        assert_eq!(parse_report("{\"reward\": 0.5}").unwrap(), Report { reward: 0.5, turn_rewards: vec![] });
        assert_eq!(parse_report("1").unwrap().reward, 1.0);
        assert_eq!(parse_report("{\"reward\": 1, \"turn_rewards\": [0, 1]}").unwrap().turn_rewards, vec![0.0, 1.0]);
        for bad in ["{\"score\": 1}", "{\"reward\": \"1\"}", "oops", "{\"reward\": 1, \"turn_rewards\": [\"a\"]}", "[1]"] {
            assert!(parse_report(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn programs_run_concurrently_with_their_record_and_session_and_faults_are_named() {
        let cfg = |command: &str, timeout_s: f64| EnvironmentSection { command: command.into(), concurrency: 4, timeout_s, max_turns: 4, max_tokens: 0, save_trajectories: false };
        let episodes: Vec<Episode> = (0..6).map(|i| Episode { session: format!("s0-r0-e{i}"), line: i + 1, record: serde_json::json!({"x": i}) }).collect();
        // the record comes on stdin, the session in the environment; 6 sleeps of 0.3 s on 4 at once
        let started = Instant::now();
        let script = r#"read rec; x=$(echo "$rec" | sed 's/[^0-9]//g'); sleep 0.3; echo "log line"; echo "{\"reward\": $x.5}"; test "$LOCKSTEP_BASE_URL" = "http://h/sessions/$LOCKSTEP_SESSION/v1""#;
        let out = play(&cfg(script, 30.0), "http://h", "m", &episodes);
        assert!(started.elapsed() < Duration::from_secs_f64(1.5), "not concurrent: {:?}", started.elapsed());
        for (i, (r, _)) in out.iter().enumerate() {
            assert_eq!(r.as_ref().unwrap().reward, i as f64 + 0.5);
        }
        let crash = play(&cfg("echo boom >&2; exit 3", 30.0), "http://h", "m", &episodes[..1]);
        let e = crash[0].0.as_ref().unwrap_err();
        assert!(e.contains("environment.command failed") && e.contains("boom"), "{e}");
        let started = Instant::now();
        let hang = play(&cfg("echo waiting >&2; sleep 60", 0.5), "http://h", "m", &episodes[..2]);
        assert!(started.elapsed() < Duration::from_secs(5));
        let e = hang[1].0.as_ref().unwrap_err();
        assert!(e.contains("environment.timeout_s = 0.5") && e.contains("waiting"), "{e}");
        let silent = play(&cfg("true", 30.0), "http://h", "m", &episodes[..1]);
        assert!(silent[0].0.as_ref().unwrap_err().contains("printed nothing"));
        let bad = play(&cfg("echo '{\"reward\": null}'", 30.0), "http://h", "m", &episodes[..1]);
        assert!(bad[0].0.as_ref().unwrap_err().contains("no finite \"reward\""), "{:?}", bad[0].0);
    }
}
