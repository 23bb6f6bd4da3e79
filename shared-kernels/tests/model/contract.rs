//! The contract: for every token, the training path's logprob bits equal the stepping path's
//! (prefill whole, prefill in chunks of 1/7/32, decode token by token), with random neighbours.

use burn::tensor::{DType, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shared_kernels::model::{tiny_config, Checkpoint, KvCache, Qwen3, Rows};

fn random_sequences(rng: &mut StdRng, count: usize, vocab: usize) -> Vec<Vec<u32>> {
    (0..count)
        .map(|_| {
            let len = rng.random_range(2..80);
            (0..len).map(|_| rng.random_range(0..vocab as u32)).collect()
        })
        .collect()
}

/// Runs every sequence through the KV cache `chunk` tokens at a time, all sequences' chunks in
/// one launch per step (sequences are in random order in the slots). Returns per-sequence,
/// per-position logprob bits of the next token.
fn stepping_logprobs(model: &Qwen3, seqs: &[Vec<u32>], chunk: usize, rng: &mut StdRng) -> Vec<Vec<u32>> {
    let device = model.embed.device();
    let mut slot_of: Vec<usize> = (0..seqs.len()).collect();
    for i in (1..slot_of.len()).rev() {
        slot_of.swap(i, rng.random_range(0..=i));
    }
    let max_len = seqs.iter().map(|s| s.len()).max().unwrap();
    let mut cache = KvCache::new(&model.config, seqs.len(), max_len, model.dtype, &device);
    let mut done = vec![0usize; seqs.len()];
    let mut out: Vec<Vec<u32>> = seqs.iter().map(|s| vec![0; s.len() - 1]).collect();
    while done.iter().zip(seqs).any(|(d, s)| *d < s.len()) {
        let mut rows = Rows::default();
        let mut owner = vec![];
        // a random subset of sequences advances this step: neighbours change every step
        for s in 0..seqs.len() {
            if done[s] >= seqs[s].len() || (rng.random_bool(0.3) && chunk > 1) {
                continue;
            }
            let end = (done[s] + chunk).min(seqs[s].len());
            for p in done[s]..end {
                rows.push(seqs[s][p], slot_of[s] as u32, p as u32);
                owner.push((s, p));
            }
            done[s] = end;
        }
        if rows.is_empty() {
            continue;
        }
        let logits = model.forward(&rows, Some(&mut cache)).unwrap();
        let keep: Vec<(usize, usize, usize)> = owner.iter().enumerate().filter(|(_, (s, p))| p + 1 < seqs[*s].len()).map(|(r, &(s, p))| (r, s, p)).collect();
        if keep.is_empty() {
            continue;
        }
        let m = keep.len();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(keep.iter().map(|k| k.0 as i32).collect::<Vec<_>>(), [m]), &device);
        let targets = Tensor::<1, Int>::from_data(TensorData::new(keep.iter().map(|&(_, s, p)| seqs[s][p + 1] as i32).collect::<Vec<_>>(), [m]), &device);
        let temps = Tensor::<1>::from_data(TensorData::new(vec![1.0f32; m], [m]), &device);
        let lp = shared_kernels::token_logprobs(logits.select(0, idx), targets, temps).unwrap().logprobs;
        let lp = lp.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        for (i, &(_, s, p)) in keep.iter().enumerate() {
            out[s][p] = lp[i].to_bits();
        }
    }
    out
}

#[test]
fn training_path_and_stepping_path_logprobs_are_bit_identical() {
    let mut rng = StdRng::seed_from_u64(crate::seed());
    let device = crate::device();
    let config = tiny_config(97, rng.random_bool(0.5));
    let model = Qwen3::from_checkpoint(&Checkpoint::random(config, 0.2, rng.random()), DType::F32, &device).unwrap();
    let seqs = random_sequences(&mut rng, 6, 97);
    let (train, _) = model.sequence_logprobs(&seqs, 1.0).unwrap();
    let train_bits: Vec<Vec<u32>> = train.iter().map(|s| s.iter().map(|v| v.to_bits()).collect()).collect();
    assert!(train.iter().flatten().all(|v| v.is_finite() && *v < 0.0));
    for chunk in [usize::MAX, 1, 7, 32] {
        let step = stepping_logprobs(&model, &seqs, chunk, &mut rng);
        for (s, (a, b)) in train_bits.iter().zip(&step).enumerate() {
            let first = a.iter().zip(b).position(|(x, y)| x != y);
            assert!(first.is_none(), "chunk {chunk}: sequence {s} (len {}) first differs at position {first:?}", seqs[s].len());
        }
    }
    // the training path itself does not depend on which other sequences share its batch
    let (alone, _) = model.sequence_logprobs(&seqs[2..3], 1.0).unwrap();
    assert_eq!(alone[0].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), train_bits[2]);
}
