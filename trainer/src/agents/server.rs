//! The episodes' server: OpenAI-compatible endpoints under `/sessions/{id}/v1/`, one session
//! per episode, on the trainer's own engine. A turn samples with the run's settings (the
//! sampler section's temperature, top-k, top-p and seed; a request asking for others is
//! refused, since the rollouts must come from the policy being trained) and its noise is
//! keyed by (session, turn), so an episode's tokens depend on the weights and on what its
//! program sends, never on timing. Every refusal is also kept in the session: the episode
//! fails with it even when the program swallows the HTTP error.

use crate::serve::Body;
use super::session::{Session, Turn};
use crate::serve::api::{self, ApiError, Defaults};
use crate::serve::respond::{self, Endpoint, Piece};
use crate::serve::tool_calls;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::{get, post};
use sampler::{EngineHandle, Request, SamplingParams};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokenizers::Tokenizer;

pub struct EpisodeServer {
    pub engine: EngineHandle,
    pub tokenizer: Tokenizer,
    pub chat: Option<crate::chat::ChatPrompts>,
    pub defaults: Defaults,
    /// The run's sampling settings (`sampler.*`, `train.seed`).
    pub params: SamplingParams,
    pub max_turns: usize,
    /// Tokens an episode may reach (prompts, observations, sampled tokens).
    pub max_tokens: usize,
    pub sessions: Mutex<HashMap<String, Session>>,
    pub next_id: AtomicU64,
}

pub fn router(server: Arc<EpisodeServer>) -> axum::Router {
    axum::Router::new()
        .route("/sessions/{id}/v1/chat/completions", post(chat))
        .route("/sessions/{id}/v1/completions", post(completions))
        .route("/sessions/{id}/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .fallback(|| async { crate::serve::error(ApiError { status: 404, message: "no such endpoint: an episode calls /sessions/<its session>/v1/chat/completions or /v1/completions (LOCKSTEP_BASE_URL)".into(), param: None }) })
        .layer(axum::extract::DefaultBodyLimit::max(crate::serve::body_limit(server.defaults.context)))
        .with_state(server)
}

async fn models(State(server): State<Arc<EpisodeServer>>) -> Response {
    crate::serve::ok(json!({"object": "list", "data": [{"id": server.defaults.model_name, "object": "model", "owned_by": "lockstep"}]}))
}

async fn chat(State(server): State<Arc<EpisodeServer>>, Path(id): Path<String>, body: Body) -> Response {
    answer(server, id, Endpoint::Chat, body).await
}

async fn completions(State(server): State<Arc<EpisodeServer>>, Path(id): Path<String>, body: Body) -> Response {
    answer(server, id, Endpoint::Completions, body).await
}

async fn answer(server: Arc<EpisodeServer>, id: String, endpoint: Endpoint, body: Body) -> Response {
    let read = crate::serve::read_body(body);
    let result = match read {
        Ok(body) => turn(&server, &id, endpoint, &body).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(v) => crate::serve::ok(v),
        Err(e) => {
            if let Some(session) = server.sessions.lock().expect("sessions").get_mut(&id) {
                let at = session.turns.len();
                session.refused.get_or_insert_with(|| format!("turn {at}: the server answered {}: {}", e.status, e.message));
            }
            crate::serve::error(e)
        }
    }
}

/// Clears a session's `busy` flag however its turn ends; a turn dropped before it finished
/// (the program closed its connection) is recorded as the episode's failure.
struct Busy<'a> {
    server: &'a EpisodeServer,
    id: &'a str,
    done: bool,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        if let Some(session) = self.server.sessions.lock().expect("sessions").get_mut(self.id) {
            session.busy = false;
            if !self.done {
                let at = session.turns.len();
                session.refused.get_or_insert_with(|| format!("turn {at}: the environment closed its connection before the reply (the request was cancelled)"));
            }
        }
    }
}

/// The sampling keys a session's request may not change, with the run's value of each.
fn fixed(params: &SamplingParams) -> [(&'static str, f64); 4] {
    [("temperature", params.temperature as f64), ("top_p", params.top_p as f64), ("top_k", params.top_k as f64), ("seed", params.seed as f64)]
}

async fn turn(server: &Arc<EpisodeServer>, id: &str, endpoint: Endpoint, bytes: &[u8]) -> Result<Value, ApiError> {
    let body = crate::serve::parse(bytes)?;
    api::check_model(&body, &server.defaults)?;
    let asked = api::sampling(&body, &server.defaults, endpoint.max_keys())?;
    if asked.stream {
        return Err(ApiError::bad("stream", "an episode's turns are answered whole: set \"stream\": false"));
    }
    if asked.n != 1 {
        return Err(ApiError::bad("n", format!("an episode samples one reply a turn (n = 1), got n = {}", asked.n)));
    }
    for (key, run) in fixed(&server.params) {
        let given = match (key, &asked.params) {
            ("temperature", p) => p.temperature as f64,
            ("top_p", p) => p.top_p as f64,
            ("top_k", p) => p.top_k as f64,
            (_, p) => p.seed as f64,
        };
        if body.get(key).is_some_and(|v| !v.is_null()) && given != run {
            return Err(ApiError::bad(key, format!("`{key}` is {given} but the rollouts sample with the run's {run} (sampler.{}): leave it out", if key == "seed" { "seed / train.seed" } else { key })));
        }
    }
    let budget_given = endpoint.max_keys().iter().any(|k| body.get(*k).is_some_and(|v| !v.is_null()));
    let mut max_new = if budget_given { asked.params.max_new_tokens.min(server.params.max_new_tokens) } else { server.params.max_new_tokens };
    let tools = body.get("tools").filter(|t| !t.is_null());
    let text_or_ids = match endpoint {
        Endpoint::Chat => {
            let Some(chat) = &server.chat else {
                return Err(ApiError::bad("messages", "the run has no chat template (model.path with one, or task.chat_template); use /v1/completions"));
            };
            let Some(messages) = body.get("messages").and_then(Value::as_array).filter(|l| !l.is_empty() && l.iter().all(|m| m.get("role").is_some_and(Value::is_string))) else {
                return Err(ApiError::bad("messages", "`messages` must be a non-empty list of {\"role\", \"content\"} objects"));
            };
            Ok(chat.render_with_tools(messages.clone(), tools).map_err(|e| ApiError::bad("messages", format!("the chat template cannot render these messages: {e}")))?)
        }
        Endpoint::Completions => match body.get("prompt") {
            Some(Value::String(text)) => Ok(text.clone()),
            Some(Value::Array(ids)) => Err(ids.iter().map(|x| x.as_u64().filter(|&n| n < server.defaults.vocab as u64).map(|n| n as u32).ok_or_else(|| ApiError::bad("prompt", format!("{x} is not a token id below the vocabulary size {}", server.defaults.vocab)))).collect::<Result<Vec<u32>, _>>()?),
            _ => return Err(ApiError::bad("prompt", "`prompt` must be a string or a list of token ids")),
        },
    };
    // the turn's prompt ids, under the session's lock (one request at a time per session)
    let (prompt, turn_index, prompt_text) = {
        let mut sessions = server.sessions.lock().expect("sessions");
        let Some(session) = sessions.get_mut(id) else {
            return Err(ApiError { status: 404, message: format!("no episode session {id:?} is open (use LOCKSTEP_BASE_URL as given)"), param: None });
        };
        if session.busy {
            return Err(ApiError { status: 409, message: "this session is already generating a turn: an episode's turns come one at a time".into(), param: None });
        }
        if session.turns.len() >= server.max_turns {
            return Err(ApiError::bad("messages", format!("the episode has had its {} turns (environment.max_turns)", server.max_turns)));
        }
        let encode = |t: &str| crate::policy::encode(&server.tokenizer, t).map_err(|e| e.to_string());
        let (prompt, text) = match &text_or_ids {
            Ok(text) => (session.next_prompt(text, &encode).map_err(|e| ApiError::bad(if endpoint == Endpoint::Chat { "messages" } else { "prompt" }, e))?, text.clone()),
            Err(ids) => {
                if let Some(last) = session.turns.last() {
                    let before = [last.prompt.as_slice(), &last.tokens].concat();
                    if !ids.starts_with(&before) {
                        let at = ids.iter().zip(&before).take_while(|(a, b)| a == b).count();
                        return Err(ApiError::bad("prompt", format!("turn {}: the prompt's ids do not extend the session's earlier ids (the last prompt and its sampled ids): they differ at position {at}", session.turns.len())));
                    }
                }
                (ids.clone(), server.tokenizer.decode(ids, false).unwrap_or_default())
            }
        };
        if prompt.is_empty() {
            return Err(ApiError::bad("prompt", "the prompt is empty"));
        }
        if prompt.len() >= server.max_tokens {
            return Err(ApiError::bad("messages", format!("turn {}: the episode has reached {} tokens, its limit (environment.max_tokens, or sampler.context = {})", session.turns.len(), prompt.len(), server.defaults.context)));
        }
        max_new = max_new.min(server.max_tokens - prompt.len());
        session.busy = true;
        (prompt, session.turns.len(), text)
    };
    let mut busy = Busy { server, id, done: false };
    // the run's stop strings (`sampler.stop`) and the request's
    let mut stop = server.params.stop.clone();
    stop.extend(asked.params.stop.iter().filter(|s| !server.params.stop.contains(s)).cloned());
    // a turn may list each token's alternatives (computed beside the draw: no bit changes)
    let params = SamplingParams { max_new_tokens: max_new, stop: stop.clone(), noise_key: Some(crate::sample_cli::noise_key(&format!("episode {id} turn {turn_index}"))), top_logprobs: asked.params.top_logprobs, ..server.params.clone() };
    let request = Request { id: server.next_id.fetch_add(1, Ordering::Relaxed), prompt: prompt.clone(), params };
    let done = server.engine.submit(request).await.map_err(|e| ApiError { status: 500, message: format!("the sampler failed this turn: {e}"), param: None })?;
    let tokenizer = &server.tokenizer;
    let sampled_text = tokenizer.decode(&done.tokens, false).unwrap_or_default();
    let reply_text = crate::serve::detok::text(tokenizer, &done.tokens, &stop);
    // the text of the stop token that ended the turn, if one did
    let end_text = match done.tokens.last() {
        Some(&t) if server.params.stop_tokens.contains(&t) => tokenizer.decode(&[t], false).unwrap_or_default(),
        _ => String::new(),
    };
    let piece = Piece { index: 0, text: reply_text.clone(), tokens: &done.tokens, logprobs: &done.logprobs, top: &done.top_logprobs, finish: Some(api::finish_reason(&done.finish)) };
    let mut choice = respond::choice(endpoint, tokenizer, piece, asked.logprobs, false, false);
    let calls = if endpoint == Endpoint::Chat && tools.is_some() && server.chat.as_ref().is_some_and(|c| c.writes_tool_call_blocks()) { tool_calls::into_choice(&mut choice, &format!("{turn_index}")) } else { 0 };
    let mut v = respond::envelope(endpoint, &server.defaults, done.id, crate::serve::unix_time(), false, vec![choice], std::slice::from_ref(&prompt));
    v["usage"] = api::usage(prompt.len(), done.tokens.len());
    {
        let mut sessions = server.sessions.lock().expect("sessions");
        let session = sessions.get_mut(id).expect("the session was open");
        session.turns.push(Turn { prompt, prompt_text, tokens: done.tokens, logprobs: done.logprobs, routing: done.routing, sampled_text, reply_text, end_text, tool_calls: calls });
    }
    busy.done = true;
    Ok(v)
}
