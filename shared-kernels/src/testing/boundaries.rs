//! The battery's size boundaries (`lockstep-battery --large`, on the H200): the sizes a real
//! run crosses and the small battery never reaches. Each check compares, as bits, what a large
//! launch gives a row with what the same row gets alone or by definition:
//! - 32-bit index arithmetic (cubecl's FastDivmod, burn's select/gather/copies) at the top of
//!   the u32 range, and a select of Qwen3-vocabulary rows past 2^31 elements, up to 2^32;
//! - grid dimensions: embedding rows whose launch needs more than 65535 cubes in x;
//! - the fused LM head + logprob over 17k rows of Qwen3's vocabulary = each row alone;
//! - attention over an 8k-position prefix: prefill tiles = the rows decoded alone;
//! - the training backward at real shapes: folded weight gradients (the LM head's and an MLP
//!   projection's) in micro-batch-sized pieces = one pass, and a sequence's attention gradients
//!   (the dense per-sequence path and the linear-memory kernels) = the same sequence alone;
//! - the one-launch swiglu, rmsnorm and rope backwards past 2^31 elements (and rmsnorm's plane
//!   kernels, forward and backward): rows across element 2^31 = the same rows alone.

use crate::testing::rows::{differing_rows, dtype_name, float_tensor, host, int_tensor, random_vec, Check};
use crate::KernelError;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Qwen3's vocabulary: the divisor whose u32 quotient wrapped at row 16384 upstream.
const QWEN_VOCAB: usize = 151_936;

fn check(op: impl Into<String>, dtype: DType, m: usize, rows_differing: usize, max_abs_diff: f64) -> Check {
    Check { op: op.into(), dtype: dtype_name(dtype), m, rows_differing, max_abs_diff }
}

/// Every boundary check at `dtype` (the select and divmod rows are dtype-free and run once, at
/// f32).
pub fn boundary_checks(dtype: DType, device: &Device, seed: u64) -> Result<Vec<Check>, KernelError> {
    let mut out = Vec::new();
    let mut rng = StdRng::seed_from_u64(seed ^ 0xb0d4);
    if dtype == DType::F32 {
        let mut wrong = 0;
        let mut n = 0;
        for divisor in [QWEN_VOCAB as u32, 1024, 3, 1, (1 << 31) + 1, u32::MAX] {
            let dividends = crate::ops::probes::index_probe::boundary_dividends(divisor);
            let (q, r, _) = crate::ops::probes::index_probe::fast_divmod(&dividends, divisor, device)?;
            n += dividends.len();
            wrong += dividends.iter().enumerate().filter(|&(i, &d)| (q[i], r[i]) != (d / divisor, d % divisor)).count();
        }
        out.push(check("FastDivmod u32 = host division (boundary dividends)", dtype, n, wrong, 0.0));
        // rows of [rows, vocab] f32 hold their row index; the select must return it
        // (past 2^32 elements burn's kernels are not used: lockstep's launchers refuse such
        // tensors by name, and its training path makes none)
        for rows in [17_000usize, 28_000] {
            let index = Tensor::<1, Int>::arange(0..rows as i64, device).float().reshape([rows, 1]);
            let big = index.repeat_dim(1, QWEN_VOCAB);
            let picked: Vec<i32> = (0..64).map(|i| (rows - 1 - i * 97) as i32).chain([16_383, 16_384, 16_385]).collect();
            let got = big.select(0, int_tensor(picked.clone(), device));
            let last = host(got.clone().slice([0..picked.len(), QWEN_VOCAB - 1..QWEN_VOCAB]));
            let first = host(got.slice([0..picked.len(), 0..1]));
            let wrong = picked.iter().enumerate().filter(|&(i, &r)| first[i] != r as f32 || last[i] != r as f32).count();
            out.push(check(format!("burn select of [{rows}, {QWEN_VOCAB}] rows ({:.2}e9 elements)", (rows * QWEN_VOCAB) as f64 / 1e9), dtype, picked.len(), wrong, 0.0));
        }
    }
    // embedding: 17000 rows x 1024 is 68000 cubes of 256 (a 2-D grid)
    let (rows, hidden, vocab) = (17_000usize, 1024usize, 5000usize);
    let table = random_vec(&mut rng, vocab * hidden, 1.0);
    let ids: Vec<i32> = (0..rows).map(|r| ((r * 7919 + 13) % vocab) as i32).collect();
    let t = float_tensor(table.clone(), [vocab, hidden], dtype, device);
    let got = host(crate::embedding(t.clone(), int_tensor(ids.clone(), device))?);
    let rounded = host(t);
    let want: Vec<f32> = ids.iter().flat_map(|&i| rounded[i as usize * hidden..(i as usize + 1) * hidden].to_vec()).collect();
    let (bad, max) = differing_rows(&[(&got, &want)], hidden);
    out.push(check(format!("embedding {rows} x {hidden} (68000 cubes) = table rows"), dtype, rows, bad, max));
    // the fused head: 17k rows of Qwen3's vocabulary in one call = a few rows alone
    let (rows, hidden) = (17_200usize, 1024usize);
    let x = float_tensor(random_vec(&mut rng, rows * hidden, 1.0), [rows, hidden], dtype, device);
    let w = float_tensor(random_vec(&mut rng, QWEN_VOCAB * hidden, 0.05), [QWEN_VOCAB, hidden], dtype, device);
    let targets: Vec<i32> = (0..rows).map(|r| ((r * 104_729 + 7) % QWEN_VOCAB) as i32).collect();
    let temps = |n: usize| Tensor::<1>::from_data(TensorData::new(vec![0.9f32; n], [n]), device);
    let all = crate::head_logprobs(x.clone(), w.clone(), int_tensor(targets.clone(), device), temps(rows))?;
    let (all_lp, all_ent) = (host(all.logprobs), host(all.entropy));
    let probe: Vec<usize> = vec![0, 1, 3532, 3533, 16_383, 16_384, 16_385, 17_000, rows - 1];
    let mut bad = 0;
    let mut max = 0.0f64;
    for &r in &probe {
        let alone = crate::head_logprobs(x.clone().slice([r..r + 1, 0..hidden]), w.clone(), int_tensor(vec![targets[r]], device), temps(1))?;
        let (lp, ent) = (host(alone.logprobs)[0], host(alone.entropy)[0]);
        if lp.to_bits() != all_lp[r].to_bits() || ent.to_bits() != all_ent[r].to_bits() {
            bad += 1;
        }
        max = max.max((lp - all_lp[r]).abs() as f64);
    }
    out.push(check(format!("head_logprobs {rows} rows x {QWEN_VOCAB} = rows alone"), dtype, probe.len(), bad, max));
    out.push(long_prefix_attention(dtype, device, &mut rng)?);
    out.extend(training_backward(dtype, device, &mut rng)?);
    out.extend(fused_backwards_across(1 << 31, dtype, device, false)?);
    Ok(out)
}

/// The one-launch backwards (`ops/swiglu_backward.rs`, `ops/rmsnorm_backward.rs`, the rope
/// kernel's backward mode) over tensors just past `boundary` elements (the battery: 2^31, within
/// the 2^32 their launchers accept; CI: what lavapipe holds) at the real shapes' row widths: the
/// rows on both sides of element `boundary`, the first and the last, each as the same rows
/// launched alone; per-head rmsnorm rows also on the plane kernels, forward and backward, where
/// the device's planes fit them. `one_launch` forces the kernels where the launchers would run
/// the op chains (`ops/unfused.rs`). Inputs are drawn on the device (2^31 host values would take minutes to
/// make and copy); a row's bits depend on its own values alone either way.
pub fn fused_backwards_across(boundary: usize, dtype: DType, device: &Device, one_launch: bool) -> Result<Vec<Check>, KernelError> {
    use crate::ops::{rmsnorm_backward as norm, rope, swiglu_backward as swiglu};
    let past = boundary + boundary / 64;
    let swiglu_bw = if one_launch { swiglu::swiglu_backward_one_launch::<2> } else { swiglu::swiglu_backward::<2> };
    let norm_bw = if one_launch { norm::rmsnorm_backward_one_launch::<3> } else { norm::rmsnorm_backward::<3> };
    let rope_bw = if one_launch { rope::rope_backward_one_launch } else { rope::rope_backward };
    let random = |shape: [usize; 2]| Tensor::<2>::random(shape, burn::tensor::Distribution::Uniform(-2.0, 2.0), device).cast(dtype);
    let probes = |width: usize, rows: usize| -> Vec<usize> {
        let split = boundary / width;
        let mut rows_probed = vec![0, split - 1, split, split + 1, rows - 1];
        rows_probed.dedup();
        rows_probed
    };
    let mut out = Vec::new();
    // swiglu's backward at the 1.7B shape's intermediate size
    let width = 6144usize;
    let rows = past.div_ceil(width);
    let (g, u, dy) = (random([rows, width]), random([rows, width]), random([rows, width]));
    let (dg, du) = swiglu_bw(g.clone(), u.clone(), dy.clone())?;
    let (mut bad, mut max) = (0, 0.0f64);
    for &r in &probes(width, rows) {
        let row = |t: &Tensor<2>| t.clone().slice([r..r + 1, 0..width]);
        let (ag, au) = swiglu_bw(row(&g), row(&u), row(&dy))?;
        let (b, m) = differing_rows(&[(&host(row(&dg)), &host(ag)), (&host(row(&du)), &host(au))], width);
        bad += b;
        max = max.max(m);
    }
    out.push(check(format!("swiglu backward [{rows}, {width}] ({} elements): rows across element {boundary} = rows alone", rows * width), dtype, 5, bad, max));
    drop((g, u, dy, dg, du));
    // rmsnorm's backward: hidden rows of 2048 and per-head rows of 16 x 128, the latter also on
    // the plane kernels (forward too) where the device's planes fit them
    let plane = crate::fixed_plane_size(device).filter(|&p| crate::ops::rmsnorm_planes::plane_fits(p, 128));
    let layouts = [(1usize, 2048usize, None), (16, 128, None)].into_iter().chain(plane.map(|p| (16, 128, Some(p))));
    for (heads, width, planes) in layouts {
        let tokens = past.div_ceil(heads * width);
        let (x, dy) = (random([tokens * heads, width]).reshape([tokens, heads, width]), random([tokens * heads, width]).reshape([tokens, heads, width]));
        let w = Tensor::<1>::random([width], burn::tensor::Distribution::Uniform(-2.0, 2.0), device).cast(dtype);
        let backward = |x: Tensor<3>, dy: Tensor<3>| match planes {
            Some(p) => norm::rmsnorm_backward_on_planes(p, x, w.clone(), dy, 1e-6),
            None => norm_bw(x, w.clone(), dy, 1e-6),
        };
        let forward = |x: Tensor<3>| crate::ops::rmsnorm::rmsnorm_with_planes(planes, x, w.clone(), 1e-6);
        let (dx, weighted) = backward(x.clone(), dy.clone())?;
        let y = forward(x.clone())?;
        let (mut bad, mut max) = (0, 0.0f64);
        let row_width = heads * width;
        for &t in &probes(row_width, tokens) {
            let tok = |x: &Tensor<3>| x.clone().slice([t..t + 1, 0..heads, 0..width]);
            let (ax, aw) = backward(tok(&x), tok(&dy))?;
            let whole_w = weighted.clone().slice([t * heads..(t + 1) * heads, 0..width]);
            let (b, m) = differing_rows(&[(&host(tok(&dx)), &host(ax)), (&host(whole_w), &host(aw)), (&host(tok(&y)), &host(forward(tok(&x))?))], row_width);
            bad += b;
            max = max.max(m);
        }
        let on = planes.map_or(String::new(), |p| format!(" on planes of {p}"));
        out.push(check(format!("rmsnorm and its backward{on} [{tokens}, {heads}, {width}] ({} elements): tokens across element {boundary} = tokens alone", tokens * row_width), dtype, 5, bad, max));
    }
    // rope's backward over the per-head rows, positions cycling through 8k
    let (heads, head_dim) = (16usize, 128usize);
    let tokens = past.div_ceil(heads * head_dim);
    let tables = crate::RopeTables::new(head_dim, 8192, 1_000_000.0, device)?;
    let positions: Vec<i32> = (0..tokens).map(|t| (t % 8192) as i32).collect();
    let pos = int_tensor(positions.clone(), device);
    let dy = random([tokens * heads, head_dim]).reshape([tokens, heads, head_dim]);
    let dx = rope_bw(dy.clone(), pos, &tables)?;
    let (mut bad, mut max) = (0, 0.0f64);
    for &t in &probes(heads * head_dim, tokens) {
        let alone = rope_bw(dy.clone().slice([t..t + 1, 0..heads, 0..head_dim]), int_tensor(vec![positions[t]], device), &tables)?;
        let (b, m) = differing_rows(&[(&host(dx.clone().slice([t..t + 1, 0..heads, 0..head_dim])), &host(alone))], heads * head_dim);
        bad += b;
        max = max.max(m);
    }
    out.push(check(format!("rope backward [{tokens}, {heads}, {head_dim}] ({} elements): tokens across element {boundary} = tokens alone", tokens * heads * head_dim), dtype, 5, bad, max));
    Ok(out)
}

/// The training backward's invariants at Qwen3-0.6B's shapes, as bits.
fn training_backward(dtype: DType, device: &Device, rng: &mut StdRng) -> Result<Vec<Check>, KernelError> {
    use crate::autodiff::plain;
    use crate::ops::weight_grad::fold_matmul;
    let mut out = Vec::new();
    // folded weight gradients: one call over all tokens = pieces cut at granules of 16 tokens
    for (t, n, k, cuts) in [(5_000usize, QWEN_VOCAB, 1024usize, vec![0usize, 1_552, 3_520, 5_000]), (17_200, 3072, 1024, vec![0, 16, 8_192, 16_384, 17_200])] {
        let dy = float_tensor(random_vec(rng, t * n, 0.05), [t, n], dtype, device);
        let x = float_tensor(random_vec(rng, t * k, 1.0), [t, k], dtype, device);
        let whole = host(plain::<2>(fold_matmul(None, dy.clone(), x.clone())?));
        let mut acc = None;
        for w in cuts.windows(2) {
            acc = Some(fold_matmul(acc, dy.clone().slice([w[0]..w[1], 0..n]), x.clone().slice([w[0]..w[1], 0..k]))?);
        }
        let pieces = host(plain::<2>(acc.expect("pieces")));
        let (bad, max) = differing_rows(&[(&pieces, &whole)], k);
        out.push(check(format!("folded weight gradient [{n}, {k}] over {t} tokens in {} pieces = one pass", cuts.len() - 1), dtype, n, bad, max));
    }
    // attention gradients of one sequence alone = between two neighbours (dense path at 1500
    // tokens, linear-memory kernels at 6000: 16 heads x 6000^2 is past DENSE_SEQUENCE_SCORES)
    let (heads, kv_heads, d) = (16usize, 8usize, 128usize);
    for len in [1_500usize, 6_000] {
        let lens = [37usize, len, 250];
        let rows: usize = lens.iter().sum();
        let make = |h: usize, rng: &mut StdRng| random_vec(rng, rows * h * d, 1.0);
        let (q, k, v, probe) = (make(heads, rng), make(kv_heads, rng), make(kv_heads, rng), make(heads, rng));
        let grads = |first: usize, lens: &[usize]| -> Result<Vec<Vec<f32>>, KernelError> {
            let n: usize = lens.iter().sum();
            let ad = device.clone().autodiff();
            let leaf = |x: &[f32], h: usize| float_tensor(x[first * h * d..(first + n) * h * d].to_vec(), [n, h, d], dtype, &ad).require_grad();
            let (ql, kl, vl) = (leaf(&q, heads), leaf(&k, kv_heads), leaf(&v, kv_heads));
            let slots: Vec<u32> = lens.iter().enumerate().flat_map(|(s, &l)| std::iter::repeat_n(s as u32, l)).collect();
            let positions: Vec<u32> = lens.iter().flat_map(|&l| 0..l as u32).collect();
            let o = crate::causal_attention(ql.clone(), kl.clone(), vl.clone(), &slots, &positions, 1.0 / (d as f32).sqrt())?;
            let p = float_tensor(probe[first * heads * d..(first + n) * heads * d].to_vec(), [n, heads, d], dtype, &ad);
            let g = (o * p).sum().backward();
            Ok([&ql, &kl, &vl].iter().map(|t| host(t.grad(&g).expect("gradient").reshape([n * t.dims()[1] * d]))).collect())
        };
        let (all, alone) = (grads(0, &lens)?, grads(37, &lens[1..2])?);
        let (mut bad, mut max) = (0, 0.0f64);
        for (i, h) in [heads, kv_heads, kv_heads].into_iter().enumerate() {
            let mid = &all[i][37 * h * d..(37 + len) * h * d];
            let (b, m) = differing_rows(&[(mid, &alone[i])], h * d);
            bad += b;
            max = max.max(m);
        }
        out.push(check(format!("attention backward: a {len}-token sequence alone = between neighbours (dQ, dK, dV rows)"), dtype, 3 * len, bad, max));
    }
    out.extend(tensor_core_backward_accuracy(dtype, device, rng)?);
    Ok(out)
}

/// The tensor-core attention backward against the f32 dense reference on the same 16-bit
/// inputs: the largest |difference| per gradient over the largest |reference| value must stay
/// under 2% (P and dS go through the tensor cores rounded to the dtype, as in flash attention);
/// the check's value is that relative error, its failing rows the gradients past the bound.
fn tensor_core_backward_accuracy(dtype: DType, device: &Device, rng: &mut StdRng) -> Result<Vec<Check>, KernelError> {
    use crate::ops::attention::backward::dense_sequence;
    use crate::ops::attention::backward::mma_backward::{mma_attention_backward, mma_backward_available};
    let (heads, kv_heads, d) = (16usize, 8usize, 128usize);
    if !mma_backward_available(dtype, d) {
        return Ok(vec![]);
    }
    let mut out = Vec::new();
    for len in [300usize, 2_100] {
        let make = |h: usize, rng: &mut StdRng| float_tensor(random_vec(rng, len * h * d, 1.0), [len, h, d], dtype, device);
        let (q, k, v, d_out) = (make(heads, rng), make(kv_heads, rng), make(kv_heads, rng), make(heads, rng));
        let scale = 1.0 / (d as f32).sqrt();
        let slots = vec![0u32; len];
        let positions: Vec<u32> = (0..len as u32).collect();
        let o = crate::causal_attention(q.clone(), k.clone(), v.clone(), &slots, &positions, scale)?;
        let (rq, rk, rv) = dense_sequence(q.clone(), k.clone(), v.clone(), d_out.clone(), scale);
        let (rq, rk, rv) = (host(rq), host(rk), host(rv));
        // both LOCKSTEP_BACKWARD_MATH arms
        for fast in [true, false] {
            let g = mma_attention_backward(q.clone(), k.clone(), v.clone(), o.clone(), d_out.clone(), &[(0, len)], scale, None, fast)?;
            let (mut worst, mut bad) = (0.0f64, 0);
            for (got, want) in [(host(g.d_q), &rq), (host(g.d_k), &rk), (host(g.d_v), &rv)] {
                let top = want.iter().fold(0.0f64, |m, x| m.max(x.abs() as f64)).max(f64::MIN_POSITIVE);
                let diff = got.iter().zip(want).fold(0.0f64, |m, (a, b)| m.max((a - b).abs() as f64));
                let rel = if got.iter().all(|x| x.is_finite()) { diff / top } else { f64::INFINITY };
                bad += usize::from(rel > 0.02);
                worst = worst.max(rel);
            }
            let arm = if fast { "fast" } else { "exact" };
            out.push(check(format!("attention backward on tensor cores, {arm} math, vs the f32 dense reference, {len} tokens (value: worst relative error; bound 2%)"), dtype, 3, bad, worst));
        }
    }
    Ok(out)
}

/// One 8300-position sequence: causal attention over all its rows (the training path's prefill
/// tiles) against its last rows and a few others run alone on the same cache (decode).
fn long_prefix_attention(dtype: DType, device: &Device, rng: &mut StdRng) -> Result<Check, KernelError> {
    let (len, heads, kv_heads, d) = (8300usize, 16usize, 8usize, 128usize);
    let q = float_tensor(random_vec(rng, len * heads * d, 1.0), [len, heads, d], dtype, device);
    let k = float_tensor(random_vec(rng, len * kv_heads * d, 1.0), [len, kv_heads, d], dtype, device);
    let v = float_tensor(random_vec(rng, len * kv_heads * d, 1.0), [len, kv_heads, d], dtype, device);
    let slots = vec![0u32; len];
    let positions: Vec<u32> = (0..len as u32).collect();
    let scale = 1.0 / (d as f32).sqrt();
    let all = host(crate::causal_attention(q.clone(), k.clone(), v.clone(), &slots, &positions, scale)?.reshape([len, heads * d]));
    let ints = |v: &[u32]| int_tensor(v.iter().map(|&x| x as i32).collect(), device);
    let empty = || Tensor::<4>::zeros([1, len, kv_heads, d], (device, dtype));
    let kc = crate::write_kv_cache(empty(), k, ints(&slots), ints(&positions))?;
    let vc = crate::write_kv_cache(empty(), v, ints(&slots), ints(&positions))?;
    let probe: Vec<u32> = vec![0, 63, 64, 4095, 4096, 8191, 8192, len as u32 - 2, len as u32 - 1];
    let mut bad = 0;
    let mut max = 0.0f64;
    for &p in &probe {
        let qr = q.clone().slice([p as usize..p as usize + 1, 0..heads, 0..d]);
        let alone = host(crate::ops::attention::attention_for_rows(qr, kc.clone(), vc.clone(), ints(&[0]), ints(&[p]), &[0], scale, None)?.reshape([1, heads * d]));
        let row = &all[p as usize * heads * d..(p as usize + 1) * heads * d];
        let (b, m) = differing_rows(&[(&alone, row)], heads * d);
        bad += b;
        max = max.max(m);
    }
    Ok(check(format!("attention over an {len}-position prefix: rows alone = prefill"), dtype, probe.len(), bad, max))
}
