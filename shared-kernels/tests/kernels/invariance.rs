use burn::tensor::DType;
use shared_kernels::testing::battery::{run_all, Impl};
use shared_kernels::testing::rows::{table, Dims, BATCH_SIZES};

#[test]
fn every_kernel_row_is_bitwise_batch_invariant_and_run_to_run_stable() {
    let checks = run_all(Impl::Lockstep, DType::F32, Dims::small(), &crate::device(), crate::seed()).expect("battery ran");
    let rows: Vec<_> = checks.iter().map(|c| ("lockstep", c.clone())).collect();
    let failing: Vec<_> = rows.iter().filter(|(_, c)| !c.identical()).cloned().collect();
    assert!(failing.is_empty(), "rows differ:\n{}", table(&failing));
    // every op was checked at every batch size plus a rerun
    let ops: std::collections::BTreeSet<_> = checks.iter().map(|c| c.op.clone()).collect();
    for op in ["matmul W[N,K]", "matmul W[K,N]", "rmsnorm", "logprob+entropy", "swiglu", "residual add", "bias add", "add + rmsnorm (fused)", "swiglu on [gate | up] (fused)", "embedding", "rope", "attention decode", "attention decode split_kv", "attention decode sequential", "sample (token, logprob)"] {
        assert!(ops.contains(op), "battery lost op {op}");
        assert_eq!(checks.iter().filter(|c| c.op == op).count(), BATCH_SIZES.len(), "{op}");
        assert!(ops.contains(&format!("{op} (rerun)")), "no rerun for {op}");
    }
    // the default attention relies on this equality for caches of one split
    assert_eq!(checks.iter().filter(|c| c.op == "attention split_kv = sequential (prefix within one split)" && c.m > 0).count(), 1);
}

#[test]
fn the_battery_detects_a_row_that_changed() {
    // guard against a comparison that can never fail
    let a = vec![vec![1.0f32, 2.0]];
    let b = vec![1.0f32, 2.0 + f32::EPSILON * 2.0];
    let c = shared_kernels::testing::rows::compare("x", "f32", 1, &a, &[&b]);
    assert!(!c.identical());
    assert_eq!(c.rows_differing, 1);
}
