//! LoRA through the CLI on the CPU runtime (the embedded model): a run trains the adapters
//! only, the sampler's logprobs equal the trainer's as bits every step, the update's bits do not
//! depend on the micro-batching, a resumed run repeats the uninterrupted one, checkpoints hold
//! PEFT's files and no base weights, and bad `[lora]` keys are refused naming the key.

mod common;

use common::{lockstep, metrics, scratch, SMALL};

fn lora_run(dir: &std::path::Path, name: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["train", "small.toml", "--set", "lora.rank=4", "--set", "lora.alpha=8", "--set", "task.reward=char_f1"];
    let run_name = format!("log.run_name={name}");
    args.extend(["--set", &run_name]);
    args.extend(extra);
    let out = lockstep(&args, dir);
    assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    metrics(&dir.join("runs").join(name))
}

#[test]
fn a_lora_run_trains_adapters_only_bit_exact_micro_batch_independent_and_resumable() {
    let dir = scratch("lora-run");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let whole = lora_run(&dir, "whole", &["--set", "train.micro_batch_tokens=0"]);
    assert_eq!(whole.len(), 6);
    for m in &whole {
        assert_eq!(m["agreement"]["bit_equal_frac"], 1.0, "{m}");
        assert_eq!(m["agreement"]["kl_k1"].as_f64(), Some(0.0), "{m}");
        assert_eq!(m["sampler_weights_fingerprint"], m["trainer_weights_fingerprint"], "{m}");
    }
    let prints: std::collections::BTreeSet<_> = whole.iter().map(|m| m["trainer_weights_fingerprint"].to_string()).collect();
    assert!(prints.len() >= 4, "the adapters hardly changed: {prints:?}");
    assert!(whole.iter().filter(|m| m["grad_norm"].as_f64().unwrap_or(0.0) > 0.0).count() >= 2, "too few real updates: {whole:?}");
    // micro-batches of 20 tokens: the same adapters' bits after every step
    let micro = lora_run(&dir, "micro", &["--set", "train.micro_batch_tokens=20"]);
    for (w, m) in whole.iter().zip(&micro) {
        for key in ["trainer_weights_fingerprint", "grad_norm", "agreement", "reward_mean"] {
            assert_eq!(w[key], m[key], "step {}: {key} differs between one pass and micro-batches", w["step"]);
        }
    }
    // three steps, then a resume from the step-3 checkpoint: the uninterrupted run's metrics
    let _ = lora_run(&dir, "resumed", &["--set", "train.micro_batch_tokens=0", "--max-steps", "3"]);
    let resumed = lora_run(&dir, "resumed", &["--set", "train.micro_batch_tokens=0", "--resume"]);
    assert_eq!(resumed, whole, "a resumed LoRA run differs from the uninterrupted one");
    // the checkpoint: PEFT's two files, the adapters' optimizer state, no base weights
    let last = dir.join("runs/whole/checkpoints/step-000006");
    for f in ["adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors", "state.json", "tokenizer.json"] {
        assert!(last.join(f).exists(), "{f} missing from {}", last.display());
    }
    assert!(!last.join("model.safetensors").exists(), "a LoRA checkpoint holds the base weights");
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(last.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!((config["peft_type"].as_str(), config["r"].as_u64(), config["lora_alpha"].as_f64()), (Some("LORA"), Some(4), Some(8.0)), "{config}");
    let names = |file: &str| -> Vec<String> {
        let bytes = std::fs::read(last.join(file)).unwrap();
        safetensors::SafeTensors::deserialize(&bytes).unwrap().names().into_iter().map(str::to_string).collect()
    };
    let adapters = names("adapter_model.safetensors");
    assert!(adapters.contains(&"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight".to_string()), "{adapters:?}");
    assert_eq!(adapters.len(), 2 * 7 * 2, "two tensors per projection, 7 projections, 2 layers: {adapters:?}");
    let moments = names("optimizer.safetensors");
    assert!(!moments.is_empty() && moments.iter().all(|n| n.contains(".lora_A.") || n.contains(".lora_B.")), "the optimizer holds state for frozen weights: {moments:?}");
}

#[test]
fn an_adapter_samples_after_training_and_bad_lora_keys_are_refused_naming_the_key() {
    let dir = scratch("lora-keys");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let _ = lora_run(&dir, "t", &["--set", "train.steps=3"]);
    // the saved adapter, loaded by `lockstep sample`: the same answers twice, other than the base's
    std::fs::write(dir.join("p.jsonl"), "{\"prompt\": \"12+7=\"}\n{\"prompt\": \"3+4=\"}\n").unwrap();
    let sample = |out: &str, extra: &[&str]| {
        let mut args = vec!["sample", "--set", "sampler.input=p.jsonl", "--set", "sampler.temperature=0", "--set", "log.progress=false"];
        let output = format!("sampler.output={out}");
        args.extend(["--set", &output]);
        args.extend(extra);
        let o = lockstep(&args, &dir);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read_to_string(dir.join(out)).unwrap()
    };
    let adapter = "lora.path=runs/t/checkpoints/step-000003";
    let (a, b, base) = (sample("a.jsonl", &["--set", adapter]), sample("b.jsonl", &["--set", adapter]), sample("base.jsonl", &[]));
    assert_eq!(a, b);
    assert_ne!(a, base, "the trained adapter changed no logprob");
    // merged into the base as an HF folder: the adapted model's logprobs up to rounding
    let o = lockstep(&["merge-lora", "--set", adapter, "--out", "merged"], &dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(dir.join("merged/model.safetensors").exists() && dir.join("merged/tokenizer.json").exists());
    let merged = sample("merged.jsonl", &["--set", "model.path=merged"]);
    let logprobs = |text: &str| -> Vec<f64> { text.lines().flat_map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["logprobs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect::<Vec<_>>()).collect() };
    let (la, lm) = (logprobs(&a), logprobs(&merged));
    assert_eq!(la.len(), lm.len(), "{a}\n{merged}");
    assert!(la.iter().zip(&lm).all(|(x, y)| (x - y).abs() < 1e-4), "merged logprobs are not the adapted model's: {la:?} vs {lm:?}");
    let o = lockstep(&["merge-lora", "--out", "merged-again"], &dir);
    assert!(o.status.code() == Some(2) && String::from_utf8_lossy(&o.stderr).contains("lora.path"), "{}", String::from_utf8_lossy(&o.stderr));
    for (set, key) in [
        ("lora.dropout=0.05", "lora.dropout"),
        ("lora.target_modules=[\"x_proj\"]", "lora.target_modules"),
        ("lora.init=orthogonal", "lora.init"),
        ("lora.alpha=-1", "lora.alpha"),
    ] {
        let o = lockstep(&["train", "small.toml", "--set", "lora.rank=4", "--set", set, "--set", "log.run_name=bad"], &dir);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{set}: {err}");
        assert!(err.contains(key), "{set}: {err}");
    }
    let o = lockstep(&["train", "small.toml", "--set", "lora.alpha=16", "--set", "log.run_name=bad"], &dir);
    assert!(o.status.code() == Some(2) && String::from_utf8_lossy(&o.stderr).contains("lora.rank"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = lockstep(&["train", "small.toml", "--set", "lora.path=nowhere", "--set", "log.run_name=bad"], &dir);
    assert!(o.status.code() == Some(2) && String::from_utf8_lossy(&o.stderr).contains("lora.path"), "{}", String::from_utf8_lossy(&o.stderr));
    let o = lockstep(&["train", "small.toml", "--set", "lora.rank=8", "--set", adapter, "--set", "log.run_name=bad"], &dir);
    assert!(o.status.code() == Some(2) && String::from_utf8_lossy(&o.stderr).contains("lora.rank"), "{}", String::from_utf8_lossy(&o.stderr));
}
