//! What every invariance check shares: the test seed, the batch sizes, a check's result and
//! its markdown table, random inputs, host read-backs, and the row-invariance harness (each
//! row inside batches of many sizes against the same row in the full batch).

use crate::KernelError;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The random seed of a test run: `LOCKSTEP_TEST_SEED` if set (to replay a failure), else fresh
/// from the clock. Printed, so a failing run can be replayed.
pub fn test_seed() -> u64 {
    let seed = crate::knobs::var("LOCKSTEP_TEST_SEED").and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(7)
    });
    eprintln!("LOCKSTEP_TEST_SEED={seed}");
    seed
}

/// Print a line per op as it completes (the battery binary turns this on).
pub static PROGRESS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The batch sizes every row-wise op is checked at.
pub const BATCH_SIZES: [usize; 10] = [1, 2, 3, 7, 8, 16, 33, 64, 128, 257];

/// One line of the battery table.
#[derive(Clone, Debug)]
pub struct Check {
    pub op: String,
    pub dtype: &'static str,
    pub m: usize,
    pub rows_differing: usize,
    pub max_abs_diff: f64,
}

impl Check {
    pub fn identical(&self) -> bool {
        self.rows_differing == 0
    }
}

/// Sizes of the battery's problems. `small` fits CI on lavapipe; `large` matches the shapes
/// measured on the H200 (hidden 2048, vocab 32000).
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub hidden: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub max_len: usize,
}

impl Dims {
    pub fn small() -> Self {
        Dims { hidden: 96, ffn: 80, vocab: 2500, heads: 4, kv_heads: 2, head_dim: 32, max_len: 150 }
    }
    pub fn large() -> Self {
        Dims { hidden: 2048, ffn: 2048, vocab: 32000, heads: 16, kv_heads: 8, head_dim: 128, max_len: 600 }
    }
}

pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        _ => "other",
    }
}

/// Uniform values in [-scale, scale) (never all zeros). SplitMix64 seeded from `rng`: fast
/// enough for the GPU battery's large buffers even in debug builds.
pub fn random_vec(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    let mut state: u64 = rng.random();
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            ((z >> 40) as f32 * (1.0 / 16_777_216.0) * 2.0 - 1.0) * scale
        })
        .collect()
}

pub fn float_tensor<const D: usize>(values: Vec<f32>, shape: [usize; D], dtype: DType, device: &Device) -> Tensor<D> {
    Tensor::<D>::from_data(TensorData::new(values, shape), device).cast(dtype)
}

pub fn int_tensor(values: Vec<i32>, device: &Device) -> Tensor<1, Int> {
    let n = values.len();
    Tensor::<1, Int>::from_data(TensorData::new(values, [n]), device)
}

/// Host copy as f32 (bf16 widens exactly).
pub fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.cast(DType::F32).into_data().convert::<f32>().try_to_vec::<f32>().expect("f32 data")
}

pub fn host_int(t: Tensor<1, Int>) -> Vec<i64> {
    t.into_data().convert::<i64>().try_to_vec::<i64>().expect("int data")
}

/// Rows of `width` values where any (got, want) pair differs in a bit (a length difference
/// counts its extra values as rows), and the largest difference seen.
pub fn differing_rows(pairs: &[(&[f32], &[f32])], width: usize) -> (usize, f64) {
    let mut differs: Vec<bool> = Vec::new();
    let mut max = 0.0f64;
    for (a, b) in pairs {
        for (i, (p, q)) in a.iter().zip(b.iter()).enumerate() {
            if p.to_bits() != q.to_bits() {
                let row = i / width;
                if differs.len() <= row {
                    differs.resize(row + 1, false);
                }
                differs[row] = true;
                max = max.max((*p as f64 - *q as f64).abs());
            }
        }
    }
    let extra: usize = pairs.iter().map(|(a, b)| a.len().abs_diff(b.len())).sum();
    (differs.iter().filter(|&&d| d).count() + extra, max)
}

/// Compare rows of batch results against the full-batch baseline, as bits.
pub fn compare(op: &str, dtype: &'static str, m: usize, got: &[Vec<f32>], want: &[&Vec<f32>]) -> Check {
    let mut rows_differing = 0;
    let mut max_abs_diff = 0.0f64;
    for (g, w) in got.iter().zip(want) {
        let differs = g.len() != w.len() || g.iter().zip(w.iter()).any(|(a, b)| a.to_bits() != b.to_bits());
        if differs {
            rows_differing += 1;
            for (a, b) in g.iter().zip(w.iter()) {
                max_abs_diff = max_abs_diff.max((*a as f64 - *b as f64).abs());
            }
        }
    }
    Check { op: op.to_string(), dtype, m, rows_differing, max_abs_diff }
}

/// Runs `f` on the full pool, then on random subsets of each size in `sizes` (random order),
/// comparing each row's output bits with its full-pool value.
pub fn row_invariance(
    op: &str,
    dtype: DType,
    pool: usize,
    sizes: &[usize],
    seed: u64,
    mut f: impl FnMut(&[usize]) -> Result<Vec<Vec<f32>>, KernelError>,
) -> Result<Vec<Check>, KernelError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let all: Vec<usize> = (0..pool).collect();
    let started = std::time::Instant::now();
    let baseline = f(&all)?;
    let mut checks = Vec::new();
    for &m in sizes.iter().filter(|&&m| m <= pool) {
        let mut idx = all.clone();
        for i in (1..idx.len()).rev() {
            idx.swap(i, rng.random_range(0..=i));
        }
        idx.truncate(m);
        let got = f(&idx)?;
        let want: Vec<&Vec<f32>> = idx.iter().map(|&i| &baseline[i]).collect();
        checks.push(compare(op, dtype_name(dtype), m, &got, &want));
    }
    // run to run: the full pool again
    let again = f(&all)?;
    let want: Vec<&Vec<f32>> = baseline.iter().collect();
    let mut rerun = compare(op, dtype_name(dtype), pool, &again, &want);
    rerun.op = format!("{op} (rerun)");
    checks.push(rerun);
    if PROGRESS.load(std::sync::atomic::Ordering::Relaxed) {
        let bad = checks.iter().filter(|c| !c.identical()).count();
        eprintln!("  {op} {}: {} checks, {bad} differ, {:.1} s", dtype_name(dtype), checks.len(), started.elapsed().as_secs_f64());
    }
    Ok(checks)
}

/// Markdown table of checks.
pub fn table(rows: &[(&str, Check)]) -> String {
    let mut out = String::from("| impl | op | dtype | M | bit-identical | rows differing | max abs diff |\n|---|---|---|---|---|---|---|\n");
    for (which, c) in rows {
        out += &format!(
            "| {which} | {} | {} | {} | {} | {} | {:.3e} |\n",
            c.op, c.dtype, c.m, match (c.identical(), c.op.contains("vs f64")) { (true, false) => "yes", (true, true) => "within tolerance", (false, false) => "NO", (false, true) => "OUT OF TOLERANCE" }, c.rows_differing, c.max_abs_diff
        );
    }
    out
}
