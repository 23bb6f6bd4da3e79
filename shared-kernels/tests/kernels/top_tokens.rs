//! A row's most likely tokens (`top_logprobs`): the order against a host sort of the same f32
//! scaled logits (highest first, ties to the lower id), the logprobs against an f64 reference,
//! the sampled token's logprob the same bits here as in the sampler's answer, and a row's
//! result the same bits alone as among other rows.

use burn::tensor::{DType, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::SeedableRng;
use shared_kernels::ops::logits::sampling::{row_rng_key, sample, SamplingRow};
use shared_kernels::ops::logits::top_tokens::top_tokens;
use shared_kernels::testing::rows::{float_tensor, random_vec};

const TEMPERATURES: [f32; 5] = [1.0, 0.7, 0.0, 1.3, 1.0];

fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

fn ids(t: Tensor<1, Int>) -> Vec<i64> {
    t.into_data().convert::<i64>().try_to_vec::<i64>().unwrap()
}

/// ([rows * n] ids, [rows * n] logprobs) of `logits` rows `rows` (a subset, in order).
fn top(logits: &[f32], vocab: usize, rows: &[usize], temps: &[f32], n: usize) -> (Vec<i64>, Vec<f32>) {
    let device = crate::device();
    let picked: Vec<f32> = rows.iter().flat_map(|&r| logits[r * vocab..(r + 1) * vocab].iter().copied()).collect();
    let t = Tensor::<1>::from_data(TensorData::new(rows.iter().map(|&r| temps[r]).collect::<Vec<_>>(), [rows.len()]), &device);
    let (tokens, logprobs) = top_tokens(float_tensor(picked, [rows.len(), vocab], DType::F32, &device), t, n).unwrap();
    (ids(tokens), host(logprobs))
}

#[test]
fn top_tokens_are_the_sorted_scaled_logits_with_the_samplers_logprob_bits_in_any_batch() {
    let mut rng = StdRng::seed_from_u64(crate::seed());
    // two vocabulary chunks and a short tail; a grid of 1/4 makes whole runs of ties
    for (vocab, grid) in [(4500usize, false), (4500, true), (300, false)] {
        let rows = TEMPERATURES.len();
        let mut logits = random_vec(&mut rng, rows * vocab, 3.0);
        if grid {
            logits.iter_mut().for_each(|x| *x = (*x * 4.0).round() / 4.0);
        }
        let n = 20;
        let all: Vec<usize> = (0..rows).collect();
        let (tokens, logprobs) = top(&logits, vocab, &all, &TEMPERATURES, n);
        for r in 0..rows {
            let t = TEMPERATURES[r];
            let inv = if t > 0.0 { 1.0 / t } else { 1.0 };
            let z: Vec<f32> = logits[r * vocab..(r + 1) * vocab].iter().map(|&x| x * inv).collect();
            let mut order: Vec<usize> = (0..vocab).collect();
            order.sort_by(|&a, &b| z[b].total_cmp(&z[a]).then(a.cmp(&b)));
            let got: Vec<usize> = tokens[r * n..(r + 1) * n].iter().map(|&x| x as usize).collect();
            assert_eq!(got, order[..n].to_vec(), "vocab {vocab}, grid {grid}, row {r}");
            let m = z.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
            let lse = m + z.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
            for k in 0..n {
                let want = z[got[k]] as f64 - lse;
                let lp = logprobs[r * n + k] as f64;
                assert!((lp - want).abs() < 1e-5, "vocab {vocab}, row {r}, rank {k}: {lp} against {want}");
            }
        }
        // the sampler's answer: its token's logprob is the same bits where the token is listed
        // (always at T = 0, where it is the first)
        let device = crate::device();
        let params: Vec<SamplingRow> = (0..rows).map(|r| SamplingRow { temperature: TEMPERATURES[r], top_k: 0, top_p: 1.0, rng_key: row_rng_key(7, r as u64, 3), processed: false }).collect();
        let (sampled, sampled_lp) = sample(float_tensor(logits.clone(), [rows, vocab], DType::F32, &device), &params).unwrap();
        let (sampled, sampled_lp) = (ids(sampled), host(sampled_lp));
        let mut listed = 0;
        for r in 0..rows {
            if let Some(k) = (0..n).find(|&k| tokens[r * n + k] == sampled[r]) {
                listed += 1;
                assert_eq!(logprobs[r * n + k].to_bits(), sampled_lp[r].to_bits(), "vocab {vocab}, row {r}: the sampled token's logprob differs");
            }
        }
        assert_eq!(tokens[2 * n], sampled[2], "the greedy row's first token is its argmax");
        assert!(listed >= 1, "no sampled token among the top {n}");
        // each row alone, and two rows in another order: the same bits
        for subset in [vec![3], vec![4, 0], vec![2]] {
            let (t, lp) = top(&logits, vocab, &subset, &TEMPERATURES, n);
            for (i, &r) in subset.iter().enumerate() {
                assert_eq!(t[i * n..(i + 1) * n], tokens[r * n..(r + 1) * n], "vocab {vocab}, row {r} in {subset:?}");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&lp[i * n..(i + 1) * n]), bits(&logprobs[r * n..(r + 1) * n]), "vocab {vocab}, row {r} in {subset:?}");
            }
        }
    }
    // a bad count is an error naming the op, never a panic
    let device = crate::device();
    let err = top_tokens(float_tensor(vec![0.5; 30], [1, 30], DType::F32, &device), Tensor::<1>::from_data(TensorData::new(vec![1.0f32], [1]), &device), 21).unwrap_err().to_string();
    assert!(err.contains("top tokens") && err.contains("21"), "{err}");
}
