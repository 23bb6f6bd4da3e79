//! The invariance battery: for every op, the bits of each row computed inside batches of many
//! sizes, in random order with random neighbours, against the same row computed in the full
//! batch. Used by the tests (which assert) and by `lockstep-battery` (which prints a table,
//! with burn's default ops alongside for contrast). `run_all` is long by design: one block per
//! op, each the same shape (inputs, the op on the full batch, the op inside batches, compare).

use crate::ops::matmul::WeightLayout;
use crate::ops::rope::RopeTables;
use crate::ops::logits::sampling::SamplingRow;

use crate::KernelError;
use burn::tensor::{DType, Device, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::rows::*;

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
                // every tile either pick rule can choose
                let persistent = crate::ops::matmul::wgmma_tiles::weighed_tiles().into_iter().chain([WgmmaTiles::NARROW, WgmmaTiles::SMALL]);
                for (schedule, tiles) in persistent.map(|t| (WgmmaSchedule::Persistent, t)).chain([(WgmmaSchedule::Synced, WgmmaTiles::DEFAULT)]) {
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
        // a projection's bias (Qwen2's q/k/v), broadcast over the rows
        let bias = float_tensor(random_vec(&mut rng, hidden, 1.0), [hidden], dtype, device);
        checks.extend(row_invariance("bias add", dtype, pool, &BATCH_SIZES, seed + 14, |idx| {
            let a = float_tensor(gather(&x, hidden, idx), [idx.len(), hidden], dtype, device);
            Ok(rows_of(host(crate::bias_add(a, bias.clone())?), hidden))
        })?);
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
                let tiled_other = with_tc_kernels(other, || run(true))??;
                checks.push(compare(&format!("attention split_kv_tc prefill tiles ({other:?} kernels) = rows alone"), dtype_name(dtype), rows, &tiled_other, &alone.iter().collect::<Vec<_>>()));
                let alone_other = with_tc_kernels(other, || run(false))??;
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
            // processed logprobs on half the truncating rows: a batch mixes both
            processed: i % 8 >= 4,
        })
        .collect();
    checks.extend(row_invariance("sample (token, logprob)", dtype, pool, &BATCH_SIZES, seed + 10, |idx| {
        let lt = float_tensor(gather(&logits, vocab, idx), [idx.len(), vocab], dtype, device);
        let p: Vec<SamplingRow> = idx.iter().map(|&i| params[i]).collect();
        let (tok, lp) = crate::sample(lt, &p)?;
        Ok(host_int(tok).into_iter().zip(host(lp)).map(|(t, l)| vec![t as f32, l]).collect())
    })?);
    if which == Impl::Lockstep {
        checks.extend(sampled_logprobs_equal_the_trainers(&logits, vocab, &params, dtype, device)?);
        checks.extend(super::definitions::matmul_accuracy(dtype, device, seed + 11)?);
        checks.push(super::definitions::fingerprint_check(dtype, device, seed + 12)?);
        checks.push(super::definitions::truncation_check(dtype, device, seed + 13, vocab)?);
    }
    Ok(checks)
}

/// The sampler's logprob of each drawn token against the trainer's, as bits, each row scored as
/// the trainer scores it: `truncated_token_logprobs` on the same logits under the kept set for
/// a processed row that truncates, on the full distribution (`None`) for every other row. And
/// the trainer's kept set of the whole vocabulary (top-k 0, top-p 1: the masked kernels) against
/// its full distribution, on every row. A differing row is printed with its parameters and both
/// values' bits.
fn sampled_logprobs_equal_the_trainers(logits: &[f32], vocab: usize, params: &[SamplingRow], dtype: DType, device: &Device) -> Result<Vec<Check>, KernelError> {
    let rows = params.len();
    let lt = float_tensor(logits[..rows * vocab].to_vec(), [rows, vocab], dtype, device);
    let (tokens, lps) = crate::sample(lt.clone(), params)?;
    let floats = |v: Vec<f32>| burn::tensor::Tensor::<1>::from_data(burn::tensor::TensorData::new(v, [rows]), device);
    let temps = || floats(params.iter().map(|p| p.temperature).collect());
    let kept_set = |p: &SamplingRow| p.scored_on_kept_set(vocab);
    let kept = |p: &SamplingRow| if kept_set(p) { (p.top_k, p.top_p) } else { (0, 1.0) };
    let truncation = crate::Truncation {
        top_k: burn::tensor::Tensor::<1, burn::tensor::Int>::from_data(burn::tensor::TensorData::new(params.iter().map(|p| kept(p).0 as i64).collect::<Vec<_>>(), [rows]), device),
        top_p: floats(params.iter().map(|p| kept(p).1).collect()),
    };
    let full = host(crate::truncated_token_logprobs(lt.clone(), tokens.clone(), temps(), None)?.logprobs);
    let truncated = host(crate::truncated_token_logprobs(lt.clone(), tokens.clone(), temps(), Some(&truncation))?.logprobs);
    let trainer: Vec<f32> = params.iter().enumerate().map(|(r, p)| if kept_set(p) { truncated[r] } else { full[r] }).collect();
    let (sampled, drawn) = (host(lps), host_int(tokens.clone()));
    let whole = crate::Truncation { top_k: burn::tensor::Tensor::<1, burn::tensor::Int>::zeros([rows], device), top_p: floats(vec![1.0; rows]) };
    let whole = host(crate::truncated_token_logprobs(lt, tokens, temps(), Some(&whole))?.logprobs);
    // `compare` counts; a differing row is also printed with what it was sampled with
    let check = |op: &str, a: &[f32], b: &[f32], names: (&str, &str)| {
        for r in (0..rows).filter(|&r| a[r].to_bits() != b[r].to_bits()).take(8) {
            let p = &params[r];
            let kind = if p.processed { "processed" } else { "raw" };
            eprintln!("  {op}: {} row {r} (T {} top-k {} top-p {} {kind}, token {}): {} {:#010x}, {} {:#010x}", dtype_name(dtype), p.temperature, p.top_k, p.top_p, drawn[r], names.0, a[r].to_bits(), names.1, b[r].to_bits());
        }
        let want = rows_of(b.to_vec(), 1);
        compare(op, dtype_name(dtype), rows, &rows_of(a.to_vec(), 1), &want.iter().collect::<Vec<_>>())
    };
    Ok(vec![
        check("sampled logprob = trainer's token_logprobs (raw and processed rows)", &sampled, &trainer, ("sampler", "trainer")),
        check("token_logprobs, kept set of the whole vocabulary = full distribution", &whole, &full, ("kept set", "full")),
    ])
}

fn rows_of(flat: Vec<f32>, width: usize) -> Vec<Vec<f32>> {
    flat.chunks(width).map(|c| c.to_vec()).collect()
}

fn gather(pool: &[f32], width: usize, idx: &[usize]) -> Vec<f32> {
    idx.iter().flat_map(|&i| pool[i * width..(i + 1) * width].iter().cloned()).collect()
}
