//! Sampler invariance on the CI runtime: one request's tokens and logprob bits are the same
//! alone, among up to 64 concurrent requests arriving at random steps, under different batch
//! and chunk sizes, and equal to the trainer's logprobs for the same tokens.

use burn::tensor::DType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sampler::{Completion, Engine, EngineConfig, EngineHandle, FinishReason, Request, SampleError, SamplingParams};
use shared_kernels::model::{tiny_config, Checkpoint, Qwen3};

const VOCAB: usize = 97;

fn seed() -> u64 {
    shared_kernels::battery::test_seed()
}

fn model(seed: u64) -> Qwen3 {
    let device = shared_kernels::device::default_device();
    Qwen3::from_checkpoint(&Checkpoint::random(tiny_config(VOCAB, false), 0.3, seed), DType::F32, &device).unwrap()
}

fn random_request(rng: &mut StdRng, id: u64) -> Request {
    let len = rng.random_range(1..40);
    Request {
        id,
        prompt: (0..len).map(|_| rng.random_range(0..VOCAB as u32)).collect(),
        params: SamplingParams {
            temperature: [1.0, 0.7, 0.0, 1.3][rng.random_range(0..4)],
            top_k: [0, 5, 20][rng.random_range(0..3)],
            top_p: [1.0, 0.9, 0.6][rng.random_range(0..3)],
            max_new_tokens: rng.random_range(1..24),
            stop_tokens: vec![rng.random_range(0..VOCAB as u32)],
            seed: rng.random(),
        },
    }
}

fn bits(c: &Completion) -> (Vec<u32>, Vec<u32>, FinishReason) {
    (c.tokens.clone(), c.logprobs.iter().map(|v| v.to_bits()).collect(), c.finish)
}

fn engine(model: &Qwen3, max_batch: usize, chunk_size: usize) -> Engine {
    Engine::new(model.clone(), EngineConfig { max_batch, context: 80, chunk_size }).unwrap()
}

/// Runs `target` among `others`, each added at a random step.
fn run_among(model: &Qwen3, target: &Request, others: &[Request], max_batch: usize, chunk: usize, rng: &mut StdRng) -> Vec<(u64, Result<Completion, SampleError>)> {
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

#[test]
fn a_request_gives_the_same_bits_alone_among_others_and_under_any_batch_or_chunk_size() {
    let mut rng = StdRng::seed_from_u64(seed());
    let model = model(rng.random());
    let target = random_request(&mut rng, 1_000_000);
    let alone = engine(&model, 1, 1000).generate(vec![target.clone()]).remove(0).unwrap();
    let want = bits(&alone);
    for (max_batch, chunk, neighbours) in [(1, 1, 0), (4, 3, 1), (16, 7, 12), (64, 16, 63), (7, 100, 30), (2, 32, 5)] {
        let others: Vec<Request> = (0..neighbours).map(|i| random_request(&mut rng, i as u64)).collect();
        let results = run_among(&model, &target, &others, max_batch, chunk, &mut rng);
        assert_eq!(results.len(), neighbours + 1, "every request is answered (batch {max_batch}, chunk {chunk})");
        let got = results.iter().find(|(id, _)| *id == target.id).unwrap().1.clone().unwrap();
        assert_eq!(bits(&got), want, "batch {max_batch}, chunk {chunk}, {neighbours} neighbours");
        for (id, r) in &results {
            assert!(r.is_ok(), "request {id} failed: {r:?}");
        }
    }
}

#[test]
fn sampled_logprobs_equal_the_training_path_bits() {
    let mut rng = StdRng::seed_from_u64(seed());
    let model = model(rng.random());
    let requests: Vec<Request> = (0..12).map(|i| random_request(&mut rng, i)).collect();
    let results = engine(&model, 5, 6).generate(requests.clone());
    for (req, res) in requests.iter().zip(results) {
        let c = res.unwrap();
        let mut seq = req.prompt.clone();
        seq.extend(&c.tokens);
        let (train, _) = model.sequence_logprobs(&[seq], req.params.temperature).unwrap();
        let trainer: Vec<u32> = train[0][req.prompt.len() - 1..].iter().map(|v| v.to_bits()).collect();
        assert_eq!(trainer, bits(&c).1, "request {}: sampler vs trainer logprob bits", req.id);
        assert!(c.tokens.len() <= req.params.max_new_tokens);
        match c.finish {
            FinishReason::Stop => assert!(req.params.stop_tokens.contains(c.tokens.last().unwrap())),
            FinishReason::Length => assert_eq!(c.tokens.len(), req.params.max_new_tokens),
        }
    }
}

#[test]
fn bad_requests_fail_alone_and_a_full_cache_makes_requests_wait() {
    let mut rng = StdRng::seed_from_u64(seed());
    let model = model(rng.random());
    let good: Vec<Request> = (0..10).map(|i| random_request(&mut rng, i)).collect();
    let mut bad = Vec::new();
    let mut r = random_request(&mut rng, 100);
    r.prompt.clear();
    bad.push(r);
    let mut r = random_request(&mut rng, 101);
    r.prompt[0] = VOCAB as u32 + 3;
    bad.push(r);
    let mut r = random_request(&mut rng, 102);
    r.params.max_new_tokens = 80;
    bad.push(r);
    let mut r = random_request(&mut rng, 103);
    r.params.temperature = -0.5;
    bad.push(r);
    let mut r = random_request(&mut rng, 104);
    r.params.top_p = 0.0;
    bad.push(r);
    let mut r = random_request(&mut rng, 105);
    r.params.top_p = 1.5;
    bad.push(r);
    let mut all = good.clone();
    all.extend(bad.clone());
    // two slots for ten good requests: the rest wait, none is dropped
    let results = engine(&model, 2, 4).generate(all);
    for (i, res) in results.iter().enumerate().take(good.len()) {
        assert!(res.is_ok(), "good request {i}: {res:?}");
    }
    let errors: Vec<String> = results[good.len()..].iter().map(|r| r.clone().unwrap_err().to_string()).collect();
    assert!(errors[0].contains("empty prompt"), "{}", errors[0]);
    assert!(errors[1].contains(&format!("token id {}", VOCAB + 3)), "{}", errors[1]);
    assert!(errors[2].contains("exceeds the context"), "{}", errors[2]);
    assert!(errors[3].contains("temperature"), "{}", errors[3]);
    assert!(errors[4].contains("top_p") && errors[5].contains("top_p"), "{errors:?}");
    // and the good ones match a run without the bad ones
    let clean = engine(&model, 3, 9).generate(good);
    for (a, b) in results.iter().zip(clean) {
        assert_eq!(bits(a.as_ref().unwrap()), bits(&b.unwrap()));
    }
}

#[test]
fn concurrent_tokio_submissions_match_the_blocking_api() {
    let mut rng = StdRng::seed_from_u64(seed());
    let model = model(rng.random());
    let requests: Vec<Request> = (0..24).map(|i| random_request(&mut rng, i)).collect();
    let want = engine(&model, 24, 1000).generate(requests.clone());
    let handle = EngineHandle::spawn(engine(&model, 6, 5));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
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
            out.push(t.await.unwrap());
        }
        out
    });
    for (a, b) in got.iter().zip(&want) {
        assert_eq!(bits(a.as_ref().unwrap()), bits(b.as_ref().unwrap()));
    }
}
