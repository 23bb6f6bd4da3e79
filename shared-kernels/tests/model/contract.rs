//! The contract: for every token, the training path's logprob bits equal the stepping path's
//! (prefill whole, prefill in chunks of 1/7/32, decode token by token), with random neighbours.

use burn::tensor::DType;
use shared_kernels::battery::{model_contract, table};

#[test]
fn training_path_and_stepping_path_logprobs_are_bit_identical() {
    let checks = model_contract(DType::F32, &crate::device(), crate::seed(), 6).unwrap();
    assert_eq!(checks.len(), 8);
    assert_eq!(checks.iter().filter(|c| c.op.contains("fused")).count(), 4);
    let failing: Vec<_> = checks.iter().filter(|c| !c.identical()).map(|c| ("lockstep", c.clone())).collect();
    assert!(failing.is_empty(), "{}", table(&failing));
}

#[test]
fn the_training_path_does_not_depend_on_its_batch_neighbours() {
    use shared_kernels::model::{tiny_config, Checkpoint, Qwen3};
    let device = crate::device();
    let model = Qwen3::from_checkpoint(&Checkpoint::random(tiny_config(61, true), 0.2, crate::seed()), DType::F32, &device).unwrap();
    let seqs: Vec<Vec<u32>> = vec![(0..40).map(|i| (i * 7 % 61) as u32).collect(), (0..9).map(|i| (i * 5 % 61) as u32).collect(), (0..70).map(|i| (i * 3 % 61) as u32).collect()];
    let (all, _) = model.sequence_logprobs(&seqs, 0.7).unwrap();
    for (i, seq) in seqs.iter().enumerate() {
        let (alone, _) = model.sequence_logprobs(std::slice::from_ref(seq), 0.7).unwrap();
        assert_eq!(alone[0].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), all[i].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "sequence {i}");
    }
}
