//! `lockstep serve`: an OpenAI-compatible HTTP server on the sampler's engine (axum on tokio;
//! the engine steps on its own thread, `sampler::EngineHandle`). `POST /v1/completions`,
//! `POST /v1/chat/completions` (the checkpoint's chat template, rendered as training renders
//! it), `POST /tokenize` / `/detokenize`, `GET /v1/models`, `GET /health`, `GET /metrics`; answers whole or streamed (SSE).
//! A request's tokens and logprobs depend only on the weights, its prompt, its sampling
//! settings and its `seed` (default `sampler.seed`): its sampling noise is keyed by what it
//! asks (`api::noise_key`), and the kernels are batch invariant, so the same request gives the
//! same bits under any load, streamed or not (docs/serve.md).

pub mod api;
pub(crate) mod detok;
mod metrics;
pub(crate) mod respond;
mod stream;
mod tokenize;
pub mod tool_calls;

use crate::config::Config;
use crate::error::RunError;
use crate::policy::{encode, Policy};
use api::{ApiError, Defaults};
use respond::Endpoint;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokenizers::Tokenizer;

struct Server {
    engine: sampler::EngineHandle,
    tokenizer: Tokenizer,
    chat: Option<crate::chat::ChatPrompts>,
    defaults: Defaults,
    next_id: AtomicU64,
    /// Choices in flight, against `serve.max_queue`.
    in_flight: std::sync::atomic::AtomicUsize,
    max_queue: usize,
    /// Requests answered 429.
    rejected: AtomicU64,
    rate: metrics::Rate,
    api_key: String,
    /// `serve.request_timeout_s`; `None`: no deadline.
    pub(crate) deadline: Option<std::time::Duration>,
}

/// A chat template where one is at hand: `task.chat_template` (an error names it), else the
/// checkpoint's; `None` without either (the chat endpoint then says so).
pub(crate) fn chat_prompts(cfg: &Config) -> Result<Option<crate::chat::ChatPrompts>, RunError> {
    let over = (!cfg.task.chat_template.is_empty()).then(|| std::path::Path::new(&cfg.task.chat_template));
    if cfg.model.path.is_empty() && over.is_none() {
        return Ok(None);
    }
    match crate::chat::ChatTemplate::from_checkpoint(std::path::Path::new(&cfg.model.path), over) {
        Ok(template) => Ok(Some(crate::chat::ChatPrompts::new(template, &cfg.task.system_prompt, &cfg.task.chat_args).map_err(|e| crate::error::invalid("task.chat_args", e))?)),
        Err(e) if over.is_some() => Err(crate::error::invalid("task.chat_template", e)),
        Err(_) => Ok(None),
    }
}

/// The name requests use for this server's model.
pub(crate) fn model_name(cfg: &Config) -> String {
    if !cfg.serve.model_name.is_empty() {
        return cfg.serve.model_name.clone();
    }
    match std::path::Path::new(&cfg.model.path).file_name() {
        Some(name) if !cfg.model.path.is_empty() => name.to_string_lossy().into_owned(),
        _ => "lockstep-tiny".into(),
    }
}

/// `lockstep serve`: the memory plan (as for sampling), the policy, then [`run`].
pub fn main(cfg: Config) -> Result<(), RunError> {
    let device = shared_kernels::device::default_device();
    let cfg = crate::memory_plan::plan(&cfg, &device, crate::memory_plan::Purpose::Sample)?;
    let policy = crate::policy::load_policy(&cfg, None, &device)?;
    run(&cfg, policy)
}

/// Serves `policy` until SIGTERM or Ctrl-C, then lets the requests in flight finish.
pub fn run(cfg: &Config, policy: Policy) -> Result<(), RunError> {
    let s = &cfg.sampler;
    let chat = chat_prompts(cfg)?;
    let defaults = Defaults { model_name: model_name(cfg), seed: s.seed, stop_tokens: policy.stop_tokens.clone(), processed_logprobs: s.logprobs_mode == crate::config::LogprobsMode::Processed, context: s.context, vocab: policy.model.config.vocab_size };
    let Policy { model, tokenizer, .. } = policy;
    let mut model = model;
    model.kernels = cfg.ablation.sampler_kernels.kernel_set();
    let engine = crate::run::sampler_engine(cfg, &tokenizer, model)?;
    let api_key = if cfg.serve.api_key.is_empty() { shared_kernels::knobs::var("LOCKSTEP_API_KEY").unwrap_or_default() } else { cfg.serve.api_key.clone() };
    let deadline = (cfg.serve.request_timeout_s > 0.0).then(|| std::time::Duration::from_secs_f64(cfg.serve.request_timeout_s));
    let (engine, engine_thread) = sampler::EngineHandle::spawn_joinable(engine);
    let server = Arc::new(Server { engine, tokenizer, chat, defaults, next_id: AtomicU64::new(0), in_flight: Default::default(), max_queue: cfg.serve.max_queue, rejected: AtomicU64::new(0), rate: Default::default(), api_key, deadline });
    let grace = std::time::Duration::from_secs_f64(cfg.serve.shutdown_grace_s);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(http_workers(cfg.serve.workers)).enable_all().build().map_err(|e| RunError::Other(format!("serve: the async runtime: {e}")))?;
    let body_limit = body_limit(s.context);
    let served = runtime.block_on(async move {
        // SIGTERM and Ctrl-C are handled from before the address is announced: a supervisor
        // that stops the server the moment it is up gets the graceful stop, not the default kill
        let signals = Signals::new().map_err(|e| RunError::Other(format!("serve: cannot handle SIGTERM / SIGINT: {e}")))?;
        let address = format!("{}:{}", cfg.serve.host, cfg.serve.port);
        let listener = tokio::net::TcpListener::bind(&address).await.map_err(|e| crate::error::invalid("serve.port", format!("cannot listen on {address}: {e}")))?;
        let bound = listener.local_addr().map_err(|e| RunError::Other(format!("serve: {e}")))?;
        let name = server.defaults.model_name.clone();
        let app = axum::Router::new()
            .route("/health", get(|| async { "ok" }))
            .route("/v1/models", get(models))
            .route("/metrics", get(metrics))
            .route("/v1/completions", post(completions))
            .route("/v1/chat/completions", post(chat_completions))
            .route("/tokenize", post(tokenize::tokenize))
            .route("/detokenize", post(tokenize::detokenize))
            .fallback(|| async { error(ApiError { status: 404, message: "no such endpoint (POST /v1/completions, POST /v1/chat/completions, POST /tokenize, POST /detokenize, GET /v1/models, GET /health, GET /metrics)".into(), param: None }) })
            .layer(axum::extract::DefaultBodyLimit::max(body_limit))
            .layer(axum::middleware::from_fn_with_state(server.clone(), authorised))
            .with_state(server);
        eprintln!("lockstep serve: listening on http://{bound} (model \"{name}\")");
        let (signalled, mut heard) = tokio::sync::watch::channel(false);
        let serving = axum::serve(listener, app).with_graceful_shutdown(async move {
            signals.stopped(grace).await;
            let _ = signalled.send(true);
        });
        // past the grace period the requests still in flight are cancelled: leaving block_on
        // drops the runtime, whose tasks' engine receivers cancel their choices
        let grace_over = async move {
            let _ = heard.wait_for(|stopping| *stopping).await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            served = serving.into_future() => served.map_err(|e| RunError::Other(format!("serve: {e}"))),
            () = grace_over => {
                eprintln!("lockstep serve: the grace period (serve.shutdown_grace_s = {}) is over: cancelling the requests still in flight", grace.as_secs_f64());
                Ok(())
            }
        }
    });
    // the runtime's tasks, and with them every handle on the engine, go first; the engine's
    // thread then cancels what was in flight and ends, and only then may the process exit
    // (exiting under a step crashed the CPU runtime: SIGSEGV / SIGABRT at exit)
    drop(runtime);
    if engine_thread.join().is_err() {
        return Err(RunError::Other("serve: the sampler's thread panicked".into()));
    }
    served
}

/// Threads for an HTTP front (`serve.workers`; 0: a quarter of the cores, 2 to 4). Each
/// stream's chunks are built and written on them; more threads than that took the cores the
/// engine's thread enqueues its steps from (docs/serve.md: 7 threads on 8 cores tripled the
/// engine's ms a step, and 2 threads kept 256 streams' batch as full as 7 did).
pub(crate) fn http_workers(setting: usize) -> usize {
    match setting {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get() / 4).clamp(2, 4),
        n => n,
    }
}

/// The largest request body an HTTP front reads: room for a prompt that fills `context` tokens
/// as token ids or text (64 bytes a token), and at least 4 MiB (chat histories, tool schemas).
pub(crate) fn body_limit(context: usize) -> usize {
    (64 * context).max(4 << 20)
}

/// A request's body, or the error that says why it could not be read (413 past
/// [`body_limit`]) in OpenAI's shape, where axum would answer plain text.
pub(crate) fn read_body(body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>) -> Result<axum::body::Bytes, ApiError> {
    body.map_err(|r| ApiError { status: r.status().as_u16(), message: format!("the request body could not be read: {}", r.body_text()), param: None })
}

/// SIGTERM and SIGINT (Ctrl-C), listened for from creation on.
struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals { terminate: signal(SignalKind::terminate())?, interrupt: signal(SignalKind::interrupt())? })
    }

    /// Resolves at the first of them.
    async fn stopped(mut self, grace: std::time::Duration) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
        eprintln!("lockstep serve: stopping: no new connections; the requests in flight have {} s to finish (serve.shutdown_grace_s)", grace.as_secs_f64());
    }
}

/// Refuses a request without the server's `api_key` (when one is set); as vLLM's, the key
/// guards `/v1/` and the tokenizer's endpoints (`/health` and `/metrics` stay open to probes and scrapers).
async fn authorised(State(server): State<Arc<Server>>, request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let path = request.uri().path();
    if server.api_key.is_empty() || !(path.starts_with("/v1/") || path == "/tokenize" || path == "/detokenize") {
        return next.run(request).await;
    }
    let given = request.headers().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).unwrap_or("");
    if constant_time_eq(given.as_bytes(), server.api_key.as_bytes()) {
        return next.run(request).await;
    }
    error(ApiError { status: 401, message: "a valid API key is required: `Authorization: Bearer <serve.api_key>`".into(), param: None })
}

/// Equality whose time depends on the lengths only, not on where the bytes first differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut differ = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        differ |= (a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0)) as usize;
    }
    differ == 0
}

pub(crate) fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    let mut response = (status, axum::Json(e.body())).into_response();
    if status == StatusCode::TOO_MANY_REQUESTS {
        response.headers_mut().insert("retry-after", axum::http::HeaderValue::from_static("1"));
    }
    response
}

pub(crate) fn ok(body: Value) -> Response {
    (StatusCode::OK, axum::Json(body)).into_response()
}

pub(crate) fn parse(bytes: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| ApiError { status: 400, message: format!("the body is not valid JSON: {e}"), param: None })?;
    if !v.is_object() {
        return Err(ApiError { status: 400, message: "the body must be a JSON object".into(), param: None });
    }
    Ok(v)
}

async fn models(State(server): State<Arc<Server>>) -> Response {
    // vLLM's `max_model_len`: the longest prompt + completion a request may ask (sampler.context)
    ok(json!({"object": "list", "data": [{"id": server.defaults.model_name, "object": "model", "owned_by": "lockstep", "max_model_len": server.defaults.context}]}))
}

async fn metrics(State(server): State<Arc<Server>>) -> Response {
    let text = metrics::text(server.engine.metrics(), &server.rate, server.in_flight.load(Ordering::SeqCst), server.rejected.load(Ordering::Relaxed));
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// A request's choices counted in flight while it lives (its stream's, for a streamed one).
pub struct Admitted {
    server: Arc<Server>,
    n: usize,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.server.in_flight.fetch_sub(self.n, Ordering::SeqCst);
    }
}

/// Admits `n` choices, or 429 past `serve.max_queue` choices in flight.
fn admit(server: &Arc<Server>, n: usize) -> Result<Admitted, ApiError> {
    if server.max_queue > 0 && n > server.max_queue {
        // no wait would let it in: refused for good, not 429
        return Err(ApiError::bad("n", format!("the request asks {n} choices (prompts x n), more than serve.max_queue = {} in flight at once: send fewer", server.max_queue)));
    }
    let before = server.in_flight.fetch_add(n, Ordering::SeqCst);
    let admitted = Admitted { server: server.clone(), n };
    if server.max_queue > 0 && before + n > server.max_queue {
        server.rejected.fetch_add(1, Ordering::Relaxed);
        return Err(ApiError { status: 429, message: format!("{before} requests are in flight and serve.max_queue is {}: retry later", server.max_queue), param: None });
    }
    Ok(admitted)
}

/// Runs the choices on the engine and waits for all of them. Awaited in the handler itself, so
/// a client that goes away drops the waits, which cancels the choices in the engine.
/// Past `serve.request_timeout_s` the waits are dropped (cancelling the choices) and the
/// request is answered 504.
async fn generate(server: &Arc<Server>, requests: Vec<sampler::Request>) -> Result<Vec<sampler::Completion>, ApiError> {
    let all = futures_util::future::join_all(requests.into_iter().map(|r| server.engine.submit(r)));
    let done = match server.deadline {
        Some(limit) => tokio::time::timeout(limit, all).await.map_err(|_| timed_out(limit))?,
        None => all.await,
    };
    done.into_iter().map(|d| d.map_err(|e| ApiError { status: 500, message: e.to_string(), param: None })).collect()
}

/// The answer to a request that ran past `serve.request_timeout_s`.
pub(crate) fn timed_out(limit: std::time::Duration) -> ApiError {
    ApiError { status: 504, message: format!("the request did not finish within {} s (serve.request_timeout_s); its choices were cancelled", limit.as_secs_f64()), param: None }
}

pub(crate) fn unix_time() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A handler's body, or why it could not be read (see [`read_body`]).
pub(crate) type Body = Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>;

async fn completions(State(server): State<Arc<Server>>, body: Body) -> Response {
    match read_body(body) {
        Ok(body) => answer(server, Endpoint::Completions, &body).await,
        Err(e) => error(e),
    }
}

async fn chat_completions(State(server): State<Arc<Server>>, body: Body) -> Response {
    match read_body(body) {
        Ok(body) => answer(server, Endpoint::Chat, &body).await,
        Err(e) => error(e),
    }
}

/// Either endpoint: the request checked, its choices run, the answer whole or streamed.
async fn answer(server: Arc<Server>, endpoint: Endpoint, body: &[u8]) -> Response {
    let result = async {
        let body = parse(body)?;
        api::check_model(&body, &server.defaults)?;
        let prompts = match endpoint {
            Endpoint::Completions => completion_prompts(&server, &body)?,
            Endpoint::Chat => vec![chat_prompt(&server, &body)?],
        };
        let sampling = api::sampling(&body, &server.defaults, endpoint.max_keys())?;
        let requests = api::requests(&prompts, &sampling, &server.defaults, endpoint == Endpoint::Chat, &mut || server.next_id.fetch_add(1, Ordering::Relaxed))?;
        let admitted = admit(&server, requests.len())?;
        // OpenAI's tools: a template that writes Hermes <tool_call> blocks gets its calls parsed
        let split_calls = endpoint == Endpoint::Chat && body.get("tools").is_some_and(|t| !t.is_null()) && server.chat.as_ref().is_some_and(|c| c.writes_tool_call_blocks());
        if sampling.stream {
            return stream::respond(server.clone(), endpoint, prompts, sampling, requests, admitted, split_calls);
        }
        let done = generate(&server, requests).await?;
        drop(admitted);
        let mut v = respond::whole(endpoint, &server.tokenizer, &server.defaults, &sampling, &prompts, &done, unix_time());
        if split_calls {
            let id = v["id"].as_str().unwrap_or("").to_string();
            for (i, choice) in v["choices"].as_array_mut().into_iter().flatten().enumerate() {
                tool_calls::into_choice(choice, &format!("{id}_{i}"));
            }
        }
        Ok(ok(v))
    };
    result.await.unwrap_or_else(error)
}

/// `/v1/completions`' prompts: text or token ids, or a batch of either (OpenAI's list of
/// strings or of token id lists; choice `i * n + j` answers prompt `i`).
fn completion_prompts(server: &Server, body: &Value) -> Result<Vec<Vec<u32>>, ApiError> {
    let ids = |list: &[Value]| -> Result<Vec<u32>, ApiError> {
        list.iter().map(|x| x.as_u64().filter(|&n| n <= u32::MAX as u64).map(|n| n as u32).ok_or_else(|| ApiError::bad("prompt", format!("{x} is not a token id")))).collect()
    };
    let one = |v: &Value| -> Result<Vec<u32>, ApiError> {
        match v {
            Value::String(text) => encode(&server.tokenizer, text).map_err(|e| ApiError::bad("prompt", e.to_string())),
            Value::Array(list) => ids(list),
            v => Err(ApiError::bad("prompt", format!("a batch's prompt must be a string or a list of token ids, got {v}"))),
        }
    };
    match body.get("prompt") {
        Some(Value::String(_)) => Ok(vec![one(&body["prompt"])?]),
        Some(Value::Array(list)) if list.is_empty() => Err(ApiError::bad("prompt", "the prompt is empty")),
        Some(Value::Array(list)) if list.iter().any(|x| x.is_string() || x.is_array()) => list.iter().map(one).collect(),
        Some(Value::Array(list)) => Ok(vec![ids(list)?]),
        Some(v) => Err(ApiError::bad("prompt", format!("`prompt` must be a string, a list of token ids, or a list of either, got {v}"))),
        None => Err(ApiError::bad("prompt", "`prompt` is required")),
    }
}

/// `/v1/chat/completions`' prompt: `messages` rendered with the chat template, then encoded.
fn chat_prompt(server: &Server, body: &Value) -> Result<Vec<u32>, ApiError> {
    let Some(chat) = &server.chat else {
        return Err(ApiError::bad("messages", "this server has no chat template (model.path with one, or task.chat_template); use /v1/completions"));
    };
    // an assistant message that only calls tools may leave out its content (OpenAI's rule)
    let Some(messages) = body.get("messages").and_then(Value::as_array).filter(|list| !list.is_empty() && list.iter().all(|m| m.get("role").is_some_and(Value::is_string) && (m.get("content").is_some() || m.get("tool_calls").is_some()))) else {
        return Err(ApiError::bad("messages", "`messages` must be a non-empty list of {\"role\", \"content\"} objects"));
    };
    let tools = body.get("tools").filter(|t| !t.is_null());
    if tools.is_some_and(|t| !t.is_array()) {
        return Err(ApiError::bad("tools", "`tools` must be a list of function schemas"));
    }
    let text = chat.render_with_tools(messages.clone(), tools).map_err(|e| ApiError::bad("messages", format!("the chat template cannot render these messages: {e}")))?;
    encode(&server.tokenizer, &text).map_err(|e| ApiError::bad("messages", e.to_string()))
}
