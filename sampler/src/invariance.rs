//! The engine's invariance checks, shared by the CI tests (which assert) and `lockstep check`
//! (which runs them on the GPU and prints a table):
//!
//! (a)–(c) one target request gives the same tokens and logprob bits alone (batch 1, whole
//!         prompt in one chunk) as among 0..=63 random neighbours arriving at random steps,
//!         under several max-batch and chunk sizes;
//! (d)     every sampled logprob equals, as bits, the training path's logprob of that token;
//! (e)     the tokio front gives the blocking API's bits under concurrent submissions;
//! (f)–(i) the engine's modes give the plain engine's bits: shared prompt KV, overlapped steps,
//!         a paged cache too small for the running requests, steps replayed as graphs.
//!
//! Every request draws its own prompt, length, temperature, top-k/top-p, stop token, seed,
//! logprob mode (raw or processed) and `top_logprobs` (0 or 3).
//! The graphs check is in `invariance/graphs.rs`; [`run_all`] is the one list `lockstep check`
//! and the CI tests run.

use crate::engine::{completes_stop_string, Decoder};
use crate::{Completion, Engine, EngineConfig, EngineHandle, FinishReason, Request, SampleError, SamplingParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shared_kernels::model::{KernelSet, Qwen3};

/// Tokens per cache slot in the checks (prompts up to 39 tokens, up to 23 new ones).
pub const CONTEXT: usize = 80;

mod bits;
mod graphs;
mod top_lists;

pub use bits::{bits, Bits};
use bits::first_difference;
pub use graphs::graphs_replay_the_launched_steps;

/// (max_batch, chunk_size, neighbours) of the "among others" scenarios.
pub const SCENARIOS: [(usize, usize, usize); 6] = [(1, 1, 0), (4, 3, 1), (16, 7, 12), (64, 16, 63), (7, 100, 30), (2, 32, 5)];

/// One line of the report.
#[derive(Clone, Debug)]
pub struct EngineCheck {
    pub name: String,
    /// `None` when it passed; what differed otherwise.
    pub failure: Option<String>,
}

impl EngineCheck {
    fn new(name: String, failure: Option<String>) -> Self {
        Self { name, failure }
    }
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }
}

/// A random valid request for a model with `vocab` tokens and a context of [`CONTEXT`].
pub fn random_request(rng: &mut StdRng, id: u64, vocab: usize) -> Request {
    let len = rng.random_range(1..40);
    Request {
        id,
        prompt: (0..len).map(|_| rng.random_range(0..vocab as u32)).collect(),
        params: SamplingParams {
            temperature: [1.0, 0.7, 0.0, 1.3][rng.random_range(0..4)],
            top_k: [0, 5, 20][rng.random_range(0..3)],
            top_p: [1.0, 0.9, 0.6][rng.random_range(0..3)],
            max_new_tokens: rng.random_range(1..24),
            stop_tokens: vec![rng.random_range(0..vocab as u32)],
            // none, or one or two strings of one or two letters (`letters_decoder`'s text)
            stop: (0..rng.random_range(0..3)).map(|_| (0..rng.random_range(1..3)).map(|_| (b'a' + rng.random_range(0..26u8)) as char).collect()).collect(),
            seed: rng.random(),
            noise_key: None, processed_logprobs: rng.random_bool(0.5),
            // most ask for no alternatives; some for a few (their logits then skip the graphs)
            top_logprobs: [0, 0, 3][rng.random_range(0..3)],
        },
    }
}

pub fn engine(model: &Qwen3, max_batch: usize, chunk_size: usize) -> Engine {
    engine_sharing(model, max_batch, chunk_size, true)
}

pub fn engine_sharing(model: &Qwen3, max_batch: usize, chunk_size: usize, share_prompt_prefix: bool) -> Engine {
    engine_with(model, EngineConfig { max_batch, kv_blocks: 0, context: CONTEXT, chunk_size, share_prompt_prefix, overlap: true, reserve: 1.0 })
}

/// Token id to a letter (`'a' + id % 26`): the checks' text, for stop strings.
pub fn letters_decoder() -> Decoder {
    std::sync::Arc::new(|ids: &[u32]| Some(ids.iter().map(|&i| (b'a' + (i % 26) as u8) as char).collect()))
}

/// An engine of `config` decoding with [`letters_decoder`].
pub fn engine_with(model: &Qwen3, config: EngineConfig) -> Engine {
    let mut e = Engine::new(model.clone(), config).expect("valid engine config");
    e.set_decoder(letters_decoder());
    e
}

/// Runs `target` among `others`, each added at a random step; every result, in completion order.
pub fn run_among(model: &Qwen3, target: &Request, others: &[Request], max_batch: usize, chunk: usize, rng: &mut StdRng) -> Vec<(u64, Result<Completion, SampleError>)> {
    let mut e = engine(model, max_batch, chunk);
    let mut pending: Vec<(usize, Request)> = others.iter().map(|r| (rng.random_range(0..30), r.clone())).collect();
    pending.push((rng.random_range(0..10), target.clone()));
    let mut results = Vec::new();
    let mut step = 0;
    while !pending.is_empty() || !e.is_idle() {
        pending.retain(|(at, r)| {
            if *at <= step {
                e.add(r.clone());
                false
            } else {
                true
            }
        });
        e.step();
        results.extend(e.take_done());
        step += 1;
    }
    results.extend(e.take_done());
    results
}

/// (a)–(c): the target's bits alone against each of [`SCENARIOS`].
pub fn alone_vs_among(model: &Qwen3, rng: &mut StdRng) -> Vec<EngineCheck> {
    let vocab = model.config.vocab_size;
    let target = random_request(rng, 1_000_000, vocab);
    let want = match engine(model, 1, 1000).generate(vec![target.clone()]).remove(0) {
        Ok(c) => bits(&c),
        Err(e) => return vec![EngineCheck::new("target alone".into(), Some(format!("failed: {e}")))],
    };
    SCENARIOS
        .iter()
        .map(|&(max_batch, chunk, neighbours)| {
            let name = format!("alone = among {neighbours} neighbours, max_batch {max_batch}, chunk {chunk}");
            let others: Vec<Request> = (0..neighbours).map(|i| random_request(rng, i as u64, vocab)).collect();
            let results = run_among(model, &target, &others, max_batch, chunk, rng);
            let failure = if results.len() != neighbours + 1 {
                Some(format!("{} results for {} requests", results.len(), neighbours + 1))
            } else if let Some((id, Err(e))) = results.iter().find(|(_, r)| r.is_err()) {
                Some(format!("request {id} failed: {e}"))
            } else {
                let got = results.iter().find(|(id, _)| *id == target.id).and_then(|(_, r)| r.as_ref().ok()).map(bits);
                match got {
                    Some(g) if g == want => None,
                    Some(g) => Some(first_difference(&want, &g, ["alone", "among others"])),
                    None => Some("the target got no result".into()),
                }
            };
            EngineCheck::new(name, failure)
        })
        .collect()
}

/// (d): sampler logprob bits = training-path logprob bits for `n` random requests. The trainer
/// always scores on lockstep's kernels, whatever kernel set the sampler's model runs.
pub fn sampler_equals_trainer(model: &Qwen3, rng: &mut StdRng, n: usize) -> EngineCheck {
    let mut trainer_model = model.clone();
    trainer_model.kernels = KernelSet::Matched;
    sampler_matches_scorer(model, &trainer_model, rng, n)
}

/// (d) with the sampler on `model` and the training path on `trainer_model` (the same weights
/// in real use; other weights in the test that proves this check can fail).
pub fn sampler_matches_scorer(model: &Qwen3, trainer_model: &Qwen3, rng: &mut StdRng, n: usize) -> EngineCheck {
    let requests: Vec<Request> = (0..n as u64).map(|i| random_request(rng, i, model.config.vocab_size)).collect();
    let results = engine(model, 5, 6).generate(requests.clone());
    let mut tokens = 0;
    for (req, res) in requests.iter().zip(results) {
        let c = match res {
            Ok(c) => c,
            Err(e) => return EngineCheck::new("sampler = trainer".into(), Some(format!("request {} failed: {e}", req.id))),
        };
        let mut seq = req.prompt.clone();
        seq.extend(&c.tokens);
        let trainer = match trainer_model.sequence_logprobs(&[seq], req.params.logprob_distribution()) {
            Ok(scores) => scores.per_sequence,
            Err(e) => return EngineCheck::new("sampler = trainer".into(), Some(format!("training path failed: {e}"))),
        };
        let trainer: Vec<u32> = trainer[0][req.prompt.len() - 1..].iter().map(|v| v.to_bits()).collect();
        let sampled = bits(&c).1;
        if let Some(i) = (0..sampled.len()).find(|&i| trainer.get(i) != Some(&sampled[i])) {
            let (p, kind) = (&req.params, if req.params.processed_logprobs { "processed" } else { "raw" });
            let detail = format!("request {} token {} (id {}; T {} top-k {} top-p {} {kind} logprobs): sampler bits {:#010x}, trainer {:?}", req.id, i, c.tokens[i], p.temperature, p.top_k, p.top_p, sampled[i], trainer.get(i).map(|b| format!("{b:#010x}")));
            return EngineCheck::new("sampler = trainer".into(), Some(detail));
        }
        if let Some(problem) = top_lists::problem(req, &c, &trainer) {
            return EngineCheck::new("sampler = trainer".into(), Some(problem));
        }
        let finish_ok = match c.finish {
            FinishReason::Stop => req.params.stop_tokens.contains(c.tokens.last().unwrap_or(&u32::MAX)) || completes_stop_string(&c.tokens, &req.params.stop, &letters_decoder()),
            FinishReason::Length => c.tokens.len() == req.params.max_new_tokens,
        };
        // and no shorter prefix held a stop string: the request stopped at the first one
        let stopped_late = (1..c.tokens.len()).any(|k| completes_stop_string(&c.tokens[..k], &req.params.stop, &letters_decoder()));
        if !finish_ok || stopped_late || c.tokens.len() > req.params.max_new_tokens {
            return EngineCheck::new("sampler = trainer".into(), Some(format!("request {}: {} tokens, finish {:?}", req.id, c.tokens.len(), c.finish)));
        }
        tokens += c.tokens.len();
    }
    EngineCheck::new(format!("sampler = trainer ({n} requests, {tokens} tokens)"), None)
}

/// (e): `n` requests submitted from concurrent tokio tasks at staggered times.
pub fn tokio_front_matches_blocking(model: &Qwen3, rng: &mut StdRng, n: usize) -> EngineCheck {
    let name = format!("tokio front = blocking API ({n} concurrent tasks)");
    let requests: Vec<Request> = (0..n as u64).map(|i| random_request(rng, i, model.config.vocab_size)).collect();
    let want = engine(model, n, 1000).generate(requests.clone());
    let handle = EngineHandle::spawn(engine(model, 6, 5));
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => return EngineCheck::new(name, Some(format!("tokio runtime: {e}"))),
    };
    let got = runtime.block_on(async {
        let tasks: Vec<_> = requests
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let h = handle.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(std::time::Duration::from_millis((i as u64 * 37) % 200)).await;
                    h.submit(r).await
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await);
        }
        out
    });
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        let failure = match (a, b) {
            (Ok(Ok(x)), Ok(y)) if bits(x) == bits(y) => continue,
            (Ok(Ok(x)), Ok(y)) => format!("request {i} differs: {}", first_difference(&bits(y), &bits(x), ["blocking", "front"])),
            (Ok(Err(e)), _) => format!("request {i} failed through the front: {e}"),
            (Err(e), _) => format!("request {i}'s task failed: {e}"),
            (_, Err(e)) => format!("request {i} failed through the blocking API: {e}"),
        };
        return EngineCheck::new(name, Some(failure));
    }
    EngineCheck::new(name, None)
}

/// (f): GRPO-style groups (several samples of one prompt, arriving together or at random
/// steps) give the same bits with the prompt's KV shared as without sharing; and sharing did
/// happen (some prompt tokens were copied rather than recomputed).
pub fn shared_prompt_prefix_matches_unshared(model: &Qwen3, rng: &mut StdRng) -> EngineCheck {
    let vocab = model.config.vocab_size;
    let mut requests = Vec::new();
    for group in 0..4u64 {
        let base = random_request(rng, 0, vocab);
        let mut prompt = base.prompt.clone();
        prompt.resize(prompt.len().max(2) + (group as usize) * 3, 1);
        for g in 0..5u64 {
            let mut r = random_request(rng, group * 100 + g, vocab);
            r.prompt = prompt.clone();
            requests.push(r);
        }
    }
    let (max_batch, chunk) = (8, [1, 4, 16][rng.random_range(0..3)]);
    let name = format!("shared prompt KV = unshared (4 groups x 5 samples, max_batch {max_batch}, chunk {chunk})");
    let plain = engine_sharing(model, max_batch, chunk, false).generate(requests.clone());
    let mut shared_engine = engine_sharing(model, max_batch, chunk, true);
    for r in &requests {
        shared_engine.add(r.clone());
    }
    let (mut results, mut copied) = (std::collections::HashMap::new(), 0);
    while !shared_engine.is_idle() {
        copied += shared_engine.step().shared_prefix_tokens;
        results.extend(shared_engine.take_done());
    }
    results.extend(shared_engine.take_done());
    if copied == 0 {
        return EngineCheck::new(name, Some("no prompt token was shared".into()));
    }
    for (r, want) in requests.iter().zip(&plain) {
        let same = matches!((results.get(&r.id), want), (Some(Ok(a)), Ok(b)) if bits(a) == bits(b));
        if !same {
            return EngineCheck::new(name, Some(format!("request {} differs with sharing", r.id)));
        }
    }
    EngineCheck::new(format!("{name}: {copied} prompt tokens copied"), None)
}

/// Overlapped steps (each enqueued before the previous one is read, decode tokens fed on the
/// device) = synchronous steps, for `n` requests arriving at random steps, with stop tokens
/// drawn from a small vocabulary so that many stop early: same tokens, logprob bits and finish
/// reasons, and the overlapped engine ran with tokens fed on the device.
pub fn overlap_matches_synchronous(model: &Qwen3, rng: &mut StdRng, n: usize) -> EngineCheck {
    let vocab = model.config.vocab_size;
    let requests: Vec<(usize, Request)> = (0..n as u64).map(|i| (rng.random_range(0..20), random_request(rng, i, vocab))).collect();
    let (max_batch, chunk) = ([3, 8, 16][rng.random_range(0..3)], [1, 5, 64][rng.random_range(0..3)]);
    let name = format!("overlapped steps = synchronous steps ({n} requests, max_batch {max_batch}, chunk {chunk})");
    let run = |overlap: bool| {
        let mut e = engine_with(model, EngineConfig { max_batch, kv_blocks: 0, context: CONTEXT, chunk_size: chunk, share_prompt_prefix: true, overlap, reserve: 1.0 });
        let (mut results, mut step, mut fed) = (std::collections::HashMap::new(), 0, 0usize);
        while results.len() < n {
            for (_, r) in requests.iter().filter(|(at, _)| *at == step) {
                e.add(r.clone());
            }
            let before = e.in_flight_rows();
            e.step();
            fed += before.min(1);
            results.extend(e.take_done());
            step += 1;
        }
        (results, fed)
    };
    let (sync, _) = run(false);
    let (overlapped, fed) = run(true);
    if fed == 0 {
        return EngineCheck::new(name, Some("no step ran with a step in flight: overlap was not exercised".into()));
    }
    for (_, r) in &requests {
        let same = matches!((sync.get(&r.id), overlapped.get(&r.id)), (Some(Ok(a)), Some(Ok(b))) if bits(a) == bits(b));
        if !same {
            return EngineCheck::new(name, Some(format!("request {} differs: synchronous {:?}, overlapped {:?}", r.id, sync.get(&r.id).map(|x| x.as_ref().map(bits)), overlapped.get(&r.id).map(|x| x.as_ref().map(bits)))));
        }
    }
    EngineCheck::new(name, None)
}

/// A paged KV cache too small for the running requests = a cache with room for all: the same
/// tokens, logprob bits and finish reasons for 3 groups of 4 requests whose prompts span 2
/// blocks and whose answers cross into a third. Run twice: admitting whenever a prompt fits
/// (`reserve` 0: requests are preempted and run again, and GRPO groups share whole prompt
/// blocks), and reserving every admitted request's whole answer (`reserve` 1: no preemption).
pub fn small_paged_cache_matches_full(model: &Qwen3, rng: &mut StdRng) -> EngineCheck {
    const LONG_CONTEXT: usize = 3 * shared_kernels::ops::attention::BLOCK;
    let vocab = model.config.vocab_size;
    let mut requests = Vec::new();
    for group in 0..3u64 {
        let len = rng.random_range(70..110);
        let prompt: Vec<u32> = (0..len).map(|_| rng.random_range(0..vocab as u32)).collect();
        for g in 0..4u64 {
            let mut r = random_request(rng, group * 100 + g, vocab);
            r.prompt = prompt.clone();
            // every request outgrows two blocks (prompt + new tokens past 128), so at reserve 0
            // the four admitted group members, holding all 5 blocks, must preempt
            r.params.max_new_tokens = rng.random_range((2 * shared_kernels::ops::attention::BLOCK + 1 - len).max(20)..=LONG_CONTEXT - len);
            (r.params.stop_tokens, r.params.stop) = (Vec::new(), Vec::new());
            requests.push(r);
        }
    }
    let (max_batch, chunk) = (8, [7, 32, 64][rng.random_range(0..3)]);
    // 5 blocks: at reserve 0 a group's four members start in them (one shared prompt block, one
    // own each) and must preempt to grow; at reserve 1 two start (3 + 2 blocks) and finish
    let blocks = 5;
    let name = format!("a {blocks}-block paged cache = a full one (3 groups x 4 requests, max_batch {max_batch}, chunk {chunk})");
    let config = |kv_blocks, share_prompt_prefix, reserve| EngineConfig { max_batch, kv_blocks, context: LONG_CONTEXT, chunk_size: chunk, share_prompt_prefix, overlap: true, reserve };
    let full = match Engine::new(model.clone(), config(0, false, 1.0)) {
        Ok(mut e) => e.generate(requests.clone()),
        Err(e) => return EngineCheck::new(name, Some(e)),
    };
    let mut report = Vec::new();
    for reserve in [0.0, 1.0] {
        let mut small = match Engine::new(model.clone(), config(blocks, true, reserve)) {
            Ok(e) => e,
            Err(e) => return EngineCheck::new(name, Some(e)),
        };
        for r in &requests {
            small.add(r.clone());
        }
        let (mut results, mut preempted, mut shared) = (std::collections::HashMap::new(), 0, 0);
        while !small.is_idle() {
            let stats = small.step();
            preempted += stats.preempted;
            shared += stats.shared_prefix_tokens;
            results.extend(small.take_done());
        }
        results.extend(small.take_done());
        let exercised = if reserve == 0.0 { preempted > 0 } else { preempted == 0 };
        if !exercised || shared < shared_kernels::ops::attention::BLOCK {
            return EngineCheck::new(name, Some(format!("reserve {reserve}: {preempted} preemptions, {shared} prompt tokens shared (a whole block is {}; expected preemptions only at reserve 0)", shared_kernels::ops::attention::BLOCK)));
        }
        for (r, want) in requests.iter().zip(&full) {
            let same = matches!((results.get(&r.id), want), (Some(Ok(a)), Ok(b)) if bits(a) == bits(b));
            if !same {
                return EngineCheck::new(name, Some(format!("reserve {reserve}: request {} differs: full cache {:?}, small {:?}", r.id, want.as_ref().map(bits), results.get(&r.id).map(|x| x.as_ref().map(bits)))));
            }
        }
        report.push(format!("reserve {reserve}: {preempted} preemptions, {shared} prompt tokens shared"));
    }
    EngineCheck::new(format!("{name}: {}", report.join("; ")), None)
}

/// Everything above, from one seed.
pub fn run_all(model: &Qwen3, seed: u64) -> Vec<EngineCheck> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut checks = alone_vs_among(model, &mut rng);
    checks.push(sampler_equals_trainer(model, &mut rng, 12));
    checks.push(tokio_front_matches_blocking(model, &mut rng, 24));
    checks.push(shared_prompt_prefix_matches_unshared(model, &mut rng));
    checks.push(overlap_matches_synchronous(model, &mut rng, 24));
    checks.push(small_paged_cache_matches_full(model, &mut rng));
    checks.push(graphs_replay_the_launched_steps(model, &mut rng, 12));
    checks
}
