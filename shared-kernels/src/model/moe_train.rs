//! The training side of the mixture-of-experts block: the router's gradient and the experts'
//! rows laid out so their folded weight gradients keep their bits under any micro-batching.
//!
//! - [`routing_weights`]: the k weights of each token as an op of the router's logits, their
//!   values the host routing's (`moe::route`) and their backward the softmax's (over the top-k
//!   when `norm_topk_prob`, over every expert otherwise), per token on the host in f32.
//! - [`weighted`]: an expert's outputs times their tokens' weights, whose weight gradient is
//!   each row's dot product on lockstep's fixed-order row sums (burn's broadcast backward
//!   would sum the rows by a strategy its shape picks).
//! - [`padded_pairs`]: an expert's (token, slot) pairs sequence by sequence, each sequence's run
//!   padded to a multiple of [`FOLD_ROWS`] rows: the weight-gradient fold walks an expert's
//!   rows in granules of `FOLD_ROWS`, so no granule spans two sequences and micro-batches of
//!   whole sequences fold the granules of one pass, in its order.

use crate::autodiff::{cube, from_tracked, inner, plain, tracked, tracked_in};
use crate::grad_fold::FOLD_ROWS;
use burn::tensor::{DType, Tensor, TensorData};

/// The load-balancing loss's constants for one GRPO step (transformers'
/// `load_balancing_loss_func` over every sparse layer's rows at once): its value is
/// `scale * sum_e counts[e] * P[e]`, with `counts[e]` the rows (of every sparse layer) routed to
/// expert e and `P[e]` the sum of their softmax probabilities; `scale = coef * experts /
/// (layers * rows)^2`. The counts are the step's, fixed before the update (the top-k has no
/// gradient), so each row's gradient is its own: the same bits under any micro-batching.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterAux {
    pub scale: f32,
    pub counts: Vec<f32>,
}

impl RouterAux {
    /// The gradient of the loss by one row's router logits `row`, added into `out`:
    /// `scale * p_j (counts_j - sum_e counts_e p_e)`.
    pub fn add_row_gradient(&self, row: &[f32], out: &mut [f32]) {
        let probs = softmax_row(row);
        let mut mean = 0.0f32;
        for (p, c) in probs.iter().zip(&self.counts) {
            mean += p * c;
        }
        for ((o, p), c) in out.iter_mut().zip(&probs).zip(&self.counts) {
            *o += self.scale * p * (c - mean);
        }
    }
}

/// One router row's softmax in f32 on the host: the max, the exponentials summed in expert
/// order, each divided by the sum (the routing, its backward and the load-balancing gradient
/// all read these values).
pub fn softmax_row(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = row.iter().map(|&l| (l - max).exp()).collect();
    let mut sum = 0.0f32;
    for &e in &exps {
        sum += e;
    }
    exps.iter().map(|&e| e / sum).collect()
}

/// The routing weights `[rows * k]` (rows' slots in ascending expert order) as a tracked op of
/// `logits` `[rows, experts]`; `host` holds the logits in f32, `chosen` / `weights` the routing.
/// With `aux` (the load-balancing loss's constants and the rows it leaves out, ascending), the
/// backward adds each other row's gradient of that loss.
pub fn routing_weights(logits: Tensor<2>, host: &[f32], chosen: &[u32], weights: &[f32], k: usize, norm_topk_prob: bool, aux: Option<(std::sync::Arc<RouterAux>, Vec<usize>)>) -> Result<Tensor<1>, crate::KernelError> {
    let la = tracked_in("moe routing", "logits", logits)?;
    let lp = plain::<2>(inner(&la));
    let [rows, experts] = lp.dims();
    let (dtype, device) = (lp.dtype(), lp.device());
    let w = Tensor::<1>::from_data(TensorData::new(weights.to_vec(), [rows * k]), &device).cast(dtype);
    let (host, chosen, weights) = (host.to_vec(), chosen.to_vec(), weights.to_vec());
    Ok(from_tracked(tracked([&la], cube(w), move |dw| {
        let g = plain::<1>(dw).cast(DType::F32).into_data().convert::<f32>().try_to_vec::<f32>().expect("f32 routing gradient");
        let mut dl = vec![0.0f32; rows * experts];
        for r in 0..rows {
            let (sel, gw, ww) = (&chosen[r * k..(r + 1) * k], &g[r * k..(r + 1) * k], &weights[r * k..(r + 1) * k]);
            let out = &mut dl[r * experts..(r + 1) * experts];
            if norm_topk_prob {
                // w = softmax over the chosen logits: dl_i = w_i (g_i - sum_j w_j g_j)
                let s: f32 = ww.iter().zip(gw).map(|(w, g)| w * g).sum();
                for i in 0..k {
                    out[sel[i] as usize] = ww[i] * (gw[i] - s);
                }
            } else {
                // w = the softmax's own probabilities: dl_j = p_j ([j chosen] g_j - sum_i g_i p_i)
                let probs = softmax_row(&host[r * experts..(r + 1) * experts]);
                let s: f32 = ww.iter().zip(gw).map(|(w, g)| w * g).sum();
                for j in 0..experts {
                    out[j] = probs[j] * -s;
                }
                for i in 0..k {
                    out[sel[i] as usize] += ww[i] * gw[i];
                }
            }
            if let Some((aux, padding)) = &aux {
                if padding.binary_search(&r).is_err() {
                    aux.add_row_gradient(&host[r * experts..(r + 1) * experts], out);
                }
            }
        }
        [Some(cube(Tensor::<2>::from_data(TensorData::new(dl, [rows, experts]), &device).cast(dtype)))]
    })))
}

/// `h * w` (`w` one weight a row, `[rows, 1]`), tracked.
pub fn weighted(h: Tensor<2>, w: Tensor<2>) -> Result<Tensor<2>, crate::KernelError> {
    let (ha, wa) = (tracked_in("moe weighting", "h", h)?, tracked_in("moe weighting", "w", w)?);
    let (hp, wp) = (plain::<2>(inner(&ha)), plain::<2>(inner(&wa)));
    let y = hp.clone() * wp.clone();
    Ok(from_tracked(tracked([&ha, &wa], cube(y), move |dy| {
        let dy = plain::<2>(dy);
        let dtype = wp.dtype();
        let rows = dy.dims()[0];
        let dw = crate::ops::reduce::row_sums((dy.clone() * hp).cast(DType::F32)).expect("moe weighting backward: a non-empty matrix").cast(dtype).reshape([rows, 1]);
        [Some(cube(dy * wp)), Some(cube(dw))]
    })))
}

/// `pairs` (ascending (token, slot) indices p, token p / k) grouped by the sequence their token
/// starts at or after (`starts`, ascending), each group padded with `None` to a multiple of
/// [`FOLD_ROWS`].
pub fn padded_pairs(pairs: &[usize], k: usize, starts: &[usize]) -> Vec<Option<usize>> {
    let mut out = Vec::with_capacity(pairs.len() + FOLD_ROWS);
    let mut group = None;
    for &p in pairs {
        let g = starts.partition_point(|&s| s <= p / k);
        if group.is_some_and(|h| h != g) {
            while out.len() % FOLD_ROWS != 0 {
                out.push(None);
            }
        }
        group = Some(g);
        out.push(Some(p));
    }
    while out.len() % FOLD_ROWS != 0 {
        out.push(None);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sequences_pairs_are_padded_to_whole_granules_in_order() {
        // k = 2; sequences start at rows 0, 3 and 40; the expert got tokens 1, 2 (sequence 0),
        // 3 (sequence 1) and 40, 41 (sequence 2)
        let pairs = [2, 5, 6, 80, 83];
        let laid = padded_pairs(&pairs, 2, &[0, 3, 40]);
        assert_eq!(laid.len(), 3 * FOLD_ROWS);
        assert_eq!(&laid[..3], &[Some(2), Some(5), None]);
        assert_eq!(laid[FOLD_ROWS], Some(6));
        assert_eq!(&laid[2 * FOLD_ROWS..2 * FOLD_ROWS + 3], &[Some(80), Some(83), None]);
        assert!(laid.iter().flatten().copied().eq(pairs.iter().copied()), "every pair once, in order");
    }

    /// The router's and the experts' gradients through the block (the routing weights' softmax
    /// backward, the weighting's row sums, and with the load-balancing loss its gradient on every
    /// row but the padding's) against central finite differences of the loss sum(out * g) (+ the
    /// load-balancing value) in f64-accurate steps: the routing itself does not move for these
    /// steps.
    #[test]
    fn the_blocks_gradients_match_finite_differences() {
        use crate::model::moe::{Expert, MoeBlock};
        use crate::model::KernelSet;
        use std::sync::Arc;
        let device = crate::device::default_device();
        let (n, h, f, experts) = (6, 8, 4, 4);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = |len: usize, scale: f32| -> Vec<f32> {
            (0..len).map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            }).collect()
        };
        let (x, router, g) = (rand(n * h, 1.0), rand(experts * h, 1.0), rand(n * h, 1.0));
        let weights: Vec<[Vec<f32>; 3]> = (0..experts).map(|_| [rand(f * h, 0.7), rand(f * h, 0.7), rand(h * f, 0.7)]).collect();
        // a large scale, so the load-balancing gradient is not lost in the tolerance; row 5 pads
        let aux = RouterAux { scale: 0.8, counts: rand(experts, 1.0).iter().map(|c| 3.0 + 2.0 * c).collect() };
        let padding = [5usize];
        let t = |v: &Vec<f32>, dims: [usize; 2]| Tensor::<2>::from_data(TensorData::new(v.clone(), dims), &device);
        for with_aux in [false, true] {
            let block = |router: &Vec<f32>, up0: &Vec<f32>, track: bool| {
                let w = |v: &Vec<f32>, dims| if track { Tensor::from_inner(t(v, dims)).require_grad() } else { t(v, dims) };
                MoeBlock {
                    router: w(router, [experts, h]),
                    experts: weights.iter().enumerate().map(|(e, [gt, u, d])| Expert { gate: w(gt, [f, h]), up: w(if e == 0 { up0 } else { u }, [f, h]), down: w(d, [h, f]) }).collect(),
                    top_k: 2,
                    norm_topk_prob: true,
                    aux: with_aux.then(|| Arc::new(aux.clone())),
                }
            };
            let loss = |router: &Vec<f32>, up0: &Vec<f32>| -> f64 {
                let (out, _) = block(router, up0, false).forward(t(&x, [n, h]), KernelSet::Matched, None, &padding, None).unwrap();
                let mut total: f64 = out.into_data().convert::<f32>().try_to_vec::<f32>().unwrap().iter().zip(&g).map(|(o, g)| *o as f64 * *g as f64).sum();
                if with_aux {
                    // scale * sum_e counts_e * sum_(rows but the padding) p_e, in f64
                    for r in (0..n).filter(|r| !padding.contains(r)) {
                        let logits: Vec<f64> = (0..experts).map(|e| (0..h).map(|i| x[r * h + i] as f64 * router[e * h + i] as f64).sum()).collect();
                        let z: f64 = logits.iter().map(|l| l.exp()).sum();
                        total += aux.scale as f64 * logits.iter().zip(&aux.counts).map(|(l, c)| l.exp() / z * *c as f64).sum::<f64>();
                    }
                }
                total
            };
            let tracked = block(&router, &weights[0][1], true);
            let (out, _) = tracked.forward(Tensor::from_inner(t(&x, [n, h])), KernelSet::Matched, Some(&[0, 3]), &padding, None).unwrap();
            let grads = (out * Tensor::from_inner(t(&g, [n, h]))).sum().backward();
            let grad_of = |w: &Tensor<2>| w.grad(&grads).expect("a gradient").into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
            for (name, analytic, base, which) in [("router", grad_of(&tracked.router), router.clone(), 0), ("expert 0 up", grad_of(&tracked.experts[0].up), weights[0][1].clone(), 1)] {
                let eps = 1e-3f32;
                for i in (0..base.len()).step_by(3) {
                    let (mut plus, mut minus) = (base.clone(), base.clone());
                    plus[i] += eps;
                    minus[i] -= eps;
                    let fd = if which == 0 { (loss(&plus, &weights[0][1]) - loss(&minus, &weights[0][1])) / (2.0 * eps as f64) } else { (loss(&router, &plus) - loss(&router, &minus)) / (2.0 * eps as f64) };
                    assert!((analytic[i] as f64 - fd).abs() <= 2e-3 + 2e-2 * fd.abs(), "{name}[{i}] (load-balancing loss {with_aux}): autodiff {} vs finite differences {fd}", analytic[i]);
                }
            }
        }
    }
}
