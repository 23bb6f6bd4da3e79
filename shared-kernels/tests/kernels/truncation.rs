//! The truncation kernel (top-k / top-p thresholds) against its definition, as bits: the plain
//! bisection with one pass over the row a step ([`shared_kernels::ops::logits::truncation_definition`]).
//! Each of the fast kernel's paths is reached: top-k's radix passes, top-p from top-k's survivors
//! in shared memory (at most 1,024 of them), and top-p over the row, several steps a pass (from
//! 0 and from a top-k threshold that is no power-of-two boundary).

use burn::tensor::{DType, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shared_kernels::ops::logits::truncation::{row_thresholds, ThresholdKernel};
use shared_kernels::testing::rows::{float_tensor, random_vec};
use shared_kernels::Truncation;

/// (temperature, top_k, top_p) of each row, cycling.
const SETTINGS: [(f32, u32, f32); 10] = [
    (1.0, 0, 0.95),   // top-p over the row from 0
    (0.7, 20, 0.95),  // Qwen3's: top-p over top-k's survivors in shared memory
    (1.0, 2000, 0.9), // top-p over the row from top-k's threshold (too many survivors)
    (1.3, 5, 1.0),    // top-k alone
    (1.0, 0, 0.3),
    (0.0, 20, 0.5),   // greedy: every token kept (0)
    (1.0, 1, 1.0),
    (0.6, 1024, 0.8), // survivors that just fit, or just do not (ties)
    (1.0, 0, 1.0),    // no truncation: 0
    (2.0, 300, 0.999),
];

fn thresholds_both_ways(logits: Vec<f32>, rows: usize, vocab: usize, settings: &[(f32, u32, f32)]) -> (Vec<u32>, Vec<u32>) {
    let device = crate::device();
    let temps = Tensor::<1>::from_data(TensorData::new(settings.iter().map(|s| s.0).collect::<Vec<_>>(), [rows]), &device);
    let truncation = Truncation {
        top_k: Tensor::from_data(TensorData::new(settings.iter().map(|s| s.1 as i64).collect::<Vec<_>>(), [rows]), &device),
        top_p: Tensor::from_data(TensorData::new(settings.iter().map(|s| s.2).collect::<Vec<_>>(), [rows]), &device),
    };
    let logits = float_tensor(logits, [rows, vocab], DType::F32, &device);
    let fast = row_thresholds(logits.clone(), temps.clone(), &truncation, ThresholdKernel::Fast).unwrap();
    let definition = row_thresholds(logits, temps, &truncation, ThresholdKernel::Definition).unwrap();
    (fast, definition)
}

#[test]
fn fast_thresholds_equal_the_definitions_bits_on_every_path() {
    let mut rng = StdRng::seed_from_u64(crate::seed());
    for (vocab, scale, ties) in [(4500, 4.0, false), (4500, 2.0, true), (700, 6.0, false)] {
        let rows = 3 * SETTINGS.len();
        let mut logits = random_vec(&mut rng, rows * vocab, scale);
        if ties {
            // logits on a grid of 1/4: whole runs of tokens tie at every boundary
            logits.iter_mut().for_each(|x| *x = (*x * 4.0).round() / 4.0);
        }
        let settings: Vec<(f32, u32, f32)> = (0..rows).map(|r| SETTINGS[r % SETTINGS.len()]).collect();
        let (fast, definition) = thresholds_both_ways(logits, rows, vocab, &settings);
        for r in 0..rows {
            assert_eq!(fast[r], definition[r], "vocab {vocab}, ties {ties}, row {r} {:?}: fast {:#010x}, definition {:#010x}", settings[r], fast[r], definition[r]);
        }
        // the checks bite: truncating rows have thresholds above 0, the others exactly 0
        for (r, s) in settings.iter().enumerate() {
            let truncates = s.0 > 0.0 && ((s.1 > 0 && (s.1 as usize) < vocab) || s.2 < 1.0);
            assert_eq!(fast[r] > 0, truncates, "vocab {vocab}, row {r} {s:?}: threshold {:#010x}", fast[r]);
        }
    }
}

#[test]
fn thresholds_keep_what_top_k_and_top_p_say() {
    // a row of known values: keys of 10 distinct logits, each repeated, so counts and masses are
    // easy to state; the kept sets are read off the thresholds
    let vocab = 1500;
    let mut rng = StdRng::seed_from_u64(crate::seed() ^ 7);
    let values: Vec<f32> = (0..vocab).map(|_| rng.random_range(0..10) as f32).collect();
    let settings = [(1.0f32, 1u32, 1.0f32), (1.0, 0, 1e-6)];
    let (fast, _) = thresholds_both_ways([values.clone(), values.clone()].concat(), 2, vocab, &settings);
    // the order key of a logit, as `rows::order_key` defines it
    let key = |z: f32| if z.to_bits() >= 0x8000_0000 { !z.to_bits() } else { z.to_bits() ^ 0x8000_0000 };
    let kept = |t: u32| values.iter().filter(|&&v| key(v) >= t).count();
    let top = values.iter().filter(|&&v| v == 9.0).count();
    // top-k 1 keeps every token tied with the largest; top-p ~0 keeps the same head
    assert_eq!(fast[0], key(9.0));
    assert_eq!(kept(fast[0]), top);
    assert_eq!(fast[1], key(9.0));
}

#[test]
fn a_row_is_scored_on_its_kept_set_only_when_processed_and_truncating() {
    // the sampler's choice of logprob kernels must be the trainer's (`Truncation::uniform` is
    // `None` for a row that keeps the whole vocabulary): a processed row that keeps everything
    // is scored on the full distribution, like a raw one
    let vocab = 151_936;
    let row = |temperature, top_k, top_p, processed| shared_kernels::SamplingRow { temperature, top_k, top_p, rng_key: 7, processed };
    for (r, kept_set) in [
        (row(0.7, 20, 0.95, true), true),
        (row(1.0, 0, 0.9, true), true),
        (row(1.2, 5, 1.0, true), true),
        (row(0.7, 20, 0.95, false), false),        // raw
        (row(0.7, 0, 1.0, true), false),           // keeps the whole vocabulary
        (row(0.0, 20, 0.5, true), false),          // greedy: scored at T = 1 on the full distribution
        (row(1.0, vocab as u32, 1.0, true), false), // top-k of the whole vocabulary
    ] {
        assert_eq!(r.scored_on_kept_set(vocab), kept_set, "{r:?}");
        // the trainer masks exactly the processed rows the sampler scores on a kept set
        let trainer_masks = Truncation::uniform(r.temperature, r.top_k, r.top_p, 4, vocab, &crate::device()).is_some();
        assert_eq!(r.processed && trainer_masks, kept_set, "{r:?}");
    }
}
