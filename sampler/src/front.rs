//! The tokio front: the engine runs on its own thread (kernel launches block), requests come
//! in over a channel from any number of tasks. A request is answered whole on a oneshot, or
//! streamed: its new tokens after every engine step, then its completion. A request whose
//! answer nobody awaits any more (the client went away) is cancelled, freeing its slot and cache.

use crate::engine::{Engine, Occupancy};
use crate::request::{Completion, Request, SampleError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;
use tokio::sync::{mpsc as tokio_mpsc, oneshot};

/// What a streamed request hears: its tokens as they come (each once, in order), then its end.
#[derive(Debug)]
pub enum StreamEvent {
    Tokens { tokens: Vec<u32>, logprobs: Vec<f32>, top_logprobs: Vec<Vec<(u32, f32)>> },
    Done(Result<Completion, SampleError>),
}

enum Reply {
    Whole(oneshot::Sender<Result<Completion, SampleError>>),
    Stream { events: tokio_mpsc::UnboundedSender<StreamEvent>, sent: Vec<u32>, replay: ReplayCheck },
}

/// How far a streamed request's current run has been checked against what was sent, so each
/// step compares only its new tokens (a full comparison every step is quadratic in the length:
/// ~2 M comparisons a step at 256 requests of 8K tokens).
#[derive(Clone, Default)]
struct ReplayCheck {
    /// Tokens of the current run equal to `sent` (checked or sent by this run).
    checked: usize,
    /// The current run's length at the last look: a shorter run is a new one.
    seen: usize,
    /// The look (one after each engine step) that last found the request running: one that
    /// was missing from a look was preempted (queued again) and runs anew from its prompt.
    last_look: u64,
}

impl ReplayCheck {
    /// Checks the run's tokens at look `look` against those `sent` (only what this run has not
    /// matched yet) and returns where its unsent tokens begin, `None` if it has none.
    fn look(&mut self, tokens: &[u32], sent: &[u32], look: u64, id: u64) -> Result<Option<usize>, SampleError> {
        if tokens.len() < self.seen || self.last_look + 1 != look {
            self.checked = 0; // (maybe) a rerun after a preemption: check it from its first token
        }
        (self.seen, self.last_look) = (tokens.len(), look);
        let upto = tokens.len().min(sent.len());
        if self.checked < upto {
            check_replay(&tokens[self.checked..upto], &sent[self.checked..upto], id)?;
            self.checked = upto;
        }
        if tokens.len() <= sent.len() {
            return Ok(None);
        }
        self.checked = tokens.len();
        Ok(Some(sent.len()))
    }
}

impl Reply {
    fn abandoned(&self) -> bool {
        match self {
            Reply::Whole(tx) => tx.is_closed(),
            Reply::Stream { events, .. } => events.is_closed(),
        }
    }

    fn finish(self, result: Result<Completion, SampleError>) {
        match self {
            Reply::Whole(tx) => {
                let _ = tx.send(result);
            }
            Reply::Stream { events, sent, .. } => {
                let result = result.and_then(|c| check_replay(&c.tokens, &sent, c.id).map(|()| c));
                let _ = events.send(StreamEvent::Done(result));
            }
        }
    }
}

/// A preempted request runs again from its prompt; the tokens it streams the second time must
/// be those it streamed the first (they are: the same bits). Checked, never assumed.
fn check_replay(tokens: &[u32], sent: &[u32], id: u64) -> Result<(), SampleError> {
    let n = tokens.len().min(sent.len());
    if tokens[..n] == sent[..n] {
        Ok(())
    } else {
        Err(SampleError::Engine { id, message: "a preempted request sampled other tokens when it ran again than it had streamed (the sampler is not deterministic here)".into() })
    }
}

/// Upper bounds (seconds) of the latency histograms' buckets: vLLM's for time to first token.
pub const LATENCY_BUCKETS: [f64; 22] = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0];

/// A Prometheus histogram of seconds over [`LATENCY_BUCKETS`] (counts per bucket, not
/// cumulative; the exposition sums them), with the sum in microseconds.
#[derive(Default)]
pub struct LatencyHistogram {
    pub buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    /// Observations past the last bucket (`+Inf`).
    pub over: AtomicU64,
    pub sum_us: AtomicU64,
    pub count: AtomicU64,
}

impl LatencyHistogram {
    pub fn observe(&self, seconds: f64) {
        match LATENCY_BUCKETS.iter().position(|&le| seconds <= le) {
            Some(i) => self.buckets[i].fetch_add(1, Ordering::Relaxed),
            None => self.over.fetch_add(1, Ordering::Relaxed),
        };
        self.sum_us.fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counters and gauges the engine thread keeps for `/metrics`.
#[derive(Default)]
pub struct EngineMetrics {
    /// From the engine's receipt of a choice to its first sampled token (queue and prefill).
    pub time_to_first_token: LatencyHistogram,
    /// From the engine's receipt of a choice to its end (finished, not failed or cancelled).
    pub request_latency: LatencyHistogram,
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
    pub kv_blocks_used: AtomicUsize,
    /// 0 for a contiguous cache.
    pub kv_blocks: AtomicUsize,
    pub steps: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub preemptions: AtomicU64,
    pub finished: AtomicU64,
    pub failed: AtomicU64,
    pub cancelled: AtomicU64,
    /// Where the engine thread's time went, in microseconds: the engine's own phases
    /// (`EnginePhaseTimes`: enqueueing launches, waiting for the device, scheduling) and the
    /// front's work between steps (taking requests, cancelling, handing out tokens), so a
    /// slower step under load shows whether the host or the device took the time.
    pub launch_us: AtomicU64,
    pub wait_us: AtomicU64,
    pub schedule_us: AtomicU64,
    pub between_steps_us: AtomicU64,
    /// Steps replayed as captured graphs (the rest launched op by op).
    pub replayed_steps: AtomicU64,
}

impl EngineMetrics {
    fn record(&self, o: Occupancy) {
        self.running.store(o.running, Ordering::Relaxed);
        self.waiting.store(o.waiting, Ordering::Relaxed);
        self.kv_blocks_used.store(o.kv_blocks_used, Ordering::Relaxed);
        self.kv_blocks.store(o.kv_blocks.unwrap_or(0), Ordering::Relaxed);
    }
}

#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<(Request, Reply)>,
    metrics: Arc<EngineMetrics>,
}

impl EngineHandle {
    /// Moves `engine` onto a dedicated thread. The thread ends when every handle is dropped
    /// and the requests in flight are answered.
    pub fn spawn(engine: Engine) -> Self {
        Self::spawn_joinable(engine).0
    }

    /// [`Self::spawn`], and the engine's thread to join once every handle is dropped: a process
    /// must not exit while that thread is inside a step (the kernels' runtime goes away under it).
    pub fn spawn_joinable(mut engine: Engine) -> (Self, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel::<(Request, Reply)>();
        let metrics = Arc::new(EngineMetrics::default());
        let shared = metrics.clone();
        let thread = std::thread::Builder::new().name("lockstep-sampler".into()).spawn(move || serve_engine(&mut engine, rx, &shared)).expect("spawn sampler thread");
        (Self { tx, metrics }, thread)
    }

    /// Runs `body` with a handle on `engine`, which steps on a scoped thread of its own
    /// meanwhile (the trainer lends its engine to the episodes' server this way and has it
    /// back after). Returns once `body` has returned, every clone of the handle is dropped and
    /// the requests in flight are answered.
    pub fn lend<R>(engine: &mut Engine, body: impl FnOnce(EngineHandle) -> R) -> R {
        let (tx, rx) = mpsc::channel::<(Request, Reply)>();
        let metrics = Arc::new(EngineMetrics::default());
        let shared = metrics.clone();
        std::thread::scope(|scope| {
            std::thread::Builder::new().name("lockstep-sampler".into()).spawn_scoped(scope, move || serve_engine(engine, rx, &shared)).expect("spawn sampler thread");
            body(Self { tx, metrics })
        })
    }

    pub fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    /// Submit a request and wait for its completion (or its error).
    pub async fn submit(&self, request: Request) -> Result<Completion, SampleError> {
        let (reply, answer) = oneshot::channel();
        self.tx.send((request, Reply::Whole(reply))).map_err(|_| SampleError::Closed)?;
        answer.await.map_err(|_| SampleError::Closed)?
    }

    /// Submit a request whose tokens arrive as they are sampled; the last event is `Done`.
    /// Dropping the receiver cancels the request.
    pub fn stream(&self, request: Request) -> Result<tokio_mpsc::UnboundedReceiver<StreamEvent>, SampleError> {
        let (events, receiver) = tokio_mpsc::unbounded_channel();
        self.tx.send((request, Reply::Stream { events, sent: Vec::new(), replay: ReplayCheck::default() })).map_err(|_| SampleError::Closed)?;
        Ok(receiver)
    }
}

/// The engine thread: take requests, step, hand out tokens and results, cancel the abandoned.
fn serve_engine(engine: &mut Engine, rx: mpsc::Receiver<(Request, Reply)>, metrics: &EngineMetrics) {
    let mut waiting: HashMap<u64, Reply> = HashMap::new();
    // when each choice came, and whether its first token has been seen (the latency histograms)
    let mut arrived: HashMap<u64, (Instant, bool)> = HashMap::new();
    let mut open = true;
    let mut looks = 0u64;
    let accept = |engine: &mut Engine, waiting: &mut HashMap<u64, Reply>, arrived: &mut HashMap<u64, (Instant, bool)>, (req, reply): (Request, Reply)| {
        if waiting.contains_key(&req.id) {
            reply.finish(Err(SampleError::Engine { id: req.id, message: "a request with this id is already running".into() }));
            return;
        }
        metrics.prompt_tokens.fetch_add(req.prompt.len() as u64, Ordering::Relaxed);
        waiting.insert(req.id, reply);
        arrived.insert(req.id, (Instant::now(), false));
        engine.add(req);
    };
    loop {
        // idle: block for work; busy: take whatever has arrived and keep stepping
        if engine.is_idle() && open {
            metrics.record(engine.occupancy());
            match rx.recv() {
                Ok(submitted) => accept(engine, &mut waiting, &mut arrived, submitted),
                Err(_) => open = false,
            }
        }
        let taking = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(submitted) => accept(engine, &mut waiting, &mut arrived, submitted),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let gone: Vec<u64> = waiting.iter().filter(|(_, r)| r.abandoned()).map(|(&id, _)| id).collect();
        for id in gone {
            waiting.remove(&id);
            arrived.remove(&id);
            if engine.cancel(id) {
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
        }
        let between = taking.elapsed();
        let before = engine.phase_times().clone();
        let stats = engine.step();
        let after = engine.phase_times();
        let us = |s: f64| (s.max(0.0) * 1e6) as u64;
        metrics.launch_us.fetch_add(us(after.launch_s - before.launch_s), Ordering::Relaxed);
        metrics.wait_us.fetch_add(us(after.wait_s - before.wait_s), Ordering::Relaxed);
        metrics.replayed_steps.fetch_add((after.replayed_steps - before.replayed_steps) as u64, Ordering::Relaxed);
        metrics.schedule_us.fetch_add(us(after.schedule_s + after.prefix_copy_s - before.schedule_s - before.prefix_copy_s), Ordering::Relaxed);
        let stepped = Instant::now();
        metrics.steps.fetch_add(1, Ordering::Relaxed);
        metrics.generated_tokens.fetch_add(stats.sampled as u64, Ordering::Relaxed);
        metrics.preemptions.fetch_add(stats.preempted as u64, Ordering::Relaxed);
        for (id, tokens, _, _) in engine.partial() {
            if let Some((at, first @ false)) = arrived.get_mut(&id) {
                if !tokens.is_empty() {
                    metrics.time_to_first_token.observe(at.elapsed().as_secs_f64());
                    *first = true;
                }
            }
        }
        looks += 1;
        for id in stream_new_tokens(engine, &mut waiting, looks) {
            engine.cancel(id);
            arrived.remove(&id);
            metrics.failed.fetch_add(1, Ordering::Relaxed);
        }
        for (id, result) in engine.take_done() {
            let came = arrived.remove(&id);
            if let Some(reply) = waiting.remove(&id) {
                let counter = if result.is_ok() { &metrics.finished } else { &metrics.failed };
                counter.fetch_add(1, Ordering::Relaxed);
                if let (Ok(_), Some((at, first))) = (&result, came) {
                    let seconds = at.elapsed().as_secs_f64();
                    if !first {
                        metrics.time_to_first_token.observe(seconds); // done in the step of its first token
                    }
                    metrics.request_latency.observe(seconds);
                }
                reply.finish(result);
            }
        }
        metrics.record(engine.occupancy());
        // this step's deliveries, and the taking of requests before it (not an idle wait)
        metrics.between_steps_us.fetch_add(us((stepped.elapsed() + between).as_secs_f64()), Ordering::Relaxed);
        if !open && engine.is_idle() {
            break;
        }
    }
}

/// Sends each streamed request the tokens it has beyond those already sent. Returns the requests
/// that failed the replay check (answered with their error, to be cancelled).
fn stream_new_tokens(engine: &Engine, waiting: &mut HashMap<u64, Reply>, look: u64) -> Vec<u64> {
    let mut failed = Vec::new();
    for (id, tokens, logprobs, top) in engine.partial() {
        let Some(Reply::Stream { events, sent, replay }) = waiting.get_mut(&id) else { continue };
        let from = match replay.look(tokens, sent, look, id) {
            Ok(Some(from)) => from,
            Ok(None) => continue, // rerunning after a preemption, not past what was sent yet
            Err(e) => {
                let _ = events.send(StreamEvent::Done(Err(e)));
                failed.push(id);
                continue;
            }
        };
        sent.extend_from_slice(&tokens[from..]);
        let top_logprobs = top.get(from..).map_or_else(Vec::new, <[_]>::to_vec);
        let _ = events.send(StreamEvent::Tokens { tokens: tokens[from..].to_vec(), logprobs: logprobs[from..].to_vec(), top_logprobs });
    }
    for id in &failed {
        waiting.remove(id);
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::ReplayCheck;

    /// A streamed request's tokens are checked once each, and a rerun after a preemption (the
    /// request missing from a look, or shorter) is checked from its first token: a rerun that
    /// differs anywhere in what was sent is caught, however short the first run was.
    #[test]
    fn a_rerun_is_checked_from_its_first_token_and_a_divergence_is_caught() {
        let mut sent = Vec::new();
        let mut r = ReplayCheck::default();
        let mut step = |r: &mut ReplayCheck, sent: &mut Vec<u32>, tokens: &[u32], look| {
            let from = r.look(tokens, sent, look, 7);
            if let Ok(Some(from)) = from {
                sent.extend_from_slice(&tokens[from..]);
            }
            from.map_err(|_| ())
        };
        assert_eq!(step(&mut r, &mut sent, &[5], 1), Ok(Some(0)));
        assert_eq!(step(&mut r, &mut sent, &[5, 6], 2), Ok(Some(1)));
        assert_eq!(step(&mut r, &mut sent, &[5, 6], 3), Ok(None)); // no new token this step
        // preempted at look 4 (missing), rerun: the same tokens pass, then new ones are sent
        assert_eq!(step(&mut r, &mut sent, &[5], 5), Ok(None));
        assert_eq!(step(&mut r, &mut sent, &[5, 6], 6), Ok(None));
        assert_eq!(step(&mut r, &mut sent, &[5, 6, 8], 7), Ok(Some(2)));
        assert_eq!(sent, [5, 6, 8]);
        // a rerun that differs at its first token, seen at a length the old run had passed
        let mut other = r.clone();
        assert_eq!(step(&mut other, &mut sent.clone(), &[9, 6, 8], 9), Err(()));
        // ... or at one already checked, the request never missing from a look but shorter
        assert_eq!(step(&mut r, &mut sent.clone(), &[5, 7], 8), Err(()));
        // a first run of one token, preempted, rerun to one other token
        let (mut one, mut sent_one) = (ReplayCheck::default(), Vec::new());
        assert_eq!(step(&mut one, &mut sent_one, &[3], 1), Ok(Some(0)));
        assert_eq!(step(&mut one, &mut sent_one, &[4], 3), Err(()));
    }
}
