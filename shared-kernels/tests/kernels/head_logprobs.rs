//! The LM head fused with the logprob, in chunks of rows: logprobs, entropies and the input
//! gradient equal the unchunked `token_logprobs(matmul(x, W))` as bits for every chunking; the
//! head's weight gradient equals it as bits with one chunk and is the fixed-order f32 sum of
//! the chunks' gradients otherwise (close to the unchunked one, identical run to run).

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

/// Runs `chunk_rows` (None: the unchunked ops) on fresh leaves; backprops sum(logprob * probe).
fn run(x: &[f32], w: &[f32], (rows, hidden, vocab): (usize, usize, usize), targets: &[i32], temps: &[f32], probe: &[f32], chunk_rows: Option<usize>) -> Outputs {
    let device = crate::device().autodiff();
    let xl = Tensor::<2>::from_data(TensorData::new(x.to_vec(), [rows, hidden]), &device).require_grad();
    let wl = Tensor::<2>::from_data(TensorData::new(w.to_vec(), [vocab, hidden]), &device).require_grad();
    let tg = Tensor::<1, Int>::from_data(TensorData::new(targets.to_vec(), [rows]), &device);
    let tt = Tensor::<1>::from_data(TensorData::new(temps.to_vec(), [rows]), &device);
    let out = match chunk_rows {
        None => shared_kernels::token_logprobs(shared_kernels::matmul(xl.clone(), wl.clone(), WeightLayout::OutIn).unwrap(), tg, tt).unwrap(),
        Some(c) => shared_kernels::head_logprobs_chunked(xl.clone(), wl.clone(), tg, tt, c).unwrap(),
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
    let targets: Vec<i32> = random_vec(&mut rng, rows, 1.0).iter().map(|v| ((v.abs() * 7919.0) as usize % vocab) as i32).collect();
    let temps: Vec<f32> = (0..rows).map(|r| [1.0f32, 0.7, 0.0, 1.3][r % 4]).collect();
    let probe = random_vec(&mut rng, rows, 1.0);
    let dims = (rows, hidden, vocab);
    let reference = run(&x, &w, dims, &targets, &temps, &probe, None);
    let one_chunk = run(&x, &w, dims, &targets, &temps, &probe, Some(rows));
    assert_eq!(one_chunk.logprobs, reference.logprobs, "logprobs, one chunk");
    assert_eq!(one_chunk.entropy, reference.entropy, "entropy, one chunk");
    assert_eq!(to_bits(&one_chunk.dx), to_bits(&reference.dx), "dx, one chunk");
    assert_eq!(to_bits(&one_chunk.dw), to_bits(&reference.dw), "dW, one chunk");
    let scale = reference.dw.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    for chunk in [1, 5, 16, 36] {
        let a = run(&x, &w, dims, &targets, &temps, &probe, Some(chunk));
        assert_eq!(a.logprobs, reference.logprobs, "logprobs, chunks of {chunk}");
        assert_eq!(a.entropy, reference.entropy, "entropy, chunks of {chunk}");
        assert_eq!(to_bits(&a.dx), to_bits(&reference.dx), "dx, chunks of {chunk}");
        for (i, (g, r)) in a.dw.iter().zip(&reference.dw).enumerate() {
            assert!((g - r).abs() <= 1e-5 * scale, "dW[{i}], chunks of {chunk}: {g} vs unchunked {r}");
        }
        let b = run(&x, &w, dims, &targets, &temps, &probe, Some(chunk));
        assert_eq!(to_bits(&a.dw), to_bits(&b.dw), "dW run to run, chunks of {chunk}");
    }
}
