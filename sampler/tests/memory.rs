//! The engine keeps its weights and KV cache out of the pages cubecl carves per-step tensors
//! from. cubecl sizes those pages to the largest allocation so far and, when a larger one comes,
//! leaves the old pages behind and walks them on every later reservation until they empty; a
//! model stranded there made each decode step's allocations slower for the engine's whole life
//! (35% of cubecl's device-thread time at Qwen3-0.6B's shape).
//!
//! Alone in its test binary: the pools are the process's, and other tests would grow them.

use burn::tensor::{DType, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sampler::invariance::random_request;
use sampler::{Engine, EngineConfig};
use shared_kernels::model::{tiny_config, Checkpoint, ModelConfig, Qwen3};

fn config() -> ModelConfig {
    // projections past cubecl's 64 KiB small-allocation pool, so they land on the carved pages
    let mut c = tiny_config(512, false);
    (c.hidden_size, c.intermediate_size, c.head_dim) = (256, 512, 64);
    c
}

fn carved_pools(device: &burn::tensor::Device) -> usize {
    device.memory_pool_report().expect("cubecl reports its pools").len()
}

#[test]
fn an_engine_leaves_no_weights_on_left_behind_pages() {
    let mut rng = StdRng::seed_from_u64(shared_kernels::testing::rows::test_seed());
    let device = shared_kernels::device::default_device();
    let model = Qwen3::from_checkpoint(&Checkpoint::random(config(), 0.3, rng.random()), DType::F32, &device).unwrap();
    let settled = carved_pools(&device);
    // a tensor larger than every page so far: the pages the weights sit on are left behind
    let large = Tensor::<1>::zeros([8 << 20], &device);
    drop(large);
    let stranded = carved_pools(&device);
    assert!(stranded > settled, "the scenario did not leave pages behind ({settled} -> {stranded} pools): the test would prove nothing");

    let mut engine = Engine::new(model, EngineConfig { max_batch: 4, kv_blocks: 0, context: 96, chunk_size: 8, share_prompt_prefix: true, overlap: true, reserve: 1.0 }).unwrap();
    engine.set_decoder(sampler::invariance::letters_decoder());
    let requests = (0..4).map(|i| random_request(&mut rng, i, 512)).collect();
    let done = engine.generate(requests);
    assert!(done.iter().all(|r| r.is_ok()), "generation failed: {done:?}");
    let after = carved_pools(&device);
    assert!(
        after < stranded,
        "the engine's weights still hold the left-behind pages ({} ; {stranded} pools with the model stranded)",
        shared_kernels::device::memory_pools_line(&device)
    );
}
