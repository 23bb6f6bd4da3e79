//! GRPO phases 1-3: the step's rollouts (problems, completions, rewards, advantages), with
//! DAPO's dynamic sampling.

use super::Trainer;
use crate::objective::{completion_rows, group_advantages, overlong_penalty};
use crate::rng::SplitMix;
use crate::error::RunError;
use crate::policy::encode;
use sampler::Request;
use std::time::Instant;

impl Trainer {
    /// Phases 1-3: the step's problems (keyed by seed and step), `group_size` completions each
    /// from the sampler, their rewards and group-normalised advantages. With
    /// `train.dynamic_sampling_rounds` (DAPO's dynamic sampling), groups whose rewards are all
    /// equal (no signal) are dropped and up to that many refill rounds draw more prompts, from
    /// streams keyed by (seed, round), until `prompts_per_step` groups remain.
    pub(super) fn rollouts(&mut self, step: usize) -> Result<Rollouts, RunError> {
        let c = self.cfg.clone();
        let (p, g) = (c.train.prompts_per_step, c.train.group_size);
        let mut kept = self.sample_round(step, 0)?;
        if c.train.dynamic_sampling_rounds == 0 {
            return Ok(kept);
        }
        let mut sample_s = kept.sample_s;
        let mut engine_phases = std::mem::take(&mut kept.engine_phases);
        let first_round = kept.clone();
        let mut sampled = kept.requests.len() / g;
        kept.retain_groups(g, |rewards| rewards.iter().any(|&r| r != rewards[0]));
        for round in 1..=c.train.dynamic_sampling_rounds {
            if kept.requests.len() / g >= p {
                break;
            }
            let mut more = self.sample_round(step, round)?;
            sample_s += more.sample_s;
            engine_phases.absorb(&more.engine_phases);
            sampled += more.requests.len() / g;
            more.retain_groups(g, |rewards| rewards.iter().any(|&r| r != rewards[0]));
            kept.extend(more);
        }
        kept.truncate_groups(g, p);
        let groups_kept = kept.requests.len() / g;
        if kept.requests.is_empty() {
            // every group was degenerate: the first round stands (zero advantages, no update)
            kept = first_round;
        }
        kept.groups = Some((groups_kept, sampled));
        kept.sample_s = sample_s;
        kept.engine_phases = engine_phases;
        Ok(kept)
    }

    /// One round of rollouts: `prompts_per_step` problems of round `round`'s stream (round 0:
    /// the step's own, keyed by (seed, step)), sampled, rewarded, with group advantages.
    pub(super) fn sample_round(&mut self, step: usize, round: usize) -> Result<Rollouts, RunError> {
        if self.task.records().is_some() {
            return self.episode_round(step, round);
        }
        let c = self.cfg.clone();
        let (p, g) = (c.train.prompts_per_step, c.train.group_size);
        // refill rounds draw from their own keyed streams, apart from the step's
        let seed = if round == 0 { c.train.seed } else { c.train.seed ^ (round as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) };
        let mut rng = SplitMix::keyed(seed, step as u64, "prompts");
        let first = (step * p) as u64;
        let problems: Vec<_> = (0..p).map(|k| self.task.problem_at(seed, first + k as u64, &mut rng)).collect::<Result<_, _>>()?;
        let mut requests = Vec::new();
        for (pi, problem) in problems.iter().enumerate() {
            let prompt = encode(&self.policy.tokenizer, &problem.prompt)?;
            for gi in 0..g {
                let id = (step as u64) << 32 | (round * p * g + pi * g + gi) as u64;
                requests.push(Request { id, prompt: prompt.clone(), params: self.params(c.train.seed) });
            }
        }
        // data parallel: this rank samples and rewards its block of groups only (the same
        // requests, ids and so bits a single rank gives them); the rest comes by gather
        let own = self.own_sequences(requests.len(), g);
        let sampling = Instant::now();
        let results = self.engine.generate(requests[own.clone()].to_vec());
        let sample_s = sampling.elapsed().as_secs_f64();
        let engine_phases = self.engine.take_phase_times();
        let mut completions = Vec::with_capacity(results.len());
        for r in results {
            completions.push(r.map_err(|e| {
                let hint = if matches!(e, sampler::SampleError::TooLong { .. }) { " (raise sampler.context or lower sampler.max_new_tokens)" } else { "" };
                RunError::Other(format!("step {step}: sampler: {e}{hint}"))
            })?);
        }
        // a non-finite logprob is a fault (weights or device), never a sample: named, not trained on
        for (r, comp) in requests[own.clone()].iter().zip(&completions) {
            if let Some(p) = comp.logprobs.iter().position(|l| !l.is_finite()) {
                return Err(RunError::Other(format!("step {step}: request {}: the sampler's logprob at completion position {p} (token {}) is {}; stopping before the update (the last checkpoint is intact). Non-finite logprobs come from the weights: {}", r.id, comp.tokens[p], comp.logprobs[p], crate::backward::nonfinite_suspects(&c.model.path, "train.lr"))));
            }
        }
        let mut texts = Vec::with_capacity(completions.len());
        for comp in &completions {
            let body: Vec<u32> = comp.tokens.iter().copied().filter(|t| !self.policy.stop_tokens.contains(t)).collect();
            texts.push(self.policy.tokenizer.decode(&body, true).map_err(|e| RunError::Other(format!("decode: {e}")))?);
        }
        let problem_of = |i: usize| &problems[(own.start + i) / g];
        let raw: Vec<f64> = if c.task.reward == "command" {
            let rollouts: Vec<crate::reward_command::Rollout<'_>> = texts.iter().enumerate().map(|(i, t)| crate::reward_command::Rollout { prompt: &problem_of(i).prompt, completion: t, answer: &problem_of(i).answer }).collect();
            match crate::reward_command::rewards(&c.task.reward_command, c.task.reward_timeout_s, &rollouts) {
                Ok(rewards) => rewards,
                Err(e) => {
                    self.save_before_failed_step(step);
                    return Err(RunError::Other(format!("step {step}: {e} (stopping before the update)")));
                }
            }
        } else {
            texts.iter().enumerate().map(|(i, t)| self.task.reward_for(&c.task, problem_of(i), t) as f64).collect()
        };
        let (completions, raw) = self.gather_rollouts(step, completions, raw)?;
        let mut completions = completions;
        let rewards: Vec<f64> = raw.iter().zip(&completions).map(|(r, comp)| r - overlong_penalty(comp.tokens.len(), c.sampler.max_new_tokens, c.train.overlong_buffer, c.train.overlong_penalty)).collect();
        let advantages = group_advantages(&rewards, g, c.train.advantage);
        // rewards too large for their group's sums (1e308 passed as a finite number) are the
        // reward's fault, named as such, not a NaN loss blamed on the learning rate later
        let overflows = |group: &[f64]| {
            let mean = group.iter().sum::<f64>() / group.len() as f64;
            !(mean.is_finite() && group.iter().map(|r| (r - mean).powi(2)).sum::<f64>().is_finite())
        };
        if let Some(i) = rewards.chunks(g).position(overflows).map(|k| k * g) {
            let group = &rewards[i / g * g..(i / g + 1) * g];
            let source = if c.task.reward == "command" { "task.reward_command" } else { "task.reward" };
            self.save_before_failed_step(step);
            return Err(RunError::Other(format!("step {step}: group {} has rewards {group:?}, whose mean or spread is not a finite number; {source} must give finite rewards small enough to add (stopping before the update)", i / g)));
        }
        let sequences: Vec<Vec<u32>> = requests.iter().zip(&completions).map(|(r, comp)| [r.prompt.clone(), comp.tokens.clone()].concat()).collect();
        if shared_kernels::knobs::var("LOCKSTEP_FAULT_SAMPLER_LOGPROB").and_then(|v| v.parse::<usize>().ok()) == Some(step) {
            if let Some(lp) = completions.first_mut().and_then(|c| c.logprobs.first_mut()) {
                *lp = f32::from_bits(lp.to_bits() ^ 1); // fault injection (faults.rs): one bit
            }
        }
        let positions = requests.iter().zip(&completions).map(|(r, comp)| completion_rows(r.prompt.len(), comp.logprobs.len())).collect();
        Ok(Rollouts { requests, completions, rewards, advantages, sequences, positions, sample_s, engine_phases, groups: None, episodes: None })
    }
}

/// A step's rollouts: requests, completions, rewards and advantages, and the scored sequences
/// (prompt + completion). An agent episode is one rollout: its request is the first turn's, its
/// completion holds every sampled token of every turn (tokens and sampler logprobs, in order),
/// its sequence the whole episode (prompts, tool results and template text between the turns).
#[derive(Clone)]
pub(super) struct Rollouts {
    pub(super) requests: Vec<Request>,
    pub(super) completions: Vec<sampler::Completion>,
    pub(super) rewards: Vec<f64>,
    pub(super) advantages: Vec<f64>,
    pub(super) sequences: Vec<Vec<u32>>,
    /// Per rollout, the row of its sequence's logprobs that scores each sampled token (row r
    /// scores token r + 1): the loss, the corrections and the bit check read these rows only.
    pub(super) positions: Vec<Vec<usize>>,
    /// Agent episodes: each one's telemetry (turns, tool calls, tokens).
    pub(super) episodes: Option<Vec<crate::agents::EpisodeStats>>,
    pub(super) sample_s: f64,
    pub(super) engine_phases: sampler::EnginePhaseTimes,
    /// Dynamic sampling: (groups kept, groups sampled over every round).
    pub(super) groups: Option<(usize, usize)>,
}

impl Rollouts {
    /// Keeps the groups (`g` consecutive rollouts) whose rewards pass `keep`, in order.
    fn retain_groups(&mut self, g: usize, keep: impl Fn(&[f64]) -> bool) {
        fn by_group<T>(v: &mut Vec<T>, keep: &[bool], g: usize) {
            let mut i = 0;
            v.retain(|_| {
                i += 1;
                keep[(i - 1) / g]
            });
        }
        let keep: Vec<bool> = self.rewards.chunks(g).map(&keep).collect();
        by_group(&mut self.requests, &keep, g);
        by_group(&mut self.completions, &keep, g);
        by_group(&mut self.rewards, &keep, g);
        by_group(&mut self.advantages, &keep, g);
        by_group(&mut self.sequences, &keep, g);
        by_group(&mut self.positions, &keep, g);
        if let Some(e) = self.episodes.as_mut() {
            by_group(e, &keep, g);
        }
    }

    fn extend(&mut self, more: Rollouts) {
        self.requests.extend(more.requests);
        self.completions.extend(more.completions);
        self.rewards.extend(more.rewards);
        self.advantages.extend(more.advantages);
        self.sequences.extend(more.sequences);
        self.positions.extend(more.positions);
        if let (Some(e), Some(more)) = (self.episodes.as_mut(), more.episodes) {
            e.extend(more);
        }
    }

    /// The first `groups` groups of `g` rollouts.
    fn truncate_groups(&mut self, g: usize, groups: usize) {
        let n = (groups * g).min(self.requests.len());
        self.requests.truncate(n);
        self.completions.truncate(n);
        self.rewards.truncate(n);
        self.advantages.truncate(n);
        self.sequences.truncate(n);
        self.positions.truncate(n);
        if let Some(e) = self.episodes.as_mut() {
            e.truncate(n);
        }
    }
}
