//! vLLM's `POST /tokenize` and `POST /detokenize`: the server's own tokenizer and chat template,
//! so a client can count, or build ahead, exactly the token ids a request would run (the ids a
//! trainer then scores).

use super::api::{self, ApiError};
use super::{chat_prompt, encode, error, ok, parse, read_body, Body, Server};
use axum::extract::State;
use axum::response::Response;
use serde_json::{json, Value};
use std::sync::Arc;

/// `{"prompt": text}` or `{"messages": [...], "tools"?: [...]}` (rendered as
/// `/v1/chat/completions` renders them, the assistant's turn opened) to
/// `{"count", "max_model_len", "tokens"}`.
pub(super) async fn tokenize(State(server): State<Arc<Server>>, body: Body) -> Response {
    let answer = || -> Result<Value, ApiError> {
        let body = parse(&read_body(body)?)?;
        api::check_model(&body, &server.defaults)?;
        let tokens = match (body.get("prompt"), body.get("messages")) {
            (Some(Value::String(text)), None) => encode(&server.tokenizer, text).map_err(|e| ApiError::bad("prompt", e.to_string()))?,
            (None, Some(_)) => chat_prompt(&server, &body)?,
            (Some(_), Some(_)) => return Err(ApiError::bad("prompt", "send `prompt` or `messages`, not both")),
            (Some(v), None) => return Err(ApiError::bad("prompt", format!("`prompt` must be a string, got {v}"))),
            (None, None) => return Err(ApiError::bad("prompt", "`prompt` (text) or `messages` (a chat) is required")),
        };
        Ok(json!({"count": tokens.len(), "max_model_len": server.defaults.context, "tokens": tokens}))
    };
    answer().map_or_else(error, ok)
}

/// `{"tokens": [ids]}` to `{"prompt": text}`: the ids' text, special tokens written out.
pub(super) async fn detokenize(State(server): State<Arc<Server>>, body: Body) -> Response {
    let answer = || -> Result<Value, ApiError> {
        let body = parse(&read_body(body)?)?;
        api::check_model(&body, &server.defaults)?;
        let Some(Value::Array(list)) = body.get("tokens") else {
            return Err(ApiError::bad("tokens", "`tokens` (a list of token ids) is required"));
        };
        let vocab = server.defaults.vocab;
        let ids = list.iter().enumerate().map(|(i, v)| v.as_u64().filter(|&t| t < vocab as u64).map(|t| t as u32).ok_or_else(|| ApiError::bad("tokens", format!("tokens[{i}] is {v}, not a token id below the vocabulary size {vocab}")))).collect::<Result<Vec<u32>, _>>()?;
        let text = server.tokenizer.decode(&ids, false).map_err(|e| ApiError::bad("tokens", format!("the tokenizer cannot decode these ids: {e}")))?;
        Ok(json!({"prompt": text}))
    };
    answer().map_or_else(error, ok)
}
