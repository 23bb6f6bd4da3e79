//! `lockstep check`: the sampler engine's invariance checks (`sampler::invariance`, the same
//! code the CI tests assert) on this machine's device, for a preset model shape in each dtype.
//! Prints a markdown table; fails if any check fails.

use burn::tensor::DType;
use shared_kernels::model::{Checkpoint, KernelSet, Qwen3};

/// `kernels` other than Matched run the checks with an ablation kernel set instead: the
/// contrast, expected to fail wherever that set is not batch invariant.
pub fn run(preset: &str, dtypes: &[DType], seed: u64, kernels: KernelSet) -> Result<(), String> {
    let device = shared_kernels::device::default_device();
    let config = super::bench::preset(preset)?;
    // the random checkpoint is built on the host as for the bench: refused by name if it cannot fit
    super::bench::check_host_memory(&config, preset)?;
    println!("# lockstep check: sampler engine invariance, runtime {}, preset {preset}, kernels {}, seed {seed}", shared_kernels::device::runtime_name(), match kernels { KernelSet::Matched => "matched (lockstep)", KernelSet::Fast => "fast (burn defaults)", KernelSet::SplitK => "split_k (batch-size-dependent split-K matmul)", KernelSet::Bf16Logits => "bf16_logits (lockstep's, logits rounded to bf16)" });
    for &dtype in dtypes {
        kernels.runs_on(dtype).map_err(|e| format!("--dtypes {dtype:?}: {e}"))?;
    }
    println!("matmul kernels: {}", shared_kernels::ops::matmul::matmul_kernels_summary(&shared_kernels::device::default_device()));
    println!("attention kernels (head_dim 32-128): {}\n", shared_kernels::ops::attention::attention_kernels_summary(&shared_kernels::device::default_device(), 128));
    println!("| dtype | check | result |");
    println!("|---|---|---|");
    let mut failed = 0;
    for &dtype in dtypes {
        let mut model = Qwen3::from_checkpoint(&Checkpoint::random(config.clone(), 0.05, seed), dtype, &device).map_err(|e| e.to_string())?;
        model.kernels = kernels;
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
            let result = match trainer::optim::master_weight_check(dtype, &device, seed) {
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
