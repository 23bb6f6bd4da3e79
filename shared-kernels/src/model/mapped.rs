//! A checkpoint folder's safetensors shards memory-mapped: where each tensor's bytes lie, the
//! parallel check of names, shapes, dtypes and finite values, and each tensor's bytes handed to
//! the runtime as a view of the mapping (no host copy of ours).

use super::weights::{to_f32, weight_files, weights_err};
use super::ModelError;
use burn::tensor::{DType, Device, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A checkpoint folder's safetensors shards memory-mapped, and where each tensor's bytes lie.
/// The weights go to the device straight from the page cache: a tensor stored in the dtype it
/// loads as is handed to the runtime as a view of the mapping (no host copy of ours; the CUDA
/// driver reads the pages itself, [`HostCopy`]), and the finite-value check runs on every
/// core at once. [`super::load_checkpoint`] instead holds every weight as f32: twice a
/// bf16 checkpoint's size, converted value by value.
pub struct MappedWeights {
    files: Vec<(PathBuf, std::sync::Arc<memmap2::Mmap>)>,
    /// name -> (file, dtype, shape, byte range in the file)
    index: HashMap<String, (usize, Dtype, Vec<usize>, std::ops::Range<usize>)>,
}

/// How a memory-mapped tensor's bytes reach the device. On the H200 machine, a 16 GB bf16
/// checkpoint (Qwen3-8B's shape, 4 shards) loads in 2.73 s `Direct` and 4.80 s `Staged`, the
/// same weights as bits (`lockstep bench --load-bench`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostCopy {
    /// cubecl's staging: every byte copied into its pinned memory pool on the runtime's
    /// thread, then an asynchronous copy.
    Staged,
    /// The mapped pages handed to the driver's copy as they are: CUDA stages pageable memory
    /// through its own reused buffers.
    #[default]
    Direct,
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
            SafeTensors::deserialize(&map).map_err(|e| ModelError::malformed(file.display(), format!("corrupt safetensors: {e}")))?;
            let (header, meta) = SafeTensors::read_metadata(&map).map_err(|e| ModelError::malformed(file.display(), format!("corrupt safetensors: {e}")))?;
            for (name, info) in meta.tensors() {
                let (a, b) = info.data_offsets;
                index.insert(name, (files.len(), info.dtype, info.shape.clone(), 8 + header + a..8 + header + b));
            }
            files.push((file, std::sync::Arc::new(map)));
        }
        Ok(Self { files, index })
    }

    /// How many files are mapped.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// Bytes of tensor data over every mapped file.
    pub fn byte_count(&self) -> u64 {
        self.index.values().map(|(_, _, _, r)| r.len() as u64).sum()
    }

    /// Every tensor's name, stored dtype and shape, by name.
    pub fn tensors(&self) -> Vec<(String, Dtype, Vec<usize>)> {
        let mut out: Vec<_> = self.index.iter().map(|(n, (_, st, shape, _))| (n.clone(), *st, shape.clone())).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// A decoder tensor the model of `config` would not use is an error naming its file
    /// ([`super::names::unexpected_decoder_tensor`]).
    pub fn check_no_unexpected(&self, config: &super::ModelConfig) -> Result<(), ModelError> {
        match super::names::unexpected_decoder_tensor(config, self.index.keys().map(String::as_str)) {
            Some(name) => Err(weights_err(&self.files[self.index[name].0].0, name, super::names::UNEXPECTED)),
            None => Ok(()),
        }
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

    /// A [`Self::check_all`]ed tensor on `device` as `dtype`, of `dims` (its element count),
    /// its bytes reaching the device as `copy` says. It is created in the dtype its bytes are
    /// stored in, then cast on the device: created without a dtype, burn would convert 16-bit
    /// data to its default float dtype on the host, value by value (~1 GB/s).
    pub fn upload<const D: usize>(&self, name: &str, dims: [usize; D], dtype: DType, device: &Device, copy: HostCopy) -> Result<Tensor<D>, ModelError> {
        let data = self.data(name, dims.to_vec(), dtype, copy)?;
        let stored = data.dtype();
        Ok(Tensor::<D>::from_data(data, (device, stored)).cast(dtype))
    }

    /// The host data behind [`Self::upload`]: a view of the mapped bytes (nothing copied here)
    /// when stored in `dtype` or in f32 (the cast rounds it on the device, as it rounds an f32
    /// host copy), else its values widened to f32 on the host (exact for 16-bit values).
    fn data(&self, name: &str, dims: Vec<usize>, dtype: DType, copy: HostCopy) -> Result<TensorData, ModelError> {
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
            let view = bytes::Bytes::from_owner(MappedBytes { map: map.clone(), range: range.clone() });
            let property = match copy {
                HostCopy::Staged => burn::tensor::AllocationProperty::File,
                // cubecl hands memory it takes for pinned to the driver's copy as it is; the
                // driver copies pageable memory through its own staging buffers and returns
                // once the source is read, and the mapping outlives the copy (cubecl's drop
                // queue holds the view until the copy's fence)
                HostCopy::Direct => burn::tensor::AllocationProperty::Pinned,
            };
            return Ok(TensorData::from_bytes(burn::tensor::Bytes::from_shared(view, property), dims, stored));
        }
        let view = safetensors::tensor::TensorView::new(*st, got.clone(), &map[range.clone()]).map_err(|e| weights_err(file, name, format!("{e}")))?;
        Ok(TensorData::new(to_f32(file, name, &view)?, dims))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_folder_where_a_weight_file_is_expected_is_named_as_such() {
        let dir = crate::testing::Scratch::new("mapped-folder");
        let folder = dir.join("model.safetensors");
        std::fs::create_dir_all(&folder).unwrap();
        let err = super::MappedWeights::open_files(vec![folder.clone()]).err().expect("a folder is refused").to_string();
        assert!(err.contains("model.safetensors") && err.contains("is a folder where a file is expected"), "{err}");
    }

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
        let dir = crate::testing::Scratch::new("weights-scan");
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
