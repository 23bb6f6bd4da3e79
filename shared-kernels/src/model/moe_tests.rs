//! The MoE block against an f64 reference, its routing rules, and its two paths (sampling,
//! training) as the same bits.

use super::*;
use crate::testing::rows::random_vec;
use rand::rngs::StdRng;
use rand::SeedableRng;

/// The block against an f64 host computation of transformers' `Qwen3MoeSparseMoeBlock`
/// (softmax, top-2 renormalised, each expert's SwiGLU, the weighted sum) on random inputs.
#[test]
fn the_block_matches_an_f64_reference() {
    let device = crate::device::default_device();
    let (n, h, f, experts) = (7, 16, 8, 4);
    // a fixed seed: the routing is compared with f64's, which a near-tie could flip
    let mut rng = StdRng::seed_from_u64(0x2545_f491_4f6c_dd1d);
    let mut rand = |len: usize, scale: f32| random_vec(&mut rng, len, scale);
    let t = |v: &Vec<f32>, dims: [usize; 2]| Tensor::<2>::from_data(TensorData::new(v.clone(), dims), &device);
    let (x, router) = (rand(n * h, 1.0), rand(experts * h, 0.8));
    let weights: Vec<[Vec<f32>; 3]> = (0..experts).map(|_| [rand(f * h, 0.5), rand(f * h, 0.5), rand(h * f, 0.5)]).collect();
    let block = MoeBlock { router: t(&router, [experts, h]), experts: weights.iter().map(|[g, u, d]| Expert { gate: t(g, [f, h]), up: t(u, [f, h]), down: t(d, [h, f]) }).collect(), top_k: 2, norm_topk_prob: true, aux: None };
    let (out, routing) = block.forward(t(&x, [n, h]), KernelSet::Matched, None, &[], None).unwrap();
    let out = out.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(&p, &q)| p as f64 * q as f64).sum::<f64>();
    for r in 0..n {
        let xr = &x[r * h..(r + 1) * h];
        let logits: Vec<f64> = (0..experts).map(|e| dot(xr, &router[e * h..(e + 1) * h])).collect();
        let mut order: Vec<usize> = (0..experts).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let mut top = order[..2].to_vec();
        top.sort();
        assert_eq!(routing.experts[2 * r..2 * r + 2], [top[0] as u32, top[1] as u32], "row {r}");
        let z: f64 = top.iter().map(|&e| logits[e].exp()).sum();
        for c in 0..h {
            let mut want = 0.0;
            for &e in &top {
                let [g, u, d] = &weights[e];
                let act: Vec<f64> = (0..f).map(|j| {
                    let (gv, uv) = (dot(xr, &g[j * h..(j + 1) * h]), dot(xr, &u[j * h..(j + 1) * h]));
                    gv / (1.0 + (-gv).exp()) * uv
                }).collect();
                let y: f64 = (0..f).map(|j| act[j] * d[c * f + j] as f64).sum();
                want += logits[e].exp() / z * y;
            }
            let got = out[r * h + c] as f64;
            assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "row {r} column {c}: {got} vs {want}");
        }
    }
}

/// The sampling path (plain tensors) and the training path (tracked ones, with and without
/// the micro-batch-independent padded layout) give the block's output as the same bits: the
/// sampler's logprobs equal the trainer's only if they do. 5 experts for 11 rows, top-3, so
/// experts get different row counts (and one may get none).
#[test]
fn sampling_and_training_paths_give_the_same_bits() {
    let device = crate::device::default_device();
    let (n, h, f, experts) = (11, 16, 8, 5);
    let mut rng = StdRng::seed_from_u64(crate::testing::rows::test_seed());
    let mut rand = |len: usize, scale: f32| random_vec(&mut rng, len, scale);
    let (x, router) = (rand(n * h, 1.0), rand(experts * h, 0.9));
    let weights: Vec<[Vec<f32>; 3]> = (0..experts).map(|_| [rand(f * h, 0.5), rand(f * h, 0.5), rand(h * f, 0.5)]).collect();
    let t = |v: &Vec<f32>, dims: [usize; 2]| Tensor::<2>::from_data(TensorData::new(v.clone(), dims), &device);
    let block = |track: bool| {
        let w = |v: &Vec<f32>, dims| if track { Tensor::from_inner(t(v, dims)).require_grad() } else { t(v, dims) };
        MoeBlock { router: w(&router, [experts, h]), experts: weights.iter().map(|[g, u, d]| Expert { gate: w(g, [f, h]), up: w(u, [f, h]), down: w(d, [h, f]) }).collect(), top_k: 3, norm_topk_prob: false, aux: None }
    };
    let bits = |out: Tensor<2>| out.into_data().convert::<f32>().try_to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    let (sampled, routing) = block(false).forward(t(&x, [n, h]), KernelSet::Matched, None, &[], None).unwrap();
    let sampled = bits(sampled);
    for starts in [None, Some(&[0usize, 4, 9][..])] {
        let (trained, trained_routing) = block(true).forward(Tensor::from_inner(t(&x, [n, h])).require_grad(), KernelSet::Matched, starts, &[], None).unwrap();
        assert_eq!(trained_routing.experts, routing.experts);
        assert_eq!(bits(trained.inner()), sampled, "the training path (sequence starts {starts:?}) differs from the sampling path");
    }
}

#[test]
fn routing_takes_the_top_k_with_ties_to_the_lower_index_and_renormalises() {
    // row 0: experts 2 and 0 highest; row 1: a tie between 1 and 3 for second place
    let logits = [1.0, -1.0, 2.0, 0.5, 0.0, 3.0, 1.0, 3.0];
    let r = route(&logits, 4, 2, true);
    assert_eq!(r.experts, vec![0, 2, 1, 3]);
    let w = |l: &[f32], a: usize, b: usize| {
        let (ea, eb) = ((l[a] as f64).exp(), (l[b] as f64).exp());
        (ea / (ea + eb), eb / (ea + eb))
    };
    let (w0, w2) = w(&logits[..4], 0, 2);
    assert!((r.weights[0] as f64 - w0).abs() < 1e-6 && (r.weights[1] as f64 - w2).abs() < 1e-6, "{:?}", r.weights);
    assert!((r.weights[2] - 0.5).abs() < 1e-6 && (r.weights[3] - 0.5).abs() < 1e-6, "{:?}", r.weights);
    // without renormalisation the weights are the softmax's own
    let raw = route(&logits, 4, 2, false);
    let total: f64 = logits[..4].iter().map(|&l| (l as f64).exp()).sum();
    assert!((raw.weights[1] as f64 - (2.0f64).exp() / total).abs() < 1e-6);
}

/// Rows routed alike in every sparse layer share a digest; a row that differs in one layer
/// does not; a dense model has none; the load counts each row's k experts.
#[test]
fn routing_digests_tell_rows_apart_by_every_layer_and_load_counts_the_rows_asked() {
    // 3 rows, top-2: rows 0 and 2 alike in layer 1; in layer 3 row 2 differs from row 0
    let layer1 = Routing { experts: vec![0, 3, 1, 2, 0, 3], weights: vec![0.5; 6], prob_sums: Vec::new() };
    let layer3 = Routing { experts: vec![1, 2, 1, 2, 0, 2], weights: vec![0.5; 6], prob_sums: Vec::new() };
    let one = RoutingLog { layers: vec![(1, layer1.clone())] };
    let d = one.row_digests(3);
    assert_eq!((d[0] == d[2], d[0] == d[1]), (true, false));
    let both = RoutingLog { layers: vec![(1, layer1.clone()), (3, layer3)] };
    let d = both.row_digests(3);
    assert_ne!(d[0], d[2], "a difference in the second sparse layer changed no digest");
    // the same experts under another layer index are another routing
    assert_ne!(RoutingLog { layers: vec![(2, layer1)] }.row_digests(3), one.row_digests(3));
    assert!(RoutingLog::default().row_digests(3).is_empty());
    assert_eq!(both.expert_load(1..3, 3, 4), vec![(1, vec![1, 1, 1, 1]), (3, vec![1, 1, 2, 0])]);
}
