//! The invariance battery: for every op, the bits of each row computed inside batches of many
//! sizes, in random order with random neighbours, against the same row computed in the full
//! batch. Used by the tests (which assert) and by `lockstep-battery` (which prints a table,
//! with burn's default ops alongside for contrast).

use crate::ops::matmul::WeightLayout;
use crate::ops::rope::RopeTables;
use crate::ops::logits::sampling::SamplingRow;
use crate::model::{tiny_config, Checkpoint, KvCache, ModelError, Qwen3, Rows};
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

fn rows_of(flat: Vec<f32>, width: usize) -> Vec<Vec<f32>> {
    flat.chunks(width).map(|c| c.to_vec()).collect()
}

fn gather(pool: &[f32], width: usize, idx: &[usize]) -> Vec<f32> {
    idx.iter().flat_map(|&i| pool[i * width..(i + 1) * width].iter().cloned()).collect()
}

/// Which implementation a battery row measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Impl {
    Lockstep,
    BurnDefault,
}

/// Every op of the battery at `dtype`, for `which` implementation. Burn has no equivalent of
/// some lockstep ops (sampling, attention over a KV cache): those rows are lockstep-only.
pub fn run_all(which: Impl, dtype: DType, dims: Dims, device: &Device, seed: u64) -> Result<Vec<Check>, KernelError> {
    let pool = *BATCH_SIZES.last().unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut checks = Vec::new();
    let Dims { hidden, ffn, vocab, .. } = dims;

    // matmul, both weight layouts
    let x = random_vec(&mut rng, pool * hidden, 1.0);
    let w = random_vec(&mut rng, ffn * hidden, 0.1);
    for layout in [WeightLayout::OutIn, WeightLayout::InOut] {
        let (name, wshape) = match layout {
            WeightLayout::OutIn => ("matmul W[N,K]", [ffn, hidden]),
            WeightLayout::InOut => ("matmul W[K,N]", [hidden, ffn]),
        };
        let wt = float_tensor(w.clone(), wshape, dtype, device);
        checks.extend(row_invariance(name, dtype, pool, &BATCH_SIZES, seed + 1, |idx| {
            let xt = float_tensor(gather(&x, hidden, idx), [idx.len(), hidden], dtype, device);
            let y = match (which, layout) {
                (Impl::Lockstep, l) => crate::matmul(xt, wt.clone(), l)?,
                (Impl::BurnDefault, WeightLayout::OutIn) => xt.matmul(wt.clone().transpose()),
                (Impl::BurnDefault, WeightLayout::InOut) => xt.matmul(wt.clone()),
            };
            Ok(rows_of(host(y), ffn))
        })?);
        // the two tensor-core kernels the hybrid default switches between must agree row for
        // row: rows of a tc launch (every subset size) against the same rows of a pipelined
        // launch of the full pool
        let tensor_cores = crate::ops::matmul::matmul_kernel_on(device, dtype)? != crate::ops::matmul::MatmulKernel::Scalar;
        if which == Impl::Lockstep && tensor_cores {
            use crate::ops::matmul::{matmul_with, MatmulKernel};
            checks.extend(row_invariance(&format!("{name} tc = pipelined"), dtype, pool, &BATCH_SIZES, seed + 1, |idx| {
                let xt = float_tensor(gather(&x, hidden, idx), [idx.len(), hidden], dtype, device);
                let kernel = if idx.len() == pool { MatmulKernel::Pipelined } else { MatmulKernel::TensorCore };
                Ok(rows_of(host(matmul_with(Some(kernel), xt, wt.clone(), layout)?), ffn))
            })?);
            // tc (the decode kernel at M <= 64, asynchronous-copy tiles above) against the
            // register-prefetch 128x64 tiles (tc-tiles, full pool)
            checks.extend(row_invariance(&format!("{name} tc = tc-tiles"), dtype, pool, &BATCH_SIZES, seed + 1, |idx| {
                let xt = float_tensor(gather(&x, hidden, idx), [idx.len(), hidden], dtype, device);
                let kernel = if idx.len() == pool { MatmulKernel::TensorCoreTiles } else { MatmulKernel::TensorCore };
                Ok(rows_of(host(matmul_with(Some(kernel), xt, wt.clone(), layout)?), ffn))
            })?);
            // a weight gradient's xᵀ @ dy with xᵀ read in place by the asynchronous tiles against
            // the register-prefetch tiles on a transposed copy (K = 256: whole 16-byte vectors)
            if layout == WeightLayout::InOut {
                let k_rows = pool & !7;
                let dy = random_vec(&mut rng, k_rows * ffn, 1.0);
                let xt = float_tensor(x[..k_rows * hidden].to_vec(), [k_rows, hidden], dtype, device);
                let dyt = float_tensor(dy, [k_rows, ffn], dtype, device);
                if !crate::ops::matmul::tc::transposed_x_fits(layout, (hidden, k_rows, ffn)) {
                    return Err(KernelError::new("battery", format!("xᵀ in place does not apply at {hidden}x{k_rows}x{ffn}: the check would compare the copy with itself")));
                }
                let in_place = host(crate::ops::matmul::matmul_transposed_x_with(Some(MatmulKernel::TensorCoreAsync), xt.clone(), dyt.clone(), layout)?);
                let copied = host(matmul_with(Some(MatmulKernel::TensorCoreTiles), xt.clone().transpose(), dyt.clone(), layout)?);
                let want = rows_of(copied, ffn);
                checks.push(compare("matmul xᵀ @ dy: xᵀ in place = transposed copy", dtype_name(dtype), hidden, &rows_of(in_place, ffn), &want.iter().collect::<Vec<_>>()));
                if crate::ops::matmul::wgmma_on(device)? {
                    let warpgroup = host(crate::ops::matmul::matmul_transposed_x_with(Some(MatmulKernel::Warpgroup), xt.clone(), dyt.clone(), layout)?);
                    checks.push(compare("matmul xᵀ @ dy: wgmma, xᵀ in place = transposed copy", dtype_name(dtype), hidden, &rows_of(warpgroup, ffn), &want.iter().collect::<Vec<_>>()));
                }
            }
            // the warpgroup (wgmma) tiles at every M against the register-prefetch tiles, and
            // their f32 accumulators against a plain cmma chain (as bits: a bf16 output hides
            // most one-ulp differences of the accumulator)
            if crate::ops::matmul::wgmma_on(device)? {
                checks.extend(row_invariance(&format!("{name} wgmma = tc-tiles"), dtype, pool, &BATCH_SIZES, seed + 1, |idx| {
                    let xt = float_tensor(gather(&x, hidden, idx), [idx.len(), hidden], dtype, device);
                    let y = if idx.len() == pool { matmul_with(Some(MatmulKernel::TensorCoreTiles), xt, wt.clone(), layout)? } else { crate::ops::matmul::matmul_warpgroup(xt, wt.clone(), layout, dtype, None, None)? };
                    Ok(rows_of(host(y), ffn))
                })?);
                let rows = pool & !15;
                if layout == WeightLayout::OutIn && hidden % 16 == 0 && ffn % 16 == 0 {
                    let xt = float_tensor(x[..rows * hidden].to_vec(), [rows, hidden], dtype, device);
                    let chain = rows_of(host(crate::ops::matmul::matmul_cmma_chain_f32(xt.clone(), wt.clone())?), ffn);
                    let warpgroup = rows_of(host(crate::ops::matmul::matmul_warpgroup(xt, wt.clone(), layout, DType::F32, None, None)?), ffn);
                    checks.push(compare("matmul W[N,K] f32 accumulators: wgmma = cmma chain", dtype_name(dtype), rows, &warpgroup, &chain.iter().collect::<Vec<_>>()));
                }
                // each tile shape under each schedule against the register-prefetch tiles, on an
                // output with more tiles than the persistent grid holds (its cubes walk several)
                // and a K whose 22 k-tiles (the last one partial) are no multiple of any slot count
                use crate::ops::matmul::wgmma::{WgmmaSchedule, WgmmaTiles};
                let (m_big, k_big, n_big) = (4133, 1352, 1536);
                let xb = float_tensor(random_vec(&mut rng, m_big * k_big, 1.0), [m_big, k_big], dtype, device);
                let wshape = if layout == WeightLayout::OutIn { [n_big, k_big] } else { [k_big, n_big] };
                let wb = float_tensor(random_vec(&mut rng, n_big * k_big, 0.05), wshape, dtype, device);
                let want = rows_of(host(matmul_with(Some(MatmulKernel::TensorCoreTiles), xb.clone(), wb.clone(), layout)?), n_big);
                for (schedule, tiles) in [
                    (WgmmaSchedule::Persistent, WgmmaTiles::DEFAULT),
                    (WgmmaSchedule::Persistent, WgmmaTiles::NARROW),
                    (WgmmaSchedule::Persistent, WgmmaTiles::MEDIUM),
                    (WgmmaSchedule::Persistent, WgmmaTiles::SMALL),
                    (WgmmaSchedule::Synced, WgmmaTiles::DEFAULT),
                ] {
                    let got = rows_of(host(crate::ops::matmul::matmul_warpgroup(xb.clone(), wb.clone(), layout, dtype, Some(schedule), Some(tiles))?), n_big);
                    let op = format!("{name} {m_big}x{k_big}x{n_big}: wgmma {schedule:?} {}/{}/{} = tc-tiles", tiles.wg_m, tiles.bn, tiles.stages);
                    checks.push(compare(&op, dtype_name(dtype), m_big, &got, &want.iter().collect::<Vec<_>>()));
                }
            }
            // the asynchronous-copy tiles at every M against the register-prefetch tiles
            checks.extend(row_invariance(&format!("{name} tc-async = tc-tiles"), dtype, pool, &BATCH_SIZES, seed + 1, |idx| {
                let xt = float_tensor(gather(&x, hidden, idx), [idx.len(), hidden], dtype, device);
                let kernel = if idx.len() == pool { MatmulKernel::TensorCoreTiles } else { MatmulKernel::TensorCoreAsync };
                Ok(rows_of(host(matmul_with(Some(kernel), xt, wt.clone(), layout)?), ffn))
            })?);
        }
    }

    // rmsnorm
    let weight = random_vec(&mut rng, hidden, 1.0);
    let wt = float_tensor(weight, [hidden], dtype, device);
    checks.extend(row_invariance("rmsnorm", dtype, pool, &BATCH_SIZES, seed + 2, |idx| {
        let xt = float_tensor(gather(&x, hidden, idx), [idx.len(), hidden], dtype, device);
        let y = match which {
            Impl::Lockstep => crate::rmsnorm(xt, wt.clone(), 1e-6)?,
            Impl::BurnDefault => {
                let x32 = xt.clone().cast(DType::F32);
                let inv = (x32.clone() * x32.clone()).mean_dim(1).add_scalar(1e-6).sqrt().recip();
                (x32 * inv).cast(dtype) * wt.clone().unsqueeze::<2>()
            }
        };
        Ok(rows_of(host(y), hidden))
    })?);

    // log-softmax family: logprob + entropy (lockstep) / log_softmax gather (burn)
    let logits = random_vec(&mut rng, pool * vocab, 4.0);
    let targets: Vec<i32> = (0..pool).map(|_| rng.random_range(0..vocab as i32)).collect();
    let temps: Vec<f32> = (0..pool).map(|i| [1.0, 0.7, 1.3][i % 3]).collect();
    checks.extend(row_invariance("logprob+entropy", dtype, pool, &BATCH_SIZES, seed + 3, |idx| {
        let lt = float_tensor(gather(&logits, vocab, idx), [idx.len(), vocab], dtype, device);
        let tg: Vec<i32> = idx.iter().map(|&i| targets[i]).collect();
        match which {
            Impl::Lockstep => {
                let tt: Vec<f32> = idx.iter().map(|&i| temps[i]).collect();
                let out = crate::token_logprobs(lt, int_tensor(tg, device), Tensor::<1>::from_data(TensorData::new(tt, [idx.len()]), device))?;
                let (lp, en) = (host(out.logprobs), host(out.entropy));
                Ok(lp.into_iter().zip(en).map(|(a, b)| vec![a, b]).collect())
            }
            Impl::BurnDefault => {
                let n = idx.len();
                let ls = burn::tensor::activation::log_softmax(lt.cast(DType::F32), 1);
                let picked = ls.gather(1, int_tensor(tg, device).reshape([n, 1]));
                Ok(rows_of(host(picked.reshape([n])), 1))
            }
        }
    })?);
    if which == Impl::BurnDefault {
        checks.extend(row_invariance("softmax", dtype, pool, &BATCH_SIZES, seed + 4, |idx| {
            let lt = float_tensor(gather(&logits, vocab, idx), [idx.len(), vocab], dtype, device);
            Ok(rows_of(host(burn::tensor::activation::softmax(lt, 1)), vocab))
        })?);
        return Ok(checks);
    }

    // pointwise ops
    let up = random_vec(&mut rng, pool * hidden, 2.0);
    checks.extend(row_invariance("swiglu", dtype, pool, &BATCH_SIZES, seed + 5, |idx| {
        let g = float_tensor(gather(&x, hidden, idx), [idx.len(), hidden], dtype, device);
        let u = float_tensor(gather(&up, hidden, idx), [idx.len(), hidden], dtype, device);
        Ok(rows_of(host(crate::swiglu(g, u)?), hidden))
    })?);
    checks.extend(row_invariance("residual add", dtype, pool, &BATCH_SIZES, seed + 6, |idx| {
        let a = float_tensor(gather(&x, hidden, idx), [idx.len(), hidden], dtype, device);
        let b = float_tensor(gather(&up, hidden, idx), [idx.len(), hidden], dtype, device);
        Ok(rows_of(host(crate::add(a, b)?), hidden))
    })?);
    if which == Impl::Lockstep {
        // the sampler's fused decode ops: residual add + rmsnorm (both outputs), swiglu on [gate | up]
        checks.extend(row_invariance("add + rmsnorm (fused)", dtype, pool, &BATCH_SIZES, seed + 12, |idx| {
            let a = float_tensor(gather(&x, hidden, idx), [idx.len(), hidden], dtype, device);
            let b = float_tensor(gather(&up, hidden, idx), [idx.len(), hidden], dtype, device);
            let (sum, normed) = crate::add_rmsnorm(a, b, wt.clone(), 1e-6)?;
            Ok(rows_of(host(sum), hidden).into_iter().zip(rows_of(host(normed), hidden)).map(|(s, n)| [s, n].concat()).collect())
        })?);
        checks.extend(row_invariance("swiglu on [gate | up] (fused)", dtype, pool, &BATCH_SIZES, seed + 13, |idx| {
            let g = float_tensor(gather(&x, hidden, idx), [idx.len(), hidden], dtype, device);
            let u = float_tensor(gather(&up, hidden, idx), [idx.len(), hidden], dtype, device);
            Ok(rows_of(host(crate::swiglu_halves(Tensor::cat(vec![g, u], 1))?), hidden))
        })?);
    }

    // embedding
    let table = random_vec(&mut rng, vocab * hidden, 1.0);
    let tt = float_tensor(table, [vocab, hidden], dtype, device);
    let ids: Vec<i32> = (0..pool).map(|_| rng.random_range(0..vocab as i32)).collect();
    checks.extend(row_invariance("embedding", dtype, pool, &BATCH_SIZES, seed + 7, |idx| {
        let it = int_tensor(idx.iter().map(|&i| ids[i]).collect(), device);
        Ok(rows_of(host(crate::embedding(tt.clone(), it)?), hidden))
    })?);

    // rope, a position per row
    let (heads, head_dim, kv_heads) = (dims.heads, dims.head_dim, dims.kv_heads);
    let tables = RopeTables::new(head_dim, dims.max_len, 1_000_000.0, device)?;
    let qx = random_vec(&mut rng, pool * heads * head_dim, 1.0);
    let positions: Vec<i32> = (0..pool).map(|_| rng.random_range(0..dims.max_len as i32)).collect();
    let width = heads * head_dim;
    checks.extend(row_invariance("rope", dtype, pool, &BATCH_SIZES, seed + 8, |idx| {
        let xt = float_tensor(gather(&qx, width, idx), [idx.len(), heads, head_dim], dtype, device);
        let pt = int_tensor(idx.iter().map(|&i| positions[i]).collect(), device);
        Ok(rows_of(host(crate::rope(xt, pt, &tables)?), width))
    })?);

    // attention decode: rows spread over ATTENTION_SLOTS cache slots (sequences), each row at
    // its own position, so several rows read the same sequence at different lengths
    const ATTENTION_SLOTS: usize = 16;
    let kv_len = dims.max_len;
    let cache_len = ATTENTION_SLOTS * kv_len * kv_heads * head_dim;
    let cache_shape = [ATTENTION_SLOTS, kv_len, kv_heads, head_dim];
    let kc = float_tensor(random_vec(&mut rng, cache_len, 1.0), cache_shape, dtype, device);
    let vc = float_tensor(random_vec(&mut rng, cache_len, 1.0), cache_shape, dtype, device);
    let scale = 1.0 / (head_dim as f32).sqrt();
    checks.extend(row_invariance("attention decode", dtype, pool, &BATCH_SIZES, seed + 9, |idx| {
        let qt = float_tensor(gather(&qx, width, idx), [idx.len(), heads, head_dim], dtype, device);
        let st = int_tensor(idx.iter().map(|&i| (i % ATTENTION_SLOTS) as i32).collect(), device);
        let pt = int_tensor(idx.iter().map(|&i| positions[i]).collect(), device);
        Ok(rows_of(host(crate::attention(qt, kc.clone(), vc.clone(), st, pt, scale)?), width))
    })?);
    if which == Impl::Lockstep {
        // each kernel by name under the same check, whatever the process default (positions
        // reach several 64-key splits)
        use crate::ops::attention::{attention_with, AttentionKernel};
        checks.extend(row_invariance("attention decode split_kv", dtype, pool, &BATCH_SIZES, seed + 9, |idx| {
            let qt = float_tensor(gather(&qx, width, idx), [idx.len(), heads, head_dim], dtype, device);
            let st = int_tensor(idx.iter().map(|&i| (i % ATTENTION_SLOTS) as i32).collect(), device);
            let pt = int_tensor(idx.iter().map(|&i| positions[i]).collect(), device);
            Ok(rows_of(host(attention_with(Some(AttentionKernel::SplitKv), qt, kc.clone(), vc.clone(), st, pt, scale)?), width))
        })?);
        checks.extend(row_invariance("attention decode sequential", dtype, pool, &BATCH_SIZES, seed + 9, |idx| {
            let qt = float_tensor(gather(&qx, width, idx), [idx.len(), heads, head_dim], dtype, device);
            let st = int_tensor(idx.iter().map(|&i| (i % ATTENTION_SLOTS) as i32).collect(), device);
            let pt = int_tensor(idx.iter().map(|&i| positions[i]).collect(), device);
            Ok(rows_of(host(attention_with(Some(AttentionKernel::Sequential), qt, kc.clone(), vc.clone(), st, pt, scale)?), width))
        })?);
        // while a prefix fits one split the two kernels must agree as bits: the default
        // (split_kv) runs the sequential kernel on caches of at most one split
        let within: Vec<usize> = (0..pool).filter(|&i| (positions[i] as usize) < crate::ops::attention::KV_SPLIT).collect();
        if kv_len > crate::ops::attention::KV_SPLIT && !within.is_empty() {
            let run = |kernel| -> Result<Vec<Vec<f32>>, KernelError> {
                let qt = float_tensor(gather(&qx, width, &within), [within.len(), heads, head_dim], dtype, device);
                let st = int_tensor(within.iter().map(|&i| (i % ATTENTION_SLOTS) as i32).collect(), device);
                let pt = int_tensor(within.iter().map(|&i| positions[i]).collect(), device);
                Ok(rows_of(host(attention_with(Some(kernel), qt, kc.clone(), vc.clone(), st, pt, scale)?), width))
            };
            let (split, sequential) = (run(AttentionKernel::SplitKv)?, run(AttentionKernel::Sequential)?);
            checks.push(compare("attention split_kv = sequential (prefix within one split)", dtype_name(dtype), within.len(), &split, &sequential.iter().collect::<Vec<_>>()));
        }
        // the tensor-core kernel where the device has it: decode rows in any batch, and prefill
        // rows sharing tiles = the same rows one per cube (tiles mix rows of different prefix
        // lengths in one staged split, and put a row at another place in the mma fragment)
        let probe = crate::bridge::float_in("battery", "probe", Tensor::<1>::zeros([1], device))?;
        let tc_ok = crate::ops::attention::tensor_cores::tc_attention_available(&probe.client, dtype, head_dim);
        if tc_ok {
            checks.extend(row_invariance("attention decode split_kv_tc", dtype, pool, &BATCH_SIZES, seed + 9, |idx| {
                let qt = float_tensor(gather(&qx, width, idx), [idx.len(), heads, head_dim], dtype, device);
                let st = int_tensor(idx.iter().map(|&i| (i % ATTENTION_SLOTS) as i32).collect(), device);
                let pt = int_tensor(idx.iter().map(|&i| positions[i]).collect(), device);
                Ok(rows_of(host(attention_with(Some(AttentionKernel::SplitKvTensorCore), qt, kc.clone(), vc.clone(), st, pt, scale)?), width))
            })?);
            // whole sequences of several lengths, each row at its position, slots in order
            let lens: Vec<usize> = [kv_len, kv_len / 2 + 3, 70, 17, 1].into_iter().filter(|&l| l <= kv_len).collect();
            let host_slots: Vec<u32> = lens.iter().enumerate().flat_map(|(s, &l)| std::iter::repeat_n(s as u32, l)).collect();
            let pos: Vec<i32> = lens.iter().flat_map(|&l| 0..l as i32).collect();
            let rows = pos.len();
            let qp = random_vec(&mut rng, rows * width, 1.0);
            let run = |tiles: bool| -> Result<Vec<Vec<f32>>, KernelError> {
                let qt = float_tensor(qp.clone(), [rows, heads, head_dim], dtype, device);
                let st = int_tensor(host_slots.iter().map(|&s| s as i32).collect(), device);
                let pt = int_tensor(pos.clone(), device);
                let out = if tiles {
                    crate::ops::attention::attention_rows(Some(AttentionKernel::SplitKvTensorCore), qt, kc.clone(), vc.clone(), st, pt, &host_slots, scale)?
                } else {
                    attention_with(Some(AttentionKernel::SplitKvTensorCore), qt, kc.clone(), vc.clone(), st, pt, scale)?
                };
                Ok(rows_of(host(out), width))
            };
            let (tiled, alone) = (run(true)?, run(false)?);
            checks.push(compare("attention split_kv_tc prefill tiles = rows alone", dtype_name(dtype), rows, &tiled, &alone.iter().collect::<Vec<_>>()));
            // both kernel sets (the default one just ran), each against the default's decode path
            use crate::ops::attention::tensor_cores::{tc_kernels, with_tc_kernels, TcKernels};
            let other = if tc_kernels()? == TcKernels::Mma { TcKernels::Cmma } else { TcKernels::Mma };
            if crate::device::runtime_name() == "cuda" {
                let tiled_other = with_tc_kernels(other, || run(true))?;
                checks.push(compare(&format!("attention split_kv_tc prefill tiles ({other:?} kernels) = rows alone"), dtype_name(dtype), rows, &tiled_other, &alone.iter().collect::<Vec<_>>()));
                let alone_other = with_tc_kernels(other, || run(false))?;
                checks.push(compare(&format!("attention split_kv_tc rows alone ({other:?} kernels) = rows alone"), dtype_name(dtype), rows, &alone_other, &alone.iter().collect::<Vec<_>>()));
            }
        }
    }

    // sampling: token and its logprob per row, mixed parameters
    let params: Vec<SamplingRow> = (0..pool)
        .map(|i| SamplingRow {
            temperature: [1.0, 0.8, 0.0, 1.2][i % 4],
            top_k: [0, 50, 0, 5][i % 4],
            top_p: [1.0, 0.9, 1.0, 0.5][i % 4],
            rng_key: crate::row_rng_key(seed, i as u64, positions[i] as u32),
        })
        .collect();
    checks.extend(row_invariance("sample (token, logprob)", dtype, pool, &BATCH_SIZES, seed + 10, |idx| {
        let lt = float_tensor(gather(&logits, vocab, idx), [idx.len(), vocab], dtype, device);
        let p: Vec<SamplingRow> = idx.iter().map(|&i| params[i]).collect();
        let (tok, lp) = crate::sample(lt, &p)?;
        Ok(host_int(tok).into_iter().zip(host(lp)).map(|(t, l)| vec![t as f32, l]).collect())
    })?);
    if which == Impl::Lockstep {
        checks.extend(matmul_accuracy(dtype, device, seed + 11)?);
        checks.push(fingerprint_check(dtype, device, seed + 12)?);
    }
    Ok(checks)
}

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

/// The sampler/trainer contract on a random tiny Qwen3: training-path logprob bits against the
/// stepping path at several chunk sizes. One check per chunk size (M = chunk, 0 = whole).
pub fn model_contract(dtype: DType, device: &Device, seed: u64, sequences: usize) -> Result<Vec<Check>, ModelError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let vocab = 97;
    let config = tiny_config(vocab, rng.random_bool(0.5));
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
