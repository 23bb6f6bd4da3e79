//! `lockstep-battery`: the kernel invariance battery on this build's runtime (wgpu/lavapipe on
//! CPU machines, CUDA with `--features cuda`). Prints one markdown table: lockstep's kernels and
//! burn's default ops side by side, per op, dtype and batch size. Exits non-zero if any
//! lockstep kernel is not bitwise batch invariant. `--large` adds the size boundaries real runs
//! cross (`testing::boundaries`, tens of GB: GPU only); `--boundaries-only` runs just those.
//!
//! Usage: lockstep-battery [--large | --boundaries-only] [--dtypes f32,bf16] [--seed N] [--burn-defaults] [--no-lockstep]
//! (`--dtypes` defaults to f32 and, on CUDA, bf16: the dtype real runs use there.)

use burn::tensor::DType;
use shared_kernels::testing::battery::{run_all, Impl};
use shared_kernels::testing::rows::{table, Dims};
use std::process::ExitCode;

fn main() -> ExitCode {
    // before any device exists: cubecl reads its configuration once
    shared_kernels::kernel_cache::enable();
    let mut dims = Dims::small();
    // on CUDA a run without --dtypes checks bf16 too: the dtype of every real-shape run there
    let mut dtypes = if shared_kernels::device::runtime_name() == "cuda" { vec![DType::F32, DType::BF16] } else { vec![DType::F32] };
    let mut seed = 20261129u64;
    let mut burn_defaults = false;
    let mut lockstep = true;
    // the size boundaries real runs cross (2^31/2^32 elements, 2-D grids, 8k prefixes): GPU-sized
    let mut boundaries = false;
    let mut boundaries_only = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--large" => {
                dims = Dims::large();
                boundaries = true;
            }
            "--boundaries-only" => {
                boundaries = true;
                boundaries_only = true;
            }
            "--burn-defaults" => burn_defaults = true,
            "--no-lockstep" => lockstep = false,
            "--seed" => match args.next().and_then(|v| v.parse().ok()) {
                Some(v) => seed = v,
                None => return usage("--seed needs an integer"),
            },
            "--dtypes" => {
                let Some(list) = args.next() else { return usage("--dtypes needs a list") };
                dtypes.clear();
                for name in list.split(',') {
                    match name {
                        "f32" => dtypes.push(DType::F32),
                        "bf16" => dtypes.push(DType::BF16),
                        other => return usage(&format!("unknown dtype `{other}` (f32, bf16)")),
                    }
                }
            }
            "-h" | "--help" => return usage(""),
            other => return usage(&format!("unknown argument `{other}`")),
        }
    }
    shared_kernels::testing::rows::PROGRESS.store(true, std::sync::atomic::Ordering::Relaxed);
    let device = shared_kernels::device::default_device();
    println!("# lockstep kernel battery: runtime {}, dims {dims:?}, seed {seed}", shared_kernels::device::runtime_name());
    println!("matmul kernels: {}", shared_kernels::ops::matmul::matmul_kernels_summary(&shared_kernels::device::default_device()));
    println!("attention kernels (head_dim 32-128): {}\n", shared_kernels::ops::attention::attention_kernels_summary(&shared_kernels::device::default_device(), 128));
    let mut rows = Vec::new();
    let mut failed = false;
    for &dtype in &dtypes {
        let mut impls = if lockstep { vec![Impl::Lockstep] } else { vec![] };
        if burn_defaults {
            impls.push(Impl::BurnDefault);
        }
        // lockstep's own check groups: every row must be bit-identical, an error fails the run
        let mut lockstep_rows = |what: &str, result: Result<Vec<shared_kernels::testing::rows::Check>, String>| match result {
            Ok(checks) => {
                for c in checks {
                    failed |= !c.identical();
                    rows.push(("lockstep", c));
                }
            }
            Err(e) => {
                eprintln!("error: {what} {dtype:?}: {e}");
                failed = true;
            }
        };
        if boundaries && lockstep {
            lockstep_rows("size boundaries", guarded(|| shared_kernels::testing::boundaries::boundary_checks(dtype, &device, seed).map_err(|e| e.to_string())));
            if boundaries_only {
                continue;
            }
        }
        if lockstep {
            // on CUDA one sequence of the 1.7B update: 4,096 tokens, Qwen3-1.7B's MLP and hidden sizes
            let (rows, ffn, hidden) = if shared_kernels::device::runtime_name() == "cuda" { (4096, 6144, 2048) } else { (64, dims.ffn, dims.hidden) };
            lockstep_rows("fused backward", guarded(|| shared_kernels::testing::fused_backward::fused_backward_checks(dtype, &device, seed, rows, ffn, hidden).map_err(|e| e.to_string())));
            lockstep_rows("attention backward statistics", guarded(|| shared_kernels::testing::attention_backward::backward_stats_checks(dtype, &device, seed).map_err(|e| e.to_string())));
            // both LOCKSTEP_BACKWARD_MATH arms, whichever the process runs: their accuracy side by side
            for (fast, group) in [(true, "attention backward fast math"), (false, "attention backward exact math")] {
                lockstep_rows(group, guarded(|| shared_kernels::testing::attention_backward::backward_math_checks(dtype, &device, seed, fast).map_err(|e| e.to_string())));
            }
            lockstep_rows("model contract", guarded(|| shared_kernels::testing::contract::model_contract(dtype, &device, seed, 8).map_err(|e| e.to_string())));
        }
        for which in impls {
            let name = if which == Impl::Lockstep { "lockstep" } else { "burn default" };
            match guarded(|| run_all(which, dtype, dims, &device, seed).map_err(|e| e.to_string())) {
                Ok(checks) => {
                    for c in checks {
                        if which == Impl::Lockstep && !c.identical() {
                            failed = true;
                        }
                        rows.push((name, c));
                    }
                }
                Err(e) => {
                    eprintln!("error: {name} {dtype:?}: {e}");
                    failed = true;
                }
            }
        }
    }
    println!("{}", table(&rows));
    let lockstep: Vec<_> = rows.iter().filter(|(n, _)| *n == "lockstep").collect();
    let identical = lockstep.iter().filter(|(_, c)| c.identical()).count();
    println!("lockstep: {identical}/{} checks bit-identical", lockstep.len());
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

/// Runs a check group, a panic inside it (a device failure surfacing where a result is read
/// back, e.g. a kernel that failed to compile) becoming that group's error: the other groups
/// still run, the table of what ran is printed and the exit is a failure, not a bare panic.
fn guarded<T>(group: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(group)).unwrap_or_else(|panic| {
        let message = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
        Err(format!("panicked: {}", message.unwrap_or_else(|| "(no message)".into())))
    })
}

fn usage(problem: &str) -> ExitCode {
    if !problem.is_empty() {
        eprintln!("error: {problem}");
    }
    eprintln!("usage: lockstep-battery [--large | --boundaries-only] [--dtypes f32,bf16] [--seed N] [--burn-defaults] [--no-lockstep]");
    if problem.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(2) }
}

#[cfg(test)]
mod tests {
    use super::guarded;

    #[test]
    fn a_panicking_group_becomes_its_error_and_a_passing_one_its_result() {
        assert_eq!(guarded(|| Ok::<_, String>(3)), Ok(3));
        assert_eq!(guarded(|| Err::<u8, _>("named".to_string())), Err("named".to_string()));
        let e = guarded::<u8>(|| panic!("Error while reading data: a kernel failed to compile")).unwrap_err();
        assert!(e.contains("panicked") && e.contains("failed to compile"), "{e}");
        let e = guarded::<u8>(|| std::panic::panic_any(7u32)).unwrap_err();
        assert!(e.contains("no message"), "{e}");
    }
}
