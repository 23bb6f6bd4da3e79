//! Index arithmetic at the sizes real runs cross, as far as lavapipe can hold them: cubecl's
//! FastDivmod (burn's select/gather/slice/copy kernels) exact up to u32::MAX, and lockstep's
//! launchers refusing, with the op and the sizes, what 32-bit indices cannot address.

use burn::tensor::{Tensor, TensorData};
use shared_kernels::ops::probes::index_probe::{boundary_dividends, fast_divmod, multiply_shift_host};
use shared_kernels::WeightLayout;

const DIVISORS: [u32; 11] = [151_936, 1024, 2048, 4096 * 2 + 1, 3, 7, 1, 2, 65_537, (1 << 31) + 1, u32::MAX];

#[test]
fn fast_divmod_is_exact_up_to_the_top_of_the_u32_range() {
    // Qwen3's vocabulary (the divisor that broke rows past 16384), hidden sizes, a power of two
    // plus one (largest multiplier), one, and divisors past 2^31; on this device's own path
    let device = crate::device();
    for divisor in DIVISORS {
        let dividends = boundary_dividends(divisor);
        let (q, r, _) = fast_divmod(&dividends, divisor, &device).unwrap();
        for (i, &n) in dividends.iter().enumerate() {
            assert_eq!((q[i], r[i]), (n / divisor, n % divisor), "{n} / {divisor}");
        }
    }
}

#[test]
fn the_patched_multiply_shift_division_is_exact_where_upstream_wrapped() {
    for divisor in DIVISORS {
        for n in boundary_dividends(divisor) {
            assert_eq!(multiply_shift_host(n, divisor).0, n / divisor, "{n} / {divisor}");
        }
    }
    // the bug the patch removes: row 16384 of a [rows, 151936] tensor read as row 0
    let n = 16_384 * 151_936 + 5;
    assert_eq!(multiply_shift_host(n, 151_936), (16_384, 0));
}

#[test]
fn launches_past_the_u32_index_range_are_errors_naming_the_op_and_sizes() {
    let device = crate::device();
    // a [65537, 65537] product from [65537, 1] operands: refused before anything is allocated
    let x = Tensor::<2>::from_data(TensorData::new(vec![1.0f32; 65_537], [65_537, 1]), &device);
    let err = shared_kernels::matmul(x.clone(), x, WeightLayout::OutIn).unwrap_err().to_string();
    assert!(err.contains("matmul") && err.contains("[65537, 65537]") && err.contains("4295098369"), "{err}");
}

#[test]
fn fused_backwards_give_rows_across_a_size_boundary_their_own_bits() {
    // the battery's check past 2^31 elements (H200) at what lavapipe holds: just past 2^23
    // elements, where the per-head rmsnorm's row cubes (65,600 of 128 values) need a 2-D grid,
    // the kernels forced where the launchers would run the op chains, the plane kernels at
    // lavapipe's planes
    let device = crate::device();
    let checks = shared_kernels::testing::boundaries::fused_backwards_across(1 << 23, burn::tensor::DType::F32, &device, true).unwrap();
    // swiglu, rmsnorm at 2048 and per head (and on this device's planes where they fit), rope
    let planes_fit = shared_kernels::fixed_plane_size(&device).is_some_and(|p| p.is_power_of_two() && (2..128).contains(&p));
    assert_eq!(checks.len(), if planes_fit { 5 } else { 4 });
    for c in checks {
        assert!(c.identical(), "{}: {} rows differ, max |diff| {}", c.op, c.rows_differing, c.max_abs_diff);
    }
}
