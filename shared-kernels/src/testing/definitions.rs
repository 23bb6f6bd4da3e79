//! The battery's rows against a definition rather than between batch sizes: lockstep's matmul
//! against an f64 reference, the weight fingerprint's launch against its host definition, the
//! truncation kernel against its plain bisection.

use crate::ops::matmul::WeightLayout;
use crate::KernelError;
use burn::tensor::{DType, Device};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::rows::*;

/// The weight fingerprint's launch against its host definition (integer sums: equal or not).
pub fn fingerprint_check(dtype: DType, device: &Device, seed: u64) -> Result<Check, KernelError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = 50_000 + rng.random_range(0..9000);
    let t = float_tensor(random_vec(&mut rng, n, 1.0), [n], dtype, device);
    let want = crate::ops::fingerprint::fingerprint_reference(&host(t.clone()));
    let launched = crate::ops::fingerprint::fingerprint_launch(t)?;
    let got = crate::ops::fingerprint::fold_data(launched.partials.into_data()).map_err(|e| KernelError::new("fingerprint", e))?;
    Ok(Check { op: "weight fingerprint = host definition".into(), dtype: dtype_name(dtype), m: n, rows_differing: usize::from(got != want), max_abs_diff: 0.0 })
}

/// lockstep's matmul (tensor cores for bf16 on CUDA, the scalar kernel elsewhere) against an f64
/// reference on the same rounded inputs, at shapes off every tile edge (M across the 128-row
/// tile, N and K not multiples of 16, vector widths 1, 4 and 8). A row fails when any element is
/// off by more than `rel` of the row's largest |reference| (bf16: 2^-7, four output roundings;
/// f32: 1e-5). `max_abs_diff` is relative to that row maximum.
pub fn matmul_accuracy(dtype: DType, device: &Device, seed: u64) -> Result<Vec<Check>, KernelError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let rel = if dtype == DType::F32 { 1e-5 } else { 1.0 / 128.0 };
    let mut checks = Vec::new();
    // the last four run the decode kernel on tensor cores: narrow weights over several x
    // stages (K 1088, 2080), wide ones (N 8208: a cube with one active plane of four) through
    // slabs with a trailing single-step chunk (K 160) and over nine x stages at 64 rows (K 1056)
    for (m, n, k) in [(130usize, 200usize, 100usize), (17, 72, 2048), (1, 1000, 37), (257, 64, 64), (5, 160, 1088), (16, 176, 2080), (40, 8208, 160), (64, 8208, 1056)] {
        for layout in [WeightLayout::OutIn, WeightLayout::InOut] {
            let wshape = if layout == WeightLayout::OutIn { [n, k] } else { [k, n] };
            let xt = float_tensor(random_vec(&mut rng, m * k, 1.0), [m, k], dtype, device);
            let wt = float_tensor(random_vec(&mut rng, n * k, 0.1), wshape, dtype, device);
            let (xh, wh) = (host(xt.clone()), host(wt.clone()));
            let y = host(crate::matmul(xt, wt, layout)?);
            let mut rows_differing = 0;
            let mut worst = 0.0f64;
            for r in 0..m {
                let reference: Vec<f64> = (0..n)
                    .map(|c| (0..k).map(|i| xh[r * k + i] as f64 * if layout == WeightLayout::OutIn { wh[c * k + i] } else { wh[i * n + c] } as f64).sum())
                    .collect();
                let scale = reference.iter().fold(1e-30f64, |a, v| a.max(v.abs()));
                let err = (0..n).map(|c| (y[r * n + c] as f64 - reference[c]).abs() / scale).fold(0.0, f64::max);
                worst = worst.max(err);
                rows_differing += (err > rel) as usize;
            }
            let tag = if layout == WeightLayout::OutIn { "W[N,K]" } else { "W[K,N]" };
            checks.push(Check { op: format!("matmul {tag} vs f64, {m}x{n}x{k}"), dtype: dtype_name(dtype), m, rows_differing, max_abs_diff: worst });
        }
    }
    Ok(checks)
}

/// The truncation kernel's thresholds against its definition's (plain bisection, a pass a step),
/// as bits, at `vocab` (the battery's: 2,500 or, `--large`, 32,000) and `dtype` logits: rows cycling through top-p alone,
/// Qwen3's top-k 20 / top-p 0.95 (survivors in shared memory), top-k 2,000 with top-p (over the
/// row from an unaligned start), top-k alone, greedy and no truncation.
pub fn truncation_check(dtype: DType, device: &Device, seed: u64, vocab: usize) -> Result<Check, KernelError> {
    use crate::ops::logits::truncation::{row_thresholds, ThresholdKernel};
    const SETTINGS: [(f32, u32, f32); 6] = [(1.0, 0, 0.95), (0.7, 20, 0.95), (1.0, 2000, 0.9), (1.3, 50, 1.0), (0.0, 20, 0.9), (1.0, 0, 1.0)];
    let mut rng = StdRng::seed_from_u64(seed);
    let rows = 48;
    let logits = float_tensor(random_vec(&mut rng, rows * vocab, 4.0), [rows, vocab], dtype, device);
    let column = |f: fn(&(f32, u32, f32)) -> f32| burn::tensor::Tensor::<1>::from_data(burn::tensor::TensorData::new((0..rows).map(|r| f(&SETTINGS[r % SETTINGS.len()])).collect::<Vec<f32>>(), [rows]), device);
    let truncation = crate::Truncation {
        top_k: burn::tensor::Tensor::from_data(burn::tensor::TensorData::new((0..rows).map(|r| SETTINGS[r % SETTINGS.len()].1 as i64).collect::<Vec<_>>(), [rows]), device),
        top_p: column(|s| s.2),
    };
    let temps = column(|s| s.0);
    let fast = row_thresholds(logits.clone(), temps.clone(), &truncation, ThresholdKernel::Fast)?;
    let definition = row_thresholds(logits, temps, &truncation, ThresholdKernel::Definition)?;
    let rows_differing = fast.iter().zip(&definition).filter(|(a, b)| a != b).count();
    Ok(Check { op: "top-k / top-p thresholds = definition (bisection)".into(), dtype: dtype_name(dtype), m: rows, rows_differing, max_abs_diff: 0.0 })
}
