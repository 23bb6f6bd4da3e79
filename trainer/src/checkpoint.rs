//! Run checkpoints: `runs/<name>/checkpoints/step-NNNNNN/` holding the policy in HF layout
//! (model.safetensors, config.json, tokenizer.json: loadable by transformers), or with LoRA its
//! adapters only in PEFT's layout (adapter_config.json, adapter_model.safetensors), the optimizer
//! moments (optimizer.safetensors) and state.json. Written into a temp folder, fsynced, then
//! renamed into place; the oldest beyond `keep` are removed after the new one is complete.

use crate::optim::AdamW;
use burn::tensor::{DType, Device, Tensor};
use safetensors::Dtype;
use serde::{Deserialize, Serialize};
use shared_kernels::model::save::{f32_bytes, write_atomic, write_safetensors};
use shared_kernels::model::mapped::MappedWeights;
use shared_kernels::model::save::save_model_f32_with;
use shared_kernels::model::{ModelError, Qwen3, Weight};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunState {
    /// GRPO steps completed.
    pub step: usize,
    /// AdamW updates taken (bias correction).
    pub adam_t: u64,
    pub git_revision: String,
}

fn io(path: &Path, e: std::io::Error) -> ModelError {
    ModelError::io(path, e)
}

pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// Where a checkpoint's f32 tensors come from: this process's optimizer ([`AdamW`]), or with a
/// sharded optimizer the ranks that own them. Called in the order the files are written:
/// `moment_names`, then every weight's `master` in name order, then `m` and `v` of each weight
/// with moments, in name order.
pub trait OptimizerState {
    /// The weights with moments, in name order, and their lengths.
    fn moment_names(&mut self) -> Result<Vec<(String, usize)>, ModelError>;
    /// A weight's f32 value: its master where the model runs narrower.
    fn master(&mut self, name: &str, weight: &Weight) -> Result<burn::tensor::Bytes, ModelError>;
    /// A weight's first (`second` false) or second moment.
    fn moment(&mut self, name: &str, second: bool) -> Result<burn::tensor::Bytes, ModelError>;
}

impl OptimizerState for &AdamW {
    fn moment_names(&mut self) -> Result<Vec<(String, usize)>, ModelError> {
        Ok(self.moments.iter().map(|(k, (m, _))| (k.clone(), m.dims()[0])).collect())
    }
    fn master(&mut self, name: &str, weight: &Weight) -> Result<burn::tensor::Bytes, ModelError> {
        Ok(match self.masters.get(name) {
            Some(master) => f32_bytes(master.clone().into_data()),
            None => f32_bytes(weight.flat().cast(DType::F32).into_data()),
        })
    }
    fn moment(&mut self, name: &str, second: bool) -> Result<burn::tensor::Bytes, ModelError> {
        let (m, v) = &self.moments[name];
        Ok(moment_bytes(if second { v } else { m }))
    }
}

/// Saves and prunes. Returns the new checkpoint folder.
pub fn save(run_dir: &Path, model: &Qwen3, opt: &AdamW, state: &RunState, tokenizer_json: &str, keep: usize) -> Result<PathBuf, ModelError> {
    save_from(run_dir, model, &mut &*opt, state, tokenizer_json, keep)
}

/// [`save`] with the optimizer's state from `source`.
pub fn save_from(run_dir: &Path, model: &Qwen3, source: &mut dyn OptimizerState, state: &RunState, tokenizer_json: &str, keep: usize) -> Result<PathBuf, ModelError> {
    let root = checkpoints_dir(run_dir);
    std::fs::create_dir_all(&root).map_err(|e| io(&root, e))?;
    let name = format!("step-{:06}", state.step);
    let dest = root.join(&name);
    if dest.join("state.json").exists() {
        // this step is saved already (a run whose last step is a checkpoint step saves it at the
        // loop and at the end): the state is the same, and deleting the complete folder to
        // rewrite it left a window with no checkpoint at all under keep_checkpoints = 1
        prune(run_dir, keep);
        return Ok(dest);
    }
    let tmp = root.join(format!(".{name}.tmp"));
    let _ = std::fs::remove_dir_all(&tmp);
    if let Err(e) = write_folder(&tmp, model, source, state, tokenizer_json) {
        // a failed write (a full disk, most often) leaves nothing behind and the older
        // checkpoints as they were
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(ModelError::Io { file: dest.display().to_string(), message: format!("checkpoint not written ({e}); the earlier checkpoints are intact") });
    }
    // an incomplete folder of this name (no state.json: a kill inside an older write) goes
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::rename(&tmp, &dest).map_err(|e| io(&dest, e))?;
    if let Ok(dir) = std::fs::File::open(&root) {
        let _ = dir.sync_all();
    }
    prune(run_dir, keep);
    Ok(dest)
}

/// Every file of a checkpoint into the folder `tmp`, one tensor at a time from the device
/// (the host never holds the whole model or optimizer state).
fn write_folder(tmp: &Path, model: &Qwen3, source: &mut dyn OptimizerState, state: &RunState, tokenizer_json: &str) -> Result<(), ModelError> {
    std::fs::create_dir_all(tmp).map_err(|e| io(tmp, e))?;
    let moments = source.moment_names()?;
    // f32 masters where the model runs narrower (bf16), so resume continues from them; with
    // LoRA the adapters only (the base is frozen: the run's model.path or embedded model)
    if model.lora.is_some() {
        shared_kernels::model::lora_files::save_adapters_f32_with(tmp, model, None, "", |name, weight| source.master(name, weight))?;
    } else {
        save_model_f32_with(tmp, model, |name, weight| source.master(name, weight))?;
    }
    write_atomic(&tmp.join("tokenizer.json"), tokenizer_json.as_bytes())?;
    // optimizer moments, `m.NAME` and `v.NAME` in name order
    let entries: Vec<(String, Dtype, Vec<usize>)> = moments.iter().flat_map(|(k, n)| [(format!("m.{k}"), Dtype::F32, vec![*n]), (format!("v.{k}"), Dtype::F32, vec![*n])]).collect();
    write_safetensors(&tmp.join("optimizer.safetensors"), &entries, None, |i| source.moment(&moments[i / 2].0, i % 2 == 1))?;
    write_atomic(&tmp.join("state.json"), serde_json::to_string_pretty(state).expect("json").as_bytes())
}

/// An f32 moment's little-endian bytes, read from the device.
fn moment_bytes(t: &burn::tensor::Tensor<1>) -> burn::tensor::Bytes {
    f32_bytes(t.clone().into_data())
}

/// Deletes the oldest complete checkpoints beyond the newest `keep`.
fn prune(run_dir: &Path, keep: usize) {
    let mut all = list(run_dir);
    while all.len() > keep {
        let old = all.remove(0);
        let _ = std::fs::remove_dir_all(old);
    }
}

/// Complete checkpoints of a run, oldest first.
pub fn list(run_dir: &Path) -> Vec<PathBuf> {
    let step = |p: &Path| p.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_prefix("step-")).and_then(|n| n.parse::<usize>().ok());
    let mut out: Vec<(usize, PathBuf)> = std::fs::read_dir(checkpoints_dir(run_dir))
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.join("state.json").exists()).filter_map(|p| Some((step(&p)?, p))).collect())
        .unwrap_or_default();
    // by step number: past step 999,999 the names outgrow their six digits and sort wrongly as text
    out.sort();
    out.into_iter().map(|(_, p)| p).collect()
}

/// What a checkpoint holds of the policy, on the device as stored: f32 (a narrower run's masters).
pub enum SavedPolicy {
    Model(Qwen3),
    /// LoRA: the adapters (f32, in a model of the run's shape) and their values by name.
    Adapters { spec: shared_kernels::model::LoraSpec, adapters: Vec<shared_kernels::model::lora::LayerAdapters>, masters: Vec<(String, Tensor<1>)> },
}

pub struct Loaded {
    pub policy: SavedPolicy,
    /// AdamW's first and second moments on the device, by weight name.
    pub moments: BTreeMap<String, (Tensor<1>, Tensor<1>)>,
    pub state: RunState,
}

/// A checkpoint folder onto `device`: the weights and the moments memory-mapped and sent as
/// stored (f32), one tensor at a time, after every tensor is checked (present, f32, as long as
/// its parameter, finite values).
/// `shape`: the run's model (a LoRA checkpoint holds no config.json of its own).
pub fn load(dir: &Path, device: &Device, shape: &shared_kernels::model::ModelConfig) -> Result<Loaded, ModelError> {
    let state_path = dir.join("state.json");
    let text = std::fs::read_to_string(&state_path).map_err(|e| io(&state_path, e))?;
    let state: RunState = serde_json::from_str(&text).map_err(|e| ModelError::Io { file: state_path.display().to_string(), message: format!("invalid run state: {e}") })?;
    use shared_kernels::model::lora_files;
    let (policy, sizes): (SavedPolicy, BTreeMap<String, usize>) = if lora_files::is_adapter_folder(dir) {
        let (spec, adapters, masters) = lora_files::load_adapters(dir, shape, DType::F32, device)?;
        let sizes = lora_files::adapter_tensors(shape, &spec).into_iter().map(|(n, s)| (n, s.iter().product())).collect();
        (SavedPolicy::Adapters { spec, adapters, masters }, sizes)
    } else {
        let model = Qwen3::load(dir, DType::F32, device)?;
        let sizes = model.config.expected_tensors().into_iter().map(|(n, shape)| (n, shape.iter().product())).collect();
        (SavedPolicy::Model(model), sizes)
    };
    let opt_path = dir.join("optimizer.safetensors");
    let mapped = MappedWeights::open_files(vec![opt_path.clone()])?;
    let bad = |tensor: &str, message: String| ModelError::Weights { file: opt_path.display().to_string(), tensor: tensor.to_string(), message };
    let mut names: BTreeMap<String, (Option<usize>, Option<usize>)> = BTreeMap::new(); // weight -> (m, v) lengths
    let stored = mapped.tensors();
    for (name, dtype, shape) in &stored {
        if *dtype != Dtype::F32 {
            return Err(bad(name, format!("is {dtype:?}; optimizer moments are f32")));
        }
        let (kind, weight) = name.split_once('.').unwrap_or(("?", name));
        let entry = names.entry(weight.to_string()).or_default();
        let len = Some(shape.iter().product());
        match kind {
            "m" => entry.0 = len,
            "v" => entry.1 = len,
            _ => return Err(bad(name, "unexpected tensor".into())),
        }
    }
    // after an update every parameter has both moments, each as long as the parameter: a
    // missing or short one would restart or misalign Adam without a word
    if state.adam_t > 0 || !names.is_empty() {
        for (name, size) in &sizes {
            let (m, v) = names.get(name).copied().unwrap_or_default();
            for (kind, got) in [("m", m), ("v", v)] {
                match got {
                    None => return Err(bad(&format!("{kind}.{name}"), format!("is missing (the checkpoint is at Adam step {})", state.adam_t))),
                    Some(n) if n != *size => return Err(bad(&format!("{kind}.{name}"), format!("has {n} values for a parameter of {size}"))),
                    Some(_) => {}
                }
            }
        }
        if let Some(extra) = names.keys().find(|k| !sizes.contains_key(*k)) {
            return Err(bad(extra, "is a moment of no parameter of the model".into()));
        }
    }
    let expected: Vec<(String, Vec<usize>)> = stored.into_iter().map(|(n, _, shape)| (n, shape)).collect();
    mapped.check_all(&opt_path, &expected).map_err(|e| match e {
        ModelError::Weights { file, tensor, message } => ModelError::Weights { file, tensor, message: format!("{message}: resuming would write non-finite weights") },
        other => other,
    })?;
    let upload = |name: String, n: usize| -> Result<Tensor<1>, ModelError> { mapped.upload(&name, [n], DType::F32, device, Default::default()) };
    let mut moments = BTreeMap::new();
    for (name, _) in names {
        let n = sizes[&name];
        moments.insert(name.clone(), (upload(format!("m.{name}"), n)?, upload(format!("v.{name}"), n)?));
    }
    // the runtime is done with the mapped bytes before the mapping goes (see `Qwen3::load`)
    device.sync().map_err(|e| ModelError::Io { file: opt_path.display().to_string(), message: format!("copying the moments to the device: {e:?}") })?;
    Ok(Loaded { policy, moments, state })
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::{tensor::TensorView, SafeTensors};
    use shared_kernels::model::Checkpoint;

    #[test]
    fn checkpoints_are_listed_by_step_number_past_six_digits() {
        let scratch = shared_kernels::testing::Scratch::new("ck-list");
        let run = scratch.join("run");
        for name in ["step-999999", "step-1000000", "step-000007", "step-x", "step-000008"] {
            std::fs::create_dir_all(checkpoints_dir(&run).join(name)).unwrap();
            if name != "step-000008" {
                std::fs::write(checkpoints_dir(&run).join(name).join("state.json"), "{}").unwrap();
            }
        }
        let names: Vec<String> = list(&run).iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        // (step-x is not a step; step-000008 is incomplete: no state.json)
        assert_eq!(names, ["step-000007", "step-999999", "step-1000000"]);
    }

    #[test]
    fn saving_a_step_that_is_saved_already_leaves_the_complete_folder_in_place() {
        let device = shared_kernels::device::default_device();
        let ck = Checkpoint::random(shared_kernels::model::tiny_config(17, true), 0.3, 5);
        let model = Qwen3::from_checkpoint(&ck, DType::F32, &device).unwrap();
        let opt = AdamW::new(0.9, 0.99, 1e-8, 0.0);
        let scratch = shared_kernels::testing::Scratch::new("ck-twice");
        let run = scratch.join("run");
        let state = RunState { step: 4, adam_t: 0, git_revision: "test".into() };
        let first = save(&run, &model, &opt, &state, "{}", 1).unwrap();
        // the old save deleted this folder before renaming its rewrite into place: a kill in
        // between left no checkpoint; now the complete folder is never touched
        std::fs::write(first.join("marker"), b"kept").unwrap();
        let again = save(&run, &model, &opt, &state, "{}", 1).unwrap();
        assert_eq!(first, again);
        assert_eq!(std::fs::read(first.join("marker")).unwrap(), b"kept");
        assert_eq!(list(&run), vec![first]);
        let _ = std::fs::remove_dir_all(&run);
    }

    /// Rewrites `dir`'s optimizer.safetensors with `edit` applied to its (name, dtype, bytes).
    fn rewrite_optimizer(dir: &Path, edit: impl Fn(&mut Vec<(String, Dtype, Vec<u8>)>)) {
        let path = dir.join("optimizer.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut tensors: Vec<(String, Dtype, Vec<u8>)> = st.tensors().into_iter().map(|(n, v)| (n, v.dtype(), v.data().to_vec())).collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        edit(&mut tensors);
        let views: Vec<(String, TensorView<'_>)> = tensors.iter().map(|(n, d, b)| (n.clone(), TensorView::new(*d, vec![b.len() * 8 / d.bitsize()], b).unwrap())).collect();
        std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    }

    #[test]
    fn damaged_optimizer_moments_are_refused_naming_the_tensor() {
        let device = shared_kernels::device::default_device();
        let ck = Checkpoint::random(shared_kernels::model::tiny_config(17, true), 0.3, 6);
        let model = Qwen3::from_checkpoint(&ck, DType::F32, &device).unwrap();
        let mut opt = AdamW::new(0.9, 0.99, 1e-8, 0.0);
        let grads = model.named_tensors().into_iter().map(|(n, w)| (n, w.flat().ones_like())).collect();
        let model = opt.step(&model, &grads, 1e-3);
        let scratch = shared_kernels::testing::Scratch::new("ck-moments");
        let run = scratch.join("run");
        let state = RunState { step: 1, adam_t: 1, git_revision: "test".into() };
        type Edit = Box<dyn Fn(&mut Vec<(String, Dtype, Vec<u8>)>)>;
        let cases: Vec<(&str, Edit, &str)> = vec![
            ("missing", Box::new(|t| { t.remove(0); }), "is missing"),
            ("short", Box::new(|t| { t[1].2.truncate(8); }), "values for a parameter of"),
            ("nan", Box::new(|t| { t[2].2[0..4].copy_from_slice(&f32::NAN.to_le_bytes()); }), "NaN"),
            ("f16", Box::new(|t| { t[3].1 = Dtype::F16; }), "F16"),
        ];
        for (what, edit, needle) in cases {
            let _ = std::fs::remove_dir_all(&run);
            let dir = save(&run, &model, &opt, &state, "{}", 1).unwrap();
            assert!(load(&dir, &device, &model.config).is_ok(), "{what}: the intact checkpoint loads");
            rewrite_optimizer(&dir, edit);
            let err = load(&dir, &device, &model.config).err().unwrap_or_else(|| panic!("{what}: loaded")).to_string();
            assert!(err.contains("optimizer.safetensors") && err.contains(needle), "{what}: {err}");
        }
        let _ = std::fs::remove_dir_all(&run);
    }
}
