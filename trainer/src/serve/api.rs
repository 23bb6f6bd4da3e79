//! The OpenAI request and response bodies `lockstep serve` speaks: a request's JSON checked field
//! by field into the sampler's [`Request`]s (an error names the field), and a completion
//! written back with its token ids and the sampler's logprobs.

use sampler::{FinishReason, Request, SamplingParams};
use serde_json::{json, Value};

/// An error as OpenAI's API writes it, with the HTTP status.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub param: Option<String>,
}

impl ApiError {
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        ApiError { status: 400, message: message.into(), param: Some(param.into()) }
    }

    pub fn body(&self) -> Value {
        let kind = match self.status {
            404 => "not_found_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        };
        json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": null}})
    }
}

/// What every request of the server shares: the defaults a request may override.
pub struct Defaults {
    pub model_name: String,
    pub seed: u64,
    pub stop_tokens: Vec<u32>,
    pub processed_logprobs: bool,
    pub context: usize,
    pub vocab: usize,
}

/// The sampling fields common to both endpoints, read from `body`.
pub struct Sampling {
    pub params: SamplingParams,
    pub n: usize,
    /// Return the per-token logprobs.
    pub logprobs: bool,
    /// Answer as server-sent events, and whether a last chunk gives the usage.
    pub stream: bool,
    pub include_usage: bool,
    /// Whether the request set its token budget (`max_keys`); else `params.max_new_tokens` is
    /// OpenAI's completions default of 16, and a chat's budget is the context's room.
    pub budget_given: bool,
}

fn number(body: &Value, key: &str) -> Result<Option<f64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| ApiError::bad(key, format!("`{key}` must be a number, got {v}"))),
    }
}

fn whole(body: &Value, key: &str) -> Result<Option<u64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| ApiError::bad(key, format!("`{key}` must be a non-negative integer, got {v}"))),
    }
}

/// The model named, which must be this server's.
pub fn check_model(body: &Value, d: &Defaults) -> Result<(), ApiError> {
    match body.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if *m == d.model_name => Ok(()),
        Some(m) => Err(ApiError { status: 404, message: format!("the model {m} does not exist; this server serves \"{}\" (GET /v1/models)", d.model_name), param: Some("model".into()) }),
    }
}

/// The request's sampling settings; `max_keys` names the fields that set the token budget.
pub fn sampling(body: &Value, d: &Defaults, max_keys: &[&str]) -> Result<Sampling, ApiError> {
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(ApiError::bad("stream", format!("`stream` must be a boolean, got {v}"))),
    };
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(o) if !stream => return Err(ApiError::bad("stream_options", format!("`stream_options` ({o}) is only for \"stream\": true"))),
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => return Err(ApiError::bad("stream_options", format!("`stream_options.include_usage` must be a boolean, got {v}"))),
        },
        Some(v) => return Err(ApiError::bad("stream_options", format!("`stream_options` must be an object, got {v}"))),
    };
    let mut params = SamplingParams { stop_tokens: d.stop_tokens.clone(), seed: d.seed, processed_logprobs: d.processed_logprobs, max_new_tokens: 16, ..SamplingParams::default() };
    let mut budget_given = false;
    for key in max_keys {
        if let Some(m) = whole(body, key)? {
            if m == 0 {
                return Err(ApiError::bad(key, format!("`{key}` must be at least 1")));
            }
            params.max_new_tokens = m as usize;
            budget_given = true;
        }
    }
    if let Some(t) = number(body, "temperature")? {
        if !(t.is_finite() && (0.0..=100.0).contains(&t)) {
            return Err(ApiError::bad("temperature", format!("`temperature` must be in [0, 100], got {t}")));
        }
        params.temperature = t as f32;
    }
    if let Some(p) = number(body, "top_p")? {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::bad("top_p", format!("`top_p` must be in (0, 1], got {p}")));
        }
        params.top_p = p as f32;
    }
    // vLLM's extension; -1 (and 0) disable it
    match body.get("top_k") {
        None | Some(Value::Null) => {}
        Some(v) => match v.as_i64() {
            Some(k) if k <= 0 => params.top_k = 0,
            Some(k) if k <= u32::MAX as i64 => params.top_k = k as u32,
            _ => return Err(ApiError::bad("top_k", format!("`top_k` must be an integer (-1 or 0: off), got {v}"))),
        },
    }
    if let Some(seed) = whole(body, "seed")? {
        params.seed = seed;
    }
    params.stop = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) => list.iter().map(|s| s.as_str().map(str::to_string).ok_or_else(|| ApiError::bad("stop", format!("`stop` must be a string or a list of strings, got {s}")))).collect::<Result<_, _>>()?,
        Some(v) => return Err(ApiError::bad("stop", format!("`stop` must be a string or a list of strings, got {v}"))),
    };
    if params.stop.iter().any(String::is_empty) {
        return Err(ApiError::bad("stop", "`stop` holds an empty string"));
    }
    // vLLM's extensions: generate past the model's end-of-sequence tokens (benchmarks ask it),
    // and more token ids that end a choice as those do
    match body.get("ignore_eos") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => params.stop_tokens.clear(),
        Some(v) => return Err(ApiError::bad("ignore_eos", format!("`ignore_eos` must be a boolean, got {v}"))),
    }
    match body.get("stop_token_ids") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for v in list {
                match v.as_u64().filter(|&t| t < d.vocab as u64) {
                    Some(t) if !params.stop_tokens.contains(&(t as u32)) => params.stop_tokens.push(t as u32),
                    Some(_) => {}
                    None => return Err(ApiError::bad("stop_token_ids", format!("`stop_token_ids` must hold token ids below the vocabulary size {}, got {v}", d.vocab))),
                }
            }
        }
        Some(v) => return Err(ApiError::bad("stop_token_ids", format!("`stop_token_ids` must be a list of token ids, got {v}"))),
    }
    let n = whole(body, "n")?.unwrap_or(1);
    if !(1..=64).contains(&n) {
        return Err(ApiError::bad("n", format!("`n` must be in 1..=64, got {n}")));
    }
    refuse_unsupported(body, n)?;
    // chat: `logprobs: true` and `top_logprobs: k`; completions: `logprobs: k` (the k most
    // likely tokens beside the sampled one's logprob)
    let (logprobs, counted) = match body.get("logprobs") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => (false, None),
        Some(Value::Bool(true)) => (true, None),
        Some(v) if v.as_u64().is_some() => (true, v.as_u64()),
        Some(v) => return Err(ApiError::bad("logprobs", format!("`logprobs` must be a boolean or a count, got {v}"))),
    };
    let (key, top) = match (whole(body, "top_logprobs")?, counted) {
        (Some(k), _) => ("top_logprobs", k),
        (None, Some(k)) => ("logprobs", k),
        (None, None) => ("top_logprobs", 0),
    };
    let most = shared_kernels::ops::logits::top_tokens::MAX_TOP.min(d.vocab);
    if top > most as u64 {
        return Err(ApiError::bad(key, format!("`{key}` must be at most {most}, got {top}")));
    }
    if top > 0 && !logprobs {
        return Err(ApiError::bad("top_logprobs", "`top_logprobs` needs `logprobs: true`"));
    }
    if top > 0 && d.processed_logprobs {
        return Err(ApiError::bad(key, "the most likely tokens are listed under the full softmax, and this server returns processed logprobs (sampler.logprobs_mode = \"processed_logprobs\"): ask without them, or serve with raw logprobs"));
    }
    params.top_logprobs = top as usize;
    Ok(Sampling { params, n: n as usize, logprobs, stream, include_usage, budget_given })
}

/// The value of an unsupported field that asks for nothing: the field may then be sent.
#[derive(Clone, Copy)]
enum Neutral {
    Zero,
    One,
    False,
    True,
    /// `""`, `{}` or `[]`
    Empty,
    /// `{"type": "text"}` (`response_format`)
    PlainText,
    /// `"auto"` (`tool_choice`: the model may call a tool or not, as the template leads it)
    Auto,
    /// only `null`
    Absent,
}

impl Neutral {
    fn holds(self, v: &Value) -> bool {
        match self {
            Neutral::Zero => v.as_f64() == Some(0.0),
            Neutral::One => v.as_f64() == Some(1.0),
            Neutral::False => *v == Value::Bool(false),
            Neutral::True => *v == Value::Bool(true),
            Neutral::Empty => v.as_str().is_some_and(str::is_empty) || v.as_object().is_some_and(|o| o.is_empty()) || v.as_array().is_some_and(|a| a.is_empty()),
            Neutral::PlainText => v.get("type").and_then(Value::as_str) == Some("text") && v.as_object().is_some_and(|o| o.len() == 1),
            Neutral::Auto => v.as_str() == Some("auto"),
            Neutral::Absent => false,
        }
    }

    fn spelled(self) -> &'static str {
        match self {
            Neutral::Zero => " or send 0",
            Neutral::One => " or send 1",
            Neutral::False => " or send false",
            Neutral::True => " or send true",
            Neutral::Empty => " or send it empty",
            Neutral::PlainText => " or send {\"type\": \"text\"}",
            Neutral::Auto => " or send \"auto\"",
            Neutral::Absent => "",
        }
    }
}

/// OpenAI's and vLLM's fields that change an answer and that lockstep's sampler does not
/// implement. A request with one of them set to anything but its neutral value is refused
/// (400, naming the field): ignoring it would answer another question than the one asked.
/// Fields that change no token (`user`, `metadata`, `store`, ...) are accepted and ignored.
const UNSUPPORTED: [(&str, Neutral); 22] = [
    ("presence_penalty", Neutral::Zero),
    ("frequency_penalty", Neutral::Zero),
    ("repetition_penalty", Neutral::One),
    ("length_penalty", Neutral::One),
    ("typical_p", Neutral::One),
    ("min_p", Neutral::Zero),
    ("min_tokens", Neutral::Zero),
    ("logit_bias", Neutral::Empty),
    ("bad_words", Neutral::Empty),
    ("echo", Neutral::False),
    ("suffix", Neutral::Empty),
    ("use_beam_search", Neutral::False),
    ("include_stop_str_in_output", Neutral::False),
    ("skip_special_tokens", Neutral::True),
    ("response_format", Neutral::PlainText),
    ("tool_choice", Neutral::Auto),
    ("guided_json", Neutral::Absent),
    ("guided_regex", Neutral::Absent),
    ("guided_choice", Neutral::Absent),
    ("guided_grammar", Neutral::Absent),
    ("structured_outputs", Neutral::Absent),
    ("prompt_logprobs", Neutral::Absent),
];

/// Refuses the first field of [`UNSUPPORTED`] `body` sets to more than its neutral value, and a
/// `best_of` other than `n` (each choice is one sample here; none is picked among more).
fn refuse_unsupported(body: &Value, n: u64) -> Result<(), ApiError> {
    for (key, neutral) in UNSUPPORTED {
        match body.get(key) {
            None | Some(Value::Null) => {}
            Some(v) if neutral.holds(v) => {}
            Some(v) => return Err(ApiError::bad(key, format!("`{key}` ({v}) is not supported by lockstep serve, whose sampler would answer as if it were not set: leave it out{}", neutral.spelled()))),
        }
    }
    match body.get("best_of") {
        None | Some(Value::Null) => Ok(()),
        Some(v) if v.as_u64() == Some(n) => Ok(()),
        Some(v) => Err(ApiError::bad("best_of", format!("`best_of` ({v}) is not supported by lockstep serve (each of the `n` = {n} choices is one sample, none is picked among more): leave it out or send {n}"))),
    }
}

/// The noise key of choice `index` of a request for `prompt`: a function of what the request
/// asks, never of when it came, so identical requests draw identical tokens under any load.
pub fn noise_key(prompt: &[u32], index: usize) -> u64 {
    let mut text = format!("serve #{index}");
    for t in prompt {
        text.push(' ');
        text.push_str(&t.to_string());
    }
    crate::sample_cli::noise_key(&text)
}

/// The engine requests of one API request: `n` for each prompt, in prompt order (choice
/// `i * n + j` is prompt `i`'s `j`th; ids from `next_id`). A prompt's choices draw the same
/// noise alone or in a batch of prompts. `fill_context` (chat, as vLLM and OpenAI): a request
/// that sets no budget may run to the end of the context.
pub fn requests(prompts: &[Vec<u32>], s: &Sampling, d: &Defaults, fill_context: bool, next_id: &mut dyn FnMut() -> u64) -> Result<Vec<Request>, ApiError> {
    let mut out = Vec::with_capacity(prompts.len() * s.n);
    for (i, prompt) in prompts.iter().enumerate() {
        let which = if prompts.len() > 1 { format!("prompt {i}: ") } else { String::new() };
        if prompt.is_empty() {
            return Err(ApiError::bad("prompt", format!("{which}the prompt is empty")));
        }
        if let Some((position, &token)) = prompt.iter().enumerate().find(|(_, t)| **t as usize >= d.vocab) {
            return Err(ApiError::bad("prompt", format!("{which}token id {token} at position {position} is out of range (vocabulary size {})", d.vocab)));
        }
        let budget = if fill_context && !s.budget_given { d.context.saturating_sub(prompt.len()) } else { s.params.max_new_tokens };
        if budget == 0 {
            return Err(ApiError { status: 400, message: format!("{which}the prompt ({} tokens) fills the context of {} tokens (sampler.context): no room for a completion", prompt.len(), d.context), param: Some("messages".into()) });
        }
        if prompt.len() + budget > d.context {
            return Err(ApiError { status: 400, message: format!("{which}the prompt ({} tokens) + max_tokens ({budget}) exceeds the context of {} tokens (sampler.context)", prompt.len(), d.context), param: Some("max_tokens".into()) });
        }
        out.extend((0..s.n).map(|j| Request { id: next_id(), prompt: prompt.clone(), params: SamplingParams { noise_key: Some(noise_key(prompt, j)), max_new_tokens: budget, ..s.params.clone() } }));
    }
    Ok(out)
}

pub fn finish_reason(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// Prompt and completion token counts.
pub fn usage(prompt: usize, generated: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Defaults {
        Defaults { model_name: "m".into(), seed: 7, stop_tokens: vec![2], processed_logprobs: false, context: 64, vocab: 100 }
    }

    fn refused(body: Value) -> ApiError {
        match sampling(&body, &defaults(), &["max_tokens"]) {
            Err(e) => e,
            Ok(_) => panic!("{body} was accepted"),
        }
    }

    #[test]
    fn fields_the_sampler_does_not_implement_are_refused_unless_neutral() {
        for (key, neutral) in UNSUPPORTED {
            let asked = match neutral {
                Neutral::Zero | Neutral::One => json!(0.5),
                Neutral::False => json!(true),
                Neutral::True => json!(false),
                Neutral::Empty => json!({"5": 100}),
                Neutral::PlainText => json!({"type": "json_object"}),
                Neutral::Auto => json!("required"),
                Neutral::Absent => json!({"type": "object"}),
            };
            let e = refused(Value::Object([(key.to_string(), asked)].into_iter().collect()));
            assert!(e.status == 400 && e.param.as_deref() == Some(key) && e.message.contains(key) && e.message.contains("not supported"), "{key}: {e:?}");
        }
        let neutral = json!({"presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1, "logit_bias": {}, "echo": false, "suffix": "", "skip_special_tokens": true,
            "response_format": {"type": "text"}, "tool_choice": "auto", "guided_json": null, "best_of": 2, "n": 2, "user": "u", "metadata": {"a": "b"}});
        assert!(sampling(&neutral, &defaults(), &["max_tokens"]).is_ok());
        let e = refused(json!({"best_of": 3}));
        assert!(e.param.as_deref() == Some("best_of") && e.message.contains("send 1"), "{e:?}");
        assert!(refused(json!({"response_format": {"type": "text", "schema": {}}})).param.as_deref() == Some("response_format"));
    }

    #[test]
    fn a_chat_without_a_budget_may_fill_the_context_and_a_completion_gets_16() {
        let d = defaults();
        let budgets = |body: Value, chat: bool, prompt_len: usize| {
            let s = sampling(&body, &d, &["max_tokens"]).unwrap();
            requests(&[vec![5; prompt_len]], &s, &d, chat, &mut || 0).map(|r| r[0].params.max_new_tokens)
        };
        assert_eq!(budgets(json!({}), true, 10).unwrap(), 54);
        assert_eq!(budgets(json!({}), false, 10).unwrap(), 16);
        assert_eq!(budgets(json!({"max_tokens": 7}), true, 10).unwrap(), 7);
        let e = budgets(json!({}), true, 64).unwrap_err();
        assert!(e.message.contains("fills the context of 64"), "{e:?}");
        let e = budgets(json!({"max_tokens": 60}), true, 10).unwrap_err();
        assert!(e.param.as_deref() == Some("max_tokens") && e.message.contains("exceeds the context of 64"), "{e:?}");
    }

    #[test]
    fn ignore_eos_and_stop_token_ids_set_the_tokens_that_end_a_choice() {
        let stops = |body: Value| sampling(&body, &defaults(), &["max_tokens"]).map(|s| s.params.stop_tokens);
        assert_eq!(stops(json!({})).unwrap(), [2]);
        assert_eq!(stops(json!({"ignore_eos": true})).unwrap(), Vec::<u32>::new());
        assert_eq!(stops(json!({"ignore_eos": false, "stop_token_ids": [5, 2, 5]})).unwrap(), [2, 5]);
        assert_eq!(stops(json!({"ignore_eos": true, "stop_token_ids": [9]})).unwrap(), [9]);
        for (body, key) in [(json!({"ignore_eos": 1}), "ignore_eos"), (json!({"stop_token_ids": [100]}), "stop_token_ids"), (json!({"stop_token_ids": [-1]}), "stop_token_ids"), (json!({"stop_token_ids": 5}), "stop_token_ids")] {
            let e = refused(body.clone());
            assert_eq!(e.param.as_deref(), Some(key), "{body}: {e:?}");
        }
    }
}
