//! The two endpoints' response shapes: a whole response (`choices` of `text` or `message`) and a
//! stream's chunks (`text` or `delta`), both with each choice's `token_ids` and the sampler's
//! logprobs, around the envelope both share.

use super::api::{self, Defaults};
use serde_json::{json, Value};
use tokenizers::Tokenizer;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

impl Endpoint {
    /// The fields that set the token budget.
    pub fn max_keys(self) -> &'static [&'static str] {
        match self {
            Endpoint::Completions => &["max_tokens"],
            Endpoint::Chat => &["max_tokens", "max_completion_tokens"],
        }
    }

    fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        }
    }

    fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }
}

/// One choice's tokens with their logprobs and the text they add.
pub struct Piece<'a> {
    pub index: usize,
    pub text: String,
    pub tokens: &'a [u32],
    pub logprobs: &'a [f32],
    /// Each token's most likely alternatives, when asked (else empty).
    pub top: &'a [Vec<(u32, f32)>],
    pub finish: Option<&'static str>,
}

fn token_text(tokenizer: &Tokenizer, t: u32) -> String {
    tokenizer.decode(&[t], true).unwrap_or_default()
}

/// A choice of a whole response (`chunk` false) or of a stream's chunk; `first` (chat streams)
/// adds the assistant's role to the delta.
pub fn choice(endpoint: Endpoint, tokenizer: &Tokenizer, p: Piece, with_logprobs: bool, chunk: bool, first: bool) -> Value {
    let alternatives = |i: usize| p.top.get(i).map_or(&[][..], Vec::as_slice);
    let logprobs = with_logprobs.then(|| match endpoint {
        Endpoint::Completions => {
            let mut v = json!({"tokens": p.tokens.iter().map(|&t| token_text(tokenizer, t)).collect::<Vec<_>>(), "token_logprobs": p.logprobs});
            if !p.top.is_empty() {
                // OpenAI's legacy shape (text -> logprob; two ids with one text keep the first),
                // and the ids beside it
                v["top_logprobs"] = p.top.iter().map(|list| list.iter().rev().map(|&(t, lp)| (token_text(tokenizer, t), json!(lp))).collect::<serde_json::Map<_, _>>().into()).collect::<Vec<Value>>().into();
                v["top_token_ids"] = p.top.iter().map(|list| list.iter().map(|&(t, lp)| json!([t, lp])).collect::<Vec<_>>()).collect::<Vec<_>>().into();
            }
            v
        }
        Endpoint::Chat => json!({"content": p.tokens.iter().zip(p.logprobs).enumerate().map(|(i, (&t, &lp))| {
            let top: Vec<Value> = alternatives(i).iter().map(|&(a, alp)| json!({"token": token_text(tokenizer, a), "logprob": alp, "token_id": a})).collect();
            json!({"token": token_text(tokenizer, t), "logprob": lp, "token_id": t, "top_logprobs": top})
        }).collect::<Vec<_>>()}),
    });
    let mut c = json!({"index": p.index, "finish_reason": p.finish, "logprobs": logprobs, "token_ids": p.tokens});
    match (endpoint, chunk) {
        (Endpoint::Completions, _) => c["text"] = p.text.into(),
        (Endpoint::Chat, false) => c["message"] = json!({"role": "assistant", "content": p.text}),
        (Endpoint::Chat, true) if first => c["delta"] = json!({"role": "assistant", "content": p.text}),
        (Endpoint::Chat, true) => c["delta"] = json!({"content": p.text}),
    }
    c
}

/// The fields around `choices`: a whole response's (with `usage`, and `prompt_token_ids`: the
/// prompt's ids, or a list of them for a batch of prompts) or a chunk's.
pub fn envelope(endpoint: Endpoint, d: &Defaults, id: u64, created: u64, chunk: bool, choices: Vec<Value>, prompts: &[Vec<u32>]) -> Value {
    let mode = if d.processed_logprobs { "processed_logprobs" } else { "raw_logprobs" };
    let mut v = json!({"id": format!("{}-{id}", endpoint.id_prefix()), "object": endpoint.object(chunk), "created": created, "model": d.model_name, "choices": choices, "logprobs_mode": mode});
    if !chunk {
        v["prompt_token_ids"] = match prompts {
            [one] => json!(one),
            many => json!(many),
        };
    }
    v
}

/// Prompt tokens as OpenAI's `usage` counts them: each prompt once, whatever `n`.
pub fn prompt_tokens(prompts: &[Vec<u32>]) -> usize {
    prompts.iter().map(Vec::len).sum()
}

/// A whole response of finished completions.
pub fn whole(endpoint: Endpoint, tokenizer: &Tokenizer, d: &Defaults, sampling: &api::Sampling, prompts: &[Vec<u32>], done: &[sampler::Completion], created: u64) -> Value {
    let choices = done.iter().enumerate().map(|(index, c)| {
        let text = super::detok::text(tokenizer, &c.tokens, &sampling.params.stop);
        choice(endpoint, tokenizer, Piece { index, text, tokens: &c.tokens, logprobs: &c.logprobs, top: &c.top_logprobs, finish: Some(api::finish_reason(&c.finish)) }, sampling.logprobs, false, false)
    }).collect();
    let mut v = envelope(endpoint, d, done.first().map_or(0, |c| c.id), created, false, choices, prompts);
    v["usage"] = api::usage(prompt_tokens(prompts), done.iter().map(|c| c.tokens.len()).sum());
    v
}
