//! The `top_logprobs` check of (d): a completion's lists of each token's most likely
//! alternatives, against what was asked and against the trainer's logprob of the token.

use crate::{Completion, Request};

/// What is wrong with a completion's `top_logprobs`, if anything: one list per token when asked
/// (none otherwise) of the asked length, best first, and where a raw-logprob request's own
/// token is listed its logprob is the trainer's bits (`trainer`: each token's).
pub(super) fn problem(req: &Request, c: &Completion, trainer: &[u32]) -> Option<String> {
    let n = req.params.top_logprobs;
    let want = if n > 0 { c.tokens.len() } else { 0 };
    if c.top_logprobs.len() != want {
        return Some(format!("request {}: {} top_logprobs lists for {} tokens (asked {n})", req.id, c.top_logprobs.len(), c.tokens.len()));
    }
    for (i, list) in c.top_logprobs.iter().enumerate() {
        if list.len() != n || list.windows(2).any(|w| w[0].1 < w[1].1) {
            return Some(format!("request {} token {i}: top_logprobs {list:?} (asked {n}, best first)", req.id));
        }
        if !req.params.processed_logprobs {
            if let Some(&(_, lp)) = list.iter().find(|&&(t, _)| t == c.tokens[i]) {
                if Some(&lp.to_bits()) != trainer.get(i) {
                    return Some(format!("request {} token {i}: listed logprob bits {:#010x}, the trainer's {:?}", req.id, lp.to_bits(), trainer.get(i)));
                }
            }
        }
    }
    None
}
