//! Evaluation every `train.eval_every` GRPO steps on the problems of `task.eval_path` (a generator
//! task without one: problems from the generator's own evaluation stream): a greedy
//! completion and `train.eval_samples` sampled ones per problem, graded as training is
//! (`task.reward`, or the reward program of `task.reward = "command"`; a reward of 1 is correct). pass@1 (greedy), pass@k (any of the k sampled correct, the
//! unbiased estimator with n = k) and the sampled completions' mean reward and accuracy go to
//! metrics.jsonl and TensorBoard under `eval/`.

use crate::config::Config;
use crate::error::RunError;
use crate::policy::{encode, Policy};
use crate::tasks::{Problem, Task};
use sampler::{Engine, Request, SamplingParams};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct EvalMetrics {
    pub problems: usize,
    pub k: usize,
    pub pass1_greedy: f64,
    pub pass_at_k: f64,
    /// Mean accuracy of the sampled completions (pass@1 sampled).
    pub sampled_accuracy: f64,
    pub sampled_reward_mean: f64,
}

/// The eval split: the first `train.eval_problems` problems of `task.eval_path` (file order),
/// read and rendered as the training file is. A generator task (addition, sort, countdown,
/// word_problems) without one draws them from a stream keyed by (`train.seed`, "eval"), apart
/// from the training prompts' (keyed by the step), so they are the same problems at every
/// evaluation and in every run; the generators' spaces are small, so some may also occur in
/// training.
/// `task` is the run's training task (a generator draws the problems).
pub fn load_eval_problems(cfg: &Config, task: &Task) -> Result<Vec<Problem>, RunError> {
    if cfg.task.eval_path.is_empty() {
        let mut rng = crate::rng::SplitMix::keyed(cfg.train.seed, 0, "eval");
        return (0..cfg.train.eval_problems as u64).map(|i| task.problem_at(cfg.train.seed, i, &mut rng).map_err(RunError::from)).collect();
    }
    let mut c = cfg.clone();
    c.task.name = "dataset".into();
    c.task.path = cfg.task.eval_path.clone();
    let Task::Dataset { mut problems } = crate::run::load_task(&c)? else { unreachable!("a dataset task") };
    problems.truncate(cfg.train.eval_problems);
    Ok(problems)
}

/// Evaluates the engine's current weights after GRPO step `step`.
pub fn evaluate(cfg: &Config, policy: &Policy, task: &Task, engine: &mut Engine, problems: &[Problem], step: usize) -> Result<EvalMetrics, RunError> {
    let s = &cfg.sampler;
    let k = cfg.train.eval_samples;
    let params = |temperature: f32, seed: u64| SamplingParams { temperature, top_k: s.top_k, top_p: s.top_p, max_new_tokens: s.max_new_tokens, stop_tokens: policy.stop_tokens.clone(), stop: s.stop.clone(), seed, noise_key: None, processed_logprobs: s.logprobs_mode == crate::config::LogprobsMode::Processed, top_logprobs: 0 };
    let mut requests = Vec::new();
    for (p, problem) in problems.iter().enumerate() {
        let prompt = encode(&policy.tokenizer, &problem.prompt)?;
        // ids apart from training's (step << 32 | index): the top bit set
        let id = |j: usize| 1u64 << 63 | (step as u64) << 32 | (p * (k + 1) + j) as u64;
        requests.push(Request { id: id(0), prompt: prompt.clone(), params: params(0.0, cfg.train.seed) });
        for j in 1..=k {
            requests.push(Request { id: id(j), prompt: prompt.clone(), params: params(s.temperature, cfg.train.seed ^ 0xe7a1) });
        }
    }
    let results = engine.generate(requests);
    let mut grades = Vec::with_capacity(results.len());
    for r in results {
        let c = r.map_err(|e| RunError::Other(format!("step {step}: evaluation sampler: {e}")))?;
        let body: Vec<u32> = c.tokens.iter().copied().filter(|t| !policy.stop_tokens.contains(t)).collect();
        grades.push(policy.tokenizer.decode(&body, true).map_err(|e| RunError::Other(format!("evaluation decode: {e}")))?);
    }
    // graded as training grades: by the reward program when there is one (it said 1.0 to every
    // training rollout while exact match graded the evaluation), else by task.reward alone,
    // without the format score: pass@k counts correct answers
    let problem_of = |i: usize| &problems[i / (k + 1)];
    let rewards: Vec<f64> = if cfg.task.reward == "command" {
        let rollouts: Vec<crate::reward_command::Rollout<'_>> = grades.iter().enumerate().map(|(i, g)| crate::reward_command::Rollout { prompt: &problem_of(i).prompt, completion: g, answer: &problem_of(i).answer }).collect();
        crate::reward_command::rewards(&cfg.task.reward_command, cfg.task.reward_timeout_s, &rollouts).map_err(|e| RunError::Other(format!("step {step}: evaluation: {e}")))?
    } else {
        grades.iter().enumerate().map(|(i, g)| task.reward_of(&cfg.task.reward, problem_of(i), g) as f64).collect()
    };
    let (mut greedy, mut any, mut correct, mut reward) = (0usize, 0usize, 0usize, 0.0f64);
    for p in 0..problems.len() {
        let of = |j: usize| rewards[p * (k + 1) + j];
        greedy += usize::from(of(0) >= 1.0);
        let sampled: Vec<f64> = (1..=k).map(of).collect();
        any += usize::from(sampled.iter().any(|&r| r >= 1.0));
        correct += sampled.iter().filter(|&&r| r >= 1.0).count();
        reward += sampled.iter().sum::<f64>();
    }
    let n = problems.len().max(1) as f64;
    Ok(EvalMetrics {
        problems: problems.len(),
        k,
        pass1_greedy: greedy as f64 / n,
        pass_at_k: if k > 0 { any as f64 / n } else { 0.0 },
        sampled_accuracy: correct as f64 / (n * k.max(1) as f64),
        sampled_reward_mean: reward / (n * k.max(1) as f64),
    })
}
