//! The tensor-core attention backward's softmax statistics taken from the training forward
//! (`LOCKSTEP_BACKWARD_STATS=forward`, the default) against the backward's own pass over the
//! keys: the statistics and dQ, dK, dV must be equal as bits. CUDA in bf16/f16 only, where both
//! kernels run; elsewhere no rows.

use crate::ops::attention::causal::causal_attention_with_stats;
use crate::ops::attention::mma_backward::{mma_attention_backward, mma_backward_available};
use crate::testing::rows::{differing_rows, dtype_name, float_tensor, host, random_vec, Check};
use crate::KernelError;
use burn::tensor::{DType, Device};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Sequences of one launch: a single row, two, tile sizes plus and minus one (the forward's
/// tiles are 64 queries, 32 rows at two heads a KV head; the backward's 64 rows), and one long
/// enough for many splits.
const LENGTHS: [usize; 9] = [1, 2, 31, 33, 64, 65, 97, 130, 2_100];

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
        let slots: Vec<u32> = LENGTHS.iter().enumerate().flat_map(|(s, &l)| std::iter::repeat_n(s as u32, l)).collect();
        let positions: Vec<u32> = LENGTHS.iter().flat_map(|&l| 0..l as u32).collect();
        let mut first = 0;
        let sequences: Vec<(usize, usize)> = LENGTHS.iter().map(|&l| { first += l; (first - l, l) }).collect();
        let scale = 1.0 / (d as f32).sqrt();
        let what = format!("{heads}/{kv_heads} heads of {d}, sequences of {LENGTHS:?} tokens");
        let (o, stats) = causal_attention_with_stats(q.clone(), k.clone(), v.clone(), &slots, &positions, scale)?;
        let Some(stats) = stats else {
            // only the variable turns them off where the tensor-core backward runs
            let off = !crate::kernel_choice::KernelChoice::process()?.backward_stats_from_forward;
            if !off {
                out.push(Check { op: format!("the training forward returned no softmax statistics ({what})"), dtype: dtype_name(dtype), m: 1, rows_differing: 1, max_abs_diff: 0.0 });
            }
            continue;
        };
        // every tile on the flash kernel (1-row tiles included) = the forward as the sampler runs it
        let plain = crate::causal_attention(q.clone(), k.clone(), v.clone(), &slots, &positions, scale)?;
        let (bad, max) = differing_rows(&[(&host(o.clone()), &host(plain))], heads * d);
        out.push(Check { op: format!("attention forward writing the backward's statistics = without ({what})"), dtype: dtype_name(dtype), m: rows, rows_differing: bad, max_abs_diff: max });
        let given = mma_attention_backward(q.clone(), k.clone(), v.clone(), o.clone(), d_out.clone(), &sequences, scale, Some(stats))?;
        let own = mma_attention_backward(q, k, v, o, d_out, &sequences, scale, None)?;
        let (bad, max) = differing_rows(&[(&host(given.stats), &host(own.stats))], heads * 2);
        out.push(Check { op: format!("backward statistics from the forward = recomputed: (m, l) per row ({what})"), dtype: dtype_name(dtype), m: rows, rows_differing: bad, max_abs_diff: max });
        let (mut bad, mut max) = (0, 0.0f64);
        for (a, b, h) in [(given.d_q, own.d_q, heads), (given.d_k, own.d_k, kv_heads), (given.d_v, own.d_v, kv_heads)] {
            let (b_, m_) = differing_rows(&[(&host(a), &host(b))], h * d);
            bad += b_;
            max = max.max(m_);
        }
        out.push(Check { op: format!("backward statistics from the forward = recomputed: dQ, dK, dV rows ({what})"), dtype: dtype_name(dtype), m: 3 * rows, rows_differing: bad, max_abs_diff: max });
    }
    Ok(out)
}
