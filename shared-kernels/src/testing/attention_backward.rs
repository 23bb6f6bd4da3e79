//! The tensor-core attention backward's options on the battery (CUDA in bf16/f16 only, where
//! the kernels run; elsewhere no rows): the softmax statistics taken from the training forward
//! (`LOCKSTEP_BACKWARD_STATS=forward`, the default) against the backward's own pass over the
//! keys (the statistics and dQ, dK, dV equal as bits), and each `LOCKSTEP_BACKWARD_MATH` arm
//! (batch invariant as bits, accurate to the f32 reference's bound).

use crate::ops::attention::causal::causal_attention_with_stats;
use crate::ops::attention::backward::mma_backward::{mma_attention_backward, mma_backward_available};
use crate::testing::rows::{differing_rows, dtype_name, float_tensor, host, random_vec, Check};
use crate::KernelError;
use burn::tensor::{DType, Device};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Sequences of one launch: a single row, two, tile sizes plus and minus one (the forward's
/// tiles are 64 queries, 32 rows at two heads a KV head; the backward's 64 rows), and one long
/// enough for many splits.
const LENGTHS: [usize; 9] = [1, 2, 31, 33, 64, 65, 97, 130, 2_100];

/// Sequences of `lens` tokens one after another (the training layout): each row's slot and
/// position, and each sequence's (first row, length).
fn training_layout(lens: &[usize]) -> (Vec<u32>, Vec<u32>, Vec<(usize, usize)>) {
    let slots = lens.iter().enumerate().flat_map(|(s, &l)| std::iter::repeat_n(s as u32, l)).collect();
    let positions = lens.iter().flat_map(|&l| 0..l as u32).collect();
    let starts = lens.iter().scan(0, |first, &l| { *first += l; Some((*first - l, l)) }).collect();
    (slots, positions, starts)
}

pub fn backward_stats_checks(dtype: DType, device: &Device, seed: u64) -> Result<Vec<Check>, KernelError> {
    let mut out = Vec::new();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x57a7);
    // (query heads, KV heads, head_dim): Qwen3-0.6B/1.7B's group of 2, Qwen3-8B's 4, no grouping at 64
    for (heads, kv_heads, d) in [(16usize, 8usize, 128usize), (32, 8, 128), (8, 8, 64)] {
        if !mma_backward_available(dtype, d) {
            continue;
        }
        let rows: usize = LENGTHS.iter().sum();
        let make = |h: usize, rng: &mut StdRng| float_tensor(random_vec(rng, rows * h * d, 1.0), [rows, h, d], dtype, device);
        let (q, k, v, d_out) = (make(heads, &mut rng), make(kv_heads, &mut rng), make(kv_heads, &mut rng), make(heads, &mut rng));
        let (slots, positions, sequences) = training_layout(&LENGTHS);
        let scale = 1.0 / (d as f32).sqrt();
        let what = format!("{heads}/{kv_heads} heads of {d}, sequences of {LENGTHS:?} tokens");
        let (o, stats) = causal_attention_with_stats(q.clone(), k.clone(), v.clone(), &slots, &positions, scale)?;
        let Some(stats) = stats else {
            // only the variable turns them off where the tensor-core backward runs
            let off = !crate::kernel_choice::KernelChoice::current()?.backward_stats_from_forward;
            if !off {
                out.push(Check { op: format!("the training forward returned no softmax statistics ({what})"), dtype: dtype_name(dtype), m: 1, rows_differing: 1, max_abs_diff: 0.0 });
            }
            continue;
        };
        // every tile on the flash kernel (1-row tiles included) = the forward as the sampler runs it
        let plain = crate::causal_attention(q.clone(), k.clone(), v.clone(), &slots, &positions, scale)?;
        let (bad, max) = differing_rows(&[(&host(o.clone()), &host(plain))], heads * d);
        out.push(Check { op: format!("attention forward writing the backward's statistics = without ({what})"), dtype: dtype_name(dtype), m: rows, rows_differing: bad, max_abs_diff: max });
        // both LOCKSTEP_BACKWARD_MATH arms: the statistics come from the forward either way
        for fast in [true, false] {
            let arm = if fast { "fast" } else { "exact" };
            let given = mma_attention_backward(q.clone(), k.clone(), v.clone(), o.clone(), d_out.clone(), &sequences, scale, Some(stats.clone()), fast)?;
            let own = mma_attention_backward(q.clone(), k.clone(), v.clone(), o.clone(), d_out.clone(), &sequences, scale, None, fast)?;
            let (bad, max) = differing_rows(&[(&host(given.stats), &host(own.stats))], heads * 2);
            out.push(Check { op: format!("backward statistics from the forward = recomputed, {arm} math: (m, l) per row ({what})"), dtype: dtype_name(dtype), m: rows, rows_differing: bad, max_abs_diff: max });
            let (mut bad, mut max) = (0, 0.0f64);
            for (a, b, h) in [(given.d_q, own.d_q, heads), (given.d_k, own.d_k, kv_heads), (given.d_v, own.d_v, kv_heads)] {
                let (b_, m_) = differing_rows(&[(&host(a), &host(b))], h * d);
                bad += b_;
                max = max.max(m_);
            }
            out.push(Check { op: format!("backward statistics from the forward = recomputed, {arm} math: dQ, dK, dV rows ({what})"), dtype: dtype_name(dtype), m: 3 * rows, rows_differing: bad, max_abs_diff: max });
        }
    }
    Ok(out)
}

/// One arm of `LOCKSTEP_BACKWARD_MATH` (`fast`: `ex2.approx` and a reciprocal; `exact`: `exp` and
/// a division; each its own gradient bits), whatever the process's choice (the battery runs
/// both, so their errors sit side by side): a sequence's dQ, dK, dV computed in a launch with
/// the others = computed alone, as bits, and each within 2% of the f32 dense reference (the
/// largest |difference| over the largest |reference| value).
pub fn backward_math_checks(dtype: DType, device: &Device, seed: u64, fast: bool) -> Result<Vec<Check>, KernelError> {
    use crate::ops::attention::backward::dense_sequence;
    use crate::ops::attention::backward::mma_backward::mma_attention_backward;
    let (heads, kv_heads, d) = (16usize, 8usize, 128usize);
    if !mma_backward_available(dtype, d) {
        return Ok(vec![]);
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0xfa57);
    let lens = [65usize, 300, 1_000];
    let rows: usize = lens.iter().sum();
    let make = |h: usize, rng: &mut StdRng| float_tensor(random_vec(rng, rows * h * d, 1.0), [rows, h, d], dtype, device);
    let (q, k, v, d_out) = (make(heads, &mut rng), make(kv_heads, &mut rng), make(kv_heads, &mut rng), make(heads, &mut rng));
    let (slots, positions, sequences) = training_layout(&lens);
    let scale = 1.0 / (d as f32).sqrt();
    let o = crate::causal_attention(q.clone(), k.clone(), v.clone(), &slots, &positions, scale)?;
    let all = mma_attention_backward(q.clone(), k.clone(), v.clone(), o.clone(), d_out.clone(), &sequences, scale, None, fast)?;
    let all = [host(all.d_q), host(all.d_k), host(all.d_v)];
    let arm = if fast { "fast" } else { "exact" };
    let mut out = Vec::new();
    let (mut bad_bits, mut max_bits) = (0, 0.0f64);
    let (mut bad_accuracy, mut worst) = (0, 0.0f64);
    for &(start, len) in &sequences {
        let part = |t: &burn::tensor::Tensor<3>, h: usize| t.clone().slice([start..start + len, 0..h, 0..d]);
        let (qs, ks, vs, os, ds) = (part(&q, heads), part(&k, kv_heads), part(&v, kv_heads), part(&o, heads), part(&d_out, heads));
        let alone = mma_attention_backward(qs.clone(), ks.clone(), vs.clone(), os, ds.clone(), &[(0, len)], scale, None, fast)?;
        let (rq, rk, rv) = dense_sequence(qs, ks, vs, ds, scale);
        for ((got, want), (i, h)) in [(alone.d_q, rq), (alone.d_k, rk), (alone.d_v, rv)].into_iter().zip([(0usize, heads), (1, kv_heads), (2, kv_heads)]) {
            let (got, want) = (host(got), host(want));
            let (b, m) = differing_rows(&[(&got, &all[i][start * h * d..(start + len) * h * d])], h * d);
            bad_bits += b;
            max_bits = max_bits.max(m);
            let top = want.iter().fold(0.0f64, |m, x| m.max(x.abs() as f64)).max(f64::MIN_POSITIVE);
            let diff = got.iter().zip(&want).fold(0.0f64, |m, (a, b)| m.max((a - b).abs() as f64));
            let rel = if got.iter().all(|x| x.is_finite()) { diff / top } else { f64::INFINITY };
            bad_accuracy += usize::from(rel > 0.02);
            worst = worst.max(rel);
        }
    }
    out.push(Check { op: format!("attention backward, LOCKSTEP_BACKWARD_MATH={arm}: each sequence alone = in one launch with the others ({lens:?} tokens, dQ/dK/dV rows)"), dtype: dtype_name(dtype), m: 3 * rows, rows_differing: bad_bits, max_abs_diff: max_bits });
    out.push(Check { op: format!("attention backward, LOCKSTEP_BACKWARD_MATH={arm}, vs the f32 dense reference ({lens:?} tokens; value: worst relative error; bound 2%)"), dtype: dtype_name(dtype), m: 3 * lens.len(), rows_differing: bad_accuracy, max_abs_diff: worst });
    Ok(out)
}
