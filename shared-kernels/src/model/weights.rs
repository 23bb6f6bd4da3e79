//! Checkpoints in Hugging Face layout: `config.json`, `model.safetensors` (or shards with
//! `model.safetensors.index.json`), `tokenizer.json`. Saving writes the same layout so
//! transformers can load a trained policy; files are written aside and renamed into place.

use super::{ModelConfig, ModelError};
use burn::tensor::{DType, Device, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Host copy of every tensor, f32, by HF name, with its shape.
pub struct Checkpoint {
    pub config: ModelConfig,
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
}

pub(super) fn weights_err(file: &Path, tensor: &str, message: impl Into<String>) -> ModelError {
    ModelError::Weights { file: file.display().to_string(), tensor: tensor.to_string(), message: message.into() }
}

fn to_f32(file: &Path, name: &str, view: &safetensors::tensor::TensorView<'_>) -> Result<Vec<f32>, ModelError> {
    let bytes = view.data();
    let words = |n: usize| bytes.chunks_exact(n);
    Ok(match view.dtype() {
        Dtype::F32 => words(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Dtype::BF16 => words(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::F16 => words(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        other => return Err(weights_err(file, name, format!("dtype {other:?} is not supported (f32, bf16, f16)"))),
    })
}

/// The safetensors files of a checkpoint folder: the index's shards, or `model.safetensors`.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| weights_err(&index, "", format!("not valid JSON: {e}")))?;
        let map = json.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| weights_err(&index, "weight_map", "missing or not an object"))?;
        let mut files: Vec<PathBuf> = map.values().filter_map(|v| v.as_str()).map(|f| dir.join(f)).collect();
        files.sort();
        files.dedup();
        return Ok(files);
    }
    let single = dir.join("model.safetensors");
    if !single.exists() {
        return Err(weights_err(&single, "", "not found (nor model.safetensors.index.json)"));
    }
    Ok(vec![single])
}

/// Reads config and weights from an HF checkpoint folder, checking every expected tensor's
/// presence and shape.
pub fn load_checkpoint(dir: &Path) -> Result<Checkpoint, ModelError> {
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    let mut found: HashMap<String, (PathBuf, Vec<usize>, Vec<f32>)> = HashMap::new();
    for file in weight_files(dir)? {
        let bytes = std::fs::read(&file).map_err(|e| ModelError::io(&file, e))?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| weights_err(&file, "", format!("corrupt safetensors: {e}")))?;
        for (name, view) in st.tensors() {
            let values = to_f32(&file, &name, &view)?;
            found.insert(name, (file.clone(), view.shape().to_vec(), values));
        }
    }
    let mut tensors = BTreeMap::new();
    for (name, shape) in config.expected_tensors() {
        let Some((file, got, values)) = found.remove(&name) else {
            return Err(weights_err(dir, &name, "missing from the checkpoint"));
        };
        if got != shape {
            return Err(weights_err(&file, &name, format!("shape {got:?}, expected {shape:?} from config.json")));
        }
        if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
            return Err(weights_err(&file, &name, format!("non-finite value at flat index {bad}")));
        }
        tensors.insert(name, (shape, values));
    }
    Ok(Checkpoint { config, tensors })
}

/// A checkpoint folder's safetensors shards memory-mapped, and where each tensor's bytes lie.
/// The weights go to the device straight from the page cache: a tensor stored in the dtype it
/// loads as is handed to the runtime as a view of the mapping (no host copy of ours; the CUDA
/// runtime copies it once into pinned memory for the transfer), and the finite-value check
/// runs on every core at once. [`load_checkpoint`] instead holds every weight as f32: twice a
/// bf16 checkpoint's size, converted value by value.
pub struct MappedWeights {
    files: Vec<(PathBuf, std::sync::Arc<memmap2::Mmap>)>,
    /// name -> (file, dtype, shape, byte range in the file)
    index: HashMap<String, (usize, Dtype, Vec<usize>, std::ops::Range<usize>)>,
}

/// Bytes of one memory-mapped tensor, kept alive by the map they point into.
struct MappedBytes {
    map: std::sync::Arc<memmap2::Mmap>,
    range: std::ops::Range<usize>,
}

impl AsRef<[u8]> for MappedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.map[self.range.clone()]
    }
}

/// The work unit of the parallel finite-value scan: big enough that threads rarely meet, small
/// enough that the largest tensor (an embedding of ~1 GB) spreads over every core.
const SCAN_CHUNK_BYTES: usize = 32 << 20;

/// The flat index of the first infinity or NaN in `bytes` (values of `dtype`), if any: a value
/// whose exponent bits are all set. A branch-free pass over each block (it vectorises) and an
/// exact search only in the block that has one.
fn first_non_finite(dtype: Dtype, bytes: &[u8]) -> Option<usize> {
    fn scan<const W: usize>(bytes: &[u8], bad: impl Fn(&[u8]) -> bool + Copy) -> Option<usize> {
        const BLOCK: usize = 1 << 16;
        for (b, block) in bytes.chunks(BLOCK * W).enumerate() {
            if block.chunks_exact(W).fold(false, |any, v| any | bad(v)) {
                return block.chunks_exact(W).position(bad).map(|i| b * BLOCK + i);
            }
        }
        None
    }
    match dtype {
        Dtype::F32 => scan::<4>(bytes, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x7f80_0000 == 0x7f80_0000),
        Dtype::BF16 => scan::<2>(bytes, |b| u16::from_le_bytes([b[0], b[1]]) & 0x7f80 == 0x7f80),
        Dtype::F16 => scan::<2>(bytes, |b| u16::from_le_bytes([b[0], b[1]]) & 0x7c00 == 0x7c00),
        _ => None,
    }
}

pub(super) fn element_bytes(dtype: Dtype) -> Option<usize> {
    match dtype {
        Dtype::F32 => Some(4),
        Dtype::BF16 | Dtype::F16 => Some(2),
        _ => None,
    }
}

impl MappedWeights {
    /// Maps every shard of `dir` and checks each is well-formed safetensors.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        Self::open_files(weight_files(dir)?)
    }

    /// Maps each of `paths` (safetensors files; a tensor name in two files is the later one's).
    pub fn open_files(paths: Vec<PathBuf>) -> Result<Self, ModelError> {
        let mut files = Vec::new();
        let mut index = HashMap::new();
        for file in paths {
            let handle = std::fs::File::open(&file).map_err(|e| ModelError::io(&file, e))?;
            // SAFETY: the map is read-only; as with any loader, the file must not be rewritten
            // while it loads (lockstep itself writes checkpoints aside and renames them).
            let map = unsafe { memmap2::Mmap::map(&handle) }.map_err(|e| ModelError::io(&file, e))?;
            SafeTensors::deserialize(&map).map_err(|e| weights_err(&file, "", format!("corrupt safetensors: {e}")))?;
            let (header, meta) = SafeTensors::read_metadata(&map).map_err(|e| weights_err(&file, "", format!("corrupt safetensors: {e}")))?;
            for (name, info) in meta.tensors() {
                let (a, b) = info.data_offsets;
                index.insert(name, (files.len(), info.dtype, info.shape.clone(), 8 + header + a..8 + header + b));
            }
            files.push((file, std::sync::Arc::new(map)));
        }
        Ok(Self { files, index })
    }

    /// Every tensor's name, stored dtype and shape, by name.
    pub fn tensors(&self) -> Vec<(String, Dtype, Vec<usize>)> {
        let mut out: Vec<_> = self.index.iter().map(|(n, (_, st, shape, _))| (n.clone(), *st, shape.clone())).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Checks every tensor of `expected` (name and shape from config.json): present, that
    /// shape, a supported dtype, every value finite. Errors name the file and tensor (the
    /// first in `expected`'s order); the value scan runs on every core.
    pub fn check_all(&self, dir: &Path, expected: &[(String, Vec<usize>)]) -> Result<(), ModelError> {
        for (name, shape) in expected {
            let Some((f, st, got, _)) = self.index.get(name) else {
                return Err(weights_err(dir, name, "missing from the checkpoint"));
            };
            let file = &self.files[*f].0;
            if got != shape {
                return Err(weights_err(file, name, format!("shape {got:?}, expected {shape:?} from config.json")));
            }
            if element_bytes(*st).is_none() {
                return Err(weights_err(file, name, format!("dtype {st:?} is not supported (f32, bf16, f16)")));
            }
        }
        // (tensor, first element, bytes) pieces of whole elements
        let mut pieces: Vec<(usize, usize, &[u8])> = Vec::new();
        for (t, (name, _)) in expected.iter().enumerate() {
            let (f, st, _, range) = &self.index[name];
            let width = element_bytes(*st).expect("checked above");
            let bytes = &self.files[*f].1[range.clone()];
            let step = SCAN_CHUNK_BYTES / width * width;
            for (c, piece) in bytes.chunks(step).enumerate() {
                pieces.push((t, c * step / width, piece));
            }
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 32).min(pieces.len().max(1));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let found = std::sync::Mutex::new(Vec::<(usize, usize)>::new()); // (tensor, flat index)
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(t, first, piece)) = pieces.get(i) else { break };
                    let dtype = self.index[&expected[t].0].1;
                    if let Some(at) = first_non_finite(dtype, piece) {
                        found.lock().unwrap_or_else(|e| e.into_inner()).push((t, first + at));
                    }
                });
            }
        });
        let found = found.into_inner().unwrap_or_else(|e| e.into_inner());
        match found.into_iter().min() {
            Some((t, at)) => {
                let name = &expected[t].0;
                let (f, st, _, range) = &self.index[name];
                let (file, map) = &self.files[*f];
                let width = element_bytes(*st).expect("checked above");
                let b = &map[range.start + at * width..range.start + (at + 1) * width];
                let value = match st {
                    Dtype::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                    Dtype::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
                    _ => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
                };
                Err(weights_err(file, name, format!("non-finite value {value} at flat index {at}")))
            }
            None => Ok(()),
        }
    }

    /// A [`Self::check_all`]ed tensor as host data of `dims` (its element count), for a tensor
    /// of `dtype`: a view of the mapped bytes (nothing copied here) when stored in `dtype` or in
    /// f32 (the caller's cast rounds it on the device, as it rounds an f32 host copy), else its
    /// values widened to f32 on the host (exact for 16-bit values).
    pub fn data(&self, name: &str, dims: Vec<usize>, dtype: DType) -> Result<TensorData, ModelError> {
        let (f, st, got, range) = &self.index[name];
        let (file, map) = &self.files[*f];
        let stored = match st {
            Dtype::F32 => DType::F32,
            Dtype::BF16 => DType::BF16,
            _ => DType::F16,
        };
        // a stored f32 tensor loaded narrower goes up as f32 too: the caller's cast rounds it
        // on the device, as it rounds an f32 host copy ([`Checkpoint::tensor`])
        if stored == dtype || stored == DType::F32 {
            // `File`: the CUDA runtime stages such bytes through pinned memory before the
            // asynchronous copy reads them (a mapping may still fault)
            let view = bytes::Bytes::from_owner(MappedBytes { map: map.clone(), range: range.clone() });
            return Ok(TensorData::from_bytes(burn::tensor::Bytes::from_shared(view, burn::tensor::AllocationProperty::File), dims, stored));
        }
        let view = safetensors::tensor::TensorView::new(*st, got.clone(), &map[range.clone()]).map_err(|e| weights_err(file, name, format!("{e}")))?;
        Ok(TensorData::new(to_f32(file, name, &view)?, dims))
    }
}

impl Checkpoint {
    pub fn tensor<const D: usize>(&self, name: &str, dtype: DType, device: &Device) -> Tensor<D> {
        let (shape, values) = &self.tensors[name];
        let shape: [usize; D] = shape.clone().try_into().expect("rank checked by expected_tensors");
        Tensor::<D>::from_data(TensorData::new(values.clone(), shape), device).cast(dtype)
    }
}

impl Checkpoint {
    /// A randomly initialised checkpoint for `config` (N(0, std) projections via a uniform of
    /// equal variance, norms near 1), reproducible from `seed`: the tests' and quickstart's model.
    pub fn random(config: ModelConfig, std: f32, seed: u64) -> Self {
        let mut state = seed ^ 0x5851_f42d_4c95_7f2d;
        let mut next = move || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z >> 40) as f32 / 16_777_216.0 * 2.0 - 1.0
        };
        let half_width = std * 3.0f32.sqrt();
        let mut tensors = BTreeMap::new();
        for (name, shape) in config.expected_tensors() {
            let n: usize = shape.iter().product();
            let values = if name.ends_with("norm.weight") {
                (0..n).map(|_| 1.0 + 0.1 * next()).collect()
            } else {
                (0..n).map(|_| next() * half_width).collect()
            };
            tensors.insert(name, (shape, values));
        }
        Checkpoint { config, tensors }
    }
}

/// A tiny Qwen3 config for tests and the quickstart.
pub fn tiny_config(vocab: usize, tied: bool) -> ModelConfig {
    let json = serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": tied, "torch_dtype": "float32"
    });
    ModelConfig::from_json(&json.to_string(), "tiny_config").expect("valid tiny config")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect()
    }

    #[test]
    fn the_scan_finds_the_first_non_finite_value_in_any_block() {
        // fresh values, a bad one placed at block and chunk edges and between them
        let mut state = 0x2545_f491_4f6c_dd1du64 ^ std::process::id() as u64;
        let mut values: Vec<f32> = (0..(3 << 16) + 17)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / 1e6 - 8.0
            })
            .collect();
        assert_eq!(first_non_finite(Dtype::BF16, &bf16_bytes(&values)), None);
        let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(first_non_finite(Dtype::F32, &f32_bytes(&values)), None);
        for at in [0, (1 << 16) - 1, 1 << 16, (2 << 16) + 5, values.len() - 1] {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let keep = values[at];
                values[at] = bad;
                assert_eq!(first_non_finite(Dtype::BF16, &bf16_bytes(&values)), Some(at), "bf16 {bad} at {at}");
                assert_eq!(first_non_finite(Dtype::F32, &f32_bytes(&values)), Some(at), "f32 {bad} at {at}");
                values[at] = keep;
            }
        }
        // f16: 65504 is the largest finite value, 0x7c00 is infinity
        let mut f16: Vec<u8> = values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
        assert_eq!(first_non_finite(Dtype::F16, &f16), None);
        f16[2 * 70_000..2 * 70_000 + 2].copy_from_slice(&0x7c00u16.to_le_bytes());
        assert_eq!(first_non_finite(Dtype::F16, &f16), Some(70_000));
    }

    #[test]
    fn check_all_reports_the_first_bad_tensor_and_index_across_chunks() {
        let dir = std::env::temp_dir().join(format!("lockstep-weights-scan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // a tensor spanning several scan chunks: the bad value sits in its third chunk
        let per_chunk = SCAN_CHUNK_BYTES / 2;
        let big_len = 2 * per_chunk + 1000;
        let mut big = vec![0.5f32; big_len];
        let bad_at = 2 * per_chunk + 7;
        big[bad_at] = f32::INFINITY;
        big[big_len - 1] = f32::NAN; // a later bad value in the same tensor is not the one named
        let mut small = vec![0.25f32; 300];
        small[299] = f32::NAN; // a later tensor's bad value is not the one named either
        let tensors = [("a.big", bf16_bytes(&big), vec![big_len]), ("b.small", bf16_bytes(&small), vec![300])];
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> =
            tensors.iter().map(|(n, b, s)| (n.to_string(), safetensors::tensor::TensorView::new(Dtype::BF16, s.clone(), b).unwrap())).collect();
        std::fs::write(dir.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
        let mapped = MappedWeights::open(&dir).unwrap();
        let expected: Vec<(String, Vec<usize>)> = tensors.iter().map(|(n, _, s)| (n.to_string(), s.clone())).collect();
        let e = mapped.check_all(&dir, &expected).unwrap_err().to_string();
        assert!(e.contains("a.big") && e.contains(&format!("flat index {bad_at}")), "{e}");
        let e = mapped.check_all(&dir, &expected[1..]).unwrap_err().to_string();
        assert!(e.contains("b.small") && e.contains("flat index 299"), "{e}");
        let e = mapped.check_all(&dir, &[("c.absent".to_string(), vec![3])]).unwrap_err().to_string();
        assert!(e.contains("c.absent") && e.contains("missing"), "{e}");
        let e = mapped.check_all(&dir, &[("b.small".to_string(), vec![301])]).unwrap_err().to_string();
        assert!(e.contains("[300]") && e.contains("[301]"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
