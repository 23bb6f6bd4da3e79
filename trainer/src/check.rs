//! `lockstep check`: the sampler engine's invariance checks (`sampler::invariance`, the same
//! code the CI tests assert) on this machine's device, for a preset model shape in each dtype.
//! Prints a markdown table; fails if any check fails.

use burn::tensor::DType;
use shared_kernels::model::{Checkpoint, KernelSet, Qwen3};

/// `fast` runs the checks with the ablation's fast kernels instead: the contrast, expected to fail
/// wherever burn's default ops are not batch invariant.
pub fn run(preset: &str, dtypes: &[DType], seed: u64, fast: bool) -> Result<(), String> {
    let device = shared_kernels::device::default_device();
    let config = crate::bench::preset(preset)?;
    println!("# lockstep check: sampler engine invariance, runtime {}, preset {preset}, kernels {}, seed {seed}\n", shared_kernels::device::runtime_name(), if fast { "fast (burn defaults)" } else { "matched (lockstep)" });
    println!("| dtype | check | result |");
    println!("|---|---|---|");
    let mut failed = 0;
    for &dtype in dtypes {
        let mut model = Qwen3::from_checkpoint(&Checkpoint::random(config.clone(), 0.05, seed), dtype, &device).map_err(|e| e.to_string())?;
        if fast {
            model.kernels = KernelSet::Fast;
        }
        for check in sampler::invariance::run_all(&model, seed) {
            let result = match &check.failure {
                None => "bit-identical".to_string(),
                Some(f) => {
                    failed += 1;
                    format!("FAILED: {f}")
                }
            };
            println!("| {dtype:?} | {} | {result} |", check.name);
        }
        if dtype != DType::F32 {
            let result = match crate::optim::master_weight_check(dtype, &device, seed) {
                Ok(()) => "passed".to_string(),
                Err(e) => {
                    failed += 1;
                    format!("FAILED: {e}")
                }
            };
            println!("| {dtype:?} | AdamW f32 masters: narrow weights = cast of masters, sub-ulp steps accumulate, checkpoint round trip | {result} |");
        }
    }
    if failed > 0 {
        return Err(format!("{failed} engine check(s) failed"));
    }
    println!("\nall engine checks bit-identical");
    Ok(())
}
