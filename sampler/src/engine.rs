//! The continuous-batching loop.
//!
//! Each `step` builds one list of rows for the model: for every admitted request still in
//! prefill, its next `chunk_size` prompt tokens; for every decoding request, its last sampled
//! token. One forward over all rows, then one sampling launch over the rows that end a prompt
//! or are decode tokens. Which requests share a step changes all the time; lockstep's kernels
//! make that irrelevant to every bit.

use crate::request::{Completion, FinishReason, Request, SampleError, Timings};
use burn::tensor::{DType, Int, Tensor};
use shared_kernels::model::{KernelSet, KvCache, Qwen3, Rows};
use shared_kernels::ops::attention::BLOCK;
use shared_kernels::{bridge::ReadBack, row_rng_key, sample, SamplingRow};
use std::collections::VecDeque;
use std::time::Instant;

#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// The most requests running at once.
    pub max_batch: usize,
    /// KV cache blocks of [`BLOCK`] positions shared by all running requests (0: enough for
    /// `max_batch` requests of `context` tokens). A request takes blocks as it grows and gives
    /// them back when it finishes; when none is left the newest request is preempted (its
    /// blocks freed, it starts again later: the same tokens and bits, batch invariance and
    /// per-(request, position) random keys make the rerun equal).
    pub kv_blocks: usize,
    /// Tokens per slot: prompt + generated tokens must fit.
    pub context: usize,
    /// Prompt tokens per request per step while prefilling.
    pub chunk_size: usize,
    /// Requests with the same prompt (a GRPO group) prefill it once: the first prefills, the
    /// others copy its KV for all prompt tokens but the last and prefill only that one. The
    /// kernels are chunk invariant, so the copied rows are the very bits each would compute.
    pub share_prompt_prefix: bool,
    /// Enqueue each step before reading the previous step's tokens, so the host builds and
    /// launches step N+1 while the device runs step N (decode rows take their token straight
    /// from step N's device output). Same tokens and bits either way; a request that samples a
    /// stop token costs one more row, whose token is dropped.
    pub overlap: bool,
}

impl EngineConfig {
    /// `max_batch` requests at once over as many cache blocks as fit in `kv_budget_bytes`
    /// (0: enough blocks for `max_batch` requests of `context` tokens).
    pub fn from_budget(model: &Qwen3, kv_budget_bytes: usize, context: usize, max_batch: usize, chunk_size: usize) -> Result<Self, String> {
        let c = &model.config;
        let per_block = 2 * c.num_layers * BLOCK * c.num_kv_heads * c.head_dim * model.dtype.size();
        let width = KvCache::blocks_for(context);
        let kv_blocks = if kv_budget_bytes == 0 { max_batch * width } else { kv_budget_bytes / per_block.max(1) };
        if kv_blocks < width {
            return Err(format!("KV budget of {kv_budget_bytes} bytes holds {kv_blocks} blocks of {BLOCK} positions ({per_block} bytes each), fewer than one request of {context} tokens needs ({width})"));
        }
        Ok(Self { max_batch, kv_blocks, context, chunk_size, share_prompt_prefix: true, overlap: true })
    }
}

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
    /// Tokens sampled for it by a step that has not been read yet (0 or 1 between steps).
    in_flight: usize,
    added: Instant,
    admitted: Instant,
    first_token: Option<Instant>,
}

/// A step's sampled tokens and logprobs on the device, not read yet.
struct InFlight {
    /// On the device: the next step's decode rows read their token from here.
    tokens: Tensor<1, Int>,
    /// Logprobs and tokens on their way to the host.
    copy: ReadBack,
    /// The request each sampled row belongs to, in row order.
    owners: Vec<u64>,
}

/// What one step did, for progress bars and benchmarks.
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

/// Where the engine's wall-clock time went since the last [`Engine::take_phase_times`], as the
/// host sees it: enqueueing a step's launches returns before the device has run them, and the
/// read-back of the sampled tokens waits for all of it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnginePhaseTimes {
    /// Engine steps (batched forwards) run.
    pub steps: usize,
    /// Enqueueing each step's forward and sampling launches (host work, kernel launches, allocations).
    pub launch_s: f64,
    /// Waiting for each step's tokens and logprobs to come back (device time not hidden by the host).
    pub wait_s: f64,
    /// Copying shared prompt prefixes between cache slots.
    pub prefix_copy_s: f64,
    /// Everything else in `step`: admitting requests, building rows, retiring finished ones.
    pub schedule_s: f64,
    /// Requests preempted for want of cache blocks (each runs again from its prompt).
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
}

impl Engine {
    pub fn new(model: Qwen3, config: EngineConfig) -> Result<Self, String> {
        if config.max_batch == 0 || config.context == 0 || config.chunk_size == 0 {
            return Err(format!("engine config needs max_batch, context and chunk_size >= 1, got {config:?}"));
        }
        if config.context > model.config.max_position_embeddings {
            return Err(format!("context {} exceeds the model's max_position_embeddings {}", config.context, model.config.max_position_embeddings));
        }
        let model = decode_ready(model)?;
        let device = model.embed.device();
        let blocks = if config.kv_blocks == 0 { config.max_batch * KvCache::blocks_for(config.context) } else { config.kv_blocks };
        let cache = KvCache::paged(&model.config, config.max_batch, config.context, blocks, model.dtype, &device).map_err(|e| e.to_string())?;
        let free_slots = (0..config.max_batch as u32).rev().collect();
        Ok(Self { phase: EnginePhaseTimes::default(), model, config, cache, free_slots, waiting: VecDeque::new(), active: Vec::new(), done: Vec::new(), in_flight: None })
    }

    pub fn model(&self) -> &Qwen3 {
        &self.model
    }

    /// Replace the weights (after an optimizer step); only between rollouts.
    pub fn set_model(&mut self, model: Qwen3) -> Result<(), String> {
        if !self.is_idle() {
            return Err("set_model while requests are running".into());
        }
        self.model = decode_ready(model)?;
        Ok(())
    }

    /// The phase times accumulated since the last call, and a fresh start.
    pub fn take_phase_times(&mut self) -> EnginePhaseTimes {
        std::mem::take(&mut self.phase)
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
        match request.validate(self.model.config.vocab_size, self.config.context) {
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
        let stats = self.step_inner(now);
        // what the timed parts inside did not cover
        let inner = (self.phase.launch_s - launch_before) + (self.phase.wait_s - wait_before) + (self.phase.prefix_copy_s - copy_before);
        self.phase.schedule_s += (now.elapsed().as_secs_f64() - inner).max(0.0);
        stats
    }

    fn step_inner(&mut self, now: Instant) -> StepStats {
        // admitted while a slot and the blocks for its prompt are free (a request admitted
        // only to be preempted at once would be wasted work)
        while let (Some(next), Some(slot)) = (self.waiting.front(), self.free_slots.last().copied()) {
            if self.cache.free_blocks().unwrap_or(usize::MAX) < KvCache::blocks_for(next.request.prompt.len()) && !self.active.is_empty() {
                break;
            }
            self.free_slots.pop();
            let p = self.waiting.pop_front().expect("front exists");
            self.active.push(Active { request: p.request, slot, prefilled: 0, tokens: Vec::new(), logprobs: Vec::new(), in_flight: 0, added: p.added, admitted: now, first_token: None });
        }
        let mut stats = StepStats { running: self.active.len(), waiting: self.waiting.len(), ..Default::default() };
        if self.active.is_empty() {
            self.in_flight = None; // nobody is left to read it
            return stats;
        }
        // requests waiting for a same-prompt donor to finish its prefill skip this step
        let copying = Instant::now();
        let shared = if self.config.share_prompt_prefix { self.share_prefixes(&mut stats) } else { Ok(Vec::new()) };
        self.phase.prefix_copy_s += copying.elapsed().as_secs_f64();
        let mut held = match shared {
            Ok(held) => held,
            Err(e) => {
                // a failed copy fails the step's requests, as a failed forward does
                self.fail_all(e.to_string());
                return stats;
            }
        };
        self.reserve_blocks(&mut held, &mut stats);
        // The step before, enqueued but not read yet (overlap mode): a decoding request whose
        // newest token is in it feeds that token to this step straight from the device.
        let previous = self.in_flight.take();
        let previous_row: std::collections::HashMap<u64, i32> = previous.iter().flat_map(|p| p.owners.iter().enumerate().map(|(i, &id)| (id, i as i32))).collect();
        // fed rows first (their tokens are on the device), then rows whose tokens the host has;
        // row order does not change a bit (batch invariance)
        let (mut fed, mut fed_index, mut fed_sampled) = (Rows::default(), Vec::new(), Vec::new());
        let (mut host, mut host_sampled) = (Rows::default(), Vec::new());
        let mut lost = None;
        let mut prefilled_to = Vec::new(); // (active index, prompt tokens in the cache after this step)
        for (a, act) in self.active.iter().enumerate() {
            if held.get(a).copied().unwrap_or(false) {
                continue;
            }
            let prompt = &act.request.prompt;
            if act.prefilled < prompt.len() {
                let end = (act.prefilled + self.config.chunk_size).min(prompt.len());
                for p in act.prefilled..end {
                    host.push(prompt[p], act.slot, p as u32);
                }
                stats.prefill_rows += end - act.prefilled;
                prefilled_to.push((a, end));
                if end == prompt.len() {
                    host_sampled.push((a, host.len() - 1));
                }
            } else {
                let generated = act.tokens.len() + act.in_flight;
                if generated >= act.request.params.max_new_tokens {
                    continue; // its last token is in flight; it finishes when that is read
                }
                let position = (prompt.len() + generated - 1) as u32;
                match (act.in_flight > 0, previous_row.get(&act.request.id), act.tokens.last()) {
                    (true, Some(&i), _) => {
                        fed.push(0, act.slot, position);
                        fed_index.push(i);
                        fed_sampled.push((a, fed.len() - 1));
                    }
                    (false, _, Some(&last)) => {
                        host.push(last, act.slot, position);
                        host_sampled.push((a, host.len() - 1));
                    }
                    _ => lost = Some(act.request.id),
                }
                stats.decode_rows += 1;
            }
        }
        if let Some(id) = lost {
            self.fail_all(format!("engine bookkeeping: request {id} decodes but its last token is neither read nor in the step in flight"));
            return stats;
        }
        for (a, end) in prefilled_to {
            self.active[a].prefilled = end;
        }
        let k = fed.len();
        let mut rows = fed;
        for r in 0..host.len() {
            rows.push(host.tokens[r], host.slots[r], host.positions[r]);
        }
        let sample_at: Vec<(usize, usize)> = fed_sampled.into_iter().chain(host_sampled.into_iter().map(|(a, r)| (a, k + r))).collect();
        stats.rows = rows.len();
        stats.sampled = sample_at.len();
        let mut launched = None;
        if !rows.is_empty() {
            self.phase.steps += 1;
            let fed = previous.as_ref().filter(|_| k > 0).map(|p| (&p.tokens, fed_index.as_slice()));
            match self.launch(&rows, &sample_at, fed) {
                Ok(step) => launched = step,
                Err(e) => {
                    // a failed launch fails the requests of this step, never silently
                    self.fail_all(e);
                    return stats;
                }
            }
        }
        // read the step before now that this one is queued behind it (overlap), or this one
        let to_read = if self.config.overlap { previous } else { launched.take() };
        if let Some(step) = to_read {
            if let Err(e) = self.read(step) {
                self.fail_all(e);
                return stats;
            }
        }
        self.in_flight = launched;
        let mut still = Vec::with_capacity(self.active.len());
        for act in self.active.drain(..) {
            let finish = act.tokens.last().and_then(|t| {
                if act.request.params.stop_tokens.contains(t) {
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
                    self.done.push((id, Ok(Completion { id, prompt_len: act.request.prompt.len(), tokens: act.tokens, logprobs: act.logprobs, finish, timings })));
                }
                None => still.push(act),
            }
        }
        self.active = still;
        stats
    }

    fn fail_all(&mut self, message: String) {
        self.in_flight = None;
        for act in self.active.drain(..) {
            self.cache.release(act.slot as usize);
            self.free_slots.push(act.slot);
            self.done.push((act.request.id, Err(SampleError::Engine { id: act.request.id, message: message.clone() })));
        }
    }

    /// Before a step's rows are built: every request that has not started its prefill and
    /// shares its prompt (of 2+ tokens) with an earlier active request (the donor) either copies
    /// the donor's KV for the first `len - 1` prompt positions, when the donor has written them
    /// (in earlier steps), or is held until it has. Returns which active requests are held (a
    /// mask: the step's row loop looks each one up, ~1000 requests in a GRPO step).
    fn share_prefixes(&mut self, stats: &mut StepStats) -> Result<Vec<bool>, shared_kernels::KernelError> {
        let mut held = vec![false; self.active.len()];
        let mut donors: std::collections::HashMap<&[u32], usize> = std::collections::HashMap::new();
        let mut copies: Vec<(usize, usize)> = Vec::new();
        for (a, act) in self.active.iter().enumerate() {
            let prompt = act.request.prompt.as_slice();
            if prompt.len() < 2 {
                continue;
            }
            match donors.get(prompt) {
                Some(&d) if act.prefilled == 0 => {
                    if self.active[d].prefilled >= prompt.len() - 1 {
                        copies.push((d, a));
                    } else {
                        held[a] = true;
                    }
                }
                Some(_) => {}
                None => {
                    donors.insert(prompt, a);
                }
            }
        }
        let slot_copies: Vec<(usize, usize, usize)> = copies.iter().map(|&(d, a)| (self.active[d].slot as usize, self.active[a].slot as usize, self.active[a].request.prompt.len() - 1)).collect();
        // a copy with no free block for its prompt's partial block is not made: that request
        // prefills its prompt itself
        let made = self.cache.copy_prefixes(&slot_copies)?;
        for (&(_, a), (&(_, _, n), made)) in copies.iter().zip(slot_copies.iter().zip(made)) {
            if made {
                self.active[a].prefilled = n;
                stats.shared_prefix_tokens += n;
            }
        }
        Ok(held)
    }

    /// Before a step's rows are built: every running request gets the cache blocks for the
    /// positions it writes in this step (its next prompt chunk, or its decode position). When
    /// the cache has none left, the newest request is preempted (blocks released, back to the
    /// front of the queue) until the older ones fit; a request the step cannot serve is never
    /// given a row. `held` (the requests waiting for a prefix donor) is kept in step.
    fn reserve_blocks(&mut self, held: &mut Vec<bool>, stats: &mut StepStats) {
        held.resize(self.active.len(), false);
        let mut a = 0;
        while a < self.active.len() {
            let act = &self.active[a];
            let prompt = act.request.prompt.len();
            let generated = act.tokens.len() + act.in_flight;
            let need = if held[a] {
                0
            } else if act.prefilled < prompt {
                (act.prefilled + self.config.chunk_size).min(prompt)
            } else if generated >= act.request.params.max_new_tokens {
                0
            } else {
                prompt + generated
            };
            if self.cache.reserve(act.slot as usize, need) {
                a += 1;
                continue;
            }
            // the newest goes first; when that is this request, it waits itself
            let victim = self.active.len() - 1;
            let act = self.active.remove(victim);
            held.remove(victim);
            self.cache.release(act.slot as usize);
            self.free_slots.push(act.slot);
            self.waiting.push_front(Pending { request: act.request, added: act.added });
            stats.preempted += 1;
            self.phase.preempted += 1;
        }
    }

    /// Enqueues a step's forward and sampling; `None` when no row is sampled (prompt chunks
    /// that end no prompt). Nothing is read back here.
    fn launch(&mut self, rows: &Rows, sample_at: &[(usize, usize)], fed: Option<(&Tensor<1, Int>, &[i32])>) -> Result<Option<InFlight>, String> {
        let launching = Instant::now();
        // logits only for the rows that are sampled (the last row of a prompt, decode rows)
        let at: Vec<usize> = sample_at.iter().map(|&(_, r)| r).collect();
        let logits = match fed {
            Some(fed) => self.model.forward_at_fed(rows, Some(&mut self.cache), &at, fed),
            None => self.model.forward_at(rows, Some(&mut self.cache), &at),
        };
        let Some(picked) = logits.map_err(|e| e.to_string())? else {
            self.phase.launch_s += launching.elapsed().as_secs_f64();
            return Ok(None);
        };
        let params: Vec<SamplingRow> = sample_at
            .iter()
            .map(|&(a, _)| {
                let act = &self.active[a];
                let p = &act.request.params;
                let position = (act.request.prompt.len() + act.tokens.len() + act.in_flight) as u32;
                SamplingRow { temperature: p.temperature, top_k: p.top_k, top_p: p.top_p, rng_key: row_rng_key(p.seed, act.request.id, position) }
            })
            .collect();
        let (tokens, logprobs) = sample(picked, &params).map_err(|e| e.to_string())?;
        // the copy to the host is queued right behind this step, so a later step enqueued
        // before the wait does not delay it
        let copy = ReadBack::start(vec![logprobs.cast(DType::F32)], vec![tokens.clone()]).map_err(|e| e.to_string())?;
        let owners = sample_at.iter().map(|&(a, _)| self.active[a].request.id).collect();
        for &(a, _) in sample_at {
            self.active[a].in_flight += 1;
        }
        self.phase.launch_s += launching.elapsed().as_secs_f64();
        Ok(Some(InFlight { tokens, copy, owners }))
    }

    /// Waits for a step's tokens and logprobs and hands them to the requests still active.
    fn read(&mut self, step: InFlight) -> Result<(), String> {
        let waiting = Instant::now();
        // A failed launch anywhere in the forward surfaces here, at the first read: an error for
        // this step's requests, not a panic of the engine.
        let mut data = step.copy.wait().map_err(|e| format!("the device failed while computing this step: {e}"))?.into_iter();
        let (Some(logprobs), Some(tokens)) = (data.next(), data.next()) else {
            return Err("the step's read-back returned fewer tensors than asked".into());
        };
        let tokens = tokens.convert::<i64>().try_to_vec::<i64>().map_err(|e| format!("{e:?}"))?;
        let logprobs = logprobs.try_to_vec::<f32>().map_err(|e| format!("{e:?}"))?;
        self.phase.wait_s += waiting.elapsed().as_secs_f64();
        let now = Instant::now();
        let index: std::collections::HashMap<u64, usize> = self.active.iter().enumerate().map(|(a, act)| (act.request.id, a)).collect();
        for (i, id) in step.owners.iter().enumerate() {
            if let Some(&a) = index.get(id) {
                let act = &mut self.active[a];
                act.tokens.push(tokens[i] as u32);
                act.logprobs.push(logprobs[i]);
                act.in_flight -= 1;
                act.first_token.get_or_insert(now);
            }
        }
        Ok(())
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

/// The engine's copy of the weights: in cubecl's persistent pool (see [`Qwen3::into_resident`]),
/// and, for the invariant kernel set, with fused projections (fewer launches, same bits) unless
/// `LOCKSTEP_DECODE_FUSION=off` (benchmarks compare the two); the ablation's kernel sets keep
/// the unfused forward they were measured with.
fn decode_ready(model: Qwen3) -> Result<Qwen3, String> {
    let fuse = match shared_kernels::knobs::var("LOCKSTEP_DECODE_FUSION").as_deref().ok_or(()) {
        Err(_) | Ok("on") => true,
        Ok("off") => false,
        Ok(other) => return Err(format!("LOCKSTEP_DECODE_FUSION={other:?} is not one of on, off")),
    };
    let fuse = fuse && model.kernels == KernelSet::Matched;
    model.into_resident(fuse).map_err(|e| format!("copying the weights for the engine: {e}"))
}
