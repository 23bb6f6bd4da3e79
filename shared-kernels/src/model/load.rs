//! Getting an HF checkpoint onto the device, timed by phase: the shards memory-mapped and
//! checked (names, shapes, dtypes, finite values), then each weight handed to the runtime in its
//! stored dtype where that is the loading dtype. With more than one thread the weights after the
//! embedding are handed over by several threads at once (the runtime's staging copy runs on the
//! calling thread); the weights' bits do not depend on it (`lockstep bench --load` compares the
//! fingerprints).

use super::names::{EMBED, LM_HEAD};
use super::mapped::{HostCopy, MappedWeights};
use super::{ModelConfig, ModelError, Qwen3};
use burn::tensor::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

/// Where a checkpoint load's time went, for the line `lockstep train` / `sample` print and
/// `lockstep bench --load`.
#[derive(Clone, Debug, Default)]
pub struct LoadPhases {
    pub files: usize,
    /// Bytes of tensor data in the safetensors files.
    pub bytes: u64,
    pub threads: usize,
    pub copy: HostCopy,
    /// Mapping the files, checking names, shapes and dtypes, and the finite-value scan.
    pub open_check_s: f64,
    /// Handing the weights to the runtime (`from_data`: its staging copy and the enqueue) and
    /// the casts, summed over the threads that did it.
    pub to_runtime_s: f64,
    /// Wall time of building the model from the handed-over weights (with the above).
    pub build_s: f64,
    /// Waiting for the device's copies to finish.
    pub wait_s: f64,
    pub total_s: f64,
}

impl std::fmt::Display for LoadPhases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.2} GB from {} file(s) in {:.2} s ({:.2} GB/s): map and check {:.2} s, weights to the runtime {:.2} s wall ({:.2} s over {} thread(s)), waiting for the copies {:.2} s",
            self.bytes as f64 / 1e9,
            self.files,
            self.total_s,
            self.bytes as f64 / 1e9 / self.total_s.max(1e-9),
            self.open_check_s,
            self.build_s,
            self.to_runtime_s,
            self.threads,
            self.wait_s
        )
    }
}

/// [`Qwen3::load`] with `threads` handing weights to the runtime and their bytes reaching the
/// device as `copy` says, and where the time went.
pub fn load_timed(dir: &Path, dtype: DType, device: &Device, threads: usize, copy: HostCopy) -> Result<(Qwen3, LoadPhases), ModelError> {
    let started = Instant::now();
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    let mapped = MappedWeights::open(dir)?;
    let expected = config.expected_tensors();
    let shapes: HashMap<String, Vec<usize>> = expected.iter().cloned().collect();
    // every tensor checked (presence, shape, finite values) before any goes to the device
    mapped.check_all(dir, &expected)?;
    let threads = threads.max(1);
    let mut phases = LoadPhases { files: mapped.file_count(), bytes: mapped.byte_count(), threads, copy, open_check_s: started.elapsed().as_secs_f64(), ..Default::default() };
    let spent = Mutex::new(0.0f64);
    let upload = |name: &str| -> Result<Tensor<2>, ModelError> {
        let shape = &shapes[name];
        let rows = if shape.len() == 2 { shape[0] } else { 1 };
        let t = Instant::now();
        let data = mapped.data_by(name, vec![rows, shape.iter().product::<usize>() / rows], dtype, copy)?;
        // created in the dtype the bytes are stored in: without it burn converts 16-bit data to
        // its default float dtype on the host, value by value (~1 GB/s), before the cast
        let stored = data.dtype();
        let tensor = Tensor::<2>::from_data(data, (device, stored)).cast(dtype);
        *spent.lock().unwrap_or_else(|e| e.into_inner()) += t.elapsed().as_secs_f64();
        Ok(tensor)
    };
    let building = Instant::now();
    let model = if threads == 1 {
        Qwen3::from_source(&config, dtype, device, &upload)?
    } else {
        // the largest tensors first and alone, as the serial path does (cubecl sizes its
        // pages to the largest allocation so far), then the rest from a shared queue
        let mut ready: HashMap<String, Tensor<2>> = HashMap::new();
        for name in [EMBED, LM_HEAD] {
            if shapes.contains_key(name) {
                ready.insert(name.to_string(), upload(name)?);
            }
        }
        let rest: Vec<&String> = expected.iter().map(|(n, _)| n).filter(|n| !ready.contains_key(n.as_str())).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let done = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..threads.min(rest.len().max(1)) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(name) = rest.get(i) else { break };
                    let result = upload(name);
                    done.lock().unwrap_or_else(|e| e.into_inner()).push((i, (*name).clone(), result));
                });
            }
        });
        let mut done = done.into_inner().unwrap_or_else(|e| e.into_inner());
        // the first failure in the checkpoint's order, whichever thread met it first
        done.sort_by_key(|d| d.0);
        for (_, name, result) in done {
            ready.insert(name, result?);
        }
        let ready = Mutex::new(ready);
        let take = |name: &str| -> Result<Tensor<2>, ModelError> { ready.lock().unwrap_or_else(|e| e.into_inner()).remove(name).ok_or_else(|| ModelError::Input(format!("{}: weight {name} was not loaded", dir.display()))) };
        Qwen3::from_source(&config, dtype, device, &take)?
    };
    phases.build_s = building.elapsed().as_secs_f64();
    phases.to_runtime_s = spent.into_inner().unwrap_or_else(|e| e.into_inner());
    // the runtime may still be reading the mapped bytes: it is done before the mapping can go
    // (a file truncated in place while mapped would fault here, not later)
    let waiting = Instant::now();
    device.sync().map_err(|e| ModelError::Input(format!("{}: copying the weights to the device: {e:?}", dir.display())))?;
    phases.wait_s = waiting.elapsed().as_secs_f64();
    phases.total_s = started.elapsed().as_secs_f64();
    Ok((model, phases))
}
