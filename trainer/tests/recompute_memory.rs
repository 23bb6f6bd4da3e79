//! Per-layer recomputation must hold less after the forward than the one-graph pass (the test
//! that catches a first pass that records its graph after all, as burn's `detach` did). Its own
//! test binary: the device's live bytes are read with nothing else running on it.

use shared_kernels::model::{tiny_config, Checkpoint, Qwen3};

#[test]
fn the_recomputed_forward_holds_a_fraction_of_the_one_graph_forward() {
    let device = shared_kernels::device::default_device();
    let model = Qwen3::from_checkpoint(&Checkpoint::random(tiny_config(97, true), 0.05, 3), burn::tensor::DType::F32, &device).unwrap();
    let sequences: Vec<Vec<u32>> = (0..8).map(|s| (0..200).map(|t| ((s * 31 + t * 7) % 97) as u32).collect()).collect();
    let held = |recompute: bool| {
        let tracked = trainer::backward::tracked_copy(&model);
        let before = device.memory_pool_usage().expect("the runtime reports memory").bytes_in_use;
        let (_, logprobs) = tracked.training_logprobs(&sequences, 1.0, recompute).unwrap();
        let _ = device.sync();
        let after = device.memory_pool_usage().unwrap().bytes_in_use;
        drop(logprobs);
        after.saturating_sub(before)
    };
    let (graph, recomputed) = (held(false), held(true));
    eprintln!("held after the forward: one graph {graph} bytes, recomputed {recomputed} bytes");
    // 2 layers of 64 wide: the one-graph pass keeps ~12 values a token and layer, the
    // recomputed one each layer's input (1) and the head's graph
    assert!(recomputed * 3 < graph, "recomputation holds {recomputed} bytes after the forward, the one-graph pass {graph}");
}
