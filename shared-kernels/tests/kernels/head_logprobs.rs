//! The LM head fused with the logprob, in chunks of rows: logprobs, entropies and the input
//! gradient equal the unchunked `token_logprobs(matmul(x, W))` as bits for every chunking; the
//! head's weight gradient equals it as bits with one chunk and is the fixed-order f32 sum of
//! the chunks' gradients otherwise (close to the unchunked one, identical run to run). The same
//! under a truncated (processed) distribution.

use burn::tensor::{Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::SeedableRng;
use shared_kernels::testing::rows::random_vec;
use shared_kernels::WeightLayout;

struct Outputs {
    logprobs: Vec<u32>,
    entropy: Vec<u32>,
    dx: Vec<f32>,
    dw: Vec<f32>,
}

fn bits(t: Tensor<1>) -> Vec<u32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

fn host(t: Tensor<2>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

/// Per-row top-k and top-p of a truncated (processed) distribution.
type Kept<'a> = Option<(&'a [u32], &'a [f32])>;

/// Runs `chunk_rows` (None: the unchunked ops) on fresh leaves; backprops sum(logprob * probe).
#[allow(clippy::too_many_arguments)]
fn run(x: &[f32], w: &[f32], (rows, hidden, vocab): (usize, usize, usize), targets: &[i32], temps: &[f32], kept: Kept, probe: &[f32], chunk_rows: Option<usize>) -> Outputs {
    let device = crate::device().autodiff();
    let xl = Tensor::<2>::from_data(TensorData::new(x.to_vec(), [rows, hidden]), &device).require_grad();
    let wl = Tensor::<2>::from_data(TensorData::new(w.to_vec(), [vocab, hidden]), &device).require_grad();
    let tg = Tensor::<1, Int>::from_data(TensorData::new(targets.to_vec(), [rows]), &device);
    let tt = Tensor::<1>::from_data(TensorData::new(temps.to_vec(), [rows]), &device);
    let truncation = kept.map(|(k, p)| shared_kernels::Truncation {
        top_k: Tensor::<1, Int>::from_data(TensorData::new(k.iter().map(|&v| v as i64).collect::<Vec<_>>(), [rows]), &device),
        top_p: Tensor::<1>::from_data(TensorData::new(p.to_vec(), [rows]), &device),
    });
    let out = match chunk_rows {
        None => shared_kernels::truncated_token_logprobs(shared_kernels::matmul(xl.clone(), wl.clone(), WeightLayout::OutIn).unwrap(), tg, tt, truncation.as_ref()).unwrap(),
        Some(c) => shared_kernels::head_logprobs_chunked(xl.clone(), wl.clone(), tg, tt, truncation.as_ref(), c).unwrap(),
    };
    let probe = Tensor::<1>::from_data(TensorData::new(probe.to_vec(), [rows]), &device);
    let grads = (out.logprobs.clone() * probe).sum().backward();
    Outputs {
        logprobs: bits(out.logprobs.inner()),
        entropy: bits(out.entropy),
        dx: host(xl.grad(&grads).unwrap()),
        dw: host(wl.grad(&grads).unwrap()),
    }
}

fn to_bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn chunked_head_logprobs_equal_the_unchunked_ops_as_bits() {
    let mut rng = StdRng::seed_from_u64(crate::seed());
    // several vocabulary chunks of the logprob kernel, rows that no chunking divides evenly
    let (rows, hidden, vocab) = (37, 24, 2 * shared_kernels::ops::logits::logprob::VOCAB_CHUNK + 45);
    let x = random_vec(&mut rng, rows * hidden, 1.0);
    let w = random_vec(&mut rng, vocab * hidden, 0.5);
    let random_targets: Vec<i32> = random_vec(&mut rng, rows, 1.0).iter().map(|v| ((v.abs() * 7919.0) as usize % vocab) as i32).collect();
    let temps: Vec<f32> = (0..rows).map(|r| [1.0f32, 0.7, 0.0, 1.3][r % 4]).collect();
    let probe = random_vec(&mut rng, rows, 1.0);
    let dims = (rows, hidden, vocab);
    // the truncated distribution (processed logprobs): every other row's target is its argmax,
    // always kept; the others mostly fall outside their set (logprob NEG_BIG, no gradient)
    let logits = shared_kernels::reference::matmul(&x, &w, rows, hidden, vocab, true);
    let argmax = |r: usize| (0..vocab).max_by(|&a, &b| logits[r * vocab + a].total_cmp(&logits[r * vocab + b])).unwrap() as i32;
    let kept_targets: Vec<i32> = (0..rows).map(|r| if r % 2 == 0 { argmax(r) } else { random_targets[r] }).collect();
    let top_k: Vec<u32> = (0..rows).map(|r| [0u32, 40, 7, 0, 1000][r % 5]).collect();
    let top_p: Vec<f32> = (0..rows).map(|r| [0.9f32, 1.0, 0.8, 1.0, 0.95, 0.5][r % 6]).collect();
    for (what, targets, kept) in [("full", &random_targets, None), ("truncated", &kept_targets, Some((&top_k[..], &top_p[..])))] {
        let reference = run(&x, &w, dims, targets, &temps, kept, &probe, None);
        let one_chunk = run(&x, &w, dims, targets, &temps, kept, &probe, Some(rows));
        assert_eq!(one_chunk.logprobs, reference.logprobs, "{what}: logprobs, one chunk");
        assert_eq!(one_chunk.entropy, reference.entropy, "{what}: entropy, one chunk");
        assert_eq!(to_bits(&one_chunk.dx), to_bits(&reference.dx), "{what}: dx, one chunk");
        assert_eq!(to_bits(&one_chunk.dw), to_bits(&reference.dw), "{what}: dW, one chunk");
        let scale = reference.dw.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for chunk in [1, 5, 16, 36] {
            let a = run(&x, &w, dims, targets, &temps, kept, &probe, Some(chunk));
            assert_eq!(a.logprobs, reference.logprobs, "{what}: logprobs, chunks of {chunk}");
            assert_eq!(a.entropy, reference.entropy, "{what}: entropy, chunks of {chunk}");
            assert_eq!(to_bits(&a.dx), to_bits(&reference.dx), "{what}: dx, chunks of {chunk}");
            for (i, (g, r)) in a.dw.iter().zip(&reference.dw).enumerate() {
                assert!((g - r).abs() <= 1e-5 * scale, "{what}: dW[{i}], chunks of {chunk}: {g} vs unchunked {r}");
            }
            let b = run(&x, &w, dims, targets, &temps, kept, &probe, Some(chunk));
            assert_eq!(to_bits(&a.dw), to_bits(&b.dw), "{what}: dW run to run, chunks of {chunk}");
        }
        if kept.is_some() {
            // the truncation is real: some rows renormalise, some targets fall outside
            let neg_big = shared_kernels::ops::reduce::NEG_BIG.to_bits();
            assert!(reference.logprobs.iter().any(|&b| b == neg_big), "no target outside its kept set");
            assert!(reference.logprobs.iter().step_by(2).all(|&b| b != neg_big), "an argmax target outside its kept set");
        }
    }
}
