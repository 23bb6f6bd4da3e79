//! Save -> load round trips and loading errors that name the file, tensor or key.

use burn::tensor::DType;
use shared_kernels::model::{load_checkpoint, save_checkpoint, save_model, tiny_config, Checkpoint, ModelError, Qwen3, Rows};
use shared_kernels::testing::Scratch;
use std::path::Path;

fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("test-{name}"))
}

fn write_random(dir: &Path, seed: u64) -> Checkpoint {
    let ck = Checkpoint::random(tiny_config(50, false), 0.2, seed);
    save_checkpoint(dir, &ck, DType::F32, None).unwrap();
    ck
}

#[test]
fn save_load_save_gives_identical_weights_and_sharded_loads_the_same() {
    let dir = scratch("roundtrip");
    let ck = write_random(&dir, crate::seed());
    let model = Qwen3::load(&dir, DType::F32, &crate::device()).unwrap();
    let again = model.to_checkpoint();
    for (name, (shape, values)) in &ck.tensors {
        let (s2, v2) = &again.tensors[name];
        assert_eq!(shape, s2, "{name}");
        assert!(values.iter().zip(v2).all(|(a, b)| a.to_bits() == b.to_bits()), "{name} changed bits");
    }
    let dir2 = scratch("roundtrip2");
    save_checkpoint(&dir2, &again, DType::F32, None).unwrap();
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), std::fs::read(dir2.join("model.safetensors")).unwrap());

    // shard it in two with an index and load again
    let shard_dir = scratch("sharded");
    std::fs::copy(dir.join("config.json"), shard_dir.join("config.json")).unwrap();
    let names: Vec<String> = ck.tensors.keys().cloned().collect();
    let (a, b) = names.split_at(names.len() / 2);
    let mut weight_map = serde_json::Map::new();
    for (file, part) in [("model-00001-of-00002.safetensors", a), ("model-00002-of-00002.safetensors", b)] {
        let sub = Checkpoint { config: ck.config.clone(), tensors: part.iter().map(|n| (n.clone(), ck.tensors[n].clone())).collect() };
        let tmp = scratch(&format!("shard-{file}"));
        save_checkpoint(&tmp, &sub, DType::F32, None).unwrap();
        std::fs::copy(tmp.join("model.safetensors"), shard_dir.join(file)).unwrap();
        for n in part {
            weight_map.insert(n.clone(), serde_json::Value::from(file));
        }
    }
    std::fs::write(shard_dir.join("model.safetensors.index.json"), serde_json::json!({"weight_map": weight_map}).to_string()).unwrap();
    let sharded = load_checkpoint(&shard_dir).unwrap();
    assert_eq!(sharded.tensors, ck.tensors);
}

#[test]
fn the_memory_mapped_load_gives_the_host_copy_loads_bits_from_f32_and_bf16_files() {
    // Qwen3::load (mapped shards, stored bytes or an exact widening) against the f32 host copy
    // of load_checkpoint + from_checkpoint, for an f32 and a bf16 file loaded as f32 (the CPU
    // runtime has no bf16 tensors; the H200 bench compares bf16 loads too)
    for (name, file_dtype) in [("mapped-f32", DType::F32), ("mapped-bf16", DType::BF16)] {
        let dir = scratch(name);
        let ck = Checkpoint::random(tiny_config(50, false), 0.2, crate::seed() ^ 3);
        save_checkpoint(&dir, &ck, file_dtype, None).unwrap();
        let mapped = Qwen3::load(&dir, DType::F32, &crate::device()).unwrap().to_checkpoint();
        let host = Qwen3::from_checkpoint(&load_checkpoint(&dir).unwrap(), DType::F32, &crate::device()).unwrap().to_checkpoint();
        assert_eq!(mapped.tensors.len(), host.tensors.len());
        for (n, (shape, values)) in &host.tensors {
            let (s2, v2) = &mapped.tensors[n];
            assert_eq!(shape, s2, "{name}: {n}");
            assert!(values.iter().zip(v2).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}: {n} differs between the two loads");
        }
    }
}

#[test]
fn bad_checkpoints_give_errors_naming_the_problem() {
    let device = crate::device();
    let dir = scratch("errors");
    write_random(&dir, 3);
    let msg = |r: Result<Qwen3, ModelError>| r.err().expect("an error").to_string();

    // missing folder / config
    let e = msg(Qwen3::load(&dir.join("nope"), DType::F32, &device));
    assert!(e.contains("config.json"), "{e}");

    // corrupt safetensors
    let corrupt = scratch("corrupt");
    std::fs::copy(dir.join("config.json"), corrupt.join("config.json")).unwrap();
    std::fs::write(corrupt.join("model.safetensors"), b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}").unwrap();
    let e = msg(Qwen3::load(&corrupt, DType::F32, &device));
    assert!(e.contains("model.safetensors") && e.contains("corrupt") && !e.contains("``"), "{e}");

    // a truncated config.json names the file, and no empty key
    let truncated = scratch("truncated-config");
    std::fs::write(truncated.join("config.json"), b"{\"hidden_size\": 64").unwrap();
    let e = msg(Qwen3::load(&truncated, DType::F32, &device));
    assert!(e.contains("config.json") && e.contains("not valid JSON") && !e.contains("``"), "{e}");

    // wrong shape: a checkpoint from another model shape
    let other = scratch("other-shape");
    let mut ck = Checkpoint::random(tiny_config(50, false), 0.2, 1);
    ck.tensors.get_mut("model.norm.weight").unwrap().0 = vec![32];
    ck.tensors.get_mut("model.norm.weight").unwrap().1.truncate(32);
    save_checkpoint(&other, &ck, DType::F32, None).unwrap();
    let e = msg(Qwen3::load(&other, DType::F32, &device));
    assert!(e.contains("model.norm.weight") && e.contains("[32]") && e.contains("[64]"), "{e}");

    // missing key
    let missing = scratch("missing");
    let mut ck = Checkpoint::random(tiny_config(50, false), 0.2, 1);
    ck.tensors.remove("lm_head.weight");
    save_checkpoint(&missing, &ck, DType::F32, None).unwrap();
    let e = msg(Qwen3::load(&missing, DType::F32, &device));
    assert!(e.contains("lm_head.weight") && e.contains("missing"), "{e}");

    // a Qwen2 checkpoint without one of its q/k/v biases, and with one of the wrong length
    let mut raw = tiny_config(50, false).raw;
    raw["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
    let qwen2 = shared_kernels::model::ModelConfig::from_json(&raw.to_string(), "qwen2").unwrap();
    for (name, damage) in [("no-bias", None), ("short-bias", Some(7usize))] {
        let folder = scratch(name);
        let mut ck = Checkpoint::random(qwen2.clone(), 0.2, 1);
        match damage {
            None => drop(ck.tensors.remove("model.layers.1.self_attn.k_proj.bias")),
            Some(n) => *ck.tensors.get_mut("model.layers.1.self_attn.k_proj.bias").unwrap() = (vec![n], vec![0.5; n]),
        }
        save_checkpoint(&folder, &ck, DType::F32, None).unwrap();
        let e = msg(Qwen3::load(&folder, DType::F32, &device));
        let want = if damage.is_none() { "missing".to_string() } else { "[7]".to_string() };
        assert!(e.contains("model.layers.1.self_attn.k_proj.bias") && e.contains(&want), "{name}: {e}");
    }

    // unsupported architecture and bad config values name the key
    let arch = scratch("arch");
    std::fs::write(arch.join("config.json"), r#"{"architectures": ["MixtralForCausalLM"]}"#).unwrap();
    let e = msg(Qwen3::load(&arch, DType::F32, &device));
    assert!(e.contains("MixtralForCausalLM") && e.contains("architectures"), "{e}");
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap().replace("\"hidden_size\": 64", "\"hidden_size\": -3");
    let bad = scratch("badkey");
    std::fs::write(bad.join("config.json"), text).unwrap();
    let e = msg(Qwen3::load(&bad, DType::F32, &device));
    assert!(e.contains("hidden_size"), "{e}");

    // missing tokenizer
    let e = shared_kernels::model::load_tokenizer(&dir.join("tokenizer.json")).err().unwrap().to_string();
    assert!(e.contains("tokenizer.json") && e.contains("not found"), "{e}");

    // token id out of range names the id
    let model = Qwen3::load(&dir, DType::F32, &device).unwrap();
    let e = model.forward(&Rows::whole(&[vec![1, 2, 50]]), None).err().unwrap().to_string();
    assert!(e.contains("token id 50") && e.contains("vocabulary size 50"), "{e}");
}

#[test]
fn saving_a_model_from_the_device_writes_the_host_checkpoints_bytes() {
    // save_model reads one weight at a time while it writes; the file must be byte for byte the
    // one save_checkpoint writes from a whole host copy, in f32 and bf16, and load back exactly
    let ck = Checkpoint::random(tiny_config(50, false), 0.2, crate::seed() ^ 5);
    let model = Qwen3::from_checkpoint(&ck, DType::F32, &crate::device()).unwrap();
    for (name, dtype) in [("stream-f32", DType::F32), ("stream-bf16", DType::BF16)] {
        let (streamed, whole) = (scratch(&format!("{name}-model")), scratch(&format!("{name}-host")));
        save_model(&streamed, &model, dtype, None).unwrap();
        save_checkpoint(&whole, &model.to_checkpoint(), dtype, None).unwrap();
        for file in ["model.safetensors", "config.json"] {
            assert!(std::fs::read(streamed.join(file)).unwrap() == std::fs::read(whole.join(file)).unwrap(), "{name}: {file} differs");
        }
        let back = load_checkpoint(&streamed).unwrap();
        if dtype == DType::F32 {
            assert_eq!(back.tensors, ck.tensors, "{name}: the round trip changed a value");
        }
        let names: Vec<_> = std::fs::read_dir(&streamed).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{name}: a temp file was left: {names:?}");
    }
}

#[test]
fn a_tensor_that_fails_mid_write_leaves_the_earlier_file_and_no_temp_file() {
    use shared_kernels::model::save::write_safetensors;
    let dir = scratch("stream-fail");
    let file = dir.join("optimizer.safetensors");
    std::fs::write(&file, b"the earlier file").unwrap();
    let entries = vec![("a".to_string(), safetensors::Dtype::F32, vec![3]), ("b".to_string(), safetensors::Dtype::F32, vec![2])];
    let e = write_safetensors(&file, &entries, None, |i| match i {
        0 => Ok(vec![0u8; 12]),
        _ => Err(ModelError::Input("the device read failed".into())),
    })
    .unwrap_err();
    assert!(e.to_string().contains("device read failed"), "{e}");
    // a tensor of the wrong size is refused naming it
    let e = write_safetensors(&file, &entries, None, |i| Ok(vec![0u8; if i == 0 { 12 } else { 7 }])).unwrap_err().to_string();
    assert!(e.contains("7 bytes") && e.contains("[2]"), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), b"the earlier file");
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, vec!["optimizer.safetensors".to_string()], "{names:?}");
    // and a complete write replaces it with a file safetensors reads
    write_safetensors(&file, &entries, None, |i| Ok(vec![0u8; if i == 0 { 12 } else { 8 }])).unwrap();
    let bytes = std::fs::read(&file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("b").unwrap().shape(), &[2]);
}
