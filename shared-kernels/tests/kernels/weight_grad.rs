//! Folded weight gradients (`shared_kernels::grad_fold`): a gradient folded over several calls
//! split on multiples of FOLD_ROWS tokens has the bits of one call over all the tokens; close to
//! an f64 reference; and the model's weight gradients do not depend on the micro-batching.
//! Also the linear-memory attention backward: a sequence's gradients are its own bits whatever
//! shares the batch, and close to dense attention's.

use burn::tensor::{Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::SeedableRng;
use shared_kernels::autodiff::plain;
use shared_kernels::testing::rows::random_vec;
use shared_kernels::grad_fold::{node_id, GradFold, FOLD_ROWS};
use shared_kernels::model::{tiny_config, Checkpoint, Qwen3, Weight};
use shared_kernels::ops::weight_grad::{fold_column_sums, fold_embedding, fold_matmul};

fn bits2(t: Tensor<2>) -> Vec<u32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

fn host(t: Tensor<2>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

fn mat(v: &[f32], rows: usize, cols: usize) -> Tensor<2> {
    Tensor::<2>::from_data(TensorData::new(v.to_vec(), [rows, cols]), &crate::device())
}

/// The norms' weight fold adds in a fixed order: each chunk's rows in order from zero, then the
/// chunks in order onto the accumulator. Checked as bits against that order on the host, with
/// enough chunks (21: two batches of eight loads in flight and five more) for every loop of the
/// kernel, an accumulator that starts non-zero, and a partial last chunk.
#[test]
fn fold_column_sums_adds_in_its_fixed_order() {
    let mut rng = StdRng::seed_from_u64(crate::seed() ^ 0xf01d);
    let (chunk, cols) = (FOLD_ROWS, 37);
    let t = 20 * chunk + 5;
    let x = random_vec(&mut rng, t * cols, 3.0);
    let start = random_vec(&mut rng, cols, 50.0);
    let acc = fold_column_sums(None, mat(&start, 1, cols), 1).unwrap();
    let got = host(plain::<2>(fold_column_sums(Some(acc), mat(&x, t, cols), chunk).unwrap()).reshape([1, cols]));
    for c in 0..cols {
        let mut want = 0.0f32 + start[c];
        for first in (0..t).step_by(chunk) {
            let partial = (first..(first + chunk).min(t)).fold(0.0f32, |a, r| a + x[r * cols + c]);
            want += partial;
        }
        assert_eq!(got[c].to_bits(), want.to_bits(), "column {c}: {} vs {want}", got[c]);
    }
}

#[test]
fn folded_weight_gradients_split_on_granules_equal_one_pass_as_bits() {
    let mut rng = StdRng::seed_from_u64(crate::seed());
    let (t, n, k) = (5 * FOLD_ROWS + 3, 48, 32);
    let dy = random_vec(&mut rng, t * n, 1.0);
    let x = random_vec(&mut rng, t * k, 1.0);
    let rows = |v: &[f32], a: usize, b: usize, cols: usize| mat(&v[a * cols..b * cols], b - a, cols);
    // matmul: one call, then 3 calls cut at granules 16 and 64
    let whole = plain::<2>(fold_matmul(None, rows(&dy, 0, t, n), rows(&x, 0, t, k)).unwrap());
    let mut acc = None;
    for (a, b) in [(0, FOLD_ROWS), (FOLD_ROWS, 4 * FOLD_ROWS), (4 * FOLD_ROWS, t)] {
        acc = Some(fold_matmul(acc, rows(&dy, a, b, n), rows(&x, a, b, k)).unwrap());
    }
    let pieces = plain::<2>(acc.unwrap());
    assert_eq!(bits2(whole.clone()), bits2(pieces), "fold_matmul in 3 calls");
    let got = host(whole);
    for i in 0..n {
        for j in 0..k {
            let want: f64 = (0..t).map(|r| dy[r * n + i] as f64 * x[r * k + j] as f64).sum();
            assert!((got[i * k + j] as f64 - want).abs() <= 1e-4 * (t as f64).sqrt(), "dW[{i},{j}] {} vs {want}", got[i * k + j]);
        }
    }
    // column sums with 2 rows a token (a q/k norm's [tokens, heads, d] input)
    let per_token = 2;
    let chunk = FOLD_ROWS * per_token;
    let whole = fold_column_sums(None, rows(&x, 0, t, k), chunk).unwrap();
    let cut = 2 * chunk;
    let acc = fold_column_sums(None, rows(&x, 0, cut, k), chunk).unwrap();
    let acc = fold_column_sums(Some(acc), rows(&x, cut, t, k), chunk).unwrap();
    let (whole, acc) = (host(plain::<2>(whole).reshape([1, k])), host(plain::<2>(acc).reshape([1, k])));
    assert_eq!(whole.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), acc.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "fold_column_sums in 2 calls");
    for j in 0..k {
        let want: f64 = (0..t).map(|r| x[r * k + j] as f64).sum();
        assert!((whole[j] as f64 - want).abs() <= 1e-4 * t as f64, "column {j}: {} vs {want}", whole[j]);
    }
    // embedding: repeated ids, in two calls
    let vocab = 7;
    let ids: Vec<i32> = (0..t).map(|r| ((r * 5 + r / 3) % vocab) as i32).collect();
    let id_t = |a: usize, b: usize| Tensor::<1, Int>::from_data(TensorData::new(ids[a..b].to_vec(), [b - a]), &crate::device());
    let whole = plain::<2>(fold_embedding(None, rows(&x, 0, t, k), id_t(0, t), vocab).unwrap());
    let acc = fold_embedding(None, rows(&x, 0, 2 * FOLD_ROWS, k), id_t(0, 2 * FOLD_ROWS), vocab).unwrap();
    let pieces = plain::<2>(fold_embedding(Some(acc), rows(&x, 2 * FOLD_ROWS, t, k), id_t(2 * FOLD_ROWS, t), vocab).unwrap());
    assert_eq!(bits2(whole.clone()), bits2(pieces), "fold_embedding in 2 calls");
    let got = host(whole);
    for v in 0..vocab {
        for j in 0..k {
            let want: f64 = (0..t).filter(|&r| ids[r] as usize == v).map(|r| x[r * k + j] as f64).sum();
            assert!((got[v * k + j] as f64 - want).abs() <= 1e-4 * t as f64, "dE[{v},{j}]");
        }
    }
    // an id outside the vocabulary is an error naming it
    let bad = Tensor::<1, Int>::from_data(TensorData::new(vec![0i32, 9], [2]), &crate::device());
    let err = fold_embedding(None, rows(&x, 0, 2, k), bad, vocab).unwrap_err().to_string();
    assert!(err.contains("token id 9") && err.contains("vocabulary of 7"), "{err}");
}

/// dQ, dK, dV of `causal_attention` over contiguous sequences of `lens`, for sum(out * probe).
fn attention_grads(q: &[f32], k: &[f32], v: &[f32], probe: &[f32], lens: &[usize], (hq, hkv, d): (usize, usize, usize)) -> [Vec<f32>; 3] {
    let device = crate::device().autodiff();
    let rows: usize = lens.iter().sum();
    let leaf = |x: &[f32], h: usize| Tensor::<3>::from_data(TensorData::new(x.to_vec(), [rows, h, d]), &device).require_grad();
    let (ql, kl, vl) = (leaf(q, hq), leaf(k, hkv), leaf(v, hkv));
    let slots: Vec<u32> = lens.iter().enumerate().flat_map(|(s, &l)| std::iter::repeat_n(s as u32, l)).collect();
    let positions: Vec<u32> = lens.iter().flat_map(|&l| 0..l as u32).collect();
    let out = shared_kernels::causal_attention(ql.clone(), kl.clone(), vl.clone(), &slots, &positions, 1.0 / (d as f32).sqrt()).unwrap();
    let probe = Tensor::<3>::from_data(TensorData::new(probe.to_vec(), [rows, hq, d]), &device);
    let grads = (out * probe).sum().backward();
    let g = |t: &Tensor<3>| t.grad(&grads).unwrap().into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    [g(&ql), g(&kl), g(&vl)]
}

#[test]
fn attention_backward_bits_are_the_sequence_own_and_close_to_dense() {
    let mut rng = StdRng::seed_from_u64(crate::seed());
    let (hq, hkv, d) = (4, 2, 8);
    // sequence 0 crosses a KV split (64 keys); its neighbours differ between the two batches
    let alone = [70usize];
    let batch = [3usize, 70, 17];
    let rows: usize = batch.iter().sum();
    let q = random_vec(&mut rng, rows * hq * d, 1.0);
    let k = random_vec(&mut rng, rows * hkv * d, 1.0);
    let v = random_vec(&mut rng, rows * hkv * d, 1.0);
    let probe = random_vec(&mut rng, rows * hq * d, 1.0);
    let in_batch = attention_grads(&q, &k, &v, &probe, &batch, (hq, hkv, d));
    let seq = |x: &[f32], h: usize| x[3 * h * d..73 * h * d].to_vec();
    let by_itself = attention_grads(&seq(&q, hq), &seq(&k, hkv), &seq(&v, hkv), &seq(&probe, hq), &alone, (hq, hkv, d));
    for (i, name) in ["dq", "dk", "dv"].iter().enumerate() {
        let h = if i == 0 { hq } else { hkv };
        let a: Vec<u32> = seq(&in_batch[i], h).iter().map(|x| x.to_bits()).collect();
        let b: Vec<u32> = by_itself[i].iter().map(|x| x.to_bits()).collect();
        assert_eq!(a, b, "{name} of a 70-token sequence alone vs between two others");
    }
    // against dense attention: rows interleaved take the dense backward
    let mut order: Vec<usize> = (0..rows).collect();
    order.swap(0, 5);
    let lens_slots: Vec<u32> = batch.iter().enumerate().flat_map(|(s, &l)| std::iter::repeat_n(s as u32, l)).collect();
    let lens_positions: Vec<u32> = batch.iter().flat_map(|&l| 0..l as u32).collect();
    let device = crate::device().autodiff();
    let pick = |x: &[f32], h: usize| order.iter().flat_map(|&r| x[r * h * d..(r + 1) * h * d].to_vec()).collect::<Vec<f32>>();
    let leaf = |x: Vec<f32>, h: usize| Tensor::<3>::from_data(TensorData::new(x, [rows, h, d]), &device).require_grad();
    let (ql, kl, vl) = (leaf(pick(&q, hq), hq), leaf(pick(&k, hkv), hkv), leaf(pick(&v, hkv), hkv));
    let slots: Vec<u32> = order.iter().map(|&r| lens_slots[r]).collect();
    let positions: Vec<u32> = order.iter().map(|&r| lens_positions[r]).collect();
    let out = shared_kernels::causal_attention(ql.clone(), kl.clone(), vl.clone(), &slots, &positions, 1.0 / (d as f32).sqrt()).unwrap();
    let probe_t = Tensor::<3>::from_data(TensorData::new(pick(&probe, hq), [rows, hq, d]), &device);
    let grads = (out * probe_t).sum().backward();
    for (i, t) in [&ql, &kl, &vl].into_iter().enumerate() {
        let h = if i == 0 { hq } else { hkv };
        let dense = t.grad(&grads).unwrap().into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let flash = pick(&in_batch[i], h);
        let scale = dense.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-3);
        for (j, (a, b)) in flash.iter().zip(&dense).enumerate() {
            assert!((a - b).abs() <= 1e-4 * scale, "grad {i}[{j}]: linear-memory {a} vs dense {b}");
        }
    }
}

/// Every weight's gradient of sum(w * logprobs) over `sequences`, cut into `batches`, folded.
fn model_grads(model: &Qwen3, sequences: &[Vec<u32>], coef: &[f32], batches: &[std::ops::Range<usize>]) -> Vec<(String, Vec<u32>)> {
    let mut fold = GradFold::new();
    let mut at = 0;
    for range in batches {
        let tracked = model.map_weights(&mut |_, w| w.map(|v| Tensor::from_inner(v).require_grad(), |m| Tensor::from_inner(m).require_grad()));
        let flat = tracked.sequence_logprobs(&sequences[range.clone()], 1.0).unwrap().flat;
        let n = flat.dims()[0];
        let w = Tensor::<1>::from_data(TensorData::new(coef[at..at + n].to_vec(), [n]), &flat.device());
        at += n;
        let nodes: Vec<(String, u64)> = tracked
            .named_tensors()
            .into_iter()
            .map(|(name, w)| {
                let id = match &w {
                    Weight::Vector(v) => node_id(v),
                    Weight::Matrix(m) => node_id(m),
                };
                (name, id.expect("tracked"))
            })
            .collect();
        let _attached = fold.attach(nodes);
        let grads = (flat * w).sum().backward();
        for (name, w) in tracked.named_tensors() {
            let burn_grad = match &w {
                Weight::Vector(v) => v.grad(&grads).is_some(),
                Weight::Matrix(m) => m.grad(&grads).is_some(),
            };
            assert!(!burn_grad, "{name}: its gradient went to burn, not to the fold");
        }
    }
    assert_eq!(at, coef.len());
    fold.into_grads().into_iter().map(|(name, g)| (name, g.into_data().convert::<f32>().try_to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect())).collect()
}

#[test]
fn model_weight_gradients_do_not_depend_on_the_micro_batching() {
    let mut rng = StdRng::seed_from_u64(crate::seed());
    for tied in [true, false] {
        // the untied model with projection biases (q/k/v and o), folded like the norms' weights
        let mut config = tiny_config(23, tied);
        (config.qkv_bias, config.o_bias) = (!tied, !tied);
        let ck = Checkpoint::random(config, 0.3, crate::seed() ^ tied as u64);
        let model = Qwen3::from_checkpoint(&ck, burn::tensor::DType::F32, &crate::device()).unwrap();
        // lengths that are not granule multiples, one longer than a KV split
        let lens = [9usize, 21, 5, 70, 16, 3];
        let sequences: Vec<Vec<u32>> = lens.iter().map(|&l| (0..l).map(|i| ((i * 7 + l) % 23) as u32).collect()).collect();
        let scored: usize = lens.iter().map(|l| l - 1).sum();
        let coef = random_vec(&mut rng, scored, 0.01);
        let one = model_grads(&model, &sequences, &coef, &[0..6]);
        assert_eq!(one.len(), model.named_tensors().len(), "every weight folded");
        for batches in [vec![0..2, 2..6], vec![0..1, 1..2, 2..3, 3..4, 4..5, 5..6], vec![0..3, 3..4, 4..6]] {
            let cut = model_grads(&model, &sequences, &coef, &batches);
            for ((name, a), (_, b)) in one.iter().zip(&cut) {
                assert!(a == b, "tied {tied}: {name}'s gradient differs between one pass and micro-batches {batches:?}");
            }
        }
    }
}

#[test]
fn padded_rows_keep_each_sequence_on_a_granule() {
    use shared_kernels::model::Rows;
    let sequences = vec![vec![1u32; 5], vec![2u32; 16], vec![3u32; 17]];
    let rows = Rows::whole_padded(&sequences, FOLD_ROWS, 1000);
    assert_eq!(rows.len(), 16 + 16 + 32);
    assert_eq!(&rows.slots[..16], &[0u32; 16]);
    assert_eq!(&rows.positions[..16], &(0..16).collect::<Vec<u32>>()[..]);
    assert_eq!(&rows.tokens[5..16], &[0u32; 11]);
    // padding that would pass max_positions becomes a sequence of its own in an extra slot
    let rows = Rows::whole_padded(&sequences[..1], FOLD_ROWS, 8);
    assert_eq!(rows.slots, [vec![0u32; 5], vec![1u32; 11]].concat());
    assert_eq!(&rows.positions[5..], &(0..11).collect::<Vec<u32>>()[..]);
}

#[test]
fn linear_memory_attention_backward_matches_dense_and_keeps_each_sequence_bits() {
    use shared_kernels::ops::attention::backward::{attention_backward, contiguous_sequences, dense_sequence};
    let mut rng = StdRng::seed_from_u64(crate::seed());
    let (hq, hkv, d) = (4, 2, 8);
    let device = crate::device();
    let t3 = |x: &[f32], rows: usize, h: usize| Tensor::<3>::from_data(TensorData::new(x.to_vec(), [rows, h, d]), &device);
    let ints = |v: Vec<i32>| Tensor::<1, Int>::from_data(TensorData::new(v.clone(), [v.len()]), &device);
    let host3 = |t: Tensor<3>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    // the kernels over a batch of 3 sequences (the middle one crosses a 64-key split), and over
    // the middle one alone
    let lens = [3usize, 70, 17];
    let rows: usize = lens.iter().sum();
    let (q, k, v, d_out) = (random_vec(&mut rng, rows * hq * d, 1.0), random_vec(&mut rng, rows * hkv * d, 1.0), random_vec(&mut rng, rows * hkv * d, 1.0), random_vec(&mut rng, rows * hq * d, 1.0));
    let run = |first: usize, lens: &[usize]| {
        let n: usize = lens.iter().sum();
        let slots: Vec<u32> = lens.iter().enumerate().flat_map(|(s, &l)| std::iter::repeat_n(s as u32, l)).collect();
        let positions: Vec<u32> = lens.iter().flat_map(|&l| 0..l as u32).collect();
        let (starts, seq_lens) = contiguous_sequences(&slots, &positions).unwrap();
        let cut = |x: &[f32], h: usize| t3(&x[first * h * d..(first + n) * h * d], n, h);
        let (qt, kt, vt) = (cut(&q, hq), cut(&k, hkv), cut(&v, hkv));
        let out = shared_kernels::causal_attention(qt.clone(), kt.clone(), vt.clone(), &slots, &positions, 1.0 / (d as f32).sqrt()).unwrap();
        let layout = (ints(starts), ints(seq_lens), ints(positions.iter().map(|&p| p as i32).collect()));
        let (dq, dk, dv) = attention_backward(qt, kt, vt, out, cut(&d_out, hq), layout, 1.0 / (d as f32).sqrt()).unwrap();
        [host3(dq), host3(dk), host3(dv)]
    };
    let batch = run(0, &lens);
    let alone = run(3, &lens[1..2]);
    for (i, h) in [hq, hkv, hkv].into_iter().enumerate() {
        let mid: Vec<u32> = batch[i][3 * h * d..73 * h * d].iter().map(|x| x.to_bits()).collect();
        assert_eq!(mid, alone[i].iter().map(|x| x.to_bits()).collect::<Vec<u32>>(), "gradient {i}: the sequence's bits changed with its neighbours");
    }
    // against the dense per-sequence backward, within f32 rounding
    let mid = |x: &[f32], h: usize| t3(&x[3 * h * d..73 * h * d], 70, h);
    let dense = dense_sequence(mid(&q, hq), mid(&k, hkv), mid(&v, hkv), mid(&d_out, hq), 1.0 / (d as f32).sqrt());
    for (i, want) in [host3(dense.0), host3(dense.1), host3(dense.2)].into_iter().enumerate() {
        let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-3);
        for (j, (a, b)) in alone[i].iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-4 * scale, "gradient {i}[{j}]: linear-memory {a} vs dense {b}");
        }
    }
}
