//! `lockstep merge-lora`: a base model with a LoRA adapter folded in, written as a Hugging Face
//! folder for transformers or another engine. A merged model computes the adapted model's
//! outputs up to rounding, not the training path's bits (docs/lora.md).

use crate::config::Config;
use crate::error::{invalid, RunError};
use std::path::Path;

pub fn main(cfg: Config, out: &Path) -> Result<(), RunError> {
    if cfg.lora.path.is_empty() {
        return Err(invalid("lora.path", "names no adapter to merge: set it to a PEFT adapter folder or a LoRA run's checkpoint".into()));
    }
    if out.exists() && std::fs::read_dir(out).map(|mut d| d.next().is_some()).unwrap_or(true) {
        return Err(invalid("--out", format!("{} exists and is not empty: name a new folder", out.display())));
    }
    let device = shared_kernels::device::default_device();
    let policy = crate::policy::load_policy(&cfg, None, &device)?;
    let merged = policy.model.merged()?;
    shared_kernels::model::save_model(out, &merged, merged.dtype, None)?;
    shared_kernels::model::save::write_atomic(&out.join("tokenizer.json"), policy.tokenizer_json.as_bytes())?;
    eprintln!("merged {} into {} ({:?}): {}", cfg.lora.path, if cfg.model.path.is_empty() { "the embedded model" } else { &cfg.model.path }, merged.dtype, out.display());
    Ok(())
}
