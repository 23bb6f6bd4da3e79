//! `lockstep bench`: speed, measured side by side in one run (never in tests).
//!
//! 1. Sampler throughput: generated tokens/s at several concurrencies, lockstep's kernels
//!    ("matched") against the same engine on burn's default matmul/rmsnorm ("fast").
//! 2. Kernels: time per call of lockstep's matmul / rmsnorm / logprob against burn's default op
//!    on the same inputs, at several batch sizes.
//! Every timing syncs the device; each number is the median of `repeats` runs after a warm-up.

use burn::tensor::{DType, Device};
use sampler::{Engine, EngineConfig, Request, SamplingParams};
use shared_kernels::model::{Checkpoint, KernelSet, ModelConfig, Qwen3};
use std::time::Instant;

pub use super::bench_options::BenchOptions;
use super::bench_options::{median, sync};

/// How the sampler table's requests sample (a kernel set's suffix).
#[derive(Clone, Copy, PartialEq)]
enum Sampling {
    /// T = 1 over the full vocabulary: no truncation kernel.
    Full,
    /// Qwen3's recommended top-p 0.95 / top-k 20 at T = 1, raw or processed logprobs.
    Truncated { processed: bool },
}

impl Sampling {
    fn params(self, max_new_tokens: usize) -> SamplingParams {
        let (top_k, top_p, processed_logprobs) = match self {
            Sampling::Full => (0, 1.0, false),
            Sampling::Truncated { processed } => (20, 0.95, processed),
        };
        SamplingParams { temperature: 1.0, top_k, top_p, max_new_tokens, stop_tokens: vec![], stop: vec![], seed: 1, noise_key: None, processed_logprobs, top_logprobs: 0 }
    }

    fn label(self) -> &'static str {
        match self {
            Sampling::Full => "",
            Sampling::Truncated { processed: false } => " top-p 0.95 / top-k 20",
            Sampling::Truncated { processed: true } => " top-p 0.95 / top-k 20, processed logprobs",
        }
    }
}

/// A `--kernels` name: (kernel set, overlapped steps, graphs, padded row counts, sampling).
fn kernel_set(name: &str) -> Result<(KernelSet, bool, bool, bool, Sampling, bool), String> {
    let (set, sampling) = match name.split_once('+') {
        None => (name, Sampling::Full),
        Some((set, "topp")) => (set, Sampling::Truncated { processed: false }),
        Some((set, "processed")) => (set, Sampling::Truncated { processed: true }),
        Some((_, other)) => return Err(format!("--kernels: unknown sampling suffix `+{other}` in `{name}` (+topp, +processed)")),
    };
    let (kernels, overlap, graphs, padding) = match set {
        "matched" => (KernelSet::Matched, true, false, false),
        "sync" => (KernelSet::Matched, false, false, false),
        "graphs" => (KernelSet::Matched, true, true, false),
        "graphs-padded" => (KernelSet::Matched, true, true, true),
        "unfused" => (KernelSet::Matched, true, false, false),
        "fast" => (KernelSet::Fast, true, false, false),
        "split_k" => (KernelSet::SplitK, true, false, false),
        "bf16_logits" => (KernelSet::Bf16Logits, true, false, false),
        other => return Err(format!("--kernels: unknown kernel set `{other}` (matched, sync, graphs, graphs-padded, unfused, fast, split_k, bf16_logits; a suffix +topp or +processed samples with top-p 0.95 / top-k 20)")),
    };
    // `unfused`: the matched kernels without the decode path's fused launches (the same bits)
    Ok((kernels, overlap, graphs, padding, sampling, set != "unfused"))
}

pub fn preset(name: &str) -> Result<ModelConfig, String> {
    let json = match name {
        "tiny" => serde_json::json!({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512, "tie_word_embeddings": true}),
        "small" => serde_json::json!({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "max_position_embeddings": 1024, "tie_word_embeddings": true}),
        "qwen3-0.6b" => serde_json::json!({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960, "tie_word_embeddings": true}),
        "qwen3-1.7b" => serde_json::json!({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960, "tie_word_embeddings": true}),
        "qwen3-4b" => serde_json::json!({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960, "tie_word_embeddings": true}),
        "qwen3-8b" => serde_json::json!({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960, "tie_word_embeddings": false}),
        // mixture-of-experts (the shapes experiments/fixtures/make_real_shape.py makes): a tiny
        // one (a dense layer, then 8 experts, 2 a token), 32 experts top-4, issue 65's GRPO
        // target (64 experts, top-8, 1.3B parameters) and Qwen3-30B-A3B's
        "moe-tiny" => serde_json::json!({"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512, "tie_word_embeddings": true, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": true, "mlp_only_layers": [0]}),
        "qwen3-moe-small" | "qwen3-moe-1b" | "qwen3-30b-a3b" => {
            let (layers, hidden, heads, inter, experts, top_k, width) = match name {
                "qwen3-moe-small" => (8, 1024, 16, 3072, 32, 4, 512),
                "qwen3-moe-1b" => (12, 1024, 16, 3072, 64, 8, 384),
                _ => (48, 2048, 32, 6144, 128, 8, 768),
            };
            serde_json::json!({"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 151936, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 40960, "tie_word_embeddings": false, "num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": width, "norm_topk_prob": true})
        }
        other => return Err(format!("unknown preset `{other}` (tiny, small, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, moe-tiny, qwen3-moe-small, qwen3-moe-1b, qwen3-30b-a3b)")),
    };
    ModelConfig::from_json(&json.to_string(), "bench preset").map_err(|e| e.to_string())
}

/// Loading the checkpoint in `dir` as `dtype`: the f32 host copy (every weight widened to f32
/// on the host, then cast on the device; below 4 GB) against the memory-mapped path, staged by
/// cubecl or copied by the driver from the mapping, each timed to the device's last copy and split by
/// phase, with every model's weight fingerprint (they must all match).
fn load_bench(dir: &std::path::Path, dtype: DType, device: &Device) -> Result<(), String> {
    let bytes: u64 = std::fs::read_dir(dir).map_err(|e| e.to_string())?.filter_map(|e| e.ok()).filter(|e| e.path().extension().is_some_and(|x| x == "safetensors")).filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum();
    // a first read puts the files in the page cache for every timed path alike
    for e in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
        if e.path().extension().is_some_and(|x| x == "safetensors") {
            std::io::copy(&mut std::fs::File::open(e.path()).map_err(|e| e.to_string())?, &mut std::io::sink()).map_err(|e| e.to_string())?;
        }
    }
    let fingerprint = |m: &Qwen3| trainer::grpo::weights_fingerprint(m, dtype).map_err(|e| e.to_string());
    println!("## checkpoint load: {:.2} GB of safetensors as {dtype:?}, runtime {}\n", bytes as f64 / 1e9, shared_kernels::device::runtime_name());
    println!("| path | seconds | GB/s | map and check s | to the runtime s | waiting s | weights fingerprint |");
    println!("|---|---|---|---|---|---|---|");
    // the f32 host copy (the reference) up to 4 GB: a 16 GB checkpoint's takes over a minute
    let mut reference = None;
    if bytes < 4_000_000_000 {
        let t = std::time::Instant::now();
        let old = Qwen3::from_checkpoint(&shared_kernels::model::load_checkpoint(dir).map_err(|e| e.to_string())?, dtype, device).map_err(|e| e.to_string())?;
        sync(device);
        let old_s = t.elapsed().as_secs_f64();
        let old_fp = fingerprint(&old)?;
        println!("| f32 host copy, cast on the device | {old_s:.2} | {:.2} | - | - | - | {old_fp} |", bytes as f64 / 1e9 / old_s);
        reference = Some(old_fp);
    }
    let mut differ = Vec::new();
    use shared_kernels::model::mapped::HostCopy;
    for copy in [HostCopy::Staged, HostCopy::Direct] {
        let (m, p) = shared_kernels::model::load::load_timed(dir, dtype, device, copy).map_err(|e| e.to_string())?;
        let fp = fingerprint(&m)?;
        drop(m);
        println!("| memory-mapped, {copy:?} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {fp} |", p.total_s, bytes as f64 / 1e9 / p.total_s, p.open_check_s, p.build_s, p.wait_s);
        if *reference.get_or_insert_with(|| fp.clone()) != fp {
            differ.push(format!("{copy:?}"));
        }
    }
    println!("\nfingerprints {}", if differ.is_empty() { "all equal".to_string() } else { format!("DIFFER: {differ:?}") });
    if !differ.is_empty() {
        return Err("the load paths gave different weights".into());
    }
    Ok(())
}

/// The bench and `check` build their model from a random f32 checkpoint on the host, and on a CPU runtime
/// the device's copies live in host memory too: a preset past the host's free memory would be
/// killed by the OS mid-run, so it is refused naming `--preset` and the sizes.
pub(crate) fn check_host_memory(config: &ModelConfig, preset: &str) -> Result<(), String> {
    let params: f64 = config.expected_tensors().iter().map(|(_, shape)| shape.iter().product::<usize>() as f64).sum();
    // bytes a parameter at the peak: on the CPU runtime qwen3-0.6b's 0.6e9 parameters peaked at
    // 9.9 GB; on CUDA the f32 checkpoint and its staging
    let per_parameter = if shared_kernels::device::runtime_name() == "cuda" { 8.0 } else { 17.0 };
    let need = params * per_parameter;
    match host_available_bytes() {
        Some(free) if need > free as f64 => Err(format!(
            "--preset {preset}: its {:.2e} parameters need about {:.0} GB of host memory for the random checkpoint on the {} runtime, and {:.0} GB is free; pick a smaller preset (or the --tile-sweep, which builds no model)",
            params,
            need / 1e9,
            shared_kernels::device::runtime_name(),
            free as f64 / 1e9
        )),
        _ => Ok(()),
    }
}

/// `MemAvailable` of /proc/meminfo, in bytes (`None` where there is no such file).
fn host_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}



pub fn run(o: &BenchOptions) -> Result<(), String> {
    if o.matmul_m.contains(&0) {
        return Err(format!("--matmul-m: every size must be at least 1, got {:?}", o.matmul_m));
    }
    if o.concurrency.contains(&0) {
        return Err(format!("--concurrency: every level must be at least 1 request, got {:?}", o.concurrency));
    }
    if !o.concurrency.is_empty() && (o.prompt_len == 0 || o.new_tokens == 0) {
        return Err(format!("--prompt-len and --new-tokens must be at least 1 for the sampler rows, got {} and {}", o.prompt_len, o.new_tokens));
    }
    // the JSON's folder must take a file before any timing is spent (it is written row by row)
    if let Some(path) = &o.json {
        shared_kernels::model::save::check_writable(path).map_err(|e| format!("--json {}: cannot be written ({e})", path.display()))?;
    }
    if o.repeats == 0 {
        return Err("--repeats: every timing is the median of at least 1 run, got 0".into());
    }
    if o.trainer_len == 0 {
        return Err("--trainer-len: a trainer sequence needs at least 1 token, got 0".into());
    }
    if o.trainer_batches.contains(&0) {
        return Err(format!("--trainer-batches: every batch must be at least 1 sequence, got {:?}", o.trainer_batches));
    }
    let device = shared_kernels::device::default_device();
    let config = preset(&o.preset)?;
    if o.trainer_len > config.max_position_embeddings {
        return Err(format!("--trainer-len {} is past --preset {}'s {} positions", o.trainer_len, o.preset, config.max_position_embeddings));
    }
    println!("# lockstep bench: runtime {}, preset {}, dtype {:?}, prompt {} tokens, {} new tokens{}\n", shared_kernels::device::runtime_name(), o.preset, o.dtype, o.prompt_len, o.new_tokens, if o.ragged_lengths { format!(" (ragged: {} to {})", o.new_tokens - o.new_tokens / 2, o.new_tokens) } else { String::new() });
    if o.tile_sweep {
        // before the model: the sweep needs only the shapes
        return super::bench_tiles::run(o, &config, &device);
    }
    check_host_memory(&config, &o.preset)?;
    let checkpoint = Checkpoint::random(config.clone(), 0.05, 7);
    if let Some(dir) = &o.save_model {
        // --load-bench on a folder that holds a checkpoint already (e.g. transformers' shards of
        // a real shape) times that one as it is
        let holds_checkpoint = dir.join("config.json").exists() || std::fs::read_dir(dir).is_ok_and(|mut d| d.any(|e| e.is_ok_and(|e| e.path().extension().is_some_and(|x| x == "safetensors"))));
        if holds_checkpoint && !o.load_bench {
            // random weights written over a user's checkpoint would lose it
            return Err(format!("--save-model {}: the folder holds a checkpoint already; name a new or empty folder (or add --load-bench to time loading that checkpoint as it is)", dir.display()));
        }
        if !(o.load_bench && dir.join("config.json").exists()) {
            shared_kernels::model::save_checkpoint(dir, &checkpoint, o.dtype, None).map_err(|e| e.to_string())?;
            eprintln!("bench: model saved to {}", dir.display());
        }
        if o.load_bench {
            return load_bench(dir, o.dtype, &device);
        }
    }
    for k in &o.kernels {
        kernel_set(k)?.0.runs_on(o.dtype).map_err(|e| format!("--kernels {k} with --dtype {:?}: {e}", o.dtype))?;
    }
    // resident, as the engines keep theirs, so no weights stay behind on cubecl's per-step pages
    let model = Qwen3::from_checkpoint(&checkpoint, o.dtype, &device).map_err(|e| e.to_string())?.into_resident(false).map_err(|e| e.to_string())?;

    // (kernel set, overlapped engine steps, steps replayed as graphs, row counts padded, sampling);
    // `sync` is the matched kernels with each step read back before the next is enqueued,
    // `graphs` the matched kernels with steps replayed (LOCKSTEP_DECODE_GRAPHS's mode; the other
    // sets launch), `graphs-padded` the same with row counts padded (LOCKSTEP_DECODE_GRAPH_PADDING).
    // A `+topp` suffix samples with Qwen3's top-p 0.95 / top-k 20 (the truncation kernel's cost),
    // `+processed` the same with processed logprobs; without one, T = 1 over the full vocabulary.
    let sets: Vec<(KernelSet, bool, bool, bool, Sampling, bool)> = o.kernels.iter().map(|k| kernel_set(k)).collect::<Result<_, _>>()?;
    // --trainer-only is the trainer step alone: no sampler table either
    if o.concurrency.is_empty() || o.trainer_only {
        return super::bench_ops::run(o, &config, &device);
    }
    println!("## sampler throughput (generated tokens/s)\n");
    // one column per kernel set, then the first set's rate over each other set's
    let names = &o.kernels;
    let ratio_heads: Vec<String> = names.iter().skip(1).map(|n| format!(" {} / {n} |", names[0])).collect();
    println!("| concurrency | {} tok/s |{}", names.join(" tok/s | "), ratio_heads.concat());
    println!("|---|{}", "---|".repeat(sets.len() + ratio_heads.len()));
    for &c in &o.concurrency {
        let context = o.prompt_len + o.new_tokens;
        // ragged: a fixed spread (no rng) so every kernel set and round gets the same lengths
        let answer_len = |i: usize| if o.ragged_lengths { o.new_tokens - (i * 7919) % (o.new_tokens / 2 + 1) } else { o.new_tokens };
        let requests = |round: u64, sampling: Sampling| -> Vec<Request> {
            (0..c as u64)
                .map(|i| Request {
                    id: round * 1_000_000 + i,
                    prompt: (0..o.prompt_len).map(|p| ((i as usize * 31 + p * 7) % config.vocab_size) as u32).collect(),
                    params: sampling.params(answer_len(i as usize)),
                })
                .collect()
        };
        let mut engines = Vec::new();
        for &(kernels, overlap, graphs, padding, sampling, fused) in &sets {
            let mut m = model.clone();
            m.kernels = kernels;
            let config = EngineConfig { max_batch: c, kv_blocks: 0, context, chunk_size: o.prompt_len.max(1), share_prompt_prefix: true, overlap, reserve: 1.0 };
            let mut engine = shared_kernels::kernel_choice::KernelChoice::scoped(|k| k.decode_fusion &= fused, || Engine::new(m, config)).map_err(|e| e.to_string())??;
            engine.set_decode_graphs(graphs);
            engine.set_decode_graph_padding(padding);
            let warm = Instant::now();
            engine.generate(requests(0, sampling)); // warm-up: kernel compilation (and burn's autotuning)
            sync(&device);
            let kernels = match (overlap, graphs) {
                (_, true) if padding => format!("{kernels:?} (graphs, padded){}", sampling.label()),
                (_, true) => format!("{kernels:?} (graphs){}", sampling.label()),
                (true, false) => format!("{kernels:?}{}", sampling.label()),
                (false, false) => format!("{kernels:?} (sync){}", sampling.label()),
            };
            eprintln!("bench: {kernels} concurrency {c}: warm-up {:.1}s", warm.elapsed().as_secs_f64());
            engine.take_phase_times();
            engines.push(engine);
        }
        // rounds alternate between the kernel sets, so drift on a shared machine hits all alike;
        // each set's rate is the median of its rounds
        let mut rates = vec![Vec::new(); sets.len()];
        for round in 0..o.repeats {
            for ((engine, rate), set) in engines.iter_mut().zip(rates.iter_mut()).zip(&sets) {
                let t = Instant::now();
                let out = engine.generate(requests(round as u64 + 1, set.4));
                sync(&device);
                let generated: usize = out.iter().filter_map(|r| r.as_ref().ok()).map(|c| c.tokens.len()).sum();
                rate.push(generated as f64 / t.elapsed().as_secs_f64());
            }
        }
        let rates: Vec<f64> = rates.into_iter().map(median).collect();
        // where a step's wall time went, over all timed rounds: host enqueueing vs waiting on the device
        for (kernels, engine) in o.kernels.iter().zip(engines.iter_mut()) {
            let p = engine.take_phase_times();
            let per_step = |s: f64| 1e6 * s / p.steps.max(1) as f64;
            eprintln!("bench: {kernels} concurrency {c}: {} engine steps ({} replayed as graphs), per step {:.0} us launching, {:.0} us waiting for tokens, {:.0} us scheduling", p.steps, p.replayed_steps, per_step(p.launch_s), per_step(p.wait_s), per_step(p.schedule_s + p.prefix_copy_s));
        }
        for (kernels, r) in o.kernels.iter().zip(&rates) {
            eprintln!("bench: {kernels} concurrency {c}: median {r:.1} tok/s over {} rounds", o.repeats);
        }
        eprintln!("bench: concurrency {c}: {}", shared_kernels::device::memory_pools_line(&device));
        let cells: Vec<String> = rates.iter().map(|r| format!("{r:.1}")).collect();
        let ratio: String = rates.iter().skip(1).map(|r| format!(" {:.2} |", rates[0] / r)).collect();
        println!("| {c} | {} |{ratio}", cells.join(" | "));
    }
    if o.skip_ops {
        return Ok(());
    }

    super::bench_ops::run(o, &config, &device)
}

