//! Agreement with f64 host references, within stated tolerances (lavapipe's exp/ln are up to
//! ~17 ulp from libm, and nothing here is bit-compared to the host).

use burn::tensor::{DType, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shared_kernels::testing::rows::{float_tensor, host, host_int, int_tensor, random_vec};
use shared_kernels::ops::logits::sampling::token_uniform;
use shared_kernels::{reference, RopeTables, SamplingRow, WeightLayout};

fn assert_close(what: &str, got: &[f32], want: &[f64], abs: f64, rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(err <= abs + rel * w.abs(), "{what}[{i}]: got {g}, want {w} (|err| {err:.3e})");
    }
}

#[test]
fn matmul_matches_f64_in_both_layouts() {
    let (device, mut rng) = (crate::device(), StdRng::seed_from_u64(crate::seed()));
    let (m, k, n) = (37, 130, 45);
    let x = random_vec(&mut rng, m * k, 1.0);
    let w = random_vec(&mut rng, k * n, 1.0);
    for (layout, shape, out_in) in [(WeightLayout::OutIn, [n, k], true), (WeightLayout::InOut, [k, n], false)] {
        let y = shared_kernels::matmul(float_tensor(x.clone(), [m, k], DType::F32, &device), float_tensor(w.clone(), shape, DType::F32, &device), layout).unwrap();
        // f32 accumulation over K=130 terms of magnitude <= 1: 1e-5 absolute is ~100 ulp headroom
        assert_close("matmul", &host(y), &reference::matmul(&x, &w, m, k, n, out_in), 2e-5, 1e-6);
    }
}

#[test]
fn weight_gradient_matmul_of_a_transposed_x_matches_f64() {
    // xtᵀ @ W with xt stored [K, M], as the backward calls it (on CUDA's tensor cores xᵀ is read
    // in place, bit-compared with the copy by the GPU battery; here it takes the copy)
    let (device, mut rng) = (crate::device(), StdRng::seed_from_u64(crate::seed()));
    let (m, k, n) = (24, 40, 33);
    let xt = random_vec(&mut rng, k * m, 1.0);
    let x: Vec<f32> = (0..m * k).map(|i| xt[(i % k) * m + i / k]).collect();
    let w = random_vec(&mut rng, k * n, 1.0);
    for (layout, shape, out_in) in [(WeightLayout::OutIn, [n, k], true), (WeightLayout::InOut, [k, n], false)] {
        let y = shared_kernels::ops::matmul::matmul_transposed_x_with(None, float_tensor(xt.clone(), [k, m], DType::F32, &device), float_tensor(w.clone(), shape, DType::F32, &device), layout).unwrap();
        assert_eq!(y.dims(), [m, n], "{layout:?}");
        assert_close("matmul of a transposed x", &host(y), &reference::matmul(&x, &w, m, k, n, out_in), 2e-5, 1e-6);
    }
}

#[test]
fn rmsnorm_swiglu_rope_match_f64() {
    let (device, mut rng) = (crate::device(), StdRng::seed_from_u64(crate::seed()));
    let (rows, hidden) = (19, 200);
    let x = random_vec(&mut rng, rows * hidden, 3.0);
    let w = random_vec(&mut rng, hidden, 1.0);
    let y = shared_kernels::rmsnorm(float_tensor(x.clone(), [rows, hidden], DType::F32, &device), float_tensor(w.clone(), [hidden], DType::F32, &device), 1e-6).unwrap();
    assert_close("rmsnorm", &host(y), &reference::rmsnorm(&x, &w, hidden, 1e-6), 1e-5, 1e-5);

    let up = random_vec(&mut rng, rows * hidden, 3.0);
    let y = shared_kernels::swiglu(float_tensor(x.clone(), [rows, hidden], DType::F32, &device), float_tensor(up.clone(), [rows, hidden], DType::F32, &device)).unwrap();
    assert_close("swiglu", &host(y), &reference::swiglu(&x, &up), 1e-5, 1e-5);

    let (heads, head_dim, max_pos, theta) = (3, 16, 300, 10_000.0);
    let tables = RopeTables::new(head_dim, max_pos, theta, &device).unwrap();
    let q = random_vec(&mut rng, rows * heads * head_dim, 1.0);
    let pos: Vec<usize> = (0..rows).map(|_| rng.random_range(0..max_pos)).collect();
    let y = shared_kernels::rope(float_tensor(q.clone(), [rows, heads, head_dim], DType::F32, &device), int_tensor(pos.iter().map(|&p| p as i32).collect(), &device), &tables).unwrap();
    // tables are f64 rounded to f32: a few ulp of the angle's cos/sin
    assert_close("rope", &host(y), &reference::rope(&q, &pos, heads, head_dim, theta), 1e-6, 1e-5);
}

#[test]
fn attention_matches_f64() {
    let (device, mut rng) = (crate::device(), StdRng::seed_from_u64(crate::seed()));
    let (rows, qh, kvh, d, max_len) = (5, 4, 2, 32, 140);
    let kc = random_vec(&mut rng, rows * max_len * kvh * d, 1.0);
    let vc = random_vec(&mut rng, rows * max_len * kvh * d, 1.0);
    let q = random_vec(&mut rng, rows * qh * d, 1.0);
    let pos: Vec<usize> = vec![0, 63, 64, 139, rng.random_range(1..139)];
    let scale = 1.0 / (d as f64).sqrt();
    let slice = |c: &Vec<f32>, r: usize, p: usize| c[r * max_len * kvh * d..(r * max_len + p + 1) * kvh * d].to_vec();
    let keys: Vec<Vec<f32>> = (0..rows).map(|r| slice(&kc, r, pos[r])).collect();
    let values: Vec<Vec<f32>> = (0..rows).map(|r| slice(&vc, r, pos[r])).collect();
    let want = reference::attention(&q, &keys, &values, qh, kvh, d, scale);
    use shared_kernels::ops::attention::{attention_with, AttentionKernel};
    for kernel in [AttentionKernel::Sequential, AttentionKernel::SplitKv] {
        let y = attention_with(
            Some(kernel),
            float_tensor(q.clone(), [rows, qh, d], DType::F32, &device),
            float_tensor(kc.clone(), [rows, max_len, kvh, d], DType::F32, &device),
            float_tensor(vc.clone(), [rows, max_len, kvh, d], DType::F32, &device),
            int_tensor((0..rows as i32).collect(), &device),
            int_tensor(pos.iter().map(|&p| p as i32).collect(), &device),
            scale as f32,
        )
        .unwrap();
        assert_close(&format!("attention {kernel:?}"), &host(y), &want, 2e-5, 2e-5);
    }
}

#[test]
fn logprob_and_entropy_match_f64() {
    let (device, mut rng) = (crate::device(), StdRng::seed_from_u64(crate::seed()));
    // 9001 = four 2048-logit chunks and a partial fifth: the chunked max/sum must still be the
    // row's softmax
    let (rows, vocab) = (9, 9001);
    let logits = random_vec(&mut rng, rows * vocab, 8.0);
    let targets: Vec<i32> = (0..rows).map(|_| rng.random_range(0..vocab as i32)).collect();
    let temps: Vec<f32> = (0..rows).map(|i| [1.0, 0.5, 2.0][i % 3]).collect();
    let out = shared_kernels::token_logprobs(
        float_tensor(logits.clone(), [rows, vocab], DType::F32, &device),
        int_tensor(targets.clone(), &device),
        Tensor::<1>::from_data(TensorData::new(temps.clone(), [rows]), &device),
    )
    .unwrap();
    let (lp, ent) = (host(out.logprobs), host(out.entropy));
    for r in 0..rows {
        let (want_lp, want_ent) = reference::logprob_entropy(&logits[r * vocab..(r + 1) * vocab], targets[r] as usize, temps[r]);
        assert_close("logprob", &lp[r..r + 1], &[want_lp], 2e-5, 2e-6);
        assert_close("entropy", &ent[r..r + 1], &[want_ent], 2e-5, 2e-6);
    }
}

#[test]
fn sampling_respects_top_k_top_p_matches_gumbel_reference_and_returns_the_logprob_definition() {
    let (device, mut rng) = (crate::device(), StdRng::seed_from_u64(crate::seed()));
    let (rows, vocab) = (64, 4500);
    let logits = random_vec(&mut rng, rows * vocab, 5.0);
    let params: Vec<SamplingRow> = (0..rows)
        .map(|i| SamplingRow {
            temperature: [1.0, 0.7, 0.0, 1.5][i % 4],
            top_k: [0, 10, 0, 3][i % 4],
            top_p: [1.0, 0.8, 1.0, 0.6][(i / 4) % 4],
            rng_key: shared_kernels::row_rng_key(rng.random(), i as u64, rng.random()),
            processed: false,
        })
        .collect();
    let (tokens, lps) = shared_kernels::sample(float_tensor(logits.clone(), [rows, vocab], DType::F32, &device), &params).unwrap();
    let (tokens, lps) = (host_int(tokens), host(lps));
    for r in 0..rows {
        let row = &logits[r * vocab..(r + 1) * vocab];
        let p = params[r];
        let tok = tokens[r] as usize;
        let allowed = reference::allowed_tokens(row, p.temperature, p.top_k, p.top_p);
        assert!(allowed[tok], "row {r}: token {tok} outside the top-k/top-p set ({p:?})");
        // the f64 Gumbel-max over the same noise picks the same token unless two scores tie
        // within float error
        let inv = if p.temperature > 0.0 { 1.0 / p.temperature as f64 } else { 1.0 };
        let scores: Vec<(f64, usize)> = (0..vocab)
            .filter(|&j| allowed[j])
            .map(|j| {
                let z = row[j] as f64 * inv;
                let g = if p.temperature > 0.0 { -(-(token_uniform(p.rng_key, j as u32) as f64).ln()).ln() } else { 0.0 };
                (z + g, j)
            })
            .collect();
        let best = scores.iter().cloned().fold((f64::NEG_INFINITY, 0), |a, b| if b.0 > a.0 { b } else { a });
        let runner_up = scores.iter().filter(|s| s.1 != best.1).map(|s| s.0).fold(f64::NEG_INFINITY, f64::max);
        if best.0 - runner_up > 1e-4 {
            assert_eq!(tok, best.1, "row {r}: kernel chose {tok}, f64 Gumbel-max chose {}", best.1);
        }
        let (want_lp, _) = reference::logprob_entropy(row, tok, p.temperature);
        assert_close("sampled logprob", &lps[r..r + 1], &[want_lp], 2e-5, 2e-6);
    }
}

#[test]
fn sampled_logprob_bits_equal_the_trainer_logprob_bits() {
    let (device, mut rng) = (crate::device(), StdRng::seed_from_u64(crate::seed()));
    // three vocabulary chunks, the last partial; one batch with truncating rows (the top-k/top-p
    // pass runs) and one without (it is skipped): rows that do not truncate draw the same token
    // with the same logprob bits in both, and every logprob equals the trainer's
    let (rows, vocab) = (33, 4999);
    let logits = random_vec(&mut rng, rows * vocab, 6.0);
    let mixed: Vec<SamplingRow> = (0..rows)
        .map(|i| SamplingRow { temperature: [1.0, 0.6, 0.0][i % 3], top_k: [0, 20, 0][i % 3], top_p: [0.95, 1.0, 1.0][i % 3], rng_key: rng.random(), processed: false })
        .collect();
    let plain: Vec<SamplingRow> = mixed.iter().map(|p| SamplingRow { top_k: 0, top_p: 1.0, ..*p }).collect();
    let lt = float_tensor(logits.clone(), [rows, vocab], DType::F32, &device);
    let mut drawn = Vec::new();
    for params in [&mixed, &plain] {
        let (tokens, lps) = shared_kernels::sample(lt.clone(), params).unwrap();
        let temps = Tensor::<1>::from_data(TensorData::new(params.iter().map(|p| p.temperature).collect::<Vec<_>>(), [rows]), &device);
        let trainer = shared_kernels::token_logprobs(lt.clone(), tokens.clone(), temps).unwrap();
        let (a, b) = (host(lps), host(trainer.logprobs));
        for r in 0..rows {
            assert_eq!(a[r].to_bits(), b[r].to_bits(), "row {r}: sampler {} vs trainer {}", a[r], b[r]);
        }
        drawn.push((host_int(tokens), a));
    }
    let ((tok_mixed, lp_mixed), (tok_plain, lp_plain)) = (&drawn[0], &drawn[1]);
    for r in (0..rows).filter(|r| mixed[*r] == plain[*r]) {
        assert_eq!(tok_mixed[r], tok_plain[r], "row {r}: token changed with the other rows' truncation");
        assert_eq!(lp_mixed[r].to_bits(), lp_plain[r].to_bits(), "row {r}: logprob changed with the other rows' truncation");
    }
}

#[test]
fn sampling_frequencies_follow_the_softmax() {
    // 4000 independent draws (one row each, distinct positions) from one small distribution
    let device = crate::device();
    let vocab = 6;
    let row: Vec<f32> = vec![0.3, -1.0, 1.2, 0.0, 2.0, -0.5];
    let rows = 4000;
    let logits: Vec<f32> = (0..rows).flat_map(|_| row.clone()).collect();
    let seed: u64 = StdRng::seed_from_u64(crate::seed()).random();
    let params: Vec<SamplingRow> = (0..rows).map(|i| SamplingRow { temperature: 1.0, top_k: 0, top_p: 1.0, rng_key: shared_kernels::row_rng_key(seed, 1, i as u32), processed: false }).collect();
    let (tokens, _) = shared_kernels::sample(float_tensor(logits, [rows, vocab], DType::F32, &device), &params).unwrap();
    let mut counts = vec![0usize; vocab];
    for t in host_int(tokens) {
        counts[t as usize] += 1;
    }
    let max = 2.0f64;
    let z: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    for (j, &c) in counts.iter().enumerate() {
        let p = (row[j] as f64 - max).exp() / z;
        let sd = (rows as f64 * p * (1.0 - p)).sqrt();
        assert!((c as f64 - rows as f64 * p).abs() < 5.0 * sd + 1.0, "token {j}: {c} draws, expected {:.0} ± {:.0}", rows as f64 * p, sd);
    }
}

#[test]
fn sum_all_adds_in_its_fixed_order_and_matches_f64() {
    let (device, mut rng) = (crate::device(), StdRng::seed_from_u64(crate::seed()));
    // one element, one partial cube, one full cube, just over, and a two-pass size
    for n in [1usize, 127, 4096, 4097, 4096 * 130 + 17] {
        let x = random_vec(&mut rng, n, 2.0);
        let got = host(shared_kernels::sum_all(float_tensor(x.clone(), [n], DType::F32, &device)).unwrap());
        assert_eq!(got.len(), 1, "n={n}: one element out");
        let want_bits = shared_kernels::ops::reduce::sum_all_host_order(&x);
        assert_eq!(got[0].to_bits(), want_bits.to_bits(), "n={n}: got {} want {} (the documented order)", got[0], want_bits);
        let exact: f64 = x.iter().map(|&v| v as f64).sum();
        let scale: f64 = x.iter().map(|&v| (v as f64).abs()).sum();
        assert!((got[0] as f64 - exact).abs() <= 1e-6 * scale + 1e-30, "n={n}: got {} want {exact}", got[0]);
    }
    // rank-2 input sums all elements, the same bits as its flat view
    let x = random_vec(&mut rng, 33 * 70, 1.0);
    let a = host(shared_kernels::sum_all(float_tensor(x.clone(), [33, 70], DType::F32, &device)).unwrap());
    let b = host(shared_kernels::sum_all(float_tensor(x, [33 * 70], DType::F32, &device)).unwrap());
    assert_eq!(a[0].to_bits(), b[0].to_bits());
}

#[test]
fn row_sums_match_f64_and_repeat_bit_for_bit() {
    // rows shorter than the cube, inside the 4-loads loop, and with a tail after it
    let (device, mut rng) = (crate::device(), StdRng::seed_from_u64(crate::seed() ^ 0x20b5));
    for (rows, cols) in [(3usize, 50usize), (7, 1000), (2, 128 * 4 * 3 + 129)] {
        let x = random_vec(&mut rng, rows * cols, 2.0);
        let t = float_tensor(x.clone(), [rows, cols], DType::F32, &device);
        let got = host(shared_kernels::ops::reduce::row_sums(t.clone()).unwrap());
        let want: Vec<f64> = x.chunks(cols).map(|r| r.iter().map(|&v| v as f64).sum()).collect();
        assert_close(&format!("row_sums {rows}x{cols}"), &got, &want, 1e-4, 1e-5);
        let again = host(shared_kernels::ops::reduce::row_sums(t).unwrap());
        assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), again.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "row_sums {rows}x{cols} rerun");
    }
}

#[test]
fn hbm_read_reads_every_element_exactly_once() {
    // the bandwidth probe's number is bytes / time: it must touch each element once, main loop
    // (4 loads in flight) and tail alike; small integers keep every f32 sum exact
    let (device, mut rng) = (crate::device(), StdRng::seed_from_u64(crate::seed()));
    let (rows, cols) = (301, 64);
    let values: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(1..8) as f32).collect();
    let x = float_tensor(values.clone(), [rows, cols], DType::F32, &device);
    let (sums, bytes) = shared_kernels::ops::probes::hbm_read::hbm_read(&x, 2).unwrap();
    assert_eq!(bytes, (rows * cols * 4) as f64);
    let total: f64 = host(sums).iter().map(|&v| v as f64).sum();
    assert_eq!(total, values.iter().map(|&v| v as f64).sum::<f64>());
}

#[test]
fn processed_logprobs_are_the_kept_sets_renormalised_softmax_and_equal_the_trainers_bits() {
    let (device, mut rng) = (crate::device(), StdRng::seed_from_u64(crate::seed()));
    // three vocabulary chunks, the last partial: with top-k 3 most chunks keep no token at all
    let (rows, vocab) = (48, 4999);
    let logits = random_vec(&mut rng, rows * vocab, 5.0);
    let params: Vec<SamplingRow> = (0..rows)
        .map(|i| SamplingRow {
            temperature: [1.0, 0.7, 0.0, 1.3][i % 4],
            top_k: [0, 10, 0, 3][(i / 4) % 4],
            top_p: [0.8, 1.0, 0.9, 0.6][(i / 2) % 4],
            rng_key: rng.random(),
            // processed and raw rows share the batch
            processed: i % 3 != 0,
        })
        .collect();
    let lt = float_tensor(logits.clone(), [rows, vocab], DType::F32, &device);
    let (tokens, lps) = shared_kernels::sample(lt.clone(), &params).unwrap();
    // the trainer's side: a truncation for the processed rows, none (top-k 0, top-p 1) for the raw
    let trainer_row = |p: &SamplingRow| if p.processed { (p.top_k, p.top_p) } else { (0, 1.0) };
    let truncation = shared_kernels::Truncation {
        top_k: burn::tensor::Tensor::<1, burn::tensor::Int>::from_data(TensorData::new(params.iter().map(|p| trainer_row(p).0 as i64).collect::<Vec<_>>(), [rows]), &device),
        top_p: Tensor::<1>::from_data(TensorData::new(params.iter().map(|p| trainer_row(p).1).collect::<Vec<_>>(), [rows]), &device),
    };
    let temps = Tensor::<1>::from_data(TensorData::new(params.iter().map(|p| p.temperature).collect::<Vec<_>>(), [rows]), &device);
    let trainer = shared_kernels::truncated_token_logprobs(lt.clone(), tokens.clone(), temps.clone(), Some(&truncation)).unwrap();
    let (tokens, lps, trainer_lps, entropy) = (host_int(tokens), host(lps), host(trainer.logprobs), host(trainer.entropy));
    let mut truncated_rows = 0;
    for r in 0..rows {
        assert_eq!(lps[r].to_bits(), trainer_lps[r].to_bits(), "row {r}: sampler {} vs trainer {} ({:?})", lps[r], trainer_lps[r], params[r]);
        let (row, p, tok) = (&logits[r * vocab..(r + 1) * vocab], params[r], tokens[r] as usize);
        let (raw_lp, raw_entropy) = reference::logprob_entropy(row, tok, p.temperature);
        if !(p.processed && p.temperature > 0.0 && (p.top_k > 0 || p.top_p < 1.0)) {
            assert_close("raw logprob", &lps[r..r + 1], &[raw_lp], 2e-5, 2e-6);
            assert_close("raw entropy", &entropy[r..r + 1], &[raw_entropy], 5e-5, 5e-6);
            continue;
        }
        truncated_rows += 1;
        // f64: the kept set's log-softmax at the temperature
        let kept = reference::allowed_tokens(row, p.temperature, p.top_k, p.top_p);
        let z: Vec<f64> = row.iter().map(|&v| v as f64 / p.temperature as f64).collect();
        let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + (0..vocab).filter(|&j| kept[j]).map(|j| (z[j] - max).exp()).sum::<f64>().ln();
        let entropy_kept = -(0..vocab).filter(|&j| kept[j]).map(|j| (z[j] - lse).exp() * (z[j] - lse)).sum::<f64>();
        assert!(kept[tok], "row {r}: token {tok} outside the kept set");
        assert_close("processed logprob", &lps[r..r + 1], &[z[tok] - lse], 2e-5, 2e-6);
        assert_close("processed entropy", &entropy[r..r + 1], &[entropy_kept], 5e-5, 5e-6);
        assert!(lps[r] as f64 > raw_lp, "row {r}: renormalising over the kept set must raise the logprob ({} vs raw {raw_lp})", lps[r]);
    }
    assert!(truncated_rows >= rows / 3, "only {truncated_rows} processed rows truncate");

    // a target outside its row's kept set has probability 0: logprob NEG_BIG
    let outside: Vec<i32> = (0..rows)
        .map(|r| {
            let p = params[r];
            let (k, top_p) = trainer_row(&p);
            let row = &logits[r * vocab..(r + 1) * vocab];
            let kept = reference::allowed_tokens(row, p.temperature, k, top_p);
            // the smallest logit outside the set: far from its boundary
            let far = (0..vocab).filter(|&j| !kept[j]).min_by(|&a, &b| row[a].total_cmp(&row[b]));
            if p.temperature > 0.0 { far.unwrap_or(0) as i32 } else { 0 }
        })
        .collect();
    let out = shared_kernels::truncated_token_logprobs(lt, int_tensor(outside.clone(), &device), temps, Some(&truncation)).unwrap();
    for (r, lp) in host(out.logprobs).into_iter().enumerate() {
        let (k, top_p) = trainer_row(&params[r]);
        if params[r].temperature > 0.0 && (k > 0 || top_p < 1.0) {
            assert_eq!(lp, shared_kernels::ops::reduce::NEG_BIG, "row {r}: token {} is outside the kept set", outside[r]);
        }
    }
}
