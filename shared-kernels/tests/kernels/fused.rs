//! The decode path's fused launches give the unfused ops' bits: add + rmsnorm, swiglu on the
//! fused gate/up output, and q/k-norm + RoPE + KV-cache writes from the fused q/k/v projection.
//! The training path's fused backward kernels give the bits of the op chains that define them.
//! Also bad shapes are errors that name the problem.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shared_kernels::{add, add_rmsnorm, attention_inputs, attention_inputs_with_planes, fixed_plane_size, rmsnorm, rope, swiglu, swiglu_halves, write_kv_cache, QkNorm, RopeTables};

fn bits<const D: usize>(t: Tensor<D>) -> Vec<u32> {
    t.cast(DType::F32).into_data().convert::<f32>().try_to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

fn random<const D: usize>(rng: &mut StdRng, shape: [usize; D], scale: f32, device: &Device) -> Tensor<D> {
    let n = shape.iter().product();
    Tensor::<D>::from_data(TensorData::new((0..n).map(|_| rng.random_range(-scale..scale)).collect::<Vec<f32>>(), shape), device)
}

fn ints(v: Vec<i32>, device: &Device) -> Tensor<1, Int> {
    let n = v.len();
    Tensor::<1, Int>::from_data(TensorData::new(v, [n]), device)
}

#[test]
fn add_rmsnorm_and_swiglu_halves_equal_the_unfused_ops_as_bits() {
    let device = crate::device();
    let mut rng = StdRng::seed_from_u64(crate::seed());
    for (rows, hidden) in [(1usize, 64usize), (5, 200), (33, 130)] {
        let (a, b) = (random(&mut rng, [rows, hidden], 2.0, &device), random(&mut rng, [rows, hidden], 2.0, &device));
        let w = random(&mut rng, [hidden], 1.5, &device);
        let (sum, normed) = add_rmsnorm(a.clone(), b.clone(), w.clone(), 1e-6).unwrap();
        let want_sum = add(a, b).unwrap();
        let want = rmsnorm(want_sum.clone(), w, 1e-6).unwrap();
        assert_eq!(bits(sum), bits(want_sum), "sum {rows}x{hidden}");
        assert_eq!(bits(normed), bits(want), "rmsnorm {rows}x{hidden}");

        let gate_up = random(&mut rng, [rows, 2 * hidden], 4.0, &device);
        let (gate, up) = (gate_up.clone().slice([0..rows, 0..hidden]), gate_up.clone().slice([0..rows, hidden..2 * hidden]));
        assert_eq!(bits(swiglu_halves(gate_up).unwrap()), bits(swiglu(gate, up).unwrap()), "swiglu {rows}x{hidden}");
    }
}

/// The pointwise kernels load vectors of up to 16 bytes but compute lane by lane: the same
/// values give the same bits at vector width 4 (a length divisible by 4) and 1 (an odd length,
/// the same values plus one more).
#[test]
fn pointwise_bits_do_not_depend_on_the_vector_width() {
    let device = crate::device();
    let mut rng = StdRng::seed_from_u64(crate::seed() ^ 0x5eed);
    let n = 4 * 301;
    let (a, b) = (random(&mut rng, [n + 1], 4.0, &device), random(&mut rng, [n + 1], 4.0, &device));
    let head = |t: &Tensor<1>| t.clone().slice([0..n]).reshape([n / 4, 4]);
    let wide = bits(swiglu(head(&a), head(&b)).unwrap());
    let narrow = bits(swiglu(a.clone(), b.clone()).unwrap());
    assert_eq!(wide[..], narrow[..n], "swiglu");
    let wide = bits(add(head(&a), head(&b)).unwrap());
    let narrow = bits(add(a, b).unwrap());
    assert_eq!(wide[..], narrow[..n], "add");
}

#[test]
fn attention_inputs_equal_norm_rope_and_cache_writes_as_bits() {
    let device = crate::device();
    let mut rng = StdRng::seed_from_u64(crate::seed() ^ 0xa77);
    let (slots, max_len, max_positions) = (6usize, 40usize, 64usize);
    for (q_heads, kv_heads, head_dim, qk_norm) in [(4usize, 2usize, 16usize, true), (3, 1, 32, false), (2, 2, 8, true), (2, 1, 128, true), (3, 1, 128, false)] {
        let tables = RopeTables::new(head_dim, max_positions, 10000.0, &device).unwrap();
        let width = (q_heads + 2 * kv_heads) * head_dim;
        let norms = QkNorm { q: random(&mut rng, [head_dim], 1.5, &device), k: random(&mut rng, [head_dim], 1.5, &device), eps: 1e-6 };
        for rows in [1usize, 5] {
            let qkv = random(&mut rng, [rows, width], 3.0, &device);
            // distinct (slot, position) per row, random; caches start from random contents
            let mut taken = std::collections::HashSet::new();
            let (mut s, mut p) = (Vec::new(), Vec::new());
            while s.len() < rows {
                let (a, b) = (rng.random_range(0..slots as i32), rng.random_range(0..max_len as i32));
                if taken.insert((a, b)) {
                    s.push(a);
                    p.push(b);
                }
            }
            let k0 = random(&mut rng, [slots, max_len, kv_heads, head_dim], 1.0, &device);
            let v0 = random(&mut rng, [slots, max_len, kv_heads, head_dim], 1.0, &device);
            let (st, pt) = (ints(s, &device), ints(p, &device));

            let (q, k_cache, v_cache) = attention_inputs(qkv.clone(), q_heads, qk_norm.then_some(&norms), st.clone(), pt.clone(), &tables, k0.clone(), v0.clone(), None).unwrap();

            let split = |from: usize, heads: usize| qkv.clone().slice([0..rows, from * head_dim..(from + heads) * head_dim]).reshape([rows, heads, head_dim]);
            let (mut wq, mut wk, wv) = (split(0, q_heads), split(q_heads, kv_heads), split(q_heads + kv_heads, kv_heads));
            if qk_norm {
                wq = rmsnorm(wq, norms.q.clone(), norms.eps).unwrap();
                wk = rmsnorm(wk, norms.k.clone(), norms.eps).unwrap();
            }
            let wq = rope(wq, pt.clone(), &tables).unwrap();
            let wk = rope(wk, pt.clone(), &tables).unwrap();
            let want_k = write_kv_cache(k0, wk, st.clone(), pt.clone()).unwrap();
            let want_v = write_kv_cache(v0, wv, st, pt).unwrap();
            let what = format!("{q_heads}/{kv_heads} heads x {head_dim}, qk_norm {qk_norm}, {rows} rows");
            assert_eq!(bits(q), bits(wq), "queries, {what}");
            assert_eq!(bits(k_cache), bits(want_k), "key cache, {what}");
            assert_eq!(bits(v_cache), bits(want_v), "value cache, {what}");
        }
    }
}

/// The plane kernel (what CUDA runs for heads of 128) at this device's own plane size: its tree
/// of shuffles and in-unit adds gives the cube kernel's bits, and so the unfused ops'.
#[test]
fn attention_inputs_on_planes_equal_norm_rope_and_cache_writes_as_bits() {
    let device = crate::device();
    let Some(plane) = fixed_plane_size(&device).filter(|&p| p.is_power_of_two() && (2..128).contains(&p)) else {
        eprintln!("skipped: this device's planes have no fixed size below 128 ({:?})", fixed_plane_size(&device));
        return;
    };
    let mut rng = StdRng::seed_from_u64(crate::seed() ^ 0x91a);
    let (slots, max_len, head_dim) = (5usize, 24usize, 128usize);
    let tables = RopeTables::new(head_dim, 64, 10000.0, &device).unwrap();
    for (q_heads, kv_heads, qk_norm) in [(2usize, 1usize, true), (3, 1, false)] {
        let norms = QkNorm { q: random(&mut rng, [head_dim], 1.5, &device), k: random(&mut rng, [head_dim], 1.5, &device), eps: 1e-6 };
        for rows in [1usize, 4] {
            let qkv = random(&mut rng, [rows, (q_heads + 2 * kv_heads) * head_dim], 3.0, &device);
            let (s, p): (Vec<i32>, Vec<i32>) = (0..rows as i32).map(|r| (r, rng.random_range(0..max_len as i32))).unzip();
            let k0 = random(&mut rng, [slots, max_len, kv_heads, head_dim], 1.0, &device);
            let v0 = random(&mut rng, [slots, max_len, kv_heads, head_dim], 1.0, &device);
            let (st, pt) = (ints(s, &device), ints(p, &device));
            let run = |plane: Option<usize>| {
                let (q, k, v) = attention_inputs_with_planes(plane, qkv.clone(), q_heads, qk_norm.then_some(&norms), st.clone(), pt.clone(), &tables, k0.clone(), v0.clone(), None).unwrap();
                (bits(q), bits(k), bits(v))
            };
            let what = format!("planes of {plane}, {q_heads}/{kv_heads} heads x {head_dim}, qk_norm {qk_norm}, {rows} rows");
            let (want, got) = (run(None), run(Some(plane)));
            assert_eq!(got.0, want.0, "queries, {what}");
            assert_eq!(got.1, want.1, "key cache, {what}");
            assert_eq!(got.2, want.2, "value cache, {what}");
        }
    }
}

#[test]
fn fused_launchers_reject_bad_shapes_by_name() {
    let device = crate::device();
    let mut rng = StdRng::seed_from_u64(crate::seed() ^ 0xbad);
    let tables = RopeTables::new(8, 16, 10000.0, &device).unwrap();
    let cache = || Tensor::<4>::zeros([2, 8, 1, 8], &device);
    // 2 query heads + 2 x 1 kv heads of 8 = 32 columns; give 30
    let err = attention_inputs(random(&mut rng, [1, 30], 1.0, &device), 2, None, ints(vec![0], &device), ints(vec![0], &device), &tables, cache(), cache(), None).unwrap_err().to_string();
    assert!(err.contains("attention_inputs") && err.contains("qkv"), "{err}");
    // a plane the plane kernel cannot run (heads of 8 values, planes of 3 units) is named
    let err = attention_inputs_with_planes(Some(3), random(&mut rng, [1, 32], 1.0, &device), 2, None, ints(vec![0], &device), ints(vec![0], &device), &tables, cache(), cache(), None).unwrap_err().to_string();
    assert!(err.contains("attention_inputs") && err.contains("planes of 3"), "{err}");
    let err = swiglu_halves(random(&mut rng, [2, 7], 1.0, &device)).unwrap_err().to_string();
    assert!(err.contains("swiglu_halves") && err.contains("even"), "{err}");
    let err = add_rmsnorm(random(&mut rng, [2, 8], 1.0, &device), random(&mut rng, [2, 8], 1.0, &device), random(&mut rng, [7], 1.0, &device), 1e-6).unwrap_err().to_string();
    assert!(err.contains("add_rmsnorm") && err.contains("weight"), "{err}");
    // the training path's one-launch backwards
    use shared_kernels::ops::{rmsnorm_backward::rmsnorm_backward, rope::rope_backward, swiglu_backward::swiglu_backward};
    let err = swiglu_backward(random(&mut rng, [2, 8], 1.0, &device), random(&mut rng, [2, 8], 1.0, &device), random(&mut rng, [2, 7], 1.0, &device)).unwrap_err().to_string();
    assert!(err.contains("swiglu_backward") && err.contains("dy [2, 7]"), "{err}");
    let err = rmsnorm_backward(random(&mut rng, [2, 8], 1.0, &device), random(&mut rng, [7], 1.0, &device), random(&mut rng, [2, 8], 1.0, &device), 1e-6).unwrap_err().to_string();
    assert!(err.contains("rmsnorm_backward") && err.contains("weight"), "{err}");
    let err = rope_backward(random(&mut rng, [2, 1, 8], 1.0, &device), ints(vec![0], &device), &tables).unwrap_err().to_string();
    assert!(err.contains("rope") && err.contains("positions"), "{err}");
    // the plane kernels: rows of 128 only, and only this device's own plane size (another would
    // shuffle across planes)
    use shared_kernels::ops::{rmsnorm::rmsnorm_with_planes, rmsnorm_backward::rmsnorm_backward_on_planes};
    let rows = |width: usize, rng: &mut StdRng| random(rng, [3, width], 1.0, &device);
    let err = rmsnorm_backward_on_planes(8, rows(64, &mut rng), random(&mut rng, [64], 1.0, &device), rows(64, &mut rng), 1e-6).unwrap_err().to_string();
    assert!(err.contains("rmsnorm_backward") && err.contains("rows of 64"), "{err}");
    let other = if fixed_plane_size(&device) == Some(16) { 32 } else { 16 };
    let err = rmsnorm_with_planes(Some(other), rows(128, &mut rng), random(&mut rng, [128], 1.0, &device), 1e-6).unwrap_err().to_string();
    assert!(err.contains("rmsnorm") && err.contains(&format!("planes of {other} lanes")) && err.contains("this device's planes"), "{err}");
}

/// swiglu's and rmsnorm's one-launch backwards = burn's f32 op chains, as bits, with edge values
/// planted (the check group the battery runs at real shapes on the H200): even and odd widths
/// (vectors of 4 lanes and of 1 on wgpu), rows longer and shorter than the 128-unit cube, and
/// rmsnorm per head of 128 (also on the plane kernels, 32 and 15 rows, and their rows inside
/// launches of every battery batch size) and 64.
#[test]
fn fused_backward_kernels_equal_their_op_chains_as_bits() {
    let device = crate::device();
    let dtypes: &[DType] = if shared_kernels::device::runtime_name() == "cuda" { &[DType::F32, DType::BF16] } else { &[DType::F32] };
    for &dtype in dtypes {
        for (rows, ffn, hidden) in [(16usize, 96usize, 256usize), (7, 37, 200), (3, 8, 64), (5, 16, 384)] {
            let checks = shared_kernels::testing::fused_backward::fused_backward_checks(dtype, &device, crate::seed(), rows, ffn, hidden).unwrap();
            for c in &checks {
                assert!(c.identical(), "{} {:?}: {} rows differ, max |diff| {}", c.op, dtype, c.rows_differing, c.max_abs_diff);
            }
            // heads of 128 run the plane kernels too wherever this device's planes fit them
            let planes_fit = fixed_plane_size(&device).is_some_and(|p| p.is_power_of_two() && (2..128).contains(&p));
            let plane_rows = planes_fit && hidden % 128 == 0;
            let on_planes = checks.iter().filter(|c| c.op.contains("on planes") && !c.op.contains("forward and backward")).count();
            assert_eq!(on_planes, if plane_rows { 2 } else { 0 }, "plane checks at hidden {hidden} (planes {:?})", fixed_plane_size(&device));
            // and their rows inside launches of every batch size up to `rows`, plus a rerun
            let invariance = checks.iter().filter(|c| c.op.contains("on planes") && c.op.contains("forward and backward")).count();
            assert!(if plane_rows { invariance >= 2 } else { invariance == 0 }, "{invariance} plane invariance checks at {rows} rows, hidden {hidden}");
        }
    }
}
