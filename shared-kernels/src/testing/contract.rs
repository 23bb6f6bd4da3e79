//! The model contract: the trainer's logprob of every token (whole sequences, batched) equals
//! as bits the sampler's (a KV cache, prefill chunks, token-by-token decoding, with random
//! neighbours and slots), on the unfused and the fused decode paths; on a failure, the first
//! op where the two paths diverge.

use super::rows::{compare, dtype_name, host, int_tensor, Check, PROGRESS};
use crate::model::{tiny_config, Checkpoint, KvCache, ModelError, Qwen3, RopeScaling, Rows};
use burn::tensor::{DType, Device, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};


/// Per-token next-token logprob bits when every sequence runs through a KV cache `chunk` tokens
/// at a time (`usize::MAX`: whole prefill; 1: token by token). Each step launches the chunks of
/// a random subset of the unfinished sequences together, in random cache slots, so a token's
/// neighbours change from step to step.
pub fn stepping_logprob_bits(model: &Qwen3, seqs: &[Vec<u32>], chunk: usize, rng: &mut StdRng) -> Result<Vec<Vec<u32>>, ModelError> {
    let device = model.embed.device();
    let mut slot_of: Vec<usize> = (0..seqs.len()).collect();
    for i in (1..slot_of.len()).rev() {
        slot_of.swap(i, rng.random_range(0..=i));
    }
    let max_len = seqs.iter().map(|s| s.len()).max().unwrap_or(1);
    let mut cache = KvCache::new(&model.config, seqs.len(), max_len, model.dtype, &device);
    let mut done = vec![0usize; seqs.len()];
    let mut out: Vec<Vec<u32>> = seqs.iter().map(|s| vec![0; s.len().saturating_sub(1)]).collect();
    while done.iter().zip(seqs).any(|(d, s)| *d < s.len()) {
        let mut rows = Rows::default();
        let mut owner = vec![];
        for s in 0..seqs.len() {
            if done[s] >= seqs[s].len() || (chunk > 1 && rng.random_bool(0.3)) {
                continue;
            }
            let end = done[s].saturating_add(chunk).min(seqs[s].len());
            for p in done[s]..end {
                rows.push(seqs[s][p], slot_of[s] as u32, p as u32);
                owner.push((s, p));
            }
            done[s] = end;
        }
        if rows.is_empty() {
            continue;
        }
        let logits = model.forward(&rows, Some(&mut cache))?;
        let keep: Vec<(usize, usize, usize)> = owner.iter().enumerate().filter(|(_, (s, p))| p + 1 < seqs[*s].len()).map(|(r, &(s, p))| (r, s, p)).collect();
        if keep.is_empty() {
            continue;
        }
        let idx = int_tensor(keep.iter().map(|k| k.0 as i32).collect(), &device);
        let targets = int_tensor(keep.iter().map(|&(_, s, p)| seqs[s][p + 1] as i32).collect(), &device);
        let temps = Tensor::<1>::from_data(TensorData::new(vec![1.0f32; keep.len()], [keep.len()]), &device);
        let lp = host(crate::token_logprobs(logits.select(0, idx), targets, temps)?.logprobs);
        for (i, &(_, s, p)) in keep.iter().enumerate() {
            out[s][p] = lp[i].to_bits();
        }
    }
    Ok(out)
}

/// The sampler/trainer contract on random tiny Qwen3s: training-path logprob bits against the
/// stepping path at several chunk sizes. One check per chunk size (M = chunk, 0 = whole), for
/// heads of 16 values and of 128 (real Qwen3 and Llama heads, where some fused decode kernels
/// take another path on devices with fixed-size planes; these with Llama 3.1's RoPE scaling, the
/// others with q/k/v/o projection biases).
pub fn model_contract(dtype: DType, device: &Device, seed: u64, sequences: usize) -> Result<Vec<Check>, ModelError> {
    let mut checks = Vec::new();
    for wide_heads in [false, true] {
        checks.extend(contract_for(dtype, device, seed ^ wide_heads as u64, sequences, wide_heads)?);
    }
    Ok(checks)
}

fn contract_for(dtype: DType, device: &Device, seed: u64, sequences: usize, wide_heads: bool) -> Result<Vec<Check>, ModelError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let vocab = 97;
    let mut config = tiny_config(vocab, rng.random_bool(0.5));
    if wide_heads {
        (config.num_heads, config.num_kv_heads, config.head_dim) = (2, 1, 128);
        // and Llama 3.1's scaled RoPE: the tables differ, both paths must still read the same
        config.rope.scaling = RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_positions: 64.0 };
    } else {
        // projection biases (Llama's `attention_bias`: q/k/v and o), which the fused decode
        // path adds to the fused q/k/v projection as one concatenated bias
        (config.qkv_bias, config.o_bias) = (true, true);
    }
    let model = Qwen3::from_checkpoint(&Checkpoint::random(config, 0.2, rng.random()), dtype, device)?;
    let seqs: Vec<Vec<u32>> = (0..sequences)
        .map(|_| {
            let len = rng.random_range(2..80);
            (0..len).map(|_| rng.random_range(0..vocab as u32)).collect()
        })
        .collect();
    let train = model.sequence_logprobs(&seqs, 1.0)?.per_sequence;
    let want: Vec<Vec<f32>> = train;
    let mut checks = Vec::new();
    // the stepping path on the unfused forward (the ablation's kernel sets) and on the fused
    // decode launches the sampler runs
    let mut fused = model.clone();
    fused.fuse_projections();
    for (stepper, chunk) in [usize::MAX, 1, 7, 32].into_iter().flat_map(|c| [(&model, c), (&fused, c)]) {
        let got = stepping_logprob_bits(stepper, &seqs, chunk, &mut rng)?;
        let got: Vec<Vec<f32>> = got.iter().map(|s| s.iter().map(|&b| f32::from_bits(b)).collect()).collect();
        let want_refs: Vec<&Vec<f32>> = want.iter().collect();
        let how = if stepper.fused.is_empty() { "" } else { ", fused decode launches" };
        let how = if wide_heads { format!("{how}, heads of 128, Llama 3.1 RoPE") } else { format!("{how}, projection biases") };
        let name = if chunk == usize::MAX { format!("model: train vs prefill whole{how}") } else { format!("model: train vs chunks of {chunk}{how}") };
        let check = compare(&name, dtype_name(dtype), seqs.len(), &got, &want_refs);
        if !check.identical() && PROGRESS.load(std::sync::atomic::Ordering::Relaxed) {
            diagnose(stepper, &seqs, &want, &got);
        }
        checks.push(check);
    }
    Ok(checks)
}

/// Where a failing contract first differs: the first differing (sequence, position), whether
/// the training path gives that sequence the same bits alone as in its batch, and the auditor's
/// first diverging op between the training path and token-by-token stepping.
fn diagnose(model: &Qwen3, seqs: &[Vec<u32>], train: &[Vec<f32>], step: &[Vec<f32>]) {
    let Some((s, p)) = train.iter().zip(step).enumerate().find_map(|(s, (a, b))| a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits()).map(|p| (s, p))) else { return };
    eprintln!("  diagnose: sequence {s} (len {}) first differs at position {p}: train {} vs step {}", seqs[s].len(), train[s][p], step[s][p]);
    match model.sequence_logprobs(std::slice::from_ref(&seqs[s]), 1.0) {
        Ok(scores) => {
            let alone = scores.per_sequence;
            let same = alone[0].iter().zip(&train[s]).all(|(x, y)| x.to_bits() == y.to_bits());
            let first = alone[0].iter().zip(&train[s]).position(|(x, y)| x.to_bits() != y.to_bits());
            eprintln!("  diagnose: training path alone vs in its batch: {}", if same { "identical".to_string() } else { format!("DIFFERS from position {first:?}") });
        }
        Err(e) => eprintln!("  diagnose: {e}"),
    }
    match crate::model::audit::first_divergence(model, model, &seqs[s], p) {
        Ok(report) => eprintln!("  diagnose: alone, train vs token-by-token: {report}"),
        Err(e) => eprintln!("  diagnose: {e}"),
    }
}
