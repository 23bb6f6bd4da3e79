//! Adapters on disk as PEFT writes them: `adapter_config.json` (`peft_type` "LORA", `r`,
//! `lora_alpha`, `target_modules`, ...) and `adapter_model.safetensors` with PEFT's tensor names
//! (`base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`), loadable by
//! `peft.PeftModel.from_pretrained` and back.

use super::lora::{Adapter, LayerAdapters, LoraInit, LoraSpec, Projection};
use super::save::{write_atomic, write_safetensors};
use super::{ModelConfig, ModelError, Qwen3};
use burn::tensor::{DType, Device};
use safetensors::Dtype;
use std::path::Path;

pub const ADAPTER_CONFIG: &str = "adapter_config.json";
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";
const PEFT_PREFIX: &str = "base_model.model.";

/// Whether `dir` holds a PEFT adapter.
pub fn is_adapter_folder(dir: &Path) -> bool {
    dir.join(ADAPTER_CONFIG).is_file()
}

/// Every adapter tensor of a model of shape `c` with adapters `spec`: (lockstep's name, shape).
pub fn adapter_tensors(c: &ModelConfig, spec: &LoraSpec) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    for i in 0..c.num_layers {
        for site in super::lora::sites(c, spec, i) {
            let (o, inp) = site.dims;
            let [a, b] = site.names;
            out.push((a, vec![spec.rank, inp]));
            out.push((b, vec![o, spec.rank]));
        }
    }
    out
}

/// `adapter_config.json` for `spec` on the base model at `base` (PEFT's fields).
fn config_json(spec: &LoraSpec, init: Option<LoraInit>, base: &str) -> serde_json::Value {
    let init = match init {
        Some(LoraInit::Gaussian) => serde_json::json!("gaussian"),
        _ => serde_json::json!(true),
    };
    serde_json::json!({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
        "r": spec.rank, "lora_alpha": spec.alpha, "use_rslora": spec.rslora,
        "target_modules": spec.targets.iter().map(|p| p.module()).collect::<Vec<_>>(),
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": false, "use_dora": false,
        "init_lora_weights": init, "inference_mode": true, "modules_to_save": null,
        "layers_to_transform": null, "layers_pattern": null, "rank_pattern": {}, "alpha_pattern": {},
        "revision": null
    })
}

/// Writes `model`'s adapters as a PEFT folder in f32, each tensor's bytes from `f32_bytes_of`
/// (the f32 masters where the model runs narrower), one tensor at a time.
pub fn save_adapters_f32_with(dir: &Path, model: &Qwen3, init: Option<LoraInit>, base: &str, mut f32_bytes_of: impl FnMut(&str, &super::Weight) -> Result<burn::tensor::Bytes, ModelError>) -> Result<(), ModelError> {
    let spec = model.lora.as_ref().ok_or_else(|| ModelError::Input("the model has no adapters to save".into()))?;
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let shapes: std::collections::HashMap<String, Vec<usize>> = adapter_tensors(&model.config, spec).into_iter().collect();
    let mut weights: Vec<(String, super::Weight)> = model.named_tensors().into_iter().filter(|(n, _)| Qwen3::is_adapter(n)).collect();
    weights.sort_by(|a, b| a.0.cmp(&b.0));
    let entries: Vec<(String, Dtype, Vec<usize>)> = weights.iter().map(|(n, _)| (format!("{PEFT_PREFIX}{n}"), Dtype::F32, shapes[n].clone())).collect();
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors(&dir.join(ADAPTER_WEIGHTS), &entries, Some(&metadata), |i| f32_bytes_of(&weights[i].0, &weights[i].1))?;
    let text = serde_json::to_string_pretty(&config_json(spec, init, base)).expect("json");
    write_atomic(&dir.join(ADAPTER_CONFIG), text.as_bytes())
}

/// Writes `model`'s adapters as a PEFT folder, in f32 as the device holds them.
pub fn save_adapters(dir: &Path, model: &Qwen3, base: &str) -> Result<(), ModelError> {
    save_adapters_f32_with(dir, model, None, base, |_, w| Ok(super::save::f32_bytes(w.flat().cast(DType::F32).into_data())))
}

/// A PEFT folder's `adapter_config.json` as lockstep's adapters' shape; what lockstep cannot
/// compute the same way (DoRA, biases, per-layer ranks, fan-in-fan-out, regex targets) is an
/// error naming the field.
pub fn read_adapter_config(dir: &Path) -> Result<LoraSpec, ModelError> {
    let file = dir.join(ADAPTER_CONFIG);
    let text = std::fs::read_to_string(&file).map_err(|e| ModelError::io(&file, e))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::malformed(file.display(), format!("not valid JSON: {e}")))?;
    let bad = |field: &str, message: String| ModelError::malformed(file.display(), format!("`{field}`: {message}"));
    if v.get("peft_type").and_then(|t| t.as_str()).is_some_and(|t| t != "LORA") {
        return Err(bad("peft_type", format!("is {}; lockstep loads LoRA adapters", v["peft_type"])));
    }
    let rank = v.get("r").and_then(|r| r.as_u64()).filter(|&r| r > 0).ok_or_else(|| bad("r", format!("must be a positive integer, got {}", v.get("r").unwrap_or(&serde_json::Value::Null))))? as usize;
    let alpha = v.get("lora_alpha").and_then(|a| a.as_f64()).filter(|a| a.is_finite() && *a > 0.0).ok_or_else(|| bad("lora_alpha", "must be a number > 0".into()))?;
    let targets = match v.get("target_modules") {
        Some(serde_json::Value::String(s)) if s == "all-linear" => Projection::ALL.to_vec(),
        Some(serde_json::Value::Array(list)) => {
            let mut out = Vec::new();
            for m in list {
                let name = m.as_str().unwrap_or_default();
                out.push(targeted_projection(name).ok_or_else(|| bad("target_modules", format!("{m} is not a projection lockstep adapts (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, or a layer's full path such as model.layers.0.self_attn.q_proj)")))?);
            }
            out.sort();
            out.dedup();
            out
        }
        other => return Err(bad("target_modules", format!("must be a list of module names or \"all-linear\", got {}", other.unwrap_or(&serde_json::Value::Null)))),
    };
    let flag = |k: &str| v.get(k).and_then(|x| x.as_bool()).unwrap_or(false);
    for k in ["use_dora", "fan_in_fan_out"] {
        if flag(k) {
            return Err(bad(k, "is true; lockstep computes plain LoRA (y = xW^T + s xA^T B^T) only".into()));
        }
    }
    if v.get("bias").and_then(|b| b.as_str()).is_some_and(|b| b != "none") {
        return Err(bad("bias", format!("is {}; lockstep's adapters have no bias terms", v["bias"])));
    }
    for k in ["rank_pattern", "alpha_pattern"] {
        if v.get(k).and_then(|p| p.as_object()).is_some_and(|p| !p.is_empty()) {
            return Err(bad(k, "sets per-module ranks or alphas; lockstep uses one r and lora_alpha".into()));
        }
    }
    if v.get("target_parameters").and_then(|t| t.as_array()).is_some_and(|t| !t.is_empty()) {
        return Err(bad("target_parameters", format!("is {}: PEFT's adapters on transformers 5's fused expert parameters are not read; lockstep reads experts' adapters in the per-expert layout (target_modules gate_proj / up_proj / down_proj, docs/lora.md)", v["target_parameters"])));
    }
    for k in ["layers_to_transform", "modules_to_save"] {
        if v.get(k).is_some_and(|x| !x.is_null()) {
            return Err(bad(k, "is set; lockstep adapts every layer's target modules and trains nothing else".into()));
        }
    }
    Ok(LoraSpec { rank, alpha, rslora: flag("use_rslora"), targets })
}

/// The projection a `target_modules` entry names: its module name (`q_proj`), or one layer's full
/// path as PEFT writes "all-linear" out (`model.layers.3.self_attn.q_proj`). A projection listed
/// for some layers only is caught when the weights are read: the other layers' tensors are missing.
fn targeted_projection(name: &str) -> Option<Projection> {
    Projection::from_module(name).or_else(|| {
        Projection::ALL.into_iter().find(|p| {
            let layer = name.strip_suffix(p.path()).and_then(|s| s.strip_suffix('.')).and_then(|s| s.rsplit_once("layers."));
            layer.is_some_and(|(_, i)| i.parse::<usize>().is_ok())
        })
    })
}

/// The adapters of a PEFT folder for a model of shape `c`, in `dtype` on `device`, with the
/// values as stored in f32 (the masters of a narrower run): (spec, adapters, f32 tensors by name).
pub fn load_adapters(dir: &Path, c: &ModelConfig, dtype: DType, device: &Device) -> Result<(LoraSpec, Vec<LayerAdapters>, Vec<(String, burn::tensor::Tensor<1>)>), ModelError> {
    let spec = read_adapter_config(dir)?;
    let file = dir.join(ADAPTER_WEIGHTS);
    let mapped = super::mapped::MappedWeights::open_files(vec![file.clone()])?;
    let expected: Vec<(String, Vec<usize>)> = adapter_tensors(c, &spec).into_iter().map(|(n, s)| (format!("{PEFT_PREFIX}{n}"), s)).collect();
    let known: std::collections::HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    if let Some((extra, _, _)) = mapped.tensors().into_iter().find(|(n, _, _)| !known.contains(n.as_str())) {
        return Err(ModelError::Weights { file: file.display().to_string(), tensor: extra, message: "is not an adapter of the model adapter_config.json describes (PEFT's names without an adapter name, for r and target_modules as configured)".into() });
    }
    mapped.check_all(&file, &expected)?;
    let mut masters = Vec::new();
    let mut layers = Vec::with_capacity(c.num_layers);
    for i in 0..c.num_layers {
        layers.push(LayerAdapters::from_sites(spec.scale(), &super::lora::sites(c, &spec, i), |site| {
            let [a_name, b_name] = &site.names;
            let (o, inp) = site.dims;
            let a = mapped.upload::<2>(&format!("{PEFT_PREFIX}{a_name}"), [spec.rank, inp], DType::F32, device, Default::default())?;
            let b = mapped.upload::<2>(&format!("{PEFT_PREFIX}{b_name}"), [o, spec.rank], DType::F32, device, Default::default())?;
            masters.push((a_name.clone(), a.clone().reshape([spec.rank * inp])));
            masters.push((b_name.clone(), b.clone().reshape([o * spec.rank])));
            Ok(Adapter { a: a.cast(dtype), b: b.cast(dtype) })
        })?);
    }
    device.sync().map_err(|e| ModelError::Io { file: file.display().to_string(), message: format!("copying the adapters to the device: {e:?}") })?;
    Ok((spec, layers, masters))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{lora, tiny_config, Checkpoint, LogprobDistribution};

    #[test]
    fn saved_adapters_load_back_to_the_same_logprob_bits_and_unsupported_peft_fields_are_named() {
        let device = crate::device::default_device();
        let base = Qwen3::from_checkpoint(&Checkpoint::random(tiny_config(29, false), 0.3, 4), DType::F32, &device).unwrap();
        let spec = LoraSpec { rank: 3, alpha: 6.0, rslora: true, targets: vec![Projection::Q, Projection::V, Projection::Down] };
        let adapters = lora::fresh_adapters(&base.config, &spec, LoraInit::Gaussian, 9, DType::F32, &device);
        // lora_B away from zero, so the adapters matter
        let model = base.clone().with_adapters(spec.clone(), adapters).unwrap().map_weights(&mut |name, w| if name.ends_with("lora_B.weight") { w.with_flat(w.flat().ones_like().mul_scalar(0.05)) } else { w });
        let dir = crate::testing::Scratch::new("peft-files");
        save_adapters(&dir, &model, "base").unwrap();
        let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join(ADAPTER_CONFIG)).unwrap()).unwrap();
        assert_eq!((config["r"].as_u64(), config["use_rslora"].as_bool(), config["target_modules"].clone()), (Some(3), Some(true), serde_json::json!(["q_proj", "v_proj", "down_proj"])), "{config}");
        let (read, layers, _) = load_adapters(&dir, &base.config, DType::F32, &device).unwrap();
        assert_eq!(read, spec);
        let loaded = base.clone().with_adapters(read, layers).unwrap();
        let seq: Vec<u32> = (0..14).map(|i| (i * 7 % 29) as u32).collect();
        let lp = |m: &Qwen3| m.sequence_logprobs(&[seq.clone()], LogprobDistribution::full(1.0)).unwrap().per_sequence[0].iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(lp(&loaded), lp(&model), "loaded adapters give other logprob bits");
        assert_ne!(lp(&loaded), lp(&base), "the adapters changed nothing");
        // what lockstep does not compute is refused naming PEFT's field
        for (field, value) in [("use_dora", serde_json::json!(true)), ("bias", serde_json::json!("all")), ("rank_pattern", serde_json::json!({"q_proj": 8})), ("target_modules", serde_json::json!(".*proj")), ("layers_to_transform", serde_json::json!([0])), ("target_parameters", serde_json::json!(["mlp.experts.gate_up_proj"]))] {
            let mut bad = config.clone();
            bad[field] = value;
            std::fs::write(dir.join(ADAPTER_CONFIG), bad.to_string()).unwrap();
            let e = read_adapter_config(&dir).unwrap_err().to_string();
            assert!(e.contains(field) && e.contains(ADAPTER_CONFIG), "{field}: {e}");
        }
    }
}
