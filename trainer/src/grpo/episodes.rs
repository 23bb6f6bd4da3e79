//! GRPO phases 1-3 for agent episodes (`task.name = "environment"`): each of the step's
//! records played `group_size` times by `environment.command` through the episodes' server
//! (`crate::agents`), each episode one rollout whose loss covers its sampled tokens only.

use super::rollouts::Rollouts;
use super::Trainer;
use crate::agents::environment::Episode;
use crate::agents::EpisodeStats;
use crate::error::RunError;
use crate::objective::group_advantages;
use sampler::{Completion, FinishReason, Request};
use std::time::Instant;

impl Trainer {
    /// One round of episodes: `prompts_per_step` records of round `round`'s stream, each
    /// played `group_size` times; rewards from the programs, group advantages.
    pub(super) fn episode_round(&mut self, step: usize, round: usize) -> Result<Rollouts, RunError> {
        let c = self.cfg.clone();
        if self.comm.is_some() {
            return Err(crate::error::invalid("task.name", "agent episodes (\"environment\") run on one process: data-parallel ranks would each need the episodes' server".to_string()));
        }
        let (p, g) = (c.train.prompts_per_step, c.train.group_size);
        let seed = if round == 0 { c.train.seed } else { c.train.seed ^ (round as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) };
        let first = (step * p) as u64;
        let mut episodes = Vec::with_capacity(p * g);
        for k in 0..p {
            let (line, record) = self.task.record_at(seed, first + k as u64).ok_or_else(|| RunError::Other("an environment task has records".into()))?;
            for gi in 0..g {
                episodes.push(Episode { session: format!("s{step}-r{round}-e{}", k * g + gi), line, record: record.clone() });
            }
        }
        let s = &c.sampler;
        let defaults = crate::serve::api::Defaults { model_name: crate::serve::model_name(&c), seed: c.train.seed, stop_tokens: self.policy.stop_tokens.clone(), processed_logprobs: s.logprobs_mode == crate::config::LogprobsMode::Processed, context: s.context, vocab: self.policy.model.config.vocab_size };
        let max_tokens = if c.environment.max_tokens == 0 { s.context } else { c.environment.max_tokens.min(s.context) };
        let chat = crate::serve::chat_prompts(&c)?;
        let params = self.params(c.train.seed);
        let playing = Instant::now();
        let played = crate::agents::play(&mut self.engine, self.policy.tokenizer.clone(), chat, defaults, params, &c.environment, max_tokens, &episodes).map_err(RunError::Other)?;
        let sample_s = playing.elapsed().as_secs_f64();
        let engine_phases = self.engine.take_phase_times();
        // the first failed episode fails the step, before any weight moves
        for (i, (e, played)) in episodes.iter().zip(&played).enumerate() {
            // the program's own failure first: a program stopped at its deadline also hangs up
            let failure = match (&played.report, &played.session.refused) {
                (Err(e), Some(refused)) => Some(format!("{e} (and the server: {refused})")),
                (Err(e), None) => Some(e.clone()),
                (Ok(_), Some(refused)) => Some(format!("the server refused its request ({refused})")),
                (Ok(_), None) if played.session.turns.is_empty() => Some("its program reported a reward without asking the model anything (no turn)".into()),
                _ => None,
            };
            if let Some(why) = failure {
                self.save_before_failed_step(step);
                return Err(RunError::Other(format!("step {step}: episode {i} (session {}, record {}:{}): {why} (stopping before the update)", e.session, c.task.path, e.line)));
            }
        }
        let mut out = Rollouts { requests: Vec::new(), completions: Vec::new(), rewards: Vec::new(), advantages: Vec::new(), sequences: Vec::new(), positions: Vec::new(), sample_s, engine_phases, groups: None, episodes: Some(Vec::new()) };
        let mut stats = Vec::with_capacity(played.len());
        for (i, (e, played)) in episodes.iter().zip(played).enumerate() {
            let trajectory = played.session.trajectory().expect("an episode with turns");
            let report = played.report.expect("checked above");
            if let Some(t) = trajectory.logprobs.iter().position(|l| !l.is_finite()) {
                return Err(RunError::Other(format!("step {step}: episode {i}: the sampler's logprob of sampled token {t} is {}; stopping before the update (the last checkpoint is intact). Non-finite logprobs come from the weights: {}", trajectory.logprobs[t], crate::backward::nonfinite_suspects(&c.model.path, "train.lr"))));
            }
            let last = played.session.turns.last().expect("an episode with turns");
            let finish = if last.tokens.len() >= c.sampler.max_new_tokens { FinishReason::Length } else { FinishReason::Stop };
            stats.push(EpisodeStats {
                step,
                episode: i,
                session: e.session.clone(),
                line: e.line,
                turns: played.session.turns.len(),
                tool_calls: played.session.turns.iter().map(|t| t.tool_calls).sum(),
                sampled_tokens: trajectory.tokens.len(),
                episode_tokens: trajectory.sequence.len(),
                reward: report.reward,
                turn_rewards: report.turn_rewards,
                program_s: played.program_s,
            });
            let id = (step as u64) << 32 | (round * p * g + i) as u64;
            out.requests.push(Request { id, prompt: trajectory.first_prompt.clone(), params: self.params(c.train.seed) });
            out.completions.push(Completion { id, prompt_len: trajectory.first_prompt.len(), tokens: trajectory.tokens, logprobs: trajectory.logprobs, top_logprobs: Vec::new(), routing: trajectory.routing, finish, timings: Default::default() });
            out.rewards.push(report.reward);
            out.sequences.push(trajectory.sequence);
            out.positions.push(trajectory.positions);
        }
        // rewards too large for their group's sums are the program's fault, named as such
        if let Some(k) = out.rewards.chunks(g).position(|group| {
            let mean = group.iter().sum::<f64>() / group.len() as f64;
            !(mean.is_finite() && group.iter().map(|r| (r - mean).powi(2)).sum::<f64>().is_finite())
        }) {
            self.save_before_failed_step(step);
            return Err(RunError::Other(format!("step {step}: group {k} has rewards {:?}, whose mean or spread is not a finite number; environment.command must report finite rewards small enough to add (stopping before the update)", &out.rewards[k * g..(k + 1) * g])));
        }
        out.advantages = group_advantages(&out.rewards, g, c.train.advantage);
        if c.environment.save_trajectories {
            save_trajectories(&self.run_dir, step, round, &out, &stats)?;
        }
        crate::telemetry::append_episodes(&self.run_dir, &stats).map_err(|e| RunError::Other(format!("episodes.jsonl: {e}")))?;
        out.episodes = Some(stats);
        Ok(out)
    }
}

/// The round's episodes as trained on, one JSON line each (`environment.save_trajectories`):
/// the session, the whole sequence's ids, the rows that score its sampled tokens and the
/// sampler's logprobs of those tokens, written atomically.
fn save_trajectories(run_dir: &std::path::Path, step: usize, round: usize, r: &Rollouts, stats: &[EpisodeStats]) -> Result<(), RunError> {
    let dir = run_dir.join("trajectories");
    std::fs::create_dir_all(&dir).map_err(|e| RunError::Other(format!("environment.save_trajectories: {}: {e}", dir.display())))?;
    let mut text = String::new();
    for (i, e) in stats.iter().enumerate() {
        let line = serde_json::json!({"step": step, "episode": e.episode, "session": e.session, "reward": r.rewards[i], "sequence": r.sequences[i], "sampled_rows": r.positions[i], "logprobs": r.completions[i].logprobs});
        text += &format!("{line}\n");
    }
    let name = if round == 0 { format!("step-{step:06}.jsonl") } else { format!("step-{step:06}-round-{round}.jsonl") };
    shared_kernels::model::save::write_atomic(&dir.join(name), text.as_bytes())?;
    Ok(())
}
