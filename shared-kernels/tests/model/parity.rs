//! Parity with transformers: a tiny random Qwen3 made by tests/fixtures/make_tiny_qwen3.py
//! (transformers 5 / torch 2.11 on the H200 machine), and tiny Llama 3.1, YaRN Qwen3, Qwen2 and
//! biased Llama checkpoints made by tests/fixtures/make_tiny_families.py; f32, eager attention.

use burn::tensor::DType;
use shared_kernels::model::moe::{load_balancing_loss, RoutingLog};
use shared_kernels::model::{load_tokenizer, Forward, Qwen3, Rows};
use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen3")
}

#[test]
fn logits_match_transformers_and_tokenizer_matches_hf_tokenizers() {
    let dir = fixture();
    let parity: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("parity.json")).unwrap()).unwrap();
    let tokenizer = load_tokenizer(&dir.join("tokenizer.json")).unwrap();
    let model = Qwen3::load(&dir, DType::F32, &crate::device()).unwrap();
    for record in parity["records"].as_array().unwrap() {
        let text = record["text"].as_str().unwrap();
        assert_eq!(tokenizer.encode(text, false).unwrap().get_ids(), record_ids(record).as_slice(), "tokenizer ids for {text:?}");
    }
    let worst = worst_logit_diff("tiny-qwen3", &model, &parity);
    eprintln!("worst |logit diff| vs transformers: {worst:.3e}");
}

fn record_ids(record: &serde_json::Value) -> Vec<u32> {
    record["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

/// The largest |logit difference| from transformers' logits over a fixture's records, each
/// asserted within 1e-4 + 1e-5 |logit|: f32 end to end on both sides, different reduction orders
/// (and, for scaled RoPE, frequencies made in f32 there and f64 here), on logits of magnitude
/// ~1-10 (the measured worst is printed by the callers).
fn worst_logit_diff(name: &str, model: &Qwen3, parity: &serde_json::Value) -> f64 {
    let mut worst = 0.0f64;
    for record in parity["records"].as_array().unwrap() {
        let ids = record_ids(record);
        let logits = model.forward(&Rows::whole(&[ids.clone()]), None).unwrap();
        let got = logits.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let want: Vec<f64> = record["logits"].as_array().unwrap().iter().flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap())).collect();
        assert_eq!(got.len(), want.len());
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let err = (g as f64 - w).abs();
            worst = worst.max(err);
            assert!(err < 1e-4 + 1e-5 * w.abs(), "{name}, {} ids, logit {i}: lockstep {g} vs transformers {w}", ids.len());
        }
    }
    worst
}

/// The families beyond plain Qwen3 against transformers (fixtures from
/// tests/fixtures/make_tiny_families.py, f32, eager attention, 5-120 positions, configs spelled as
/// the Hub ships them): Llama 3.1's `llama3` RoPE scaling on a tied Llama without q/k norm, YaRN
/// on a Qwen3, a Qwen2 (q/k/v biases), and a Llama with `attention_bias` (q/k/v/o biases).
#[test]
fn other_families_logits_match_transformers() {
    use shared_kernels::model::RopeScaling;
    for name in ["tiny-llama31", "tiny-qwen3-yarn", "tiny-qwen2", "tiny-llama-bias"] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
        let parity: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("parity.json")).unwrap()).unwrap();
        let model = Qwen3::load(&dir, DType::F32, &crate::device()).unwrap();
        let c = &model.config;
        // what each fixture is there to test is what the config was read as
        let features = (c.rope.scaling != RopeScaling::Default, c.qk_norm, c.qkv_bias, c.o_bias);
        let want_features = match name {
            "tiny-llama31" => (true, false, false, false),
            "tiny-qwen3-yarn" => (true, true, false, false),
            "tiny-qwen2" => (false, false, true, false),
            _ => (false, false, true, true),
        };
        assert_eq!(features, want_features, "{name}: (scaled rope, qk norm, qkv bias, o bias)");
        let worst = worst_logit_diff(name, &model, &parity);
        eprintln!("{name}: worst |logit diff| vs transformers: {worst:.3e}");
    }
}

/// Qwen3-MoE against transformers' `Qwen3MoeForCausalLM` (fixtures from
/// tests/fixtures/make_tiny_moe_and_lora.py, f32, eager attention): 8, 16 and 64 experts, top-2,
/// -4 and -8, `norm_topk_prob` on and off, a dense layer by `mlp_only_layers` and by
/// `decoder_sparse_step` 2, each config read as transformers reads it.
#[test]
fn mixture_of_experts_logits_match_transformers() {
    let cases: [(&str, (usize, usize, bool), &[bool]); 3] = [
        ("tiny-qwen3-moe-a", (8, 2, true), &[false, true, true]),
        ("tiny-qwen3-moe-b", (16, 4, false), &[false, true, false, false]),
        ("tiny-qwen3-moe-c", (64, 8, true), &[true, true]),
    ];
    for (name, (experts, top_k, norm), sparse) in cases {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
        let parity: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("parity.json")).unwrap()).unwrap();
        let model = Qwen3::load(&dir, DType::F32, &crate::device()).unwrap();
        let m = model.config.moe.as_ref().unwrap_or_else(|| panic!("{name}: read as a dense model"));
        assert_eq!((m.num_experts, m.top_k, m.norm_topk_prob), (experts, top_k, norm), "{name}: (experts, top-k, norm_topk_prob)");
        let read: Vec<bool> = model.layers.iter().map(|l| l.moe.is_some()).collect();
        assert_eq!(read, sparse, "{name}: which layers are sparse");
        let worst = worst_logit_diff(name, &model, &parity);
        eprintln!("{name}: worst |logit diff| vs transformers: {worst:.3e}");
        // the load-balancing loss over each record: transformers' value (output_router_logits)
        for record in parity["records"].as_array().unwrap() {
            let ids = record_ids(record);
            let rows = Rows::whole(&[ids.clone()]);
            let mut log = RoutingLog::default();
            model.run(Forward::rows(&rows).logits_at(&[]).routing(&mut log)).unwrap();
            let (counts, probs, layer_rows) = log.load_balancing_sums(rows.len(), experts);
            let got = load_balancing_loss(&counts, &probs, layer_rows);
            let want = record["load_balancing_loss"].as_f64().unwrap();
            assert!((got - want).abs() <= 1e-5 * want.abs(), "{name}, {} ids: load-balancing loss {got} vs transformers {want}", ids.len());
        }
    }
}

/// A LoRA adapter made and saved by PEFT (`get_peft_model` + `save_pretrained`, rank 4 on every
/// linear projection of tiny-qwen3, tests/fixtures/make_tiny_moe_and_lora.py) loads onto the base
/// and gives `PeftModel`'s logits.
#[test]
fn a_peft_adapter_gives_peft_logits() {
    use shared_kernels::model::lora_files::load_adapters;
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dir = fixtures.join("tiny-qwen3-lora");
    let parity: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("parity.json")).unwrap()).unwrap();
    let base = Qwen3::load(&fixtures.join("tiny-qwen3"), DType::F32, &crate::device()).unwrap();
    let (spec, adapters, _) = load_adapters(&dir, &base.config, DType::F32, &crate::device()).unwrap();
    assert_eq!((spec.rank, spec.targets.len()), (4, 7), "rank and projections read from PEFT's adapter_config.json");
    let adapted = base.clone().with_adapters(spec, adapters).unwrap();
    let worst = worst_logit_diff("tiny-qwen3-lora", &adapted, &parity);
    eprintln!("tiny-qwen3-lora: worst |logit diff| vs PEFT: {worst:.3e}");
    // the adapter matters: the base alone is far from PeftModel's logits somewhere
    let ids = record_ids(&parity["records"][0]);
    let plain = base.forward(&Rows::whole(&[ids.clone()]), None).unwrap().into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
    let want: Vec<f64> = parity["records"][0]["logits"].as_array().unwrap().iter().flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap())).collect();
    assert!(plain.iter().zip(&want).any(|(&g, &w)| (g as f64 - w).abs() > 1e-2), "the base model alone gives PEFT's logits: the fixture's adapter tests nothing");
}
