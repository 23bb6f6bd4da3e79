//! Agent episodes (`task.name = "environment"`, docs/agents.md): GRPO on multi-turn episodes
//! that the user's program plays through an OpenAI-compatible server on the trainer's own
//! engine, trained on exactly the token ids the server gave the sampler and the ids it drew.
//!
//! - `environment.rs`: the programs, run concurrently, one per episode;
//! - `server.rs`: the per-episode sessions' endpoints;
//! - `session.rs`: a session's exact trajectory and the rule that extends it turn by turn;
//! tool calls are `lockstep serve`'s (`crate::serve::tool_calls`).

pub mod environment;
pub mod server;
pub mod session;

use crate::config::EnvironmentSection;
use environment::{Episode, Report};
use serde::Serialize;
use server::EpisodeServer;
use session::Session;
use std::collections::HashMap;
use std::sync::Arc;

/// One episode's telemetry (`episodes.jsonl`, and the step's means in `metrics.jsonl`).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct EpisodeStats {
    pub step: usize,
    pub episode: usize,
    pub session: String,
    /// The record's line in `task.path`.
    pub line: usize,
    pub turns: usize,
    pub tool_calls: usize,
    /// Tokens the sampler drew (the loss's tokens).
    pub sampled_tokens: usize,
    /// The episode's whole sequence: prompts, observations and sampled tokens.
    pub episode_tokens: usize,
    pub reward: f64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub turn_rewards: Vec<f64>,
    /// Seconds its program ran (its generations included).
    pub program_s: f64,
}

/// A played episode: its session (turns) and its program's report or failure.
pub struct Played {
    pub session: Session,
    pub report: Result<Report, String>,
    pub program_s: f64,
}

/// Serves `episodes` on `engine` (lent for the duration) and plays them with
/// `environment.command`: one session each, answered with `params`.
#[allow(clippy::too_many_arguments)]
pub fn play(engine: &mut sampler::Engine, tokenizer: tokenizers::Tokenizer, chat: Option<crate::chat::ChatPrompts>, defaults: crate::serve::api::Defaults, params: sampler::SamplingParams, cfg: &EnvironmentSection, max_tokens: usize, episodes: &[Episode]) -> Result<Vec<Played>, String> {
    sampler::EngineHandle::lend(engine, |handle| {
        let sessions = episodes.iter().map(|e| (e.session.clone(), Session::default())).collect::<HashMap<_, _>>();
        let model = defaults.model_name.clone();
        let server = Arc::new(EpisodeServer { engine: handle, tokenizer, chat, defaults, params, max_turns: cfg.max_turns, max_tokens, sessions: std::sync::Mutex::new(sessions), next_id: Default::default() });
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(crate::serve::http_workers(0)).thread_name("lockstep-episodes").enable_all().build().map_err(|e| format!("the episodes' server: the async runtime: {e}"))?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).map_err(|e| format!("the episodes' server cannot listen on 127.0.0.1: {e}"))?;
        let address = listener.local_addr().map_err(|e| format!("the episodes' server: {e}"))?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = server::router(server.clone());
        let serving = runtime.spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
        let reports = environment::play(cfg, &format!("http://{address}"), &model, episodes);
        let _ = stop.send(());
        let _ = runtime.block_on(serving);
        // every connection's task ends with the runtime, so the engine's handle is the
        // server's alone now: dropping it ends the engine's thread
        runtime.shutdown_timeout(std::time::Duration::from_secs(5));
        let server = Arc::try_unwrap(server).map_err(|_| "the episodes' server is still referenced after it stopped".to_string())?;
        let mut sessions = server.sessions.into_inner().map_err(|_| "the episodes' sessions: a handler panicked".to_string())?;
        Ok(episodes.iter().zip(reports).map(|(e, (report, program_s))| Played { session: sessions.remove(&e.session).unwrap_or_default(), report, program_s }).collect())
    })
}
