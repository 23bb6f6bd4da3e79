//! `lockstep`: train (SFT warm start, then GRPO), sft, sample.

mod device_failures;
mod tools;

use burn::tensor::DType;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use shared_kernels::model::KernelSet;
use trainer::config::Config;
use trainer::grpo::{new_adamw, Trainer};
use trainer::run::{invalid, load_policy, run_dir, RunError};

#[derive(Parser)]
#[command(name = "lockstep", version, about = "RL for language models with a bit-exact sampler and trainer")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// GRPO training (with an SFT warm start when train.sft_steps > 0).
    Train {
        /// TOML config; omitted = the embedded defaults.
        config: Option<PathBuf>,
        /// Override a key: --set train.steps=10 (repeatable).
        #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
        overrides: Vec<String>,
        /// Continue from the run's latest checkpoint.
        #[arg(long)]
        resume: bool,
        /// Stop after this many GRPO steps in this invocation (the run's total stays train.steps).
        #[arg(long)]
        max_steps: Option<usize>,
        /// With --resume: continue although the config differs from the run's
        /// config.resolved.toml (the run is then no longer bit-identical to an uninterrupted one;
        /// the earlier config is kept beside it and the change is logged in the run).
        #[arg(long)]
        allow_config_change: bool,
        /// Data parallel on this host: one process per GPU (NCCL; the CUDA build). Processes
        /// started by torchrun or a cluster launcher (RANK, WORLD_SIZE, MASTER_ADDR,
        /// MASTER_PORT set) join their group without it (docs/distributed.md).
        #[arg(long)]
        gpus: Option<usize>,
        /// Data parallel as N threads of this process on one device (the in-process
        /// communicator): checks that a data-parallel run gives one rank's bits (weights,
        /// grad norm, metrics) where one GPU is all there is. Prints every rank's steps.
        #[arg(long, conflicts_with = "gpus")]
        ranks_in_threads: Option<usize>,
    },
    /// Benchmarks: sampler tokens/s matched vs fast kernels, and kernels vs burn's defaults.
    Bench {
        /// Model shape: tiny, small or qwen3-0.6b (random weights).
        #[arg(long, default_value = "tiny")]
        preset: String,
        /// Sampler concurrencies; `none` skips the sampler table.
        #[arg(long, value_delimiter = ',', default_value = "1,8,64,256")]
        concurrency: Vec<String>,
        #[arg(long, default_value_t = 16)]
        prompt_len: usize,
        #[arg(long, default_value_t = 16)]
        new_tokens: usize,
        /// Sampler table: answer lengths spread over [new_tokens / 2, new_tokens] (an RL tail).
        #[arg(long)]
        ragged_lengths: bool,
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// f32 or bf16.
        #[arg(long, default_value = "f32")]
        dtype: String,
        /// Sampler kernel sets: matched (launched), sync (each step read back before the next),
        /// graphs (replayed at exact row counts), graphs-padded (the default), unfused, fast, split_k, bf16_logits;
        /// a suffix +topp samples with top-p 0.95 / top-k 20, +processed also with processed logprobs.
        #[arg(long, value_delimiter = ',', default_value = "matched,fast")]
        kernels: Vec<String>,
        /// Only the sampler table, not the per-kernel one.
        #[arg(long)]
        skip_ops: bool,
        /// Kernel table without burn's column (its autotuner spends minutes on new shapes).
        #[arg(long)]
        no_burn: bool,
        /// Kernel table: only the default matmul kernel's rows (for sweeps of LOCKSTEP_PIPELINED_*).
        #[arg(long)]
        matmul_only: bool,
        /// Kernel table: every warpgroup matmul tile at the preset's projection shapes and
        /// --matmul-m (default 256,4096), each checked against the default pick as bits.
        #[arg(long)]
        tile_sweep: bool,
        /// Only the trainer step: the sampler and kernel tables skipped (for profiles of it).
        #[arg(long)]
        trainer_only: bool,
        /// Kernel table: only the attention rows (decode and prefill, every kernel).
        #[arg(long)]
        attention_only: bool,
        /// Kernel table: only the memory-bound rows (streaming read ceiling, norms, pointwise,
        /// rope, logprob), with bandwidth-sized inputs.
        #[arg(long)]
        memory_only: bool,
        /// Kernel table: every op called once, not timed in repeats (for kernel profilers: ncu
        /// then sees one launch per kernel and shape).
        #[arg(long)]
        single_call: bool,
        /// Trainer step at these batch sizes only (comma-separated; default 8,32 sequences of 128).
        #[arg(long, value_delimiter = ',')]
        trainer_batches: Vec<usize>,
        /// Tokens per sequence of the trainer step (default 128).
        #[arg(long, default_value_t = 128)]
        trainer_len: usize,
        /// Trainer step twice per size, with per-layer activation recomputation and without
        /// (train.recompute_layers), the device's memory pools after each.
        #[arg(long)]
        trainer_recompute: bool,
        /// Matmul rows only at these M (comma-separated; default 1,16,64,256,1024,4096).
        #[arg(long, value_delimiter = ',')]
        matmul_m: Vec<usize>,
        /// Also write the kernel timings as JSON (for experiments/bench/torch_bench.py).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Also save the bench model in HF layout (for transformers' generate on the same weights).
        #[arg(long)]
        save_model: Option<PathBuf>,
        /// With --save-model: time loading the saved checkpoint, or the one already in that folder (f32 host copy vs memory-mapped, staged or direct), then stop.
        #[arg(long, requires = "save_model")]
        load_bench: bool,
    },
    /// The sampler engine's invariance checks on this device (the CI tests' code), per dtype.
    Check {
        /// Model shape (random weights): tiny, small, qwen3-0.6b ... qwen3-8b, moe-tiny, qwen3-moe-small, qwen3-moe-1b, qwen3-30b-a3b.
        #[arg(long, default_value = "tiny")]
        preset: String,
        #[arg(long, value_delimiter = ',', default_value = "f32")]
        dtypes: Vec<String>,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Run the checks on the ablation's fast kernels instead (the contrast).
        #[arg(long)]
        fast: bool,
        /// Run the checks on the ablation's split-K matmul instead (the contrast).
        #[arg(long, conflicts_with = "fast")]
        split_k: bool,
        /// Run the checks with the logits rounded to bf16 (f32 only): batch invariant, but not
        /// the trainer's logprobs.
        #[arg(long, conflicts_with_all = ["fast", "split_k"])]
        bf16_logits: bool,
    },
    /// Table and plots of several runs, read from their TensorBoard files.
    Report {
        /// Run folders (each with a `tb` folder).
        runs: Vec<PathBuf>,
        #[arg(long)]
        out: PathBuf,
        /// "Steps to target" column threshold.
        #[arg(long, default_value_t = 0.5)]
        target_reward: f64,
    },
    /// Serve the policy over HTTP, OpenAI-compatible (docs/serve.md): `[serve]` host and port.
    Serve {
        /// TOML config (as for `train`); omitted = the embedded defaults.
        #[arg(value_name = "CONFIG")]
        config: Option<PathBuf>,
        /// Override a key: --set serve.port=8080 (repeatable).
        #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
        overrides: Vec<String>,
    },
    /// Write the base model with the LoRA adapter of `lora.path` merged in (W + s B A) as a
    /// Hugging Face folder (docs/lora.md); a merged model no longer gives the training bits.
    MergeLora {
        /// TOML config (as for `train`: the base in `[model]`, the adapter in `lora.path`).
        #[arg(value_name = "CONFIG")]
        config: Option<PathBuf>,
        /// Override a key: --set lora.path=runs/NAME/checkpoints/step-000008 (repeatable).
        #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
        overrides: Vec<String>,
        /// The new folder to write.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Sample completions for prompts from sampler.input into sampler.output (JSONL).
    Sample {
        /// TOML config (as for `train`); omitted = the embedded defaults.
        #[arg(value_name = "CONFIG")]
        config_file: Option<PathBuf>,
        /// The same config file as a flag (the form earlier scripts use).
        #[arg(long, value_name = "CONFIG", conflicts_with = "config_file")]
        config: Option<PathBuf>,
        /// Override a key: --set sampler.input=prompts.jsonl (repeatable).
        #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
        overrides: Vec<String>,
    },
}

fn main() -> ExitCode {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        // Mesa's lavapipe (the CPU runtime) prints an error per adapter probe without it.
        // SAFETY: first statement of main, before any thread exists.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir()) };
    }
    // before any device exists: cubecl reads its configuration once
    shared_kernels::kernel_cache::enable();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn,wgpu_hal=off,wgpu_core=off".into());
    {
        use tracing_subscriber::prelude::*;
        tracing_subscriber::registry().with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter)).with(device_failures::StopOnDeviceThreadFailure.with_filter(tracing_subscriber::filter::LevelFilter::WARN)).init();
    }
    if shared_kernels::knobs::is_set("LOCKSTEP_FAULT_COMPILE") {
        // failpoint for the fault suite: the warning cubecl's device thread logs for a kernel
        // that does not compile
        std::thread::spawn(|| tracing::warn!(target: "cubecl_runtime::logging::server", "A launch error happened\n  A compilation error happened during launch\n  [Compilation Error] fault injection: LOCKSTEP_FAULT_COMPILE")).join().ok();
    }
    let cli = Cli::parse();
    // a panic anywhere below (burn, cubecl, tokenizers, tensorboard-rs, lockstep) reaches the
    // user as an error naming the kernel launch entered last and its input sizes, not as a raw
    // panic (exit 101); RUST_BACKTRACE=1 prints the panic itself too
    std::panic::set_hook(Box::new(|info| {
        *device_failures::PANIC_AT.lock().unwrap_or_else(|e| e.into_inner()) = info.location().map(|l| format!("{}:{}", l.file(), l.line()));
        if std::env::var_os("RUST_BACKTRACE").is_some() {
            eprintln!("{info}\n{}", std::backtrace::Backtrace::force_capture());
        }
    }));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cli))).unwrap_or_else(|payload| {
        let at = device_failures::PANIC_AT.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default();
        let launch = shared_kernels::error::last_launch().map_or_else(|| "no kernel launch yet".to_string(), |l| format!("the last kernel launch entered: {l}"));
        Err(RunError::Other(format!("internal failure (a panic at {at}: {}); {launch}. Rerun with RUST_BACKTRACE=1 and report it with the command and config", shared_kernels::error::panic_text(payload.as_ref()))))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(RunError::Config(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}


fn run(cli: Cli) -> Result<(), RunError> {
    // parsed before any work, so a typo in a LOCKSTEP_* kernel variable stops the run at once
    shared_kernels::ops::check_environment().map_err(|e| RunError::Other(format!("the environment: {e}")))?;
    match cli.command {
        Command::Train { gpus: Some(n), .. } if n != 1 => {
            let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
            trainer::distributed::launch::launch_local(n, &trainer::distributed::launch::without_gpus(&args))
        }
        Command::Train { config, overrides, resume, max_steps, ranks_in_threads: Some(n), allow_config_change, .. } => Config::load_training(config.as_deref(), &overrides).map(Config::with_warnings_printed).map_err(RunError::from).and_then(|c| trainer::distributed::threads::train_from_cli(c, n, resume, max_steps, allow_config_change)),
        Command::Train { config, overrides, resume, max_steps, allow_config_change, .. } => Config::load_training(config.as_deref(), &overrides).map(Config::with_warnings_printed).map_err(RunError::from).and_then(|c| train(c, resume, max_steps, allow_config_change)),
        Command::Bench { preset, concurrency, prompt_len, new_tokens, ragged_lengths, repeats, dtype, kernels, skip_ops, no_burn, matmul_only, tile_sweep, trainer_only, attention_only, memory_only, single_call, trainer_batches, trainer_len, trainer_recompute, matmul_m, json, save_model, load_bench } => {
            let dtype = parse_dtype("--dtype", &dtype)?;
            let concurrency: Vec<usize> = match concurrency.iter().filter(|c| *c != "none").map(|c| c.parse::<usize>()).collect() {
                Ok(c) => c,
                Err(_) => return Err(invalid("--concurrency", format!("{concurrency:?}: expected numbers like 1,8,64 or `none`"))),
            };
            tools::host_profile::profiled(|| tools::bench::run(&tools::bench::BenchOptions { preset, concurrency, prompt_len, new_tokens, ragged_lengths, repeats, dtype, kernels, skip_ops, no_burn, matmul_only, tile_sweep, trainer_only, attention_only, memory_only, single_call, trainer_batches, trainer_len, trainer_recompute, matmul_m, json, save_model, load_bench })).map_err(RunError::Other)
        }
        Command::Check { preset, dtypes, seed, fast, split_k, bf16_logits } => {
            let dtypes = dtypes.iter().map(|d| parse_dtype("--dtypes", d)).collect::<Result<Vec<_>, _>>()?;
            let kernels = if fast { KernelSet::Fast } else if split_k { KernelSet::SplitK } else if bf16_logits { KernelSet::Bf16Logits } else { KernelSet::Matched };
            tools::check::run(&preset, &dtypes, seed, kernels).map_err(RunError::Other)
        }
        Command::Report { runs, out, target_reward } => tools::report::report(&runs, &out, target_reward).map(|md| println!("{md}")).map_err(RunError::Other),
        Command::Sample { config_file, config, overrides } => Config::load(config_file.or(config).as_deref(), &overrides).map_err(RunError::from).and_then(trainer::sample_cli::main),
        Command::MergeLora { config, overrides, out } => Config::load(config.as_deref(), &overrides).map_err(RunError::from).and_then(|c| trainer::lora_merge::main(c, &out)),
        Command::Serve { config, overrides } => Config::load(config.as_deref(), &overrides).map_err(RunError::from).and_then(trainer::serve::main),
    }
}

/// `name` as a dtype this device computes in (bf16 on a device without it would fail inside
/// the kernel compiler on cubecl's device thread).
fn parse_dtype(flag: &str, name: &str) -> Result<DType, RunError> {
    let dtype = match name {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        other => return Err(invalid(flag, format!("`{other}`: expected f32 or bf16"))),
    };
    if !shared_kernels::device::supports_dtype(&shared_kernels::device::default_device(), dtype) {
        return Err(invalid(flag, format!("`{name}`: this device ({}) has no {name} support; use f32", shared_kernels::device::runtime_name())));
    }
    Ok(dtype)
}


fn train(cfg: Config, resume: bool, max_steps: Option<usize>, allow_config_change: bool) -> Result<(), RunError> {
    // a data-parallel rank (RANK etc. set) joins its group first: rank 0 alone writes the
    // run's files and checkpoints, every rank loads the same ones
    let comm = trainer::distributed::launch::join_from_env()?;
    let rank0 = comm.as_ref().is_none_or(|c| c.rank() == 0);
    let device = shared_kernels::device::default_device();
    let dir = run_dir(&cfg);
    if allow_config_change && !resume {
        return Err(RunError::Other("--allow-config-change applies to --resume only".into()));
    }
    // rank 0 writes the run's files: it holds the folder before deciding fresh or resumed
    let _run_lock = if rank0 { Some(trainer::run_lock::lock(&dir)?) } else { None };
    // SIGTERM or Ctrl-C: finish the step, write a checkpoint, stop; a second one stops at once
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        // the second signal exits at once (below): a child program running then ends with us
        let second = std::sync::Arc::clone(&stop);
        // SAFETY: the action only loads an atomic and calls kill(2), both async-signal-safe
        unsafe { signal_hook::low_level::register(signal, move || if second.load(std::sync::atomic::Ordering::SeqCst) { trainer::child::end_all() }) }.map_err(|e| RunError::Other(format!("installing the signal handler: {e}")))?;
        signal_hook::flag::register_conditional_shutdown(signal, 130, std::sync::Arc::clone(&stop)).and_then(|_| signal_hook::flag::register(signal, std::sync::Arc::clone(&stop))).map_err(|e| RunError::Other(format!("installing the signal handler: {e}")))?;
    }
    // the run must fit the device before anything loads (exit 2 otherwise); "auto" sizes are
    // chosen here. `sized` runs the steps; the run's records keep the config as the user gave it
    let sized = trainer::memory_plan::resolve(&cfg, &device, trainer::memory_plan::Purpose::Train, comm.as_ref().map_or(1, |c| c.world()), 1)?;
    // the one guard of the run folder every entry point passes (rank 0 writes the records)
    let latest = if rank0 {
        trainer::run_folder::open(&cfg, resume, allow_config_change)?
    } else {
        let existing = trainer::checkpoint::list(&dir);
        if !resume && !existing.is_empty() {
            return Err(RunError::Other(format!("{} already has checkpoints; pass --resume, or choose another log.run_name", dir.display())));
        }
        existing.last().cloned()
    };
    let (policy, opt, step) = if resume {
        let Some(latest) = latest else {
            return Err(RunError::Other(format!("--resume: no checkpoint in {}", trainer::checkpoint::checkpoints_dir(&dir).display())));
        };
        let (policy, opt, at, load_s) = trainer::run::resume_state(&cfg, &latest, &device, |_| Ok(()))?;
        if rank0 {
            trainer::run_folder::record(&cfg)?;
        }
        trainer::tasks::fit::check_fits(&cfg, &policy)?;
        eprintln!("resuming {} at step {at} (weights and optimizer state loaded in {load_s:.1} s)", latest.display());
        (policy, opt, at)
    } else {
        let mut policy = load_policy(&cfg, None, &device)?;
        trainer::run::engine_config(&sized, &policy.model)?; // a bad KV budget fails before SFT
        trainer::tasks::fit::check_fits(&cfg, &policy)?;
        if cfg.train.sft_steps > 0 {
            let task = trainer::run::load_task(&cfg)?;
            let bar = progress(&cfg, cfg.train.sft_steps, "sft");
            let started = std::time::Instant::now();
            trainer::sft::warm_start(&cfg, &mut policy, &task, &stop, |step, loss| {
                bar.set_message(format!("loss {loss:.3}"));
                bar.inc(1);
                if bar.is_hidden() && (step % 25 == 0 || step + 1 == cfg.train.sft_steps) {
                    eprintln!("sft step {step:>4}  loss {loss:.4}  {:.1}s", started.elapsed().as_secs_f64());
                }
            })?;
            bar.finish();
        }
        (policy, new_adamw(&cfg), 0)
    };
    let mut trainer = Trainer::new_rank(sized, policy, opt, step, comm)?;
    let end = max_steps.map_or(cfg.train.steps, |m| (step + m).min(cfg.train.steps));
    let bar = progress(&cfg, end - step, "grpo");
    let mut history = Vec::new();
    while trainer.step < end {
        let m = trainer.step()?;
        bar.set_message(format!("step {} reward {:.3} kl {:.1e} bit-equal {:.3}", m.step, m.reward_mean, m.agreement.kl_k1, m.agreement.bit_equal_frac));
        bar.inc(1);
        let mut line = format!("step {:>4}  reward {:.3}  kl_k1 {:.2e}  kl_k3 {:.2e}  |dlogp|max {:.2e}  bit_equal {:.4}  loss {:+.4}  {:.1}s", m.step, m.reward_mean, m.agreement.kl_k1, m.agreement.kl_k3, m.agreement.logprob_abs_diff_max, m.agreement.bit_equal_frac, m.loss, m.step_s);
        if let Some(e) = &m.eval {
            line.push_str(&format!("  eval: pass@1 {:.3} pass@{} {:.3} ({} problems)", e.pass1_greedy, e.k, e.pass_at_k, e.problems));
        }
        if !rank0 {
        } else if bar.is_hidden() {
            eprintln!("{line}")
        } else {
            bar.println(line)
        }
        history.push(m);
        if cfg.train.checkpoint_every > 0 && trainer.step % cfg.train.checkpoint_every == 0 {
            trainer.checkpoint()?;
        }
        // a signal to any rank stops every rank after this step, checkpointed together
        let stopping = trainer.any_rank(&format!("after step {}: stop?", trainer.step - 1), stop.load(std::sync::atomic::Ordering::SeqCst))?;
        if stopping && trainer.step < end {
            bar.finish();
            let saved = trainer.checkpoint()?;
            if !rank0 {
                return Err(RunError::Other(format!("stopped by a signal after step {}", trainer.step - 1)));
            }
            return Err(RunError::Other(format!("stopped by a signal after step {}: checkpoint {}; continue with --resume", trainer.step - 1, saved.display())));
        }
    }
    bar.finish();
    // (save is idempotent per step: a step the loop just saved is not written again)
    // every rank: rank 0 writes, the others give their share of a sharded optimizer
    let last = if cfg.train.final_checkpoint { Some(trainer.checkpoint()?).filter(|_| rank0) } else { None };
    trainer::telemetry::print_summary(&history, last.as_deref());
    Ok(())
}

fn progress(cfg: &Config, len: usize, name: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len as u64);
    bar.set_style(indicatif::ProgressStyle::with_template(&format!("{name} {{bar:30}} {{pos}}/{{len}} {{elapsed}} {{msg}}")).expect("template"));
    if !cfg.log.progress {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar
}
