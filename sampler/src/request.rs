//! What a caller asks for and gets back.

use std::time::Duration;

/// Per-request sampling parameters (vLLM's names).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// >= 0; 0 is greedy.
    pub temperature: f32,
    /// 0 disables top-k.
    pub top_k: u32,
    /// In (0, 1]; 1 disables top-p.
    pub top_p: f32,
    pub max_new_tokens: usize,
    /// Generation stops after emitting any of these (the stop token is kept in the output).
    pub stop_tokens: Vec<u32>,
    /// Generation stops once the completion's text contains any of these strings (vLLM's
    /// `stop`), checked on the engine's decoder ([`crate::Engine::set_decoder`]) after every
    /// token; the token that completes the string is the last one kept. Only the completion is
    /// searched, never the prompt.
    pub stop: Vec<String>,
    /// With the request's noise key and the position, the only input of the sampling noise.
    pub seed: u64,
    /// The request's identity in the sampling noise; `None`: its `id`. A server sets it from
    /// what the request asks (prompt, parameters), so identical requests draw identical tokens
    /// whatever their arrival order, while each keeps its own `id` in the engine.
    pub noise_key: Option<u64>,
    /// Return each token's logprob under the distribution it was drawn from: softmax at the
    /// temperature restricted to the top-k / top-p set, renormalised (vLLM's
    /// `processed_logprobs`); else under the full softmax at the temperature (`raw_logprobs`).
    /// The same when the request does not truncate.
    pub processed_logprobs: bool,
    /// Also return, for each sampled token, the this many most likely tokens and their
    /// logprobs under the full softmax at the temperature (OpenAI's `top_logprobs`; at most
    /// [`shared_kernels::ops::logits::top_tokens::MAX_TOP`]). 0: none.
    pub top_logprobs: usize,
}

impl SamplingParams {
    /// The distribution the returned logprobs are taken under, for the training path to score
    /// the same one.
    pub fn logprob_distribution(&self) -> shared_kernels::model::LogprobDistribution {
        if self.processed_logprobs {
            shared_kernels::model::LogprobDistribution { temperature: self.temperature, top_k: self.top_k, top_p: self.top_p }
        } else {
            shared_kernels::model::LogprobDistribution::full(self.temperature)
        }
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self { temperature: 1.0, top_k: 0, top_p: 1.0, max_new_tokens: 64, stop_tokens: Vec::new(), stop: Vec::new(), seed: 0, noise_key: None, processed_logprobs: false, top_logprobs: 0 }
    }
}

/// A rollout request. `id` (or `params.noise_key`) keys the sampling noise together with
/// `params.seed`: the same (key, seed, prompt) gives the same tokens and logprob bits however the
/// batch around it looks.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// Emitted a stop token, or a token that completed a stop string.
    Stop,
    /// Reached `max_new_tokens`.
    Length,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timings {
    /// From `add` to admission into a cache slot.
    pub queued: Duration,
    /// From `add` to the first generated token.
    pub first_token: Duration,
    /// From `add` to completion.
    pub total: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub id: u64,
    pub prompt_len: usize,
    pub tokens: Vec<u32>,
    /// `logprobs[i]` belongs to `tokens[i]` (see the crate docs for the distribution).
    pub logprobs: Vec<f32>,
    /// With `top_logprobs` asked, `top_logprobs[i]`: the most likely tokens at `tokens[i]`'s
    /// position, best first, with their logprobs (empty otherwise).
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// For a mixture-of-experts model, `routing[i]`: a digest of the experts every sparse layer
    /// chose at the row that sampled `tokens[i]` (`shared_kernels::model::moe::RoutingLog::row_digests`),
    /// which the trainer compares with its own routing of that row; empty for a dense model.
    pub routing: Vec<u64>,
    pub finish: FinishReason,
    pub timings: Timings,
}

/// A request the engine refused; the engine keeps serving the others.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SampleError {
    #[error("request {id}: empty prompt")]
    EmptyPrompt { id: u64 },
    #[error("request {id}: token id {token} at prompt position {position} is out of range (vocabulary size {vocab})")]
    TokenOutOfRange { id: u64, token: u32, position: usize, vocab: usize },
    #[error("request {id}: prompt ({prompt} tokens) + max_new_tokens ({max_new}) exceeds the context of {context} tokens")]
    TooLong { id: u64, prompt: usize, max_new: usize, context: usize },
    #[error("request {id}: max_new_tokens must be at least 1")]
    NoNewTokens { id: u64 },
    #[error("request {id}: temperature must be 0 (greedy) or a finite number whose reciprocal is finite in f32 (at least about 2.9e-39: the logits are scaled by 1 / temperature), got {value}")]
    BadTemperature { id: u64, value: f32 },
    #[error("request {id}: top_p must be in (0, 1], got {value}")]
    BadTopP { id: u64, value: f32 },
    #[error("request {id}: stop string {index} is empty")]
    EmptyStop { id: u64, index: usize },
    #[error("request {id}: stop strings need a decoder, and this engine has none (Engine::set_decoder)")]
    NoDecoder { id: u64 },
    #[error("request {id}: top_logprobs must be at most {max}, got {asked}")]
    TooManyTopLogprobs { id: u64, asked: usize, max: usize },
    #[error("request {id}: the engine failed: {message}")]
    Engine { id: u64, message: String },
    #[error("the engine has stopped")]
    Closed,
}

impl Request {
    /// Checks a request against the model's vocabulary and the engine's context length.
    pub fn validate(&self, vocab: usize, context: usize) -> Result<(), SampleError> {
        let id = self.id;
        let p = &self.params;
        if p.top_logprobs > shared_kernels::ops::logits::top_tokens::MAX_TOP.min(vocab) {
            return Err(SampleError::TooManyTopLogprobs { id, asked: p.top_logprobs, max: shared_kernels::ops::logits::top_tokens::MAX_TOP.min(vocab) });
        }
        if self.prompt.is_empty() {
            return Err(SampleError::EmptyPrompt { id });
        }
        if let Some((position, &token)) = self.prompt.iter().enumerate().find(|(_, t)| **t as usize >= vocab) {
            return Err(SampleError::TokenOutOfRange { id, token, position, vocab });
        }
        if p.max_new_tokens == 0 {
            return Err(SampleError::NoNewTokens { id });
        }
        if self.prompt.len() + p.max_new_tokens > context {
            return Err(SampleError::TooLong { id, prompt: self.prompt.len(), max_new: p.max_new_tokens, context });
        }
        if !(p.temperature.is_finite() && p.temperature >= 0.0) || (p.temperature > 0.0 && !(1.0 / p.temperature).is_finite()) {
            return Err(SampleError::BadTemperature { id, value: p.temperature });
        }
        if !(p.top_p > 0.0 && p.top_p <= 1.0) {
            return Err(SampleError::BadTopP { id, value: p.top_p });
        }
        if let Some(index) = p.stop.iter().position(String::is_empty) {
            return Err(SampleError::EmptyStop { id, index });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(prompt: Vec<u32>, params: SamplingParams) -> Request {
        Request { id: 7, prompt, params }
    }

    #[test]
    fn each_request_the_engine_cannot_serve_is_refused_naming_the_setting() {
        let ok = SamplingParams { max_new_tokens: 4, ..SamplingParams::default() };
        assert_eq!(request(vec![1, 2], ok.clone()).validate(10, 8), Ok(()));
        let cases: Vec<(Vec<u32>, SamplingParams, &str)> = vec![
            (vec![], ok.clone(), "empty"),
            (vec![1, 10], ok.clone(), "token id 10"),
            (vec![1, 2], SamplingParams { max_new_tokens: 0, ..ok.clone() }, "max_new_tokens"),
            (vec![1, 2, 3, 4, 5], ok.clone(), "exceeds the context of 8"),
            (vec![1], SamplingParams { temperature: -0.5, ..ok.clone() }, "temperature"),
            (vec![1], SamplingParams { temperature: f32::NAN, ..ok.clone() }, "temperature"),
            // a subnormal temperature: 1 / t overflows, every scaled logit and logprob is NaN
            (vec![1], SamplingParams { temperature: 1e-45, ..ok.clone() }, "reciprocal"),
            (vec![1], SamplingParams { top_p: 0.0, ..ok.clone() }, "top_p"),
            (vec![1], SamplingParams { stop: vec!["a".into(), String::new()], ..ok.clone() }, "stop string 1"),
        ];
        for (prompt, params, needle) in cases {
            let err = request(prompt.clone(), params.clone()).validate(10, 8).expect_err(needle).to_string();
            assert!(err.starts_with("request 7") && err.contains(needle), "{prompt:?} {params:?}: {err}");
        }
        // the smallest temperatures that still scale: zero (greedy) and a normal f32
        for t in [0.0, 1e-30, f32::MIN_POSITIVE] {
            assert_eq!(request(vec![1], SamplingParams { temperature: t, ..ok.clone() }).validate(10, 8), Ok(()), "{t}");
        }
    }
}
