//! Getting an HF checkpoint onto the device, timed by phase: the shards memory-mapped and
//! checked (names, shapes, dtypes, finite values), then each weight handed to the runtime
//! ([`MappedWeights::upload`]), then the wait for the copies. `lockstep bench --load-bench`
//! compares the host-copy paths (the same weights as bits). Handing weights over from 4 or 8
//! threads was measured no faster (2.84 s and 3.08 s against 2.73 s for 16 GB).

use super::mapped::{HostCopy, MappedWeights};
use super::{ModelConfig, ModelError, Qwen3};
use burn::tensor::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

/// Where a checkpoint load's time went, for the line `lockstep train` / `sample` print and
/// `lockstep bench --load`.
#[derive(Clone, Debug, Default)]
pub struct LoadPhases {
    pub files: usize,
    /// Bytes of tensor data in the safetensors files.
    pub bytes: u64,
    pub copy: HostCopy,
    /// Mapping the files, checking names, shapes and dtypes, and the finite-value scan.
    pub open_check_s: f64,
    /// Building the model: each weight handed to the runtime (`from_data`: the host copy and
    /// the enqueue) and cast.
    pub build_s: f64,
    /// Waiting for the device's copies to finish.
    pub wait_s: f64,
    pub total_s: f64,
}

impl std::fmt::Display for LoadPhases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.2} GB from {} file(s) in {:.2} s ({:.2} GB/s): map and check {:.2} s, weights to the runtime ({:?}) {:.2} s, waiting for the copies {:.2} s",
            self.bytes as f64 / 1e9,
            self.files,
            self.total_s,
            self.bytes as f64 / 1e9 / self.total_s.max(1e-9),
            self.open_check_s,
            self.copy,
            self.build_s,
            self.wait_s
        )
    }
}

impl Qwen3 {
    /// The HF checkpoint in `dir`, its shards memory-mapped and each weight sent to the device
    /// in its stored dtype where that is `dtype` (no f32 host copy of the model); the same bits
    /// as [`Qwen3::from_checkpoint`] of [`super::load_checkpoint`] (a 16-bit value widened to f32 and
    /// cast back is itself). Timed by phase: [`load_timed`].
    pub fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Self, ModelError> {
        load_timed(dir, dtype, device, Default::default()).map(|(model, _)| model)
    }
}

/// [`Qwen3::load`] with the weights' bytes reaching the device as `copy` says, and where the
/// time went.
pub fn load_timed(dir: &Path, dtype: DType, device: &Device, copy: HostCopy) -> Result<(Qwen3, LoadPhases), ModelError> {
    let started = Instant::now();
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    let mapped = MappedWeights::open(dir)?;
    let expected = super::names::expected_tensors(&config);
    let shapes: HashMap<String, Vec<usize>> = expected.iter().cloned().collect();
    // every tensor checked (presence, shape, finite values) before any goes to the device
    mapped.check_no_unexpected(&config)?;
    mapped.check_all(dir, &expected)?;
    let mut phases = LoadPhases { files: mapped.file_count(), bytes: mapped.byte_count(), copy, open_check_s: started.elapsed().as_secs_f64(), ..Default::default() };
    let upload = |name: &str| -> Result<Tensor<2>, ModelError> {
        let shape = &shapes[name];
        let rows = if shape.len() == 2 { shape[0] } else { 1 };
        mapped.upload(name, [rows, shape.iter().product::<usize>() / rows], dtype, device, copy)
    };
    let building = Instant::now();
    let model = Qwen3::from_source(&config, dtype, device, &upload)?;
    phases.build_s = building.elapsed().as_secs_f64();
    // the runtime may still be reading the mapped bytes: it is done before the mapping can go
    // (a file truncated in place while mapped would fault here, not later)
    let waiting = Instant::now();
    device.sync().map_err(|e| ModelError::Input(format!("{}: copying the weights to the device: {e:?}", dir.display())))?;
    phases.wait_s = waiting.elapsed().as_secs_f64();
    phases.total_s = started.elapsed().as_secs_f64();
    Ok((model, phases))
}
