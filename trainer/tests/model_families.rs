//! GRPO end to end on checkpoints of the families beyond plain Qwen3 (Qwen2's q/k/v biases,
//! Llama's `attention_bias`, Llama 3.1's scaled RoPE), as a user brings them with `model.path`:
//! every step's sampler and trainer logprobs equal as bits, the update's bits independent of the
//! micro-batch size, and the checkpoints written with every tensor and RoPE setting they read.

mod common;

use common::{lockstep, metrics, scratch, SMALL};
use shared_kernels::model::{save_checkpoint, Checkpoint, ModelConfig};
use std::path::{Path, PathBuf};

/// A random-weight checkpoint of `arch` (the tiny shape, the tiny Qwen3 fixture's tokenizer) with
/// `extra` config keys, in `dir/name`.
fn family_checkpoint(dir: &Path, name: &str, arch: &str, extra: serde_json::Value) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared-kernels/tests/fixtures/tiny-qwen3");
    let mut json = serde_json::json!({
        "architectures": [arch], "vocab_size": 400, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": false, "eos_token_id": 0
    });
    json.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let config = ModelConfig::from_json(&json.to_string(), name).unwrap();
    let out = dir.join(name);
    save_checkpoint(&out, &Checkpoint::random(config, 0.2, 7), burn::tensor::DType::F32, Some(&fixture.join("tokenizer.json"))).unwrap();
    out
}

fn train(dir: &Path, ck: &Path, run: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["train", "small.toml", "--set", "train.steps=2", "--set", "task.reward=char_f1"];
    let (path, name) = (format!("model.path={}", ck.display()), format!("log.run_name={run}"));
    args.extend(["--set", &path, "--set", &name]);
    args.extend(extra.iter().flat_map(|s| ["--set", s]));
    let out = lockstep(&args, dir);
    assert!(out.status.success(), "{run}: {}", String::from_utf8_lossy(&out.stderr));
    metrics(&dir.join("runs").join(run))
}

#[test]
fn grpo_on_qwen2_llama_bias_and_llama31_checkpoints_is_bit_exact_and_micro_batch_invariant() {
    let dir = scratch("families");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let families = [
        ("qwen2", "Qwen2ForCausalLM", serde_json::json!({"use_sliding_window": false, "sliding_window": 131072, "max_window_layers": 2})),
        ("llama-bias", "LlamaForCausalLM", serde_json::json!({"attention_bias": true})),
        ("llama31", "LlamaForCausalLM", serde_json::json!({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}})),
    ];
    for (name, arch, extra) in families {
        let ck = family_checkpoint(&dir, name, arch, extra.clone());
        let one_pass = train(&dir, &ck, &format!("{name}-one-pass"), &[]);
        // micro-batches of at most 16 tokens: one sequence each (the rollouts are longer)
        let micro = train(&dir, &ck, &format!("{name}-micro"), &["train.micro_batch_tokens=16"]);
        assert_eq!(one_pass.len(), 2, "{name}");
        for (a, b) in one_pass.iter().zip(&micro) {
            for m in [a, b] {
                assert_eq!(m["agreement"]["bit_equal_frac"].as_f64(), Some(1.0), "{name}: {m}");
                assert_eq!(m["agreement"]["kl_k1"].as_f64(), Some(0.0), "{name}: {m}");
                assert_eq!(m["sampler_weights_fingerprint"], m["trainer_weights_fingerprint"], "{name}");
            }
            for key in ["trainer_weights_fingerprint", "grad_norm", "reward_mean"] {
                assert_eq!(a[key], b[key], "{name} step {}: {key} differs between one pass and micro-batches", a["step"]);
            }
        }
        assert!(one_pass.iter().any(|m| m["grad_norm"].as_f64().unwrap() > 0.0), "{name}: no real update: {one_pass:?}");
        // the final checkpoint holds the biases and keeps the RoPE setting, and loads again
        let last = dir.join(format!("runs/{name}-one-pass/checkpoints/step-000002"));
        let saved = shared_kernels::model::load_checkpoint(&last).unwrap();
        let biases = saved.tensors.keys().filter(|k| k.ends_with(".bias")).count();
        assert_eq!(biases, match name { "qwen2" => 2 * 3, "llama-bias" => 2 * 4, _ => 0 }, "{name}: bias tensors in {}", last.display());
        assert_eq!(saved.config.rope, shared_kernels::model::ModelConfig::from_json(&std::fs::read_to_string(ck.join("config.json")).unwrap(), "x").unwrap().rope, "{name}");
    }
}

/// A Qwen3-MoE checkpoint (a dense layer, then 8 experts of which 2 a token) as a user brings
/// it: `lockstep sample` runs it (the same answers twice); GRPO on it has the sampler's logprobs
/// equal to the trainer's as bits every step, and the update (router and experts included) does
/// not depend on the micro-batching.
#[test]
fn a_mixture_of_experts_checkpoint_samples_and_trains_bit_exact_and_micro_batch_invariant() {
    let dir = scratch("moe-family");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let ck = family_checkpoint(&dir, "moe", "Qwen3MoeForCausalLM", serde_json::json!({
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": true,
        "decoder_sparse_step": 1, "mlp_only_layers": [0]
    }));
    let saved = shared_kernels::model::load_checkpoint(&ck).unwrap();
    assert!(saved.tensors.contains_key("model.layers.1.mlp.experts.7.down_proj.weight") && !saved.tensors.contains_key("model.layers.1.mlp.gate_proj.weight"));
    std::fs::write(dir.join("p.jsonl"), "{\"prompt\": \"12+7=\"}\n{\"prompt\": \"3+4=\"}\n{\"prompt\": \"sort 31:\"}\n").unwrap();
    let path = format!("model.path={}", ck.display());
    let sample = |out: &str| {
        let o = lockstep(&["sample", "--set", &path, "--set", "sampler.input=p.jsonl", "--set", &format!("sampler.output={out}"), "--set", "sampler.max_new_tokens=12", "--set", "log.progress=false"], &dir);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read_to_string(dir.join(out)).unwrap()
    };
    let (a, b) = (sample("a.jsonl"), sample("b.jsonl"));
    assert_eq!(a, b);
    assert_eq!(a.lines().filter(|l| l.contains("\"token_ids\"")).count(), 3, "{a}");
    let one_pass = train(&dir, &ck, "moe-one-pass", &["train.steps=3"]);
    let micro = train(&dir, &ck, "moe-micro", &["train.steps=3", "train.micro_batch_tokens=16"]);
    assert_eq!(one_pass.len(), 3);
    for (x, y) in one_pass.iter().zip(&micro) {
        for m in [x, y] {
            assert_eq!(m["agreement"]["bit_equal_frac"].as_f64(), Some(1.0), "{m}");
            assert_eq!(m["agreement"]["kl_k1"].as_f64(), Some(0.0), "{m}");
        }
        for key in ["trainer_weights_fingerprint", "grad_norm", "reward_mean"] {
            assert_eq!(x[key], y[key], "step {}: {key} differs between one pass and micro-batches", x["step"]);
        }
    }
    assert!(one_pass.iter().filter(|m| m["grad_norm"].as_f64().unwrap() > 0.0).count() >= 2, "no real update: {one_pass:?}");
    // the routing telemetry: every sampled token compared, the same experts on both sides, and
    // each sparse layer's load over the step's rows (k = 2 experts a row) the same however the
    // step is micro-batched
    for (x, y) in one_pass.iter().zip(&micro) {
        for m in [x, y] {
            let moe = &m["moe"];
            assert_eq!(moe["routing_agreement"].as_f64(), Some(1.0), "{m}");
            assert_eq!(moe["routed_tokens"], m["agreement"]["tokens"], "every sampled token compared: {m}");
            let layers = moe["layers"].as_array().unwrap();
            assert_eq!(layers.iter().map(|l| l["layer"].as_u64().unwrap()).collect::<Vec<_>>(), vec![1], "the sparse layers: {m}");
            let routed: u64 = layers[0]["tokens_per_expert"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).sum();
            assert!(routed % 2 == 0 && routed > 2 * moe["routed_tokens"].as_u64().unwrap(), "two experts for every row, prompts included: {m}");
        }
        assert_eq!(x["moe"]["layers"], y["moe"]["layers"], "step {}: expert load differs between one pass and micro-batches", x["step"]);
    }
    // the load-balancing loss: the same weights in one pass and in micro-batches, other
    // weights than without it, and its value logged
    let aux = train(&dir, &ck, "moe-aux", &["train.steps=3", "train.router_aux_loss_coef=0.5"]);
    let aux_micro = train(&dir, &ck, "moe-aux-micro", &["train.steps=3", "train.router_aux_loss_coef=0.5", "train.micro_batch_tokens=16"]);
    let aux_recompute = train(&dir, &ck, "moe-aux-recompute", &["train.steps=3", "train.router_aux_loss_coef=0.5", "train.micro_batch_tokens=16", "train.recompute_layers=true"]);
    for (x, y) in aux_micro.iter().zip(&aux_recompute) {
        assert_eq!(x["trainer_weights_fingerprint"], y["trainer_weights_fingerprint"], "step {}: the load-balancing loss's update differs with recomputed layers", x["step"]);
    }
    for ((x, y), plain) in aux.iter().zip(&aux_micro).zip(&one_pass) {
        assert_eq!((x["agreement"]["bit_equal_frac"].as_f64(), y["agreement"]["bit_equal_frac"].as_f64()), (Some(1.0), Some(1.0)), "{x}");
        assert_eq!(x["trainer_weights_fingerprint"], y["trainer_weights_fingerprint"], "step {}: the load-balancing loss's update differs between one pass and micro-batches", x["step"]);
        assert_ne!(x["trainer_weights_fingerprint"], plain["trainer_weights_fingerprint"], "step {}: the load-balancing loss changed no weight", x["step"]);
        let lbl = x["moe"]["load_balancing_loss"].as_f64().unwrap();
        assert!(lbl > 0.0 && x["moe"]["aux_loss"].as_f64() == Some(0.5 * lbl), "{x}");
    }
    let dense = lockstep(&["train", "small.toml", "--set", &format!("model.path={}", Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared-kernels/tests/fixtures/tiny-qwen3").display()), "--set", "train.router_aux_loss_coef=0.1", "--set", "log.run_name=dense-aux"], &dir);
    let err = String::from_utf8_lossy(&dense.stderr);
    assert!(dense.status.code() == Some(2) && err.contains("train.router_aux_loss_coef") && err.contains("dense"), "{err}");
    // the ablation's fast kernels in the sampler: the routing is still compared token by token
    for m in train(&dir, &ck, "moe-fast", &["ablation.sampler_kernels=fast", "ablation.correction=tis"]) {
        let agreement = m["moe"]["routing_agreement"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&agreement) && m["moe"]["routed_tokens"] == m["agreement"]["tokens"], "{m}");
    }
    // LoRA on the attention projections of the MoE model, and on every projection (each
    // expert's gate / up / down too): bit-exact, the adapters' update independent of the
    // micro-batching, the adapters saved in PEFT's per-expert layout and sampled from
    let lora = train(&dir, &ck, "moe-lora", &["lora.rank=4", "lora.target_modules=[\"q_proj\", \"v_proj\"]"]);
    assert!(lora.iter().all(|m| m["agreement"]["bit_equal_frac"].as_f64() == Some(1.0)), "{lora:?}");
    let experts_one = train(&dir, &ck, "moe-lora-experts", &["lora.rank=4", "lora.init=gaussian", "train.steps=3"]);
    let experts_micro = train(&dir, &ck, "moe-lora-experts-micro", &["lora.rank=4", "lora.init=gaussian", "train.steps=3", "train.micro_batch_tokens=16"]);
    for (x, y) in experts_one.iter().zip(&experts_micro) {
        assert_eq!((x["agreement"]["bit_equal_frac"].as_f64(), y["agreement"]["bit_equal_frac"].as_f64()), (Some(1.0), Some(1.0)), "{x}");
        assert_eq!(x["trainer_weights_fingerprint"], y["trainer_weights_fingerprint"], "step {}: expert adapters differ between one pass and micro-batches", x["step"]);
    }
    let step3 = dir.join("runs/moe-lora-experts/checkpoints/step-000003");
    let bytes = std::fs::read(step3.join("adapter_model.safetensors")).unwrap();
    let adapters = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let expert_b = adapters.tensor("base_model.model.model.layers.1.mlp.experts.7.down_proj.lora_B.weight").expect("an expert's adapter in PEFT's per-expert layout");
    assert_eq!(expert_b.shape(), [64, 4], "down_proj's lora_B: [hidden, rank]");
    assert!(expert_b.data().iter().any(|&b| b != 0), "the expert's lora_B was not trained");
    // layer 0 is dense (mlp_only_layers): its MLP adapters sit on the layer's own projections
    assert!(adapters.tensor("base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight").is_ok());
    let o = lockstep(&["sample", "--set", &path, "--set", &format!("lora.path={}", step3.display()), "--set", "sampler.input=p.jsonl", "--set", "sampler.output=lora.jsonl", "--set", "sampler.max_new_tokens=12", "--set", "log.progress=false"], &dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // merged for export: each expert's adapter folded into that expert's weights
    let o = lockstep(&["merge-lora", "--set", &path, "--set", &format!("lora.path={}", step3.display()), "--out", "moe-merged"], &dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let merged = shared_kernels::model::load_checkpoint(&dir.join("moe-merged")).unwrap();
    let name = "model.layers.1.mlp.experts.7.down_proj.weight";
    assert_ne!(merged.tensors[name].1, saved.tensors[name].1, "{name}: the expert's adapter was not merged");
    // the router and the experts were trained: the last checkpoint's differ from the start's
    let last = shared_kernels::model::load_checkpoint(&dir.join("runs/moe-one-pass/checkpoints/step-000003")).unwrap();
    for name in ["model.layers.1.mlp.gate.weight", "model.layers.1.mlp.experts.0.up_proj.weight"] {
        assert_ne!(last.tensors[name].1, saved.tensors[name].1, "{name} did not change");
    }
}
