//! `[lora]`: low-rank adapters instead of full-parameter training (docs/lora.md), in PEFT's
//! terms (`r`, `lora_alpha`, `target_modules`, `init_lora_weights`, `use_rslora`).

use serde::{Deserialize, Serialize};
use shared_kernels::model::{LoraInit, LoraSpec, Projection};

/// `target_modules`: PEFT's module names, or `"all-linear"` (every projection of a layer).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum TargetModules {
    One(String),
    Many(Vec<String>),
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSection {
    /// The adapters' rank r; 0: no adapters (full-parameter training).
    pub rank: usize,
    /// PEFT's `lora_alpha`: the adapters' term is scaled by alpha / rank.
    pub alpha: f64,
    /// rsLoRA: scale by alpha / sqrt(rank).
    pub use_rslora: bool,
    pub target_modules: TargetModules,
    /// How lora_A starts ("kaiming_uniform": PEFT's default; "gaussian"); lora_B starts at 0.
    pub init: String,
    /// Seed of the fresh adapters' lora_A.
    pub init_seed: u64,
    /// Only 0: a dropout mask drawn in the trainer would have to be drawn in the sampler too,
    /// or their logprobs differ (kept so a PEFT config's value is refused, not ignored).
    pub dropout: f64,
    /// A PEFT adapter folder (`adapter_config.json`, `adapter_model.safetensors`) to start
    /// from; its rank, alpha and targets then apply, and the keys above must agree or be unset.
    pub path: String,
}

impl Default for LoraSection {
    fn default() -> Self {
        Self { rank: 0, alpha: 8.0, use_rslora: false, target_modules: TargetModules::One("all-linear".into()), init: "kaiming_uniform".into(), init_seed: 1, dropout: 0.0, path: String::new() }
    }
}

impl LoraSection {
    /// Whether the run trains adapters.
    pub fn enabled(&self) -> bool {
        self.rank > 0 || !self.path.is_empty()
    }

    /// The projections `target_modules` names (an error names the unknown one).
    pub fn targets(&self) -> Result<Vec<Projection>, String> {
        let names: Vec<&str> = match &self.target_modules {
            TargetModules::One(s) if s == "all-linear" => return Ok(Projection::ALL.to_vec()),
            TargetModules::One(s) => vec![s.as_str()],
            TargetModules::Many(list) => list.iter().map(String::as_str).collect(),
        };
        if names.is_empty() {
            return Err("names no module: use PEFT's names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj) or \"all-linear\"".into());
        }
        let mut out = Vec::new();
        for n in names {
            let p = Projection::from_module(n).ok_or_else(|| format!("`{n}` is not a projection of the model: use q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj or \"all-linear\""))?;
            if !out.contains(&p) {
                out.push(p);
            }
        }
        out.sort();
        Ok(out)
    }

    /// The adapters' shape from the keys (a PEFT folder's own config is read at load).
    pub fn spec(&self) -> Result<LoraSpec, String> {
        Ok(LoraSpec { rank: self.rank, alpha: self.alpha, rslora: self.use_rslora, targets: self.targets()? })
    }

    pub fn init_mode(&self) -> LoraInit {
        if self.init == "gaussian" { LoraInit::Gaussian } else { LoraInit::KaimingUniform }
    }

    /// Checks the keys; each error is `(key, message)`.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if !self.enabled() {
            return match Self::default() == *self {
                true => Ok(()),
                false => Err(("lora.rank", "is 0 (no adapters) while other [lora] keys are set: set lora.rank (or lora.path) to train adapters, or leave [lora] out".into())),
            };
        }
        if self.dropout != 0.0 {
            return Err(("lora.dropout", format!("must be 0, got {}: a dropout mask applied in the trainer would have to be applied in the sampler too, or the sampler's logprobs would not be the trainer's", self.dropout)));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(("lora.alpha", format!("must be a finite number > 0, got {}", self.alpha)));
        }
        if !["kaiming_uniform", "gaussian"].contains(&self.init.as_str()) {
            return Err(("lora.init", format!("`{}` is not one of [\"kaiming_uniform\", \"gaussian\"]", self.init)));
        }
        self.targets().map_err(|e| ("lora.target_modules", e))?;
        Ok(())
    }
}
