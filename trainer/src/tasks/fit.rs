//! Every problem of a dataset task fits before any training: named by file and line, with the
//! key to change, instead of failing (or silently scoring nothing) at the step that samples it.

use crate::config::Config;
use crate::error::RunError;
use crate::policy::Policy;

/// Every problem of a dataset task and of its eval split (`task.eval_path`, when
/// `train.eval_every` is set) fits: a prompt of at least one token with an answer the built-in
/// rewards can compare with, the prompt and `sampler.max_new_tokens` in `sampler.context`, and
/// (for the SFT warm start, training problems only) prompt + answer + end-of-sequence in the
/// model's positions; a line that does not is named with the key to change.
pub fn check_fits(cfg: &Config, policy: &Policy) -> Result<(), RunError> {
    let task = crate::run::load_task(cfg)?;
    if let crate::tasks::Task::Dataset { problems } = &task {
        check_problems(cfg, policy, &cfg.task.path, problems, cfg.train.sft_steps > 0)?;
    }
    // an environment's SFT warm start imitates every record's demo: each must have one
    if let (Some(records), true) = (task.records(), cfg.train.sft_steps > 0) {
        if let Some((line, _)) = records.iter().find(|(_, r)| r.get("demo").is_none()) {
            return Err(RunError::Other(format!("{}:{line}: the record has no `demo` (the episode as chat messages), which the SFT warm start imitates; add one to every record, or set train.sft_steps = 0", cfg.task.path)));
        }
    }
    if cfg.train.eval_every > 0 && !cfg.task.eval_path.is_empty() {
        let eval = crate::eval::load_eval_problems(cfg, &task)?;
        check_problems(cfg, policy, &cfg.task.eval_path, &eval, false)?;
    }
    Ok(())
}

fn check_problems(cfg: &Config, policy: &Policy, path: &str, problems: &[crate::tasks::Problem], sft: bool) -> Result<(), RunError> {
    let context = cfg.sampler.context;
    let positions = policy.model.config.max_position_embeddings;
    for p in problems {
        let at = |m: String| RunError::Other(format!("{path}:{}: {m}", p.line));
        let prompt = crate::policy::encode(&policy.tokenizer, &p.prompt).map_err(|e| at(e.to_string()))?;
        if prompt.is_empty() {
            return Err(at(format!("the prompt (task.prompt_key `{}`) has no tokens", cfg.task.prompt_key)));
        }
        // the built-in rewards compare with the answer: an empty one scores nothing but silence
        if cfg.task.reward != "command" && p.answer.trim().is_empty() {
            return Err(at(format!("the answer (task.answer_key `{}`) is empty, so task.reward = \"{}\" has nothing to compare with (task.reward = \"command\" may ignore answers)", cfg.task.answer_key, cfg.task.reward)));
        }
        if prompt.len() + cfg.sampler.max_new_tokens > context {
            return Err(crate::error::invalid("sampler.context", format!("is {context} tokens but {path}:{} has a {}-token prompt, which with sampler.max_new_tokens = {} needs {}", p.line, prompt.len(), cfg.sampler.max_new_tokens, prompt.len() + cfg.sampler.max_new_tokens)));
        }
        if sft {
            let answer = crate::policy::encode(&policy.tokenizer, &p.answer).map_err(|e| at(e.to_string()))?;
            if prompt.len() + answer.len() + 1 > positions {
                return Err(at(format!("prompt + answer + end-of-sequence is {} tokens, beyond the model's {positions} positions (the SFT warm start trains on it; train.sft_steps = 0 skips it)", prompt.len() + answer.len() + 1)));
            }
        }
    }
    Ok(())
}
