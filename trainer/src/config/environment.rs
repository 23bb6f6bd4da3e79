//! `[environment]`: agent episodes (`task.name = "environment"`, docs/agents.md): the program
//! that plays each episode through lockstep's server, how many run at once, and the limits
//! an episode must keep.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EnvironmentSection {
    /// A shell command run once per episode (`sh -c`), with the task's record as one JSON line
    /// on its stdin and `LOCKSTEP_BASE_URL` / `OPENAI_BASE_URL` (the episode's own
    /// OpenAI-compatible endpoint), `LOCKSTEP_SESSION`, `LOCKSTEP_EPISODE` in its environment;
    /// its last stdout line is `{"reward": r}` (optionally `"turn_rewards": [...]`).
    pub command: String,
    /// Episodes running at once (programs alive and sessions open).
    pub concurrency: usize,
    /// Seconds one episode may take, its generations included; past it the program and
    /// everything it started are stopped and the step fails, naming the episode.
    pub timeout_s: f64,
    /// Model turns (generation requests) one episode may make; one more is refused (HTTP 400)
    /// and the episode fails.
    pub max_turns: usize,
    /// Tokens one episode may reach (prompts, observations and sampled tokens); 0: the
    /// sampler's context (`sampler.context`).
    pub max_tokens: usize,
    /// Write each step's episodes as trained on (token ids, the rows of the sampled tokens,
    /// the sampler's logprobs) to `trajectories/step-NNNNNN.jsonl` in the run folder.
    pub save_trajectories: bool,
}

impl Default for EnvironmentSection {
    fn default() -> Self {
        Self { command: String::new(), concurrency: 64, timeout_s: 600.0, max_turns: 16, max_tokens: 0, save_trajectories: false }
    }
}

impl EnvironmentSection {
    /// The keys' own bounds, and that the section is set exactly when the task uses it:
    /// `(key, message)` of the first one that fails.
    pub fn check(&self, task_name: &str) -> Result<(), (&'static str, String)> {
        let used = task_name == "environment";
        if !used {
            if *self != Self::default() {
                return Err(("environment.command", format!("[environment] is set but task.name = \"{task_name}\" plays no episodes; set task.name = \"environment\"")));
            }
            return Ok(());
        }
        if self.command.trim().is_empty() {
            return Err(("environment.command", "task.name = \"environment\" needs the program that plays an episode".into()));
        }
        if self.concurrency == 0 {
            return Err(("environment.concurrency", "must be at least 1 (episodes running at once)".into()));
        }
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0 && self.timeout_s <= crate::child::MAX_TIMEOUT_S) {
            return Err(("environment.timeout_s", format!("must be a finite number of seconds > 0 and at most {} (a week), got {}", crate::child::MAX_TIMEOUT_S, self.timeout_s)));
        }
        if self.max_turns == 0 {
            return Err(("environment.max_turns", "must be at least 1".into()));
        }
        Ok(())
    }
}
