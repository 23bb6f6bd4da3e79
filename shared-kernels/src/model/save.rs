//! Writing checkpoints in Hugging Face layout (`model.safetensors`, `config.json`, the
//! tokenizer), so transformers can load a trained policy: every file written aside, fsynced and
//! renamed into place, safetensors one tensor at a time so the host never holds a whole model.

use super::weights::weights_err;
use super::{Checkpoint, ModelConfig, ModelError};
use burn::tensor::DType;
use safetensors::Dtype;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `file` atomically: to a sibling temp file, fsync, then rename.
pub fn write_atomic(file: &Path, bytes: &[u8]) -> Result<(), ModelError> {
    write_atomic_with(file, |w| w.write_all(bytes).map_err(|e| ModelError::io(file, e)))
}

/// Where an atomic write of `file` goes. A rename replaces the directory entry it names, so a
/// symlink would become a regular file (`/dev/stdout`, a link to a shared folder's file) and a
/// device or pipe would be unlinked: a symlink's regular target is replaced in its own folder,
/// and what is not a regular file is written through as a stream.
enum AtomicTarget {
    /// A regular file (existing or new): write a sibling of this path, then rename onto it.
    Replace(PathBuf),
    /// A device, pipe or socket (a terminal, `/dev/stdout` into a pipe): write into it.
    Stream,
}

fn atomic_target(file: &Path) -> AtomicTarget {
    match std::fs::metadata(file) {
        Ok(m) if !m.is_file() && !m.is_dir() => AtomicTarget::Stream,
        Ok(_) => AtomicTarget::Replace(file.canonicalize().unwrap_or_else(|_| file.to_path_buf())),
        Err(_) => AtomicTarget::Replace(file.to_path_buf()),
    }
}

/// This process's temp file beside `file`: two processes writing one file each rename a whole
/// file of their own, never a mix.
fn temp_sibling(file: &Path) -> PathBuf {
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("output");
    file.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

/// Whether an atomic write of `file` could start: its temp file can be made (and is removed
/// again); a stream is opened when written. For checks before long work whose result goes there.
pub fn check_writable(file: &Path) -> std::io::Result<()> {
    match atomic_target(file) {
        AtomicTarget::Replace(target) => {
            let tmp = temp_sibling(&target);
            std::fs::File::create(&tmp)?;
            std::fs::remove_file(&tmp)
        }
        AtomicTarget::Stream => Ok(()),
    }
}

/// Writes `file` atomically from `fill`: into this process's sibling temp file through an
/// 8 MiB buffer, fsync, rename (onto a symlink's target); a failed fill or write removes the
/// temp file and leaves `file` as it was. A pipe or terminal is written into.
pub fn write_atomic_with(file: &Path, fill: impl FnOnce(&mut (dyn Write + Send)) -> Result<(), ModelError>) -> Result<(), ModelError> {
    let file = match atomic_target(file) {
        AtomicTarget::Replace(target) => target,
        AtomicTarget::Stream => {
            let f = std::fs::OpenOptions::new().write(true).open(file).map_err(|e| ModelError::io(file, e))?;
            let mut w = std::io::BufWriter::new(f);
            fill(&mut w)?;
            return w.flush().map_err(|e| ModelError::io(file, e));
        }
    };
    let file = file.as_path();
    let tmp = temp_sibling(file);
    let written = (|| {
        let f = std::fs::File::create(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
        let mut w = std::io::BufWriter::with_capacity(8 << 20, f);
        fill(&mut w)?;
        let f = w.into_inner().map_err(|e| ModelError::io(&tmp, e.into_error()))?;
        f.sync_all().map_err(|e| ModelError::io(&tmp, e))
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, file).map_err(|e| ModelError::io(file, e))
}

/// Writes a safetensors file one tensor at a time: the header first (names, dtypes, shapes and
/// offsets are known up front), then each tensor's bytes as `bytes_of(i)` produces them, so the
/// host holds about two tensors at a time however large the file (a 4B model's f32 masters and
/// AdamW moments are 48 GB): a writer thread writes tensor i while `bytes_of(i + 1)` reads the
/// next from the device. Atomic like [`write_atomic`]. Tensors lie in `entries`' order.
pub fn write_safetensors<B: std::ops::Deref<Target = [u8]> + Send>(
    file: &Path,
    entries: &[(String, Dtype, Vec<usize>)],
    metadata: Option<&HashMap<String, String>>,
    mut bytes_of: impl FnMut(usize) -> Result<B, ModelError>,
) -> Result<(), ModelError> {
    let mut header = serde_json::Map::new();
    if let Some(m) = metadata {
        header.insert("__metadata__".into(), serde_json::json!(m));
    }
    let mut sizes = Vec::with_capacity(entries.len());
    let mut at = 0usize;
    for (name, dtype, shape) in entries {
        let n = shape.iter().product::<usize>() * dtype.bitsize() / 8;
        header.insert(name.clone(), serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + n]}));
        sizes.push(n);
        at += n;
    }
    let mut text = serde_json::to_vec(&header).map_err(|e| ModelError::malformed(file.display(), format!("header: {e}")))?;
    text.resize(text.len().next_multiple_of(8), b' ');
    write_atomic_with(file, |w| {
        let io = |e| ModelError::io(file, e);
        w.write_all(&(text.len() as u64).to_le_bytes()).map_err(io)?;
        w.write_all(&text).map_err(io)?;
        std::thread::scope(|s| {
            let (to_writer, queue) = std::sync::mpsc::sync_channel::<B>(1);
            let writer = s.spawn(move || -> std::io::Result<()> {
                for bytes in queue {
                    w.write_all(&bytes)?;
                }
                Ok(())
            });
            let mut produced = Ok(());
            for (i, size) in sizes.iter().enumerate() {
                let bytes = match bytes_of(i) {
                    Ok(b) => b,
                    Err(e) => {
                        produced = Err(e);
                        break;
                    }
                };
                let got = bytes.len();
                if got != *size {
                    produced = Err(weights_err(file, &entries[i].0, format!("{got} bytes for a {:?} tensor of shape {:?} ({size} bytes)", entries[i].1, entries[i].2)));
                    break;
                }
                if to_writer.send(bytes).is_err() {
                    break; // the writer failed: its error is the one reported
                }
            }
            drop(to_writer);
            let written = writer.join().unwrap_or_else(|_| Err(std::io::Error::other("the writer thread panicked")));
            produced?;
            written.map_err(io)
        })
    })
}

/// The little-endian bytes of an f32 tensor's data as read from the device (converted only if
/// the runtime returned another dtype).
pub fn f32_bytes(data: burn::tensor::TensorData) -> burn::tensor::Bytes {
    if data.dtype() == DType::F32 { data.into_bytes() } else { data.convert::<f32>().into_bytes() }
}

/// f32 values as the little-endian bytes of `dtype` (f32 or bf16, rounded to nearest even).
pub fn encode_f32(values: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        _ => values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
    }
}

fn stored_dtype(dir: &Path, dtype: DType) -> Result<Dtype, ModelError> {
    match dtype {
        DType::F32 => Ok(Dtype::F32),
        DType::BF16 => Ok(Dtype::BF16),
        other => Err(ModelError::Input(format!("cannot save weights to {} as {other:?} (f32 or bf16)", dir.display()))),
    }
}

/// `config.json` (with `torch_dtype` set to what was saved) and, if given, a copy of the
/// tokenizer file, beside a saved `model.safetensors`.
fn write_config_and_tokenizer(dir: &Path, config: &ModelConfig, dtype: DType, tokenizer: Option<&Path>) -> Result<(), ModelError> {
    let mut raw = config.raw.clone();
    raw["torch_dtype"] = serde_json::Value::from(if dtype == DType::BF16 { "bfloat16" } else { "float32" });
    write_atomic(&dir.join("config.json"), serde_json::to_string_pretty(&raw).expect("json").as_bytes())?;
    if let Some(tok) = tokenizer {
        let bytes = std::fs::read(tok).map_err(|e| ModelError::io(tok, e))?;
        write_atomic(&dir.join("tokenizer.json"), &bytes)?;
    }
    Ok(())
}

fn pt_metadata() -> HashMap<String, String> {
    HashMap::from([("format".to_string(), "pt".to_string())])
}

/// Saves `checkpoint` (host values) as an HF folder (single `model.safetensors`, f32 or bf16),
/// plus `config.json` and, if given, a copy of the tokenizer file.
pub fn save_checkpoint(dir: &Path, checkpoint: &Checkpoint, dtype: DType, tokenizer: Option<&Path>) -> Result<(), ModelError> {
    let st = stored_dtype(dir, dtype)?;
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let tensors: Vec<(&String, &(Vec<usize>, Vec<f32>))> = checkpoint.tensors.iter().collect();
    let entries: Vec<(String, Dtype, Vec<usize>)> = tensors.iter().map(|(n, (shape, _))| ((*n).clone(), st, shape.clone())).collect();
    write_safetensors(&dir.join("model.safetensors"), &entries, Some(&pt_metadata()), |i| Ok(encode_f32(&tensors[i].1 .1, st)))?;
    write_config_and_tokenizer(dir, &checkpoint.config, dtype, tokenizer)
}

/// [`save_model`] in f32 with each weight's bytes (f32, little-endian) from
/// `f32_bytes_of(name, weight)`, called in name order, one weight at a time: where a weight's
/// f32 value lives elsewhere (a sharded optimizer's master copy on the rank that owns it).
pub fn save_model_f32_with(dir: &Path, model: &super::Qwen3, mut f32_bytes_of: impl FnMut(&str, &super::Weight) -> Result<burn::tensor::Bytes, ModelError>) -> Result<(), ModelError> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let shapes: HashMap<String, Vec<usize>> = super::names::expected_tensors(&model.config).into_iter().collect();
    // the base weights (adapters are written apart, in PEFT's layout: `lora_files.rs`)
    let mut weights: Vec<_> = model.named_tensors().into_iter().filter(|(n, _)| !super::Qwen3::is_adapter(n)).collect();
    weights.sort_by(|a, b| a.0.cmp(&b.0));
    let entries: Vec<(String, Dtype, Vec<usize>)> = weights.iter().map(|(n, _)| (n.clone(), Dtype::F32, shapes[n].clone())).collect();
    write_safetensors(&dir.join("model.safetensors"), &entries, Some(&pt_metadata()), |i| f32_bytes_of(&weights[i].0, &weights[i].1))?;
    write_config_and_tokenizer(dir, &model.config, DType::F32, None)
}

/// Saves `model` as an HF folder like [`save_checkpoint`], reading one weight at a time from
/// the device while the file is written (no host copy of the whole model).
pub fn save_model(dir: &Path, model: &super::Qwen3, dtype: DType, tokenizer: Option<&Path>) -> Result<(), ModelError> {
    let st = stored_dtype(dir, dtype)?;
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let shapes: HashMap<String, Vec<usize>> = super::names::expected_tensors(&model.config).into_iter().collect();
    let mut weights: Vec<_> = model.named_tensors().into_iter().filter(|(n, _)| !super::Qwen3::is_adapter(n)).collect();
    weights.sort_by(|a, b| a.0.cmp(&b.0)); // the order save_checkpoint writes (by name)
    let entries: Vec<(String, Dtype, Vec<usize>)> = weights.iter().map(|(n, _)| (n.clone(), st, shapes[n].clone())).collect();
    write_safetensors(&dir.join("model.safetensors"), &entries, Some(&pt_metadata()), |i| {
        Ok(match st {
            // f32 as read from the device, no host conversion
            Dtype::F32 => f32_bytes(weights[i].1.flat().cast(DType::F32).into_data()),
            _ => burn::tensor::Bytes::from_bytes_vec(encode_f32(&weights[i].1.to_host(), st)),
        })
    })?;
    write_config_and_tokenizer(dir, &model.config, dtype, tokenizer)
}

#[cfg(test)]
mod tests {
    use super::write_atomic;

    #[test]
    fn an_atomic_write_replaces_a_symlinks_target_and_streams_into_a_pipe() {
        let dir = crate::testing::Scratch::new("atomic-targets");
        // a symlink stays a symlink; its target is replaced whole, in its own folder
        std::fs::create_dir_all(dir.join("shared")).unwrap();
        std::fs::write(dir.join("shared/table.md"), "old").unwrap();
        std::os::unix::fs::symlink("shared/table.md", dir.join("table.md")).unwrap();
        write_atomic(&dir.join("table.md"), b"new").unwrap();
        assert!(std::fs::symlink_metadata(dir.join("table.md")).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(dir.join("shared/table.md")).unwrap(), "new");
        let leftovers: Vec<_> = std::fs::read_dir(dir.join("shared")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(leftovers.len(), 1, "{leftovers:?}");
        // a pipe (what `/dev/stdout` is under `| tool`) is written into, and is still a pipe
        let fifo = dir.join("pipe");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        let reader = { let fifo = fifo.clone(); std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap()) };
        write_atomic(&fifo, b"streamed").unwrap();
        assert_eq!(reader.join().unwrap(), "streamed");
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the pipe was replaced by a file");
    }
}
