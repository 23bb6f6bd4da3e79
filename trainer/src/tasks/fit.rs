//! Every problem of a dataset task fits before any training: named by file and line, with the
//! key to change, instead of failing (or silently scoring nothing) at the step that samples it.

use crate::config::Config;
use crate::run::{Policy, RunError};

/// Every problem of a dataset task fits: its prompt and `sampler.max_new_tokens` in
/// `sampler.context`, and (for the SFT warm start) prompt + answer + end-of-sequence in the
/// model's positions; a line that does not is named with the key to change.
pub fn check_fits(cfg: &Config, policy: &Policy) -> Result<(), RunError> {
    let task = crate::run::load_task(cfg)?;
    let crate::tasks::Task::Dataset { problems } = &task else { return Ok(()) };
    let (context, positions) = (cfg.sampler.context, policy.model.config.max_position_embeddings);
    for p in problems {
        let prompt = crate::run::encode(&policy.tokenizer, &p.prompt).map_err(|e| RunError::Other(format!("{}:{}: {e}", cfg.task.path, p.line)))?;
        if prompt.is_empty() {
            return Err(RunError::Other(format!("{}:{}: the prompt (task.prompt_key `{}`) has no tokens", cfg.task.path, p.line, cfg.task.prompt_key)));
        }
        // the built-in rewards compare with the answer: an empty one scores nothing but silence
        if cfg.task.reward != "command" && p.answer.trim().is_empty() {
            return Err(RunError::Other(format!("{}:{}: the answer (task.answer_key `{}`) is empty, so task.reward = \"{}\" has nothing to compare with (task.reward = \"command\" may ignore answers)", cfg.task.path, p.line, cfg.task.answer_key, cfg.task.reward)));
        }
        if prompt.len() + cfg.sampler.max_new_tokens > context {
            return Err(crate::run::invalid("sampler.context", format!("is {context} tokens but {}:{} has a {}-token prompt, which with sampler.max_new_tokens = {} needs {}", cfg.task.path, p.line, prompt.len(), cfg.sampler.max_new_tokens, prompt.len() + cfg.sampler.max_new_tokens)));
        }
        if cfg.train.sft_steps > 0 {
            let answer = crate::run::encode(&policy.tokenizer, &p.answer).map_err(|e| RunError::Other(format!("{}:{}: {e}", cfg.task.path, p.line)))?;
            if prompt.len() + answer.len() + 1 > positions {
                return Err(RunError::Other(format!("{}:{}: prompt + answer + end-of-sequence is {} tokens, beyond the model's {positions} positions (the SFT warm start trains on it; train.sft_steps = 0 skips it)", cfg.task.path, p.line, prompt.len() + answer.len() + 1)));
            }
        }
    }
    Ok(())
}
