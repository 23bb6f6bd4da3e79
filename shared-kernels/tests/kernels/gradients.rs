//! Every tracked kernel's backward against burn's own autodiff of an all-burn reference of the
//! same op, within tolerance.

use burn::tensor::{activation, DType, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::SeedableRng;
use shared_kernels::testing::rows::random_vec;
use shared_kernels::{RopeTables, WeightLayout};

fn leaf<const D: usize>(values: Vec<f32>, shape: [usize; D]) -> Tensor<D> {
    let device = crate::device().autodiff();
    Tensor::<D>::from_data(TensorData::new(values, shape), &device).require_grad()
}

fn grad_of<const D: usize>(t: &Tensor<D>, grads: &burn::tensor::Gradients) -> Vec<f32> {
    t.grad(grads).expect("gradient").into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-3);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * scale, "{what}[{i}]: lockstep {g} vs burn {w} (scale {scale})");
    }
}

/// Runs `lockstep` and `reference` on fresh leaves built from the same values, backprops
/// sum(out * probe) and compares every input gradient.
fn check<const N: usize, const D: usize>(
    what: &str,
    inputs: [(Vec<f32>, Vec<usize>); N],
    lockstep: impl Fn(&[Tensor<2>]) -> Tensor<D>,
    reference: impl Fn(&[Tensor<2>]) -> Tensor<D>,
    rng: &mut StdRng,
) {
    let make = || -> Vec<Tensor<2>> {
        inputs.iter().map(|(v, s)| leaf(v.clone(), [s[0], s[1]])).collect()
    };
    let (a, b) = (make(), make());
    let out_a = lockstep(&a);
    let probe = Tensor::<D>::from_data(TensorData::new(random_vec(rng, out_a.shape().num_elements(), 1.0), out_a.shape()), &out_a.device());
    let ga = (out_a * probe.clone()).sum().backward();
    let gb = (reference(&b) * probe).sum().backward();
    for i in 0..N {
        assert_close(&format!("{what} d/input{i}"), &grad_of(&a[i], &ga), &grad_of(&b[i], &gb), 1e-4);
    }
}

#[test]
fn backward_of_every_tracked_kernel_matches_burn_autodiff() {
    let mut rng = StdRng::seed_from_u64(crate::seed());
    let (m, k, n) = (5, 24, 7);
    let x = random_vec(&mut rng, m * k, 1.0);
    let w = random_vec(&mut rng, n * k, 1.0);
    check("matmul W[N,K]", [(x.clone(), vec![m, k]), (w.clone(), vec![n, k])],
        |t| shared_kernels::matmul(t[0].clone(), t[1].clone(), WeightLayout::OutIn).unwrap(),
        |t| t[0].clone().matmul(t[1].clone().transpose()), &mut rng);
    check("matmul W[K,N]", [(x.clone(), vec![m, k]), (w.clone(), vec![k, n])],
        |t| shared_kernels::matmul(t[0].clone(), t[1].clone(), WeightLayout::InOut).unwrap(),
        |t| t[0].clone().matmul(t[1].clone()), &mut rng);

    let weight = random_vec(&mut rng, k, 1.0);
    check("rmsnorm", [(x.clone(), vec![m, k]), (weight, vec![1, k])],
        |t| shared_kernels::rmsnorm(t[0].clone(), t[1].clone().reshape([k]), 1e-6).unwrap(),
        |t| {
            let inv = (t[0].clone() * t[0].clone()).mean_dim(1).add_scalar(1e-6).sqrt().recip();
            t[0].clone() * inv * t[1].clone()
        }, &mut rng);

    let up = random_vec(&mut rng, m * k, 1.0);
    check("swiglu", [(x.clone(), vec![m, k]), (up.clone(), vec![m, k])],
        |t| shared_kernels::swiglu(t[0].clone(), t[1].clone()).unwrap(),
        |t| activation::silu(t[0].clone()) * t[1].clone(), &mut rng);
    check("add", [(x.clone(), vec![m, k]), (up, vec![m, k])],
        |t| shared_kernels::add(t[0].clone(), t[1].clone()).unwrap(),
        |t| t[0].clone() + t[1].clone(), &mut rng);

    let bias = random_vec(&mut rng, k, 1.0);
    check("bias_add", [(x.clone(), vec![m, k]), (bias, vec![1, k])],
        |t| shared_kernels::bias_add(t[0].clone(), t[1].clone().reshape([k])).unwrap(),
        |t| t[0].clone() + t[1].clone(), &mut rng);

    let device = crate::device();
    let ids = Tensor::<1, Int>::from_data(TensorData::new(vec![3i32, 1, 3, 0], [4]), &device);
    let table = random_vec(&mut rng, 5 * k, 1.0);
    check("embedding", [(table, vec![5, k])],
        |t| shared_kernels::embedding(t[0].clone(), ids.clone()).unwrap(),
        |t| t[0].clone().select(0, ids.clone().to_device(&t[0].device())), &mut rng);

    let (heads, dim) = (3, 8);
    let tables = RopeTables::new(dim, 16, 10_000.0, &device).unwrap();
    let pos = vec![0i32, 5, 15, 2, 9];
    let positions = Tensor::<1, Int>::from_data(TensorData::new(pos.clone(), [m]), &device);
    let q = random_vec(&mut rng, m * heads * dim, 1.0);
    let (cos_h, sin_h) = RopeTables::host_values(dim, 16, 10_000.0);
    check("rope", [(q, vec![m, heads * dim])],
        |t| shared_kernels::rope(t[0].clone().reshape([m, heads, dim]), positions.clone(), &tables).unwrap(),
        |t| {
            let d = t[0].device();
            let half = dim / 2;
            let gather = |tab: &Vec<f32>| {
                let rows: Vec<f32> = pos.iter().flat_map(|&p| tab[p as usize * half..(p as usize + 1) * half].to_vec()).collect();
                Tensor::<3>::from_data(TensorData::new(rows, [m, 1, half]), &d)
            };
            let (c, s) = (gather(&cos_h), gather(&sin_h));
            let x = t[0].clone().reshape([m, heads, dim]);
            let a = x.clone().slice([0..m, 0..heads, 0..half]);
            let b = x.slice([0..m, 0..heads, half..dim]);
            Tensor::cat(vec![a.clone() * c.clone() - b.clone() * s.clone(), b * c + a * s], 2)
        }, &mut rng);

    let temps = vec![1.0f32, 0.5, 2.0, 0.0, 1.0];
    let temp_t = Tensor::<1>::from_data(TensorData::new(temps.clone(), [m]), &device);
    // one chunk (vocab 11, loaded one logit at a time), then several vocabulary chunks in a row
    // length the backward loads as vectors
    let long = 2 * shared_kernels::ops::logits::logprob::VOCAB_CHUNK + 12;
    for (vocab, tg) in [(11usize, vec![0i32, 10, 4, 4, 7]), (long, vec![0, long as i32 - 1, 2048, 2047, 3000])] {
        let logits = random_vec(&mut rng, m * vocab, 3.0);
        let targets = Tensor::<1, Int>::from_data(TensorData::new(tg, [m]), &device);
        check(&format!("token_logprobs (vocab {vocab})"), [(logits, vec![m, vocab])],
            |t| shared_kernels::token_logprobs(t[0].clone(), targets.clone(), temp_t.clone()).unwrap().logprobs,
            |t| {
                let d = t[0].device();
                let inv: Vec<f32> = temps.iter().map(|&t| if t > 0.0 { 1.0 / t } else { 1.0 }).collect();
                let inv = Tensor::<2>::from_data(TensorData::new(inv, [m, 1]), &d);
                let ls = activation::log_softmax(t[0].clone() * inv, 1);
                ls.gather(1, targets.clone().to_device(&d).reshape([m, 1])).reshape([m])
            }, &mut rng);
    }
    let _ = DType::F32;
}

#[test]
fn causal_attention_backward_matches_burn_autodiff_of_dense_attention() {
    let mut rng = StdRng::seed_from_u64(crate::seed());
    let (hq, hkv, d) = (4, 2, 8);
    // two sequences (lengths 5 and 3), rows interleaved and out of order
    let slots: Vec<u32> = vec![0, 1, 0, 0, 1, 0, 1, 0];
    let positions: Vec<u32> = vec![0, 2, 1, 3, 0, 2, 1, 4];
    let rows = slots.len();
    let q = random_vec(&mut rng, rows * hq * d, 1.0);
    let k = random_vec(&mut rng, rows * hkv * d, 1.0);
    let v = random_vec(&mut rng, rows * hkv * d, 1.0);
    let scale = 1.0 / (d as f32).sqrt();
    check("causal_attention", [(q, vec![rows, hq * d]), (k, vec![rows, hkv * d]), (v, vec![rows, hkv * d])],
        |t| {
            let r = |x: &Tensor<2>, h: usize| x.clone().reshape([rows, h, d]);
            shared_kernels::causal_attention(r(&t[0], hq), r(&t[1], hkv), r(&t[2], hkv), &slots, &positions, scale).unwrap().reshape([rows, hq * d])
        },
        |t| {
            // dense reference: one row at a time against its sequence's keys at positions <= its own
            let dev = t[0].device();
            let mut outs = Vec::new();
            for r in 0..rows {
                let keys: Vec<i32> = (0..rows).filter(|&j| slots[j] == slots[r] && positions[j] <= positions[r]).map(|j| j as i32).collect();
                let n = keys.len();
                let idx = Tensor::<1, Int>::from_data(TensorData::new(keys, [n]), &dev);
                let qr = t[0].clone().slice([r..r + 1, 0..hq * d]).reshape([hq, 1, d]);
                let kr = t[1].clone().select(0, idx.clone()).reshape([n, hkv, 1, d]).repeat_dim(2, hq / hkv).reshape([n, hq, d]).swap_dims(0, 1);
                let vr = t[2].clone().select(0, idx).reshape([n, hkv, 1, d]).repeat_dim(2, hq / hkv).reshape([n, hq, d]).swap_dims(0, 1);
                let p = activation::softmax(qr.matmul(kr.swap_dims(1, 2)).mul_scalar(scale as f64), 2);
                outs.push(p.matmul(vr).reshape([1, hq * d]));
            }
            Tensor::cat(outs, 0)
        }, &mut rng);
}

#[test]
fn the_training_forward_with_statistics_is_the_forward_and_refuses_other_layouts() {
    // the statistics come from the CUDA mma kernels; here (no such kernels) none come back and
    // the output is the plain forward's, bit for bit
    let mut rng = StdRng::seed_from_u64(crate::seed());
    let (hq, hkv, d) = (4, 2, 32);
    let lens = [1usize, 5, 66];
    let rows: usize = lens.iter().sum();
    let slots: Vec<u32> = lens.iter().enumerate().flat_map(|(s, &l)| std::iter::repeat_n(s as u32, l)).collect();
    let positions: Vec<u32> = lens.iter().flat_map(|&l| 0..l as u32).collect();
    let make = |h: usize, rng: &mut StdRng| Tensor::<3>::from_data(TensorData::new(random_vec(rng, rows * h * d, 1.0), [rows, h, d]), &crate::device());
    let (q, k, v) = (make(hq, &mut rng), make(hkv, &mut rng), make(hkv, &mut rng));
    let scale = 1.0 / (d as f32).sqrt();
    let plain = shared_kernels::causal_attention(q.clone(), k.clone(), v.clone(), &slots, &positions, scale).unwrap();
    let (out, stats) = shared_kernels::ops::attention::causal::causal_attention_with_stats(q.clone(), k.clone(), v.clone(), &slots, &positions, scale).unwrap();
    assert!(stats.is_none(), "statistics without the mma backward");
    let bits = |t: Tensor<3>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap().into_iter().map(f32::to_bits).collect::<Vec<_>>();
    assert_eq!(bits(out), bits(plain));
    // rows of one sequence apart: not the training layout
    let (mut s2, mut p2) = (slots.clone(), positions.clone());
    s2.swap(1, rows - 1);
    p2.swap(1, rows - 1);
    let e = shared_kernels::ops::attention::causal::causal_attention_with_stats(q, k, v, &s2, &p2, scale).unwrap_err();
    assert!(e.to_string().contains("training layout"), "{e}");
}

#[test]
fn truncated_logprob_backward_matches_burn_autodiff_of_the_kept_sets_log_softmax() {
    let mut rng = StdRng::seed_from_u64(crate::seed());
    let device = crate::device();
    let m = 5;
    let temps = vec![1.0f32, 0.5, 1.0, 0.0, 2.0];
    let temp_t = Tensor::<1>::from_data(TensorData::new(temps.clone(), [m]), &device);
    let long = 2 * shared_kernels::ops::logits::logprob::VOCAB_CHUNK + 12;
    // top-p only on the small vocabulary: there the f64 reference set cannot straddle the f32
    // mass sum's rounding at the boundary; on the long one top-k, whose set is a count
    for (vocab, top_k, top_p) in [(11usize, [0u32, 4, 3, 0, 0], [0.7f32, 1.0, 0.9, 0.5, 0.8]), (long, [50, 3, 700, 5, 1], [1.0; 5])] {
        let logits = random_vec(&mut rng, m * vocab, 3.0);
        // greedy rows (T = 0) keep every token, as the sampler scores them
        let kept: Vec<Vec<bool>> = (0..m)
            .map(|r| if temps[r] > 0.0 { shared_kernels::reference::allowed_tokens(&logits[r * vocab..(r + 1) * vocab], temps[r], top_k[r], top_p[r]) } else { vec![true; vocab] })
            .collect();
        // targets inside each row's set, as a rollout's tokens always are
        let tg: Vec<i32> = kept.iter().map(|k| { let ids: Vec<usize> = (0..vocab).filter(|&j| k[j]).collect(); ids[rand::Rng::random_range(&mut rng, 0..ids.len())] as i32 }).collect();
        let targets = Tensor::<1, Int>::from_data(TensorData::new(tg, [m]), &device);
        let truncation = shared_kernels::Truncation {
            top_k: Tensor::<1, Int>::from_data(TensorData::new(top_k.iter().map(|&k| k as i64).collect::<Vec<_>>(), [m]), &device),
            top_p: Tensor::<1>::from_data(TensorData::new(top_p.to_vec(), [m]), &device),
        };
        let outside: Vec<bool> = kept.iter().flatten().map(|k| !k).collect();
        check(&format!("truncated token_logprobs (vocab {vocab})"), [(logits, vec![m, vocab])],
            |t| shared_kernels::truncated_token_logprobs(t[0].clone(), targets.clone(), temp_t.clone(), Some(&truncation)).unwrap().logprobs,
            |t| {
                let d = t[0].device();
                let inv: Vec<f32> = temps.iter().map(|&t| if t > 0.0 { 1.0 / t } else { 1.0 }).collect();
                let inv = Tensor::<2>::from_data(TensorData::new(inv, [m, 1]), &d);
                let mask = Tensor::<2, burn::tensor::Bool>::from_data(TensorData::new(outside.clone(), [m, vocab]), &d);
                let ls = activation::log_softmax((t[0].clone() * inv).mask_fill(mask, -1e30), 1);
                ls.gather(1, targets.clone().to_device(&d).reshape([m, 1])).reshape([m])
            }, &mut rng);
    }
}
