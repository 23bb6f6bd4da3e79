//! The continuous-batching loop.
//!
//! Each `step` builds one list of rows for the model: for every admitted request still in
//! prefill, its next `chunk_size` prompt tokens; for every decoding request, its last sampled
//! token. One forward over all rows, then one sampling launch over the rows that end a prompt
//! or are decode tokens. Which requests share a step changes all the time; lockstep's kernels
//! make that irrelevant to every bit.

mod graphs;
mod launch;
mod config;
mod phases;
mod progress;
mod rows;
mod stops;
mod weights;

use launch::InFlight;
pub use config::EngineConfig;
pub use phases::EnginePhaseTimes;
pub use progress::Occupancy;
pub use stops::{completes_stop_string, Decoder};
use rows::StepError;
use crate::request::{Completion, FinishReason, Request, SampleError, Timings};
use shared_kernels::model::{KvCache, Qwen3};
use shared_kernels::ops::attention::BLOCK;
use std::collections::VecDeque;
use std::time::Instant;

struct Pending {
    request: Request,
    added: Instant,
}

struct Active {
    request: Request,
    slot: u32,
    /// Prompt tokens already in the cache.
    prefilled: usize,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    /// Each token's most likely alternatives (`top_logprobs` asked), else empty.
    top: Vec<Vec<(u32, f32)>>,
    /// Each sampled token's routing digest (a mixture-of-experts model).
    routing: Vec<u64>,
    /// Tokens sampled for it by a step that has not been read yet (0 or 1 between steps).
    in_flight: usize,
    added: Instant,
    admitted: Instant,
    first_token: Option<Instant>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepStats {
    pub rows: usize,
    pub prefill_rows: usize,
    pub decode_rows: usize,
    pub sampled: usize,
    pub running: usize,
    pub waiting: usize,
    /// Prompt tokens whose KV was copied from another request with the same prompt.
    pub shared_prefix_tokens: usize,
    /// Requests sent back to the queue because the cache ran out of blocks.
    pub preempted: usize,
}

pub struct Engine {
    phase: EnginePhaseTimes,
    model: Qwen3,
    config: EngineConfig,
    cache: KvCache,
    free_slots: Vec<u32>,
    waiting: VecDeque<Pending>,
    active: Vec<Active>,
    /// Results not yet handed out (refused requests and finished ones).
    done: Vec<(u64, Result<Completion, SampleError>)>,
    /// The last step enqueued and not read yet (overlap mode only).
    in_flight: Option<InFlight>,
    /// Captured steps, replayed for steps of the same row count (`graphs.rs`).
    graphs: graphs::StepGraphs,
    /// The stream of the thread that built the engine, where its weights and cache were made;
    /// every step launches there, whichever thread runs it (a capture holds no cross-stream
    /// binding).
    stream: shared_kernels::graph::LaunchStream,
    /// Text of token ids, for requests with stop strings.
    decoder: Option<Decoder>,
}

impl Engine {
    pub fn new(model: Qwen3, config: EngineConfig) -> Result<Self, String> {
        if config.max_batch == 0 || config.context == 0 || config.chunk_size == 0 {
            return Err(format!("engine config needs max_batch, context and chunk_size >= 1, got {config:?}"));
        }
        if !(0.0..=1.0).contains(&config.reserve) {
            return Err(format!("engine config: reserve must be in [0, 1], got {}", config.reserve));
        }
        if config.context > model.config.max_position_embeddings {
            return Err(format!("context {} exceeds the model's max_position_embeddings {}", config.context, model.config.max_position_embeddings));
        }
        let model = weights::decode_ready(model)?;
        // the pages the weights were loaded into are empty now where the caller handed over its
        // only handle (`lockstep sample`): give them back before the KV cache is allocated, so
        // the process holds one copy of the weights, not two
        model.embed.device().memory_cleanup();
        let choice = shared_kernels::kernel_choice::KernelChoice::current().map_err(|e| e.to_string())?;
        // a mixture-of-experts step reads its routing on the host mid-forward: no graph can hold it
        let graphs = graphs::StepGraphs::new(choice.decode_graphs && model.config.moe.is_none(), choice.decode_graph_padding);
        let device = model.embed.device();
        let blocks = if config.kv_blocks == 0 { config.max_batch * KvCache::blocks_for(config.context) } else { config.kv_blocks };
        let cache = KvCache::paged(&model.config, config.max_batch, config.context, blocks, model.dtype, &device).map_err(|e| e.to_string())?;
        let free_slots = (0..config.max_batch as u32).rev().collect();
        Ok(Self { phase: EnginePhaseTimes::default(), model, config, cache, free_slots, waiting: VecDeque::new(), active: Vec::new(), done: Vec::new(), in_flight: None, graphs, stream: shared_kernels::graph::LaunchStream::current(), decoder: None })
    }

    /// Replays steps whose rows are all sampled as captured graphs, or launches every step
    /// (the default is `LOCKSTEP_DECODE_GRAPHS`); the same bits either way.
    pub fn set_decode_graphs(&mut self, on: bool) {
        self.graphs.clear();
        self.graphs.on = on;
    }

    /// Pads replayed steps' row counts to few graphs, or keeps one graph per exact count (the
    /// default is `LOCKSTEP_DECODE_GRAPH_PADDING`); the same bits either way.
    pub fn set_decode_graph_padding(&mut self, on: bool) {
        self.graphs.clear();
        self.graphs.padding = on;
    }

    /// The decoder requests' stop strings are matched on (the tokenizer of their prompts).
    pub fn set_decoder(&mut self, decoder: Decoder) {
        self.decoder = Some(decoder);
    }

    pub fn model(&self) -> &Qwen3 {
        &self.model
    }

    /// The phase times accumulated since the last call, and a fresh start.
    pub fn take_phase_times(&mut self) -> EnginePhaseTimes {
        std::mem::take(&mut self.phase)
    }

    /// The phase times accumulated since the last [`Self::take_phase_times`], left in place.
    pub fn phase_times(&self) -> &EnginePhaseTimes {
        &self.phase
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Sampled rows of the step enqueued and not read yet (0 when none is in flight).
    pub fn in_flight_rows(&self) -> usize {
        self.in_flight.as_ref().map_or(0, |f| f.owners.len())
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.active.is_empty() && self.in_flight.is_none()
    }

    /// Queue a request. Invalid requests are answered at once with their error.
    pub fn add(&mut self, request: Request) {
        let checked = request.validate(self.model.config.vocab_size, self.config.context).and_then(|()| match (&self.decoder, request.params.stop.is_empty()) {
            (None, false) => Err(SampleError::NoDecoder { id: request.id }),
            _ => Ok(()),
        });
        match checked {
            Ok(()) => self.waiting.push_back(Pending { request, added: Instant::now() }),
            Err(e) => self.done.push((request.id, Err(e))),
        }
    }

    /// Results that are ready (finished or refused requests), in completion order.
    pub fn take_done(&mut self) -> Vec<(u64, Result<Completion, SampleError>)> {
        std::mem::take(&mut self.done)
    }

    /// One batched forward + sampling launch. Returns what it did.
    pub fn step(&mut self) -> StepStats {
        let now = Instant::now();
        let (launch_before, wait_before, copy_before) = (self.phase.launch_s, self.phase.wait_s, self.phase.prefix_copy_s);
        let stream = self.stream;
        let stats = stream.enter(|| self.step_inner(now));
        // what the timed parts inside did not cover
        let inner = (self.phase.launch_s - launch_before) + (self.phase.wait_s - wait_before) + (self.phase.prefix_copy_s - copy_before);
        self.phase.schedule_s += (now.elapsed().as_secs_f64() - inner).max(0.0);
        stats
    }

    /// One step as stages: admit, share prefixes, reserve blocks, build rows, launch, read,
    /// retire. A stage that fails fails the step's requests (never silently).
    fn step_inner(&mut self, now: Instant) -> StepStats {
        self.admit(now);
        let mut stats = StepStats { running: self.active.len(), waiting: self.waiting.len(), ..Default::default() };
        if self.active.is_empty() {
            self.in_flight = None; // nobody is left to read it
            return stats;
        }
        match self.launch_and_read(&mut stats) {
            Ok(()) => self.retire(),
            Err(e) => self.fail_all(e.to_string()),
        }
        stats
    }

    /// Admits waiting requests while a slot is free and the cache keeps, beyond what the
    /// running requests are reserved (`EngineConfig::reserve`), the blocks for the next one's
    /// prompt and its reserved share of new tokens (a request admitted only to be preempted
    /// would be wasted work). The first request is always admitted.
    fn admit(&mut self, now: Instant) {
        if self.waiting.is_empty() || self.free_slots.is_empty() {
            return;
        }
        let free = self.cache.free_blocks().unwrap_or(usize::MAX);
        // prompts a later request can share blocks of (`share_prefixes` needs 2+ tokens), held
        // as borrows: a copy of every running prompt each admitting step costs milliseconds at
        // long (agent) prompts
        let sharing = self.config.share_prompt_prefix;
        let shareable = |prompt: &[u32]| sharing && prompt.len() >= 2;
        let mut prompts: std::collections::HashSet<&[u32]> = std::collections::HashSet::new();
        let mut committed = 0;
        for act in &self.active {
            committed += self.blocks_still_reserved(act);
            if shareable(&act.request.prompt) {
                prompts.insert(&act.request.prompt);
            }
        }
        // how many of the queue's head fit, decided before any is moved
        let mut admitted = 0;
        for next in self.waiting.iter().take(self.free_slots.len()) {
            let r = &next.request;
            let target = r.prompt.len() + reserved_new_tokens(r.params.max_new_tokens, self.config.reserve);
            // a group member shares its donor's whole prompt blocks (`share_prefixes`)
            let shared = if prompts.contains(r.prompt.as_slice()) { (r.prompt.len() - 1) / BLOCK } else { 0 };
            let need = KvCache::blocks_for(target).saturating_sub(shared);
            if free < committed + need && (admitted > 0 || !self.active.is_empty()) {
                break;
            }
            committed += need;
            if shareable(&r.prompt) {
                prompts.insert(&r.prompt);
            }
            admitted += 1;
        }
        for _ in 0..admitted {
            let slot = self.free_slots.pop().expect("one free slot per admitted request");
            self.take_waiting(slot, now);
        }
    }

    fn take_waiting(&mut self, slot: u32, now: Instant) {
        let p = self.waiting.pop_front().expect("front exists");
        self.active.push(Active { request: p.request, slot, prefilled: 0, tokens: Vec::new(), logprobs: Vec::new(), top: Vec::new(), routing: Vec::new(), in_flight: 0, added: p.added, admitted: now, first_token: None });
    }

    /// Blocks a running request does not hold yet but is reserved: up to its prompt plus the
    /// tokens it has, plus `reserve` of the new tokens it may still sample.
    fn blocks_still_reserved(&self, act: &Active) -> usize {
        let generated = act.tokens.len() + act.in_flight;
        let left = act.request.params.max_new_tokens.saturating_sub(generated);
        let target = act.request.prompt.len() + generated + reserved_new_tokens(left, self.config.reserve);
        KvCache::blocks_for(target).saturating_sub(self.cache.blocks_held(act.slot as usize))
    }

    /// The step's middle stages: prefixes shared, blocks reserved, rows built and launched, and
    /// the step before read (overlap mode) or this one.
    fn launch_and_read(&mut self, stats: &mut StepStats) -> Result<(), StepError> {
        // requests waiting for a same-prompt donor to finish its prefill skip this step
        let copying = Instant::now();
        let shared = if self.config.share_prompt_prefix { self.share_prefixes(stats) } else { Ok(Vec::new()) };
        self.phase.prefix_copy_s += copying.elapsed().as_secs_f64();
        let mut held = shared?;
        self.reserve_blocks(&mut held, stats);
        // The step before, enqueued but not read yet (overlap mode): a decoding request whose
        // newest token is in it feeds that token to this step straight from the device.
        let previous = self.in_flight.take();
        let built = self.build_rows(&held, previous.as_ref(), stats)?;
        stats.rows = built.rows.len();
        stats.sampled = built.sample_at.len();
        let mut launched = None;
        if !built.rows.is_empty() {
            self.phase.steps += 1;
            let fed = previous.as_ref().filter(|_| built.fed_rows > 0).map(|p| (&p.tokens, built.fed_index.as_slice()));
            launched = self.launch(&built.rows, &built.sample_at, fed).map_err(StepError::Launch)?;
        }
        // read the step before now that this one is queued behind it (overlap), or this one
        let to_read = if self.config.overlap { previous } else { launched.take() };
        if let Some(step) = to_read {
            self.read(step).map_err(StepError::Read)?;
        }
        self.in_flight = launched;
        Ok(())
    }

    /// Finished requests (a stop token, a stop string or the length limit) leave: their slot
    /// and blocks are freed and their completion is done.
    fn retire(&mut self) {
        let decoder = self.decoder.clone();
        let mut still = Vec::with_capacity(self.active.len());
        for act in self.active.drain(..) {
            let finish = act.tokens.last().and_then(|t| {
                let stop_string = || decoder.as_ref().is_some_and(|d| stops::completes_stop_string(&act.tokens, &act.request.params.stop, d));
                if act.request.params.stop_tokens.contains(t) || stop_string() {
                    Some(FinishReason::Stop)
                } else if act.tokens.len() >= act.request.params.max_new_tokens {
                    Some(FinishReason::Length)
                } else {
                    None
                }
            });
            match finish {
                // a token sampled after a stop token (overlap: enqueued before the stop was
                // read) is dropped when its step is read: its owner is gone by then
                Some(finish) => {
                    self.cache.release(act.slot as usize);
                    self.free_slots.push(act.slot);
                    let end = Instant::now();
                    let timings = Timings {
                        queued: act.admitted - act.added,
                        first_token: act.first_token.unwrap_or(end) - act.added,
                        total: end - act.added,
                    };
                    let id = act.request.id;
                    self.done.push((id, Ok(Completion { id, prompt_len: act.request.prompt.len(), tokens: act.tokens, logprobs: act.logprobs, top_logprobs: act.top, routing: act.routing, finish, timings })));
                }
                None => still.push(act),
            }
        }
        self.active = still;
    }

    fn fail_all(&mut self, message: String) {
        self.in_flight = None;
        for act in self.active.drain(..) {
            self.cache.release(act.slot as usize);
            self.free_slots.push(act.slot);
            self.done.push((act.request.id, Err(SampleError::Engine { id: act.request.id, message: message.clone() })));
        }
    }

    /// The blocking batch API: run `requests` to completion (in slots as they free up) and
    /// return their results in the order given.
    pub fn generate(&mut self, requests: Vec<Request>) -> Vec<Result<Completion, SampleError>> {
        let order: Vec<u64> = requests.iter().map(|r| r.id).collect();
        for r in requests {
            self.add(r);
        }
        let mut results: std::collections::HashMap<u64, Result<Completion, SampleError>> = std::collections::HashMap::new();
        loop {
            for (id, r) in self.take_done() {
                results.insert(id, r);
            }
            if self.is_idle() {
                break;
            }
            self.step();
        }
        order.iter().map(|id| results.remove(id).unwrap_or(Err(SampleError::Engine { id: *id, message: "duplicate request id in one batch".into() }))).collect()
    }
}

/// New tokens a request is reserved blocks for: `reserve` of `left`, rounded up.
fn reserved_new_tokens(left: usize, reserve: f32) -> usize {
    (left as f64 * reserve as f64).ceil() as usize
}
