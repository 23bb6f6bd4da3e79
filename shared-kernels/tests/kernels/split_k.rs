//! The ablation's kernels: the split-K matmul (accurate, deterministic for a given M, and by
//! design not batch invariant: a row's bits change when the batch size changes its split count)
//! and the bf16_logits arm's rounding (the host reference's bits).

use burn::tensor::{DType, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shared_kernels::ops::ablation::matmul_split_k::{matmul_split_k, splits_for};
use shared_kernels::WeightLayout;

fn host(t: Tensor<2>) -> Vec<f32> {
    t.cast(DType::F32).into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

#[test]
fn split_k_matmul_is_accurate_but_its_rows_change_with_batch_size() {
    let device = crate::device();
    let mut rng = StdRng::seed_from_u64(crate::seed());
    let (k, n, pool) = (384usize, 48usize, 200usize);
    let xs: Vec<f32> = (0..pool * k).map(|_| rng.random_range(-1.0..1.0)).collect();
    let ws: Vec<f32> = (0..n * k).map(|_| rng.random_range(-0.1..0.1)).collect();
    let w = Tensor::<2>::from_data(TensorData::new(ws.clone(), [n, k]), &device);
    let rows = |m: usize| -> Vec<f32> {
        let x = Tensor::<2>::from_data(TensorData::new(xs[..m * k].to_vec(), [m, k]), &device);
        host(matmul_split_k(x, w.clone(), WeightLayout::OutIn).unwrap())
    };
    let (one, many, again) = (rows(1), rows(pool), rows(pool));
    assert_eq!(splits_for(1), 8);
    assert_eq!(splits_for(pool), 1);
    // accurate against f64 for every row of the big batch
    for r in 0..pool {
        for c in 0..n {
            let want: f64 = (0..k).map(|i| xs[r * k + i] as f64 * ws[c * k + i] as f64).sum();
            assert!((many[r * n + c] as f64 - want).abs() < 1e-4, "row {r} col {c}: {} vs {want}", many[r * n + c]);
        }
    }
    // deterministic for a given M
    assert_eq!(many.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), again.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
    // row 0 alone (8 splits) vs among 200 rows (1 split): some of its 48 outputs change bits
    let differing = (0..n).filter(|&c| one[c].to_bits() != many[c].to_bits()).count();
    assert!(differing > 0, "row 0 kept every bit across split counts; the ablation would show no mismatch");
}

#[test]
fn the_bf16_logits_rounding_is_the_host_reference_bit_for_bit() {
    use shared_kernels::ops::ablation::round_bf16::{round_to_bf16, round_to_bf16_reference};
    let device = crate::device();
    let mut rng = StdRng::seed_from_u64(crate::seed());
    // logits-like values, exact ties (1 + 2^-8 scaled), signed zeros, infinities, the largest
    // finite f32 (rounds to infinity) and values from raw random bits
    let mut values: Vec<f32> = (0..3000).map(|_| rng.random_range(-30.0f32..30.0)).collect();
    values.extend((0..200).map(|i| (1.0 + 2f32.powi(-8) + (i % 2) as f32 * 2f32.powi(-7)) * 2f32.powi(i % 20 - 10)));
    values.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, -f32::MAX, f32::MIN_POSITIVE]);
    values.extend((0..2000).map(|_| f32::from_bits(rng.random::<u32>())).filter(|v| !v.is_nan()));
    let cols = 7;
    values.truncate(values.len() / cols * cols);
    let x = Tensor::<2>::from_data(TensorData::new(values.clone(), [values.len() / cols, cols]), &device);
    let got = host(round_to_bf16(x).unwrap());
    for (i, (&v, &g)) in values.iter().zip(&got).enumerate() {
        assert_eq!(g.to_bits(), round_to_bf16_reference(v).to_bits(), "value {i}: {v:e} -> {g:e}");
    }
    assert!(values.iter().zip(&got).any(|(v, g)| v.to_bits() != g.to_bits()), "nothing was rounded");
}
