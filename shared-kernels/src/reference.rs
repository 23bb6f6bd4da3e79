//! f64 host references for every kernel, for accuracy tests (with tolerances) and the battery.
//! Plain loops over row-major slices; slow and obviously correct.

/// `x[m,k] @ w` with `w` as `[n,k]` when `w_out_in`, else `[k,n]`.
pub fn matmul(x: &[f32], w: &[f32], m: usize, k: usize, n: usize, w_out_in: bool) -> Vec<f64> {
    let mut y = vec![0.0; m * n];
    for r in 0..m {
        for c in 0..n {
            let mut acc = 0.0f64;
            for i in 0..k {
                let wv = if w_out_in { w[c * k + i] } else { w[i * n + c] };
                acc += x[r * k + i] as f64 * wv as f64;
            }
            y[r * n + c] = acc;
        }
    }
    y
}

pub fn rmsnorm(x: &[f32], weight: &[f32], hidden: usize, eps: f64) -> Vec<f64> {
    x.chunks(hidden)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / hidden as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            row.iter().zip(weight).map(move |(&v, &w)| v as f64 * inv * w as f64).collect::<Vec<_>>()
        })
        .collect()
}

/// x [rows, heads, head_dim], rotate-half convention, angles in f64.
pub fn rope(x: &[f32], positions: &[usize], heads: usize, head_dim: usize, theta: f64) -> Vec<f64> {
    let half = head_dim / 2;
    let mut y = vec![0.0; x.len()];
    for (r, &p) in positions.iter().enumerate() {
        for h in 0..heads {
            let base = (r * heads + h) * head_dim;
            for i in 0..half {
                let angle = p as f64 * theta.powf(-((2 * i) as f64) / head_dim as f64);
                let (s, c) = angle.sin_cos();
                let (a, b) = (x[base + i] as f64, x[base + i + half] as f64);
                y[base + i] = a * c - b * s;
                y[base + i + half] = b * c + a * s;
            }
        }
    }
    y
}

pub fn swiglu(gate: &[f32], up: &[f32]) -> Vec<f64> {
    gate.iter().zip(up).map(|(&g, &u)| (g as f64 / (1.0 + (-(g as f64)).exp())) * u as f64).collect()
}

/// Causal GQA for query rows against per-row key/value prefixes.
/// `q` [rows, q_heads, d]; `keys[r]`/`values[r]` are [len_r, kv_heads, d] with len_r = pos_r + 1.
pub fn attention(q: &[f32], keys: &[Vec<f32>], values: &[Vec<f32>], q_heads: usize, kv_heads: usize, d: usize, scale: f64) -> Vec<f64> {
    let rows = keys.len();
    let group = q_heads / kv_heads;
    let mut out = vec![0.0; rows * q_heads * d];
    for r in 0..rows {
        let len = keys[r].len() / (kv_heads * d);
        for h in 0..q_heads {
            let kvh = h / group;
            let qv = &q[(r * q_heads + h) * d..][..d];
            let scores: Vec<f64> = (0..len)
                .map(|j| (0..d).map(|e| qv[e] as f64 * keys[r][(j * kv_heads + kvh) * d + e] as f64).sum::<f64>() * scale)
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for e in 0..d {
                let acc: f64 = (0..len).map(|j| weights[j] * values[r][(j * kv_heads + kvh) * d + e] as f64).sum();
                out[(r * q_heads + h) * d + e] = acc / total;
            }
        }
    }
    out
}

/// (logprob of target, entropy) of softmax(row / T) (T = 0 scored at T = 1).
pub fn logprob_entropy(row: &[f32], target: usize, temperature: f32) -> (f64, f64) {
    let inv = if temperature > 0.0 { 1.0 / temperature as f64 } else { 1.0 };
    let z: Vec<f64> = row.iter().map(|&v| v as f64 * inv).collect();
    let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = z.iter().map(|v| (v - max).exp()).sum();
    let lse = max + sum.ln();
    let entropy = -z.iter().map(|v| { let lp = v - lse; lp.exp() * lp }).sum::<f64>();
    (z[target] - lse, entropy)
}

/// Tokens allowed by top-k then top-p (vLLM's order), for checking sampled tokens.
pub fn allowed_tokens(row: &[f32], temperature: f32, top_k: u32, top_p: f32) -> Vec<bool> {
    let inv = if temperature > 0.0 { 1.0 / temperature as f64 } else { 1.0 };
    let z: Vec<f64> = row.iter().map(|&v| v as f64 * inv).collect();
    let mut order: Vec<usize> = (0..z.len()).collect();
    order.sort_by(|&a, &b| z[b].partial_cmp(&z[a]).unwrap().then(a.cmp(&b)));
    let k = if top_k == 0 || top_k as usize >= z.len() { z.len() } else { top_k as usize };
    let kth = z[order[k - 1]];
    let survivors: Vec<usize> = order.iter().cloned().filter(|&i| z[i] >= kth).collect();
    let max = z[order[0]];
    let mass: Vec<f64> = survivors.iter().map(|&i| (z[i] - max).exp()).collect();
    let total: f64 = mass.iter().sum();
    let mut allowed = vec![false; z.len()];
    let mut acc = 0.0;
    for (n, &i) in survivors.iter().enumerate() {
        allowed[i] = true;
        acc += mass[n];
        if top_p < 1.0 && acc >= top_p as f64 * total * (1.0 - 1e-6) {
            // keep ties with the last kept value
            for &j in &survivors[n + 1..] {
                if z[j] == z[i] { allowed[j] = true; }
            }
            break;
        }
    }
    allowed
}
