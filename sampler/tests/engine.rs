//! Sampler invariance on the CI runtime: one request's tokens and logprob bits are the same
//! alone, among up to 63 concurrent requests arriving at random steps, under different batch
//! and chunk sizes, and equal to the trainer's logprobs for the same tokens. The checks live in
//! `sampler::invariance` so `lockstep check` runs the very same ones on the GPU.

use burn::tensor::DType;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sampler::invariance::{self, bits, engine, random_request, EngineCheck};
use sampler::Request;
use shared_kernels::model::{tiny_config, Checkpoint, Qwen3};

const VOCAB: usize = 97;

fn seed() -> u64 {
    shared_kernels::testing::rows::test_seed()
}

fn model(seed: u64) -> Qwen3 {
    let device = shared_kernels::device::default_device();
    Qwen3::from_checkpoint(&Checkpoint::random(tiny_config(VOCAB, false), 0.3, seed), DType::F32, &device).unwrap()
}

fn assert_passed(checks: &[EngineCheck]) {
    for c in checks {
        assert!(c.passed(), "{}: {}", c.name, c.failure.as_deref().unwrap_or(""));
    }
}

#[test]
fn a_request_gives_the_same_bits_alone_among_others_and_under_any_batch_or_chunk_size() {
    let mut rng = StdRng::seed_from_u64(seed());
    let model = model(rng.random());
    let checks = invariance::alone_vs_among(&model, &mut rng);
    assert_eq!(checks.len(), invariance::SCENARIOS.len());
    assert_passed(&checks);
}

#[test]
fn sampled_logprobs_equal_the_training_path_bits() {
    let mut rng = StdRng::seed_from_u64(seed());
    let model = model(rng.random());
    assert_passed(&[invariance::sampler_equals_trainer(&model, &mut rng, 12)]);
}

#[test]
fn grpo_groups_share_their_prompt_kv_without_changing_a_bit() {
    let mut rng = StdRng::seed_from_u64(seed());
    let model = model(rng.random());
    assert_passed(&[invariance::shared_prompt_prefix_matches_unshared(&model, &mut rng)]);
}

#[test]
fn the_checks_catch_a_sampler_that_differs_from_the_trainer() {
    // The trainer scores with the model as given; a sampler on other weights must be caught.
    let mut rng = StdRng::seed_from_u64(seed());
    let trainer_model = model(rng.random());
    let other = model(rng.random());
    let check = invariance::sampler_matches_scorer(&other, &trainer_model, &mut rng, 4);
    assert!(!check.passed(), "a sampler on other weights went unnoticed");
}

#[test]
fn bad_requests_fail_alone_and_a_full_cache_makes_requests_wait() {
    let mut rng = StdRng::seed_from_u64(seed());
    let model = model(rng.random());
    let good: Vec<Request> = (0..10).map(|i| random_request(&mut rng, i, VOCAB)).collect();
    let mut bad = Vec::new();
    let mut r = random_request(&mut rng, 100, VOCAB);
    r.prompt.clear();
    bad.push(r);
    let mut r = random_request(&mut rng, 101, VOCAB);
    r.prompt[0] = VOCAB as u32 + 3;
    bad.push(r);
    let mut r = random_request(&mut rng, 102, VOCAB);
    r.params.max_new_tokens = invariance::CONTEXT;
    bad.push(r);
    let mut r = random_request(&mut rng, 103, VOCAB);
    r.params.temperature = -0.5;
    bad.push(r);
    let mut r = random_request(&mut rng, 104, VOCAB);
    r.params.top_p = 0.0;
    bad.push(r);
    let mut r = random_request(&mut rng, 105, VOCAB);
    r.params.top_p = 1.5;
    bad.push(r);
    let mut r = random_request(&mut rng, 106, VOCAB);
    r.params.stop = vec!["ab".into(), String::new()];
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
    assert!(errors[6].contains("stop string 1 is empty"), "{}", errors[6]);
    // stop strings on an engine without a decoder: refused by name, not ignored
    let mut r = random_request(&mut rng, 107, VOCAB);
    r.params.stop = vec!["a".into()];
    let plain = sampler::Engine::new(model.clone(), sampler::EngineConfig { max_batch: 2, kv_blocks: 0, context: invariance::CONTEXT, chunk_size: 4, share_prompt_prefix: true, overlap: true, reserve: 1.0 });
    let err = plain.unwrap().generate(vec![r]).remove(0).unwrap_err().to_string();
    assert!(err.contains("stop strings need a decoder"), "{err}");
    // and the good ones match a run without the bad ones
    let clean = engine(&model, 3, 9).generate(good);
    for (a, b) in results.iter().zip(clean) {
        assert_eq!(bits(a.as_ref().unwrap()), bits(&b.unwrap()));
    }
}

#[test]
fn the_kv_budget_decides_the_number_of_cache_blocks() {
    let model = model(seed());
    let c = &model.config;
    let block = shared_kernels::ops::attention::BLOCK;
    let per_block = 2 * c.num_layers * block * c.num_kv_heads * c.head_dim * 4;
    let width = invariance::CONTEXT.div_ceil(block);
    let cfg = sampler::EngineConfig::from_budget(&model, 3 * per_block + per_block / 2, invariance::CONTEXT, 64, 8).unwrap();
    assert_eq!((cfg.kv_blocks, cfg.max_batch), (3, 64));
    assert_eq!(sampler::EngineConfig::from_budget(&model, 0, invariance::CONTEXT, 64, 8).unwrap().kv_blocks, 64 * width);
    let err = sampler::EngineConfig::from_budget(&model, width * per_block - 1, invariance::CONTEXT, 64, 8).unwrap_err();
    assert!(err.contains("fewer than one request"), "{err}");
}

#[test]
fn a_small_paged_cache_preempts_and_shares_blocks_without_changing_a_bit() {
    let mut rng = StdRng::seed_from_u64(seed());
    let model = model(rng.random());
    assert_passed(&[invariance::small_paged_cache_matches_full(&model, &mut rng)]);
}

#[test]
fn concurrent_tokio_submissions_match_the_blocking_api() {
    let mut rng = StdRng::seed_from_u64(seed());
    let model = model(rng.random());
    assert_passed(&[invariance::tokio_front_matches_blocking(&model, &mut rng, 24)]);
}

#[test]
fn overlapped_steps_give_the_synchronous_engines_bits() {
    let mut rng = StdRng::seed_from_u64(seed());
    let model = model(rng.random());
    assert_passed(&[invariance::overlap_matches_synchronous(&model, &mut rng, 24)]);
}

#[test]
fn replayed_graph_steps_give_the_launched_steps_bits() {
    let mut rng = StdRng::seed_from_u64(seed());
    let model = model(rng.random());
    assert_passed(&[invariance::graphs_replay_the_launched_steps(&model, &mut rng, 12)]);
}

/// A stop string ends a request at the token that first completes it, with the bits the same
/// request had without it (stopping changes which tokens it keeps, never a logprob), and the
/// others in the batch are untouched.
#[test]
fn a_stop_string_ends_a_request_at_its_first_occurrence_with_unchanged_bits() {
    let mut rng = StdRng::seed_from_u64(seed());
    let model = model(rng.random());
    let text = |tokens: &[u32]| invariance::letters_decoder()(tokens).unwrap();
    let mut checked = 0;
    for id in 0..6u64 {
        let mut r = random_request(&mut rng, id, VOCAB);
        (r.params.stop_tokens, r.params.stop, r.params.max_new_tokens, r.params.temperature) = (Vec::new(), Vec::new(), 20, 1.0);
        let others: Vec<Request> = (0..4).map(|i| random_request(&mut rng, 100 + 10 * id + i, VOCAB)).collect();
        let mut all = vec![r.clone()];
        all.extend(others.clone());
        let free = engine(&model, 3, 4).generate(all.clone());
        let full = free[0].as_ref().unwrap().clone();
        // the string: two letters from the middle of the unstopped text; it first ends at
        // token `end` (one letter a token)
        let whole = text(&full.tokens);
        let s = whole[whole.len() / 2..whole.len() / 2 + 2].to_string();
        let end = whole.find(&s).unwrap() + 2;
        all[0].params.stop = vec![s.clone()];
        let stopped = engine(&model, 3, 4).generate(all);
        let got = stopped[0].as_ref().unwrap();
        assert_eq!(got.finish, sampler::FinishReason::Stop, "request {id}, stop {s:?} in {whole:?}");
        assert_eq!(got.tokens, full.tokens[..end], "request {id}: stop {s:?} in {whole:?}");
        assert_eq!(bits(got).1, bits(&full).1[..end], "request {id}: logprob bits");
        for (a, b) in stopped[1..].iter().zip(&free[1..]) {
            assert_eq!(bits(a.as_ref().unwrap()), bits(b.as_ref().unwrap()), "a neighbour of request {id} changed");
        }
        checked += 1;
    }
    assert_eq!(checked, 6);
}

/// Cancelling a request (a server's client went away), running or queued, in overlap mode with
/// a paged cache: it gives no result, its slot and blocks are free (none held once idle), and
/// every other request keeps the bits it has without it; an unknown id is no request.
#[test]
fn cancelling_a_request_frees_its_cache_and_changes_no_other_bit() {
    let mut rng = StdRng::seed_from_u64(seed());
    let model = model(rng.random());
    let requests: Vec<Request> = (0..7u64).map(|id| {
        let mut r = random_request(&mut rng, id, VOCAB);
        (r.params.stop_tokens, r.params.max_new_tokens) = (Vec::new(), 20);
        r
    }).collect();
    let alone: Vec<_> = engine(&model, 3, 4).generate(requests.clone()).into_iter().map(|r| bits(&r.unwrap())).collect();
    let mut e = engine(&model, 3, 4);
    for r in &requests {
        e.add(r.clone());
    }
    for _ in 0..12 {
        e.step();
    }
    let running: Vec<u64> = e.partial().map(|(id, _, _, _)| id).collect();
    assert!(!running.is_empty() && running.len() < requests.len(), "{running:?} running");
    let queued = requests.iter().map(|r| r.id).rev().find(|id| !running.contains(id)).expect("a queued request");
    for id in [running[0], queued] {
        assert!(e.cancel(id), "request {id} is in the engine");
    }
    assert!(!e.cancel(999) && !e.cancel(running[0]), "only requests in the engine can be cancelled, once");
    let mut results = e.take_done();
    while !e.is_idle() {
        e.step();
        results.extend(e.take_done());
    }
    results.extend(e.take_done());
    let ids: std::collections::BTreeSet<u64> = results.iter().map(|(id, _)| *id).collect();
    let expected: std::collections::BTreeSet<u64> = requests.iter().map(|r| r.id).filter(|id| *id != running[0] && *id != queued).collect();
    assert_eq!(ids, expected, "the cancelled requests gave no result, the others one each");
    for (id, r) in results {
        assert_eq!(bits(&r.unwrap()), alone[id as usize], "request {id} changed beside the cancelled ones");
    }
    assert_eq!(e.occupancy().kv_blocks_used, 0, "cache blocks still held once idle");
}

/// The model with LoRA adapters on every projection (rank 4; A as PEFT starts it, B random so the
/// adapters change the outputs).
fn adapted(model: &Qwen3, rng: &mut StdRng) -> Qwen3 {
    use shared_kernels::model::{lora, LoraInit, LoraSpec, Projection};
    let spec = LoraSpec { rank: 4, alpha: 8.0, rslora: false, targets: Projection::ALL.to_vec() };
    let adapters = lora::fresh_adapters(&model.config, &spec, LoraInit::KaimingUniform, rng.random(), model.dtype, &model.embed.device());
    let with = model.clone().with_adapters(spec, adapters).unwrap();
    with.map_weights(&mut |name, w| {
        if !name.ends_with("lora_B.weight") {
            return w;
        }
        let dims = w.flat().dims()[0];
        let values: Vec<f32> = (0..dims).map(|_| rng.random_range(-0.2..0.2)).collect();
        w.with_flat(burn::tensor::Tensor::from_data(burn::tensor::TensorData::new(values, [dims]), &model.embed.device()))
    })
}

/// LoRA keeps the contract: with adapters on every projection the sampler's logprobs equal the
/// training path's as bits, and a request gives the same bits alone, among others, under any
/// batch or chunk size; the adapters do change the logprobs (the check is not vacuous).
#[test]
fn adapters_keep_sampler_equal_to_trainer_and_batch_invariant() {
    let mut rng = StdRng::seed_from_u64(seed());
    let base = model(rng.random());
    let model = adapted(&base, &mut rng);
    assert_passed(&[invariance::sampler_equals_trainer(&model, &mut rng, 8)]);
    assert_passed(&invariance::alone_vs_among(&model, &mut rng));
    let seq: Vec<u32> = (0..20).map(|_| rng.random_range(0..VOCAB as u32)).collect();
    let dist = shared_kernels::model::LogprobDistribution::full(1.0);
    let (with, without) = (model.sequence_logprobs(&[seq.clone()], dist).unwrap().per_sequence, base.sequence_logprobs(&[seq], dist).unwrap().per_sequence);
    assert_ne!(with, without, "the adapters changed no logprob");
}

/// A mixture-of-experts model (Qwen3-MoE: a dense layer, then a sparse one of 8 experts, 2 a
/// token) keeps the contract: sampler = trainer as bits, and a request's bits alone, among
/// others, under any batch or chunk size, with preemption in a small paged cache: a token's
/// routing and its experts' arithmetic do not depend on which tokens share the launch.
#[test]
fn a_mixture_of_experts_model_keeps_sampler_equal_to_trainer_and_batch_invariant() {
    let mut rng = StdRng::seed_from_u64(seed());
    let device = shared_kernels::device::default_device();
    let model = Qwen3::from_checkpoint(&Checkpoint::random(shared_kernels::model::tiny_moe_config(VOCAB), 0.3, rng.random()), DType::F32, &device).unwrap();
    assert!(model.layers[0].moe.is_none() && model.layers[1].moe.as_ref().is_some_and(|m| m.experts.len() == 8));
    assert_passed(&[invariance::sampler_equals_trainer(&model, &mut rng, 8)]);
    assert_passed(&invariance::alone_vs_among(&model, &mut rng));
    assert_passed(&[invariance::small_paged_cache_matches_full(&model, &mut rng)]);
}
