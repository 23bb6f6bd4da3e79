//! The auto sizes on the shapes and cards users run: Qwen3 0.6B to 8B on an 80 GB H100 and a
//! 141 GB H200.

use super::*;

fn qwen3(hidden: usize, intermediate: usize, layers: usize, heads: usize, tied: bool) -> ModelConfig {
    let json = serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "hidden_size": hidden,
        "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": 8,
        "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960, "tie_word_embeddings": tied
    });
    ModelConfig::from_json(&json.to_string(), "test").unwrap()
}

/// An 80 GB card as the driver reports an idle H100 (79.1 GiB, ~0.5 GiB taken by the context).
const H100: DeviceMemory = DeviceMemory { total: 85_024_112_640, free: 84_500_000_000, tensor_limit: None };
const H200: DeviceMemory = DeviceMemory { total: 150_110_011_392, free: 149_500_000_000, tensor_limit: None };

/// A GRPO rung: `rollouts` x `new_tokens` in bf16, as configs/qwen3-*.toml set it.
fn rung(prompts: usize, group: usize, new_tokens: usize, max_batch: usize) -> Config {
    let mut c = Config::default();
    c.model.dtype = "bf16".into();
    c.model.path = "/some/checkpoint".into();
    (c.train.prompts_per_step, c.train.group_size) = (prompts, group);
    (c.sampler.max_new_tokens, c.sampler.context, c.sampler.max_batch) = (new_tokens, new_tokens + 64, max_batch);
    c
}

/// The planned total of a resolved config: fixed + KV + one pass with the margin.
fn planned(c: &Config, m: &ModelConfig) -> f64 {
    let plan = MemoryPlan::of_rank(c, m, 2, Purpose::Train, 1);
    let shape = Shape::of(c, m, 2);
    plan.fixed_bytes() as f64 + shape.activation_bytes(c, shape.clamp_pass(c, c.train.pass_tokens())) * ACTIVATION_MARGIN
}

#[test]
fn auto_sizes_fit_the_card_and_an_explicit_size_wins() {
    for (name, m, c) in [("0.6B 512 x 2048", qwen3(1024, 3072, 28, 16, true), rung(32, 16, 2048, 256)), ("1.7B 256 x 4096", qwen3(2048, 6144, 28, 16, true), rung(16, 16, 4096, 256))] {
        for mem in [H100, H200] {
            let (sized, line) = choose(&c, &m, 2, Purpose::Train, 1, &mem).unwrap_or_else(|e| panic!("{name}: {e}"));
            eprintln!("{name}: {line}");
            let (micro, kv) = (sized.train.pass_tokens(), sized.sampler.kv_budget_mib.set().unwrap());
            assert!(micro >= c.sampler.context && kv * 1048576.0 >= Shape::of(&c, &m, 2).per_block * Shape::request_blocks(&c), "{name}: {line}");
            assert!(planned(&sized, &m) <= mem.usable(), "{name}: {line}: {} planned > {} usable", planned(&sized, &m), mem.usable());
            assert!(line.contains(&format!("train.micro_batch_tokens = {micro}")) && line.contains("sampler.kv_budget_mib = "), "{line}");
            // an explicit size is kept, the other key takes what it leaves
            let mut set = c.clone();
            set.train.micro_batch_tokens = Sizing::Set(c.sampler.context);
            let (kept, _) = choose(&set, &m, 2, Purpose::Train, 1, &mem).unwrap();
            assert_eq!(kept.train.micro_batch_tokens, Sizing::Set(c.sampler.context));
            assert!(kept.sampler.kv_budget_mib.set().unwrap() >= kv, "{name}: a smaller pass leaves the cache no less");
        }
    }
    // the 141 GB card holds more in flight than the 80 GB one
    let (m, c) = (qwen3(1024, 3072, 28, 16, true), rung(32, 16, 2048, 256));
    let kv = |mem| choose(&c, &m, 2, Purpose::Train, 1, &mem).unwrap().0.sampler.kv_budget_mib.set().unwrap();
    assert!(kv(H200) > kv(H100));
}

#[test]
fn the_h200_configs_pool_on_an_80_gb_card_is_refused_naming_sizes_that_fit() {
    // configs/qwen3-0.6b.toml as it was: a 62,000 MiB pool beside 16,384-token passes ran
    // out of memory in step 0's update on an H100
    let (m, mut c) = (qwen3(1024, 3072, 28, 16, true), rung(32, 16, 2048, 256));
    c.sampler.kv_budget_mib = Sizing::Set(62_000.0);
    c.train.micro_batch_tokens = Sizing::Set(16_384);
    let err = choose(&c, &m, 2, Purpose::Train, 1, &H100).unwrap_err().to_string();
    assert!(err.contains("train.micro_batch_tokens") && err.contains("does not fit") && err.contains("free of"), "{err}");
    // the values it names fit
    let value = |key: &str| err.split(&format!("{key} = ")).nth(1).and_then(|r| r.split(|ch: char| !ch.is_ascii_digit() && ch != '.').next()).and_then(|v| v.parse::<f64>().ok()).unwrap_or_else(|| panic!("{key} in {err}"));
    c.sampler.kv_budget_mib = Sizing::Set(value("sampler.kv_budget_mib"));
    c.train.micro_batch_tokens = Sizing::Set(value("train.micro_batch_tokens") as usize);
    let (sized, _) = choose(&c, &m, 2, Purpose::Train, 1, &H100).unwrap_or_else(|e| panic!("the suggested sizes do not fit: {e}"));
    assert!(planned(&sized, &m) <= H100.usable());
    // and fit the H200 as written
    c.sampler.kv_budget_mib = Sizing::Set(62_000.0);
    c.train.micro_batch_tokens = Sizing::Set(16_384);
    assert!(choose(&c, &m, 2, Purpose::Train, 1, &H200).is_ok());
}

#[test]
fn full_parameter_4b_on_an_80_gb_card_is_refused_before_loading_naming_the_levers() {
    let (m, c) = (qwen3(2560, 9728, 36, 32, true), rung(16, 8, 2048, 128));
    let err = choose(&c, &m, 2, Purpose::Train, 1, &H100).unwrap_err().to_string();
    assert!(err.contains("model.path") && err.contains("--gpus") && err.contains("does not fit"), "{err}");
    // sampling it fits, with one copy of the weights
    let (_, line) = choose(&c, &m, 2, Purpose::Sample, 1, &H100).unwrap();
    assert!(line.contains("sampler.kv_budget_mib"), "{line}");
}

#[test]
fn sampling_8b_on_an_80_gb_card_holds_one_copy_of_the_weights() {
    let (m, mut c) = (qwen3(4096, 12288, 36, 32, false), rung(1, 2, 100, 256));
    c.sampler.context = 1024;
    let plan = MemoryPlan::of(&c, &m, 2, Purpose::Sample);
    let weights: Vec<&Part> = plan.fixed.iter().filter(|p| p.what.starts_with("weights")).collect();
    assert_eq!(weights.len(), 1);
    assert!((weights[0].bytes as f64 / 1e9 - 16.4).abs() < 0.1, "{}", plan.summary(None));
    let (sized, _) = choose(&c, &m, 2, Purpose::Sample, 1, &H100).unwrap();
    // 256 requests of 1,024 positions: a full cache (37.7 GB) fits beside the weights
    let full = Shape::of(&c, &m, 2).kv_full_bytes(&c);
    assert!((sized.sampler.kv_budget_mib.set().unwrap() * 1048576.0 - full).abs() < Shape::of(&c, &m, 2).per_block * 2.0);
}

#[test]
fn a_share_of_the_device_and_a_binding_limit_bound_the_auto_sizes() {
    let (m, c) = (qwen3(1024, 3072, 28, 16, true), rung(32, 16, 2048, 256));
    let half = DeviceMemory { total: H100.total / 2, free: H100.free / 2, tensor_limit: None };
    let kv = |mem: &DeviceMemory| choose(&c, &m, 2, Purpose::Train, 1, mem).unwrap().0.sampler.kv_budget_mib.set().unwrap();
    assert!(kv(&half) < kv(&H100));
    let bound = DeviceMemory { tensor_limit: Some(256 << 20), ..H100 };
    let (sized, _) = choose(&c, &m, 2, Purpose::Train, 1, &bound).unwrap();
    let plan = MemoryPlan::of(&sized, &m, 2, Purpose::Train);
    assert!(plan.kv_layer_bytes <= 256 << 20, "{}", plan.kv_layer_bytes);
    assert!(sized.train.pass_tokens() as f64 * Shape::widest(&m) as f64 * 4.0 <= (256u64 << 20) as f64);
}

/// configs/qwen3-8b.toml as shipped (256 requests, 64-token chunks, 2,112 positions) on an H100:
/// the auto KV cache leaves room for a step's buffers, the split attention's partials included
/// (a 6.89 GB allocation of its first step did not fit when the plan left them out), which are
/// one row a request since the one-row tiles' inputs are gathered (not every row of the step).
#[test]
fn sampling_8b_as_shipped_keeps_room_for_a_steps_attention_partials() {
    let m = qwen3(4096, 12288, 36, 32, false);
    let c = Config::load(Some(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/qwen3-8b.toml"))), &[]).unwrap();
    let shape = Shape::of(&c, &m, 2);
    let step = sampler_step_bytes(&c, &shape);
    let one_row_a_request = 256.0 * 32.0 * 33.0 * 130.0 * 4.0;
    let every_row = 64.0 * one_row_a_request;
    assert!(step > one_row_a_request && step < every_row, "step buffers {step}");
    // a KV group too wide for two-row prefill tiles counts every row of the step
    let mut wide = Shape::of(&c, &m, 2);
    wide.group = 32;
    assert!(sampler_step_bytes(&c, &wide) > every_row);
    let (sized, _) = choose(&c, &m, 2, Purpose::Sample, 1, &H100).unwrap();
    let plan = MemoryPlan::of(&sized, &m, 2, Purpose::Sample);
    assert!(plan.fixed_bytes() as f64 + step <= H100.free as f64 - H100.reserve(), "{} + {step}", plan.summary(Some(H100.total)));
}

/// A mixture-of-experts model's pass counts each sparse layer's k experts a token (not a dense
/// MLP's intermediate) and the experts' padded training layout: Qwen3-30B-A3B's shape.
#[test]
fn a_mixture_of_experts_pass_counts_every_token_s_experts_and_the_padded_layout() {
    let moe = |top_k: usize, sparse_step: usize| {
        let json = serde_json::json!({
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
            "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
            "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960, "tie_word_embeddings": false,
            "num_experts": 128, "num_experts_per_tok": top_k, "moe_intermediate_size": 768, "decoder_sparse_step": sparse_step
        });
        ModelConfig::from_json(&json.to_string(), "test").unwrap()
    };
    let c = rung(8, 8, 1024, 64);
    let act = |m: &ModelConfig| Shape::of(&c, m, 2).activation_bytes(&c, 4096.0);
    // top-8 against top-2 at 4,096 tokens: 6 more experts' values (4 x 2048 + 3 x 768) a token
    // in each of the 48 sparse layers, in bf16
    let per_expert = (4.0 * 2048.0 + 3.0 * 768.0) * 2.0;
    assert_eq!(act(&moe(8, 1)) - act(&moe(2, 1)), 4096.0 * 48.0 * 6.0 * per_expert);
    // every second layer sparse: the other 24 count a dense MLP of intermediate_size
    let half = act(&moe(8, 2));
    let (sparse_token, dense_token) = ((8.0 * per_expert / 2.0 + 128.0) * 2.0, 4.0 * 6144.0 * 2.0);
    assert!((act(&moe(8, 1)) - half - 4096.0 * 24.0 * (sparse_token - dense_token) - 24.0 * 128.0 * 4.0 * 15.0 * (2.0 * 2048.0 + 3.0 * 768.0) * 2.0).abs() < 1.0);
}

/// The 1.7B 256 x 4096 rung on an H100 (docs/scale.md): without recomputation the KV cache
/// held 51 requests (step 253.2 s), with it 72 (215.6 s, the same weights). An auto
/// `train.recompute_layers` is on there, off where the cache holds every request anyway and
/// when sampling; a set value wins (and off says what on would give); a run that fits only
/// with it gets it.
#[test]
fn auto_recomputation_is_on_where_it_holds_far_more_requests_in_flight() {
    let (m, c) = (qwen3(2048, 6144, 28, 16, true), rung(16, 16, 4096, 256));
    let (sized, line) = choose(&c, &m, 2, Purpose::Train, 1, &H100).unwrap();
    eprintln!("{line}");
    let requests = |c: &Config| requests_in_flight(c, &m, 2);
    let (on, without) = (requests(&sized), {
        let mut off = c.clone();
        off.train.recompute_layers = Sizing::Set(false);
        let (kept, line) = choose(&off, &m, 2, Purpose::Train, 1, &H100).unwrap();
        assert_eq!(kept.train.recompute_layers, Sizing::Set(false));
        assert!(line.contains(&format!("would hold {} requests instead of {}", requests(&sized), requests(&kept))), "{line}");
        requests(&kept)
    });
    assert_eq!(sized.train.recompute_layers, Sizing::Set(true), "{line}");
    assert!(on >= RECOMPUTE_GAIN * without, "{on} vs {without}");
    assert!(line.contains(&format!("train.recompute_layers = true ({on} requests in flight instead of {without}")), "{line}");
    assert!(planned(&sized, &m) <= H100.usable());
    // set on: kept
    let mut set = c.clone();
    set.train.recompute_layers = Sizing::Set(true);
    assert_eq!(choose(&set, &m, 2, Purpose::Train, 1, &H100).unwrap().0.sampler.kv_budget_mib, sized.sampler.kv_budget_mib);
    // every request in flight either way: off; sampling: off
    let small = rung(4, 16, 1024, 64);
    let (sized, line) = choose(&small, &qwen3(1024, 3072, 28, 16, true), 2, Purpose::Train, 1, &H100).unwrap();
    assert_eq!(sized.train.recompute_layers, Sizing::Set(false), "{line}");
    assert!(!line.contains("recompute"), "{line}");
    assert_eq!(choose(&c, &m, 2, Purpose::Sample, 1, &H100).unwrap().0.train.recompute_layers, Sizing::Set(false));
    // a card too small for one 4,160-token pass beside the fixed state without recomputation
    let mut whole = c.clone();
    whole.sampler.kv_budget_mib = Sizing::Set(2_000.0);
    let fixed_and_kv = planned(&{ let mut x = whole.clone(); x.train.micro_batch_tokens = Sizing::Set(4160); x.train.recompute_layers = Sizing::Set(true); x }, &m);
    let reserve = H100.reserve();
    let small_card = DeviceMemory { total: H100.total, free: (fixed_and_kv + reserve + 1e9) as u64, tensor_limit: None };
    let mut off = whole.clone();
    off.train.recompute_layers = Sizing::Set(false);
    let err = choose(&off, &m, 2, Purpose::Train, 1, &small_card).unwrap_err().to_string();
    assert!(err.contains("train.recompute_layers = true"), "{err}");
    let (sized, line) = choose(&whole, &m, 2, Purpose::Train, 1, &small_card).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(sized.train.recompute_layers, Sizing::Set(true), "{line}");
    assert!(line.contains("the run does not fit without it"), "{line}");
}
