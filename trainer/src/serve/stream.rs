//! `"stream": true`: a response as server-sent events in OpenAI's chunk format. Each choice's
//! new tokens go out after every engine step that samples them (text held while it may end
//! mid-character or begin a stop string), its last chunk carries `finish_reason`, then a usage
//! chunk when `stream_options.include_usage` asks, then `data: [DONE]`. A client that goes
//! away cancels its choices in the engine; so does `serve.request_timeout_s` (an error event,
//! then `[DONE]`). With `tools`, a choice's Hermes `<tool_call>` blocks come in its last chunk
//! as `delta.tool_calls`, split from the content as the whole response splits them.

use super::api::{ApiError, Sampling};
use super::detok::Detokenizer;
use super::respond::{choice, envelope, Endpoint, Piece};
use super::tool_calls::{delta_calls, StreamSplit};
use super::{Admitted, Server};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use sampler::{Request, StreamEvent};
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Starts the choices on the engine and answers with their event stream.
/// `split_calls`: a chat request with `tools` on a template that writes Hermes `<tool_call>`
/// blocks, whose calls come as `delta.tool_calls` (as the whole response's `message.tool_calls`).
pub fn respond(server: Arc<Server>, endpoint: Endpoint, prompts: Vec<Vec<u32>>, sampling: Sampling, requests: Vec<Request>, admitted: Admitted, split_calls: bool) -> Result<Response, ApiError> {
    let id = requests.first().map_or(0, |r| r.id);
    let mut receivers = Vec::new();
    for r in requests {
        receivers.push(server.engine.stream(r).map_err(|e| ApiError { status: 500, message: e.to_string(), param: None })?);
    }
    let (events, out) = mpsc::unbounded_channel::<Event>();
    tokio::spawn(async move {
        let _admitted = admitted;
        drive(&server, endpoint, id, &prompts, &sampling, receivers, &events, split_calls).await;
    });
    let body = stream::unfold(out, |mut out| async move { out.recv().await.map(|e| (Ok::<_, std::convert::Infallible>(e), out)) });
    Ok(Sse::new(body).into_response())
}

fn data(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

/// Forwards the choices' engine events as chunks until all are done or the client is gone
/// (then returning drops the engine's receivers, which cancels what still runs).
#[allow(clippy::too_many_arguments)]
async fn drive(server: &Server, endpoint: Endpoint, id: u64, prompts: &[Vec<u32>], sampling: &Sampling, receivers: Vec<mpsc::UnboundedReceiver<StreamEvent>>, out: &mpsc::UnboundedSender<Event>, split_calls: bool) {
    let n = receivers.len();
    let created = super::unix_time();
    let d = &server.defaults;
    let stop = &sampling.params.stop;
    let mut text: Vec<Detokenizer> = (0..n).map(|_| Detokenizer::new(&server.tokenizer, stop)).collect();
    let mut sent = vec![0usize; n];
    let mut first = vec![true; n];
    let mut calls: Vec<StreamSplit> = (0..n).map(|_| StreamSplit::default()).collect();
    let mut merged = stream::select_all(receivers.into_iter().enumerate().map(|(i, rx)| stream::unfold(rx, move |mut rx| async move { rx.recv().await.map(|e| ((i, e), rx)) }).boxed()));
    let deadline = async {
        match server.deadline {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    loop {
        let next = tokio::select! {
            next = merged.next() => next,
            () = out.closed() => return,
            () = &mut deadline => {
                // returning drops the receivers, which cancels the choices still running
                let _ = out.send(data(&super::timed_out(server.deadline.unwrap_or_default()).body()));
                let _ = out.send(Event::default().data("[DONE]"));
                return;
            }
        };
        let Some((i, event)) = next else { break };
        let (tokens, logprobs, top, finish) = match &event {
            StreamEvent::Tokens { tokens, logprobs, top_logprobs } => (tokens.as_slice(), logprobs.as_slice(), top_logprobs.as_slice(), None),
            // the tokens of the step that finished it have not been streamed yet
            StreamEvent::Done(Ok(c)) => (&c.tokens[sent[i].min(c.tokens.len())..], &c.logprobs[sent[i].min(c.logprobs.len())..], c.top_logprobs.get(sent[i].min(c.top_logprobs.len())..).unwrap_or_default(), Some(super::api::finish_reason(&c.finish))),
            StreamEvent::Done(Err(e)) => {
                let _ = out.send(data(&ApiError { status: 500, message: format!("choice {i}: {e}"), param: None }.body()));
                continue;
            }
        };
        sent[i] += tokens.len();
        let mut piece = text[i].push(tokens, finish.is_some());
        let mut found = Vec::new();
        if split_calls {
            let released = calls[i].push(&piece, finish.is_some(), &format!("chatcmpl-{id}_{i}"));
            (piece, found) = (released.content, released.calls);
        }
        let mut c = choice(endpoint, &server.tokenizer, Piece { index: i, text: piece, tokens, logprobs, top, finish }, sampling.logprobs, true, first[i]);
        if !found.is_empty() {
            c["delta"]["tool_calls"] = delta_calls(found);
            if c["finish_reason"] == "stop" {
                c["finish_reason"] = "tool_calls".into();
            }
        }
        first[i] = false;
        if out.send(data(&envelope(endpoint, d, id, created, true, vec![c], prompts))).is_err() {
            return;
        }
    }
    if sampling.include_usage {
        let mut v = envelope(endpoint, d, id, created, true, Vec::new(), prompts);
        v["usage"] = super::api::usage(super::respond::prompt_tokens(prompts), sent.iter().sum());
        let _ = out.send(data(&v));
    }
    let _ = out.send(Event::default().data("[DONE]"));
}
