//! The contract: for every token, the training path's logprob bits equal the stepping path's
//! (prefill whole, prefill in chunks of 1/7/32, decode token by token), with random neighbours.

use burn::tensor::DType;
use shared_kernels::testing::contract::model_contract;
use shared_kernels::testing::rows::table;

#[test]
fn training_path_and_stepping_path_logprobs_are_bit_identical() {
    let checks = model_contract(DType::F32, &crate::device(), crate::seed(), 6).unwrap();
    assert_eq!(checks.len(), 16);
    assert_eq!(checks.iter().filter(|c| c.op.contains("fused")).count(), 8);
    assert_eq!(checks.iter().filter(|c| c.op.contains("heads of 128")).count(), 8);
    let failing: Vec<_> = checks.iter().filter(|c| !c.identical()).map(|c| ("lockstep", c.clone())).collect();
    assert!(failing.is_empty(), "{}", table(&failing));
}

#[test]
fn the_training_path_does_not_depend_on_its_batch_neighbours() {
    use shared_kernels::model::{tiny_config, Checkpoint, Qwen3};
    let device = crate::device();
    let model = Qwen3::from_checkpoint(&Checkpoint::random(tiny_config(61, true), 0.2, crate::seed()), DType::F32, &device).unwrap();
    let seqs: Vec<Vec<u32>> = vec![(0..40).map(|i| (i * 7 % 61) as u32).collect(), (0..9).map(|i| (i * 5 % 61) as u32).collect(), (0..70).map(|i| (i * 3 % 61) as u32).collect()];
    let all = model.sequence_logprobs(&seqs, 0.7).unwrap().per_sequence;
    for (i, seq) in seqs.iter().enumerate() {
        let alone = model.sequence_logprobs(std::slice::from_ref(seq), 0.7).unwrap().per_sequence;
        assert_eq!(alone[0].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), all[i].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "sequence {i}");
    }
}

#[test]
fn logits_for_selected_rows_have_the_bits_of_the_full_forward() {
    use rand::{Rng, SeedableRng};
    use shared_kernels::model::{tiny_config, Checkpoint, Forward, KvCache, Qwen3, Rows};
    let device = crate::device();
    let mut rng = rand::rngs::StdRng::seed_from_u64(crate::seed() ^ 0x5e1);
    let mut model = Qwen3::from_checkpoint(&Checkpoint::random(tiny_config(61, true), 0.2, rng.random()), DType::F32, &device).unwrap();
    model.fuse_projections();
    let mut rows = Rows::default();
    for s in 0..3u32 {
        for p in 0..rng.random_range(3..20u32) {
            rows.push(rng.random_range(0..61), s, p);
        }
    }
    let bits = |t: burn::tensor::Tensor<2>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let cache = || KvCache::new(&model.config, 3, 32, DType::F32, &device);
    let full = bits(model.forward(&rows, Some(&mut cache())).unwrap());
    let at = vec![rows.len() - 1, 0, rng.random_range(0..rows.len())];
    let picked = bits(model.run(Forward::rows(&rows).cache(&mut cache()).logits_at(&at)).unwrap().expect("rows were asked for"));
    let vocab = 61;
    for (i, &r) in at.iter().enumerate() {
        assert_eq!(picked[i * vocab..(i + 1) * vocab], full[r * vocab..(r + 1) * vocab], "row {r}");
    }
    assert!(model.run(Forward::rows(&rows).cache(&mut cache()).logits_at(&[])).unwrap().is_none());
    let err = model.run(Forward::rows(&rows).cache(&mut cache()).logits_at(&[rows.len()])).unwrap_err().to_string();
    assert!(err.contains(&format!("row {}", rows.len())), "{err}");
}

#[test]
fn the_auditor_replays_a_token_inside_its_batch_and_names_what_differs() {
    use shared_kernels::model::audit::first_divergence_in_batch;
    use shared_kernels::model::{tiny_config, Checkpoint, KernelSet, Qwen3};
    let device = crate::device();
    let model = Qwen3::from_checkpoint(&Checkpoint::random(tiny_config(61, true), 0.2, crate::seed() ^ 0xa0d1), DType::F32, &device).unwrap();
    let batch: Vec<Vec<u32>> = vec![(0..30).map(|i| (i * 7 % 61) as u32).collect(), (0..45).map(|i| (i * 11 % 61) as u32).collect(), (0..12).map(|i| (i * 5 % 61) as u32).collect()];
    let (s, position) = (1, 40);
    let lp = model.sequence_logprobs(&batch, 0.8).unwrap().per_sequence;
    let sampled = lp[s][position];
    // the same kernels on both sides, the sampler's bits given: nothing to find, said plainly
    let report = first_divergence_in_batch(&model, &model, &batch, s, position, Some((sampled, 0.8.into()))).unwrap();
    assert!(report.starts_with("could not reproduce") && report.contains("3 sequences, 87 rows"), "{report}");
    // a logprob that differs with every op equal: the report says the difference is at the logprob
    let report = first_divergence_in_batch(&model, &model, &batch, s, position, Some((sampled + 0.5, 0.8.into()))).unwrap();
    assert!(report.contains("the logprob does"), "{report}");
    // a sampler on another matmul (split-K over a decode row): the first op that differs is named
    let mut split = model.clone();
    split.kernels = KernelSet::SplitK;
    let report = first_divergence_in_batch(&model, &split, &batch, s, position, Some((sampled, 0.8.into()))).unwrap();
    assert!(report.starts_with("first divergence at `layer 0 q (normed, rope)`") || report.starts_with("first divergence at `layer 0"), "{report}");
}
