//! Supervised warm start: teacher-forced cross-entropy on the task's own solutions
//! (prompt + answer + end-of-sequence; loss on the answer tokens), so RL starts from a policy
//! that sometimes earns reward.

use crate::config::Config;
use crate::backward::{tracked_copy, weighted_backward, with_folded};
use crate::optim::{clip, AdamW};
use shared_kernels::grad_fold::GradFold;
use crate::rng::SplitMix;
use crate::error::RunError;
use crate::policy::{encode, Policy};
use crate::tasks::Task;

/// Runs `cfg.train.sft_steps` steps; calls `report(step, loss)` after each.
/// Stops between steps once `stop` is set (a signal), with an error: nothing is saved before
/// GRPO's first checkpoint.
pub fn warm_start(cfg: &Config, policy: &mut Policy, task: &Task, stop: &std::sync::atomic::AtomicBool, mut report: impl FnMut(usize, f64)) -> Result<(), RunError> {
    let c = &cfg.train;
    let mut opt = AdamW::new(c.beta1, c.beta2, c.adam_eps, c.weight_decay);
    for step in 0..c.sft_steps {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(RunError::Other(format!("stopped by a signal during the SFT warm start (step {step} of {}); nothing is saved before GRPO's first checkpoint, so a new run starts over", c.sft_steps)));
        }
        let mut rng = SplitMix::keyed(c.seed, step as u64, "sft");
        let mut sequences = Vec::with_capacity(c.sft_batch);
        let mut prompt_lens = Vec::with_capacity(c.sft_batch);
        for _ in 0..c.sft_batch {
            let p = task.sample(&mut rng)?;
            let prompt = encode(&policy.tokenizer, &p.prompt)?;
            let mut seq = prompt.clone();
            seq.extend(encode(&policy.tokenizer, &p.answer)?);
            seq.push(policy.eos);
            prompt_lens.push(prompt.len());
            sequences.push(seq);
        }
        let tracked = tracked_copy(&policy.model);
        let (_, flat) = tracked.training_logprobs(&sequences, 1.0, false)?;
        let answer_tokens: usize = sequences.iter().zip(&prompt_lens).map(|(s, p)| s.len() - p).sum();
        let mut weights = Vec::new();
        for (s, seq) in sequences.iter().enumerate() {
            for t in 0..seq.len() - 1 {
                weights.push(if t + 1 >= prompt_lens[s] { -1.0 / answer_tokens as f32 } else { 0.0 });
            }
        }
        let mut fold = GradFold::new();
        let (value, grads) = weighted_backward(&tracked, flat, &weights, &mut fold, &format!("sft step {step}"), &crate::backward::nonfinite_suspects(&cfg.model.path, "train.sft_lr"))?;
        let mut grads = with_folded(grads, fold);
        clip(&mut grads, c.grad_clip);
        let lr = crate::optim::learning_rate(c.sft_lr, step, c.warmup_steps, c.sft_steps, c.min_lr_ratio);
        policy.model = opt.step(&policy.model, &grads, lr);
        report(step, value);
    }
    Ok(())
}
