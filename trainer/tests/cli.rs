//! The `lockstep` binary end to end on the CI runtime: resume is bit-identical to an
//! uninterrupted run, TensorBoard files read back with the real TensorBoard, and bad input
//! gets a clear error and a non-zero exit.
//!
//! One file past 400 lines: every test drives the same binary with the same fixtures and helpers.

mod common;

use common::{lockstep, metrics, scratch, tensorboard_points, SMALL};
use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn resume_after_a_kill_repeats_the_uninterrupted_run_bit_for_bit() {
    let dir = scratch("resume");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=straight"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let straight = metrics(&dir.join("runs/straight"));
    assert_eq!(straight.len(), 6);

    // start the same run, kill it (SIGKILL) once the step-3 checkpoint exists, resume
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["train", "small.toml", "--set", "log.run_name=killed"])
        .current_dir(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let ck = dir.join("runs/killed/checkpoints/step-000003/state.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    while !ck.exists() {
        assert!(std::time::Instant::now() < deadline, "no checkpoint after 10 minutes");
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before it could be killed");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=killed", "--resume"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let resumed = metrics(&dir.join("runs/killed"));
    assert_eq!(resumed, straight, "metrics after resume differ from the uninterrupted run");
    // checkpoints are complete HF folders
    let last = dir.join("runs/killed/checkpoints/step-000006");
    for f in ["model.safetensors", "config.json", "tokenizer.json", "optimizer.safetensors", "state.json"] {
        assert!(last.join(f).exists(), "{f} missing from {}", last.display());
    }
    assert!(dir.join("runs/killed/config.resolved.toml").exists());
    // every step logged KL exactly 0 and all bits equal
    for m in &straight {
        assert_eq!(m["agreement"]["kl_k1"].as_f64(), Some(0.0));
        assert_eq!(m["agreement"]["bit_equal_frac"].as_f64(), Some(1.0));
        assert_eq!(m["sampler_weights_fingerprint"], m["trainer_weights_fingerprint"]);
        assert_eq!(m["trainer_weights_fingerprint"].as_str().map(str::len), Some(16));
    }
}

#[test]
fn tensorboard_reads_back_every_tag() {
    let dir = scratch("tb");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let out = lockstep(&["train", "small.toml", "--set", "train.steps=2", "--set", "train.sft_steps=0", "--set", "log.run_name=tb"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let script = r#"
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1]); acc.Reload()
for tag in sorted(acc.Tags()["scalars"]):
    print(tag, len(acc.Scalars(tag)))
"#;
    let out = Command::new("python3").args(["-c", script, dir.join("runs/tb/tb").to_str().unwrap()]).output().expect("python3 with the tensorboard package (.ci/setup installs it)");
    assert!(out.status.success(), "tensorboard read-back failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for tag in [
        "rollout/reward_mean", "rollout/reward_std", "rollout/kl_k1", "rollout/kl_k3", "rollout/logprob_abs_diff_max",
        "rollout/bit_equal_frac", "train/loss", "train/grad_norm", "train/entropy", "train/is_ratio_mean", "perf/tokens_per_s", "perf/step_s",
        "timing_s/gen", "timing_s/logprob", "timing_s/update_actor", "timing_s/sync_weights",
        "timing_s/gen_launch", "timing_s/gen_wait", "timing_s/gen_prefix_copy", "timing_s/gen_schedule", "perf/gen_engine_steps",
        "train/is_weight_mean", "train_rollout_logprob_abs_diff", "rollout_corr/kl", "rollout_corr/k3_kl", "sampling/importance_sampling_ratio/mean",
    ] {
        assert!(text.lines().any(|l| l == format!("{tag} 2")), "tag {tag} with 2 points not found in:\n{text}");
    }
    // the phase times are measured and fit inside the step
    for line in std::fs::read_to_string(dir.join("runs/tb/metrics.jsonl")).unwrap().lines() {
        let m: serde_json::Value = serde_json::from_str(line).unwrap();
        // other trainers' names beside lockstep's, with the same values
        assert_eq!(m["aliases"]["rollout_corr/kl"], m["agreement"]["kl_k1"], "{line}");
        assert_eq!(m["aliases"]["sampling/importance_sampling_ratio/max"], m["is_ratio_max"], "{line}");
        let phases: Vec<f64> = ["gen_s", "logprob_s", "update_s", "sync_s"].iter().map(|k| m["timing"][k].as_f64().unwrap_or(-1.0)).collect();
        assert!(phases.iter().all(|&t| t > 0.0), "phase times {phases:?} in {line}");
        assert!(phases.iter().sum::<f64>() <= m["step_s"].as_f64().unwrap(), "phases {phases:?} exceed the step in {line}");
        // gen's engine steps ran, and its parts fit inside it
        let parts: Vec<f64> = ["gen_launch_s", "gen_wait_s", "gen_prefix_copy_s", "gen_schedule_s"].iter().map(|k| m["timing"][k].as_f64().unwrap_or(-1.0)).collect();
        assert!(m["timing"]["gen_engine_steps"].as_u64().unwrap_or(0) > 0 && parts[0] > 0.0 && parts[1] > 0.0 && parts.iter().all(|&t| t >= 0.0), "gen parts {parts:?} in {line}");
        assert!(parts.iter().sum::<f64>() <= phases[0], "gen parts {parts:?} exceed gen in {line}");
    }
}

#[test]
fn bad_input_fails_with_a_clear_error_and_a_non_zero_exit() {
    let dir = scratch("errors");
    let cases: Vec<(&str, &str, Vec<&str>)> = vec![
        ("typo.toml", "[train]\nstepz = 3\n", vec!["stepz"]),
        ("type.toml", "[train]\nsteps = \"many\"\n", vec!["steps", "line 2"]),
        ("malformed.toml", "[train\nsteps = 3\n", vec!["malformed.toml", "line 1"]),
        ("value.toml", "[sampler]\ntop_p = 1.5\n", vec!["sampler.top_p"]),
        ("section.toml", "[trainer]\nsteps = 3\n", vec!["trainer"]),
        ("task.toml", "[task]\nname = \"chess\"\n", vec!["task.name", "chess"]),
        ("budget.toml", "[sampler]\nkv_budget_mib = 0.001\n", vec!["sampler.kv_budget_mib", "fewer than one request"]),
        ("reserve.toml", "[sampler]\nkv_reserve = 1.5\n", vec!["sampler.kv_reserve", "[0, 1]"]),
        ("beta.toml", "[train]\nbeta2 = 1.0\n", vec!["train.beta2", "[0, 1)"]),
        ("no_room.toml", "[sampler]\ncontext = 8\nmax_new_tokens = 8\n", vec!["sampler.context", "sampler.max_new_tokens = 8"]),
        ("digits.toml", "[task]\nname = \"addition\"\ndigits = 12\n", vec!["task.digits", "addition", "1..=9"]),
        // sizes that would abort the process or poison the device are refused before any allocation
        ("context.toml", "[sampler]\ncontext = 100000000000\n", vec!["sampler.context"]),
        ("slots.toml", "[sampler]\nmax_batch = 100000000\ncontext = 4096\n", vec!["sampler.context", "sampler.max_batch", "index range"]),
        ("ffn.toml", "[model]\nintermediate_size = 100000000000\n", vec!["model.intermediate_size", "index range"]),
        // keys the run would never read: the user expects something else
        ("path.toml", "[task]\nname = \"sort\"\npath = \"data.jsonl\"\n", vec!["task.path", "task.name = \"sort\"", "jsonl"]),
        ("reward_command.toml", "[task]\nreward_command = \"python3 score.py\"\n", vec!["task.reward_command", "task.reward = \"exact\""]),
        ("tis_cap.toml", "[ablation]\ntis_cap = 3.0\n", vec!["ablation.tis_cap", "ablation.correction = \"none\""]),
        ("reward_timeout.toml", "[task]\nreward_timeout_s = 5\n", vec!["task.reward_timeout_s", "runs no program"]),
        ("shape_and_path.toml", "[model]\npath = \"checkpoints/x\"\nhidden_size = 256\n", vec!["model.hidden_size", "embedded model only"]),
        ("std_and_path.toml", "[model]\npath = \"checkpoints/x\"\ninit_std = 0.05\n", vec!["model.init_std", "weights are not drawn"]),
        ("greedy.toml", "[sampler]\ntemperature = 0.0\n", vec!["sampler.temperature", "greedy", "zero advantages"]),
        ("tiny_temperature.toml", "[sampler]\ntemperature = 1e-45\n", vec!["sampler.temperature", "overflows"]),
        ("raw_chat.toml", "[task]\nsystem_prompt = \"Be brief.\"\n", vec!["task.system_prompt", "task.prompt_format = \"raw\""]),
        ("model_file.toml", "[model]\npath = \"model_file.toml\"\n", vec!["model.path", "is a file", "folder"]),
        ("model_missing.toml", "[model]\npath = \"no-such-checkpoint\"\n", vec!["model.path", "does not exist"]),
        ("sft_batch.toml", "[train]\nsft_batch = 1000000000\n", vec!["train.sft_batch", "index range", "at most"]),
        // the embedded model's shape is named by its [model] keys, not the HF names they map to
        ("heads.toml", "[model]\nnum_heads = 3\n", vec!["model.num_kv_heads", "model.num_heads (3)"]),
        ("layers.toml", "[model]\nnum_layers = 0\n", vec!["model.num_layers"]),
        ("head_dim.toml", "[model]\nhead_dim = 15\n", vec!["model.head_dim", "even"]),
        ("std.toml", "[model]\ninit_std = -1.0\n", vec!["model.init_std"]),
    ];
    // bf16 where the device has none (lavapipe, the CI runtime) names the key
    let mut cases = cases;
    if !shared_kernels::device::supports_dtype(&shared_kernels::device::default_device(), burn::tensor::DType::BF16) {
        cases.push(("bf16.toml", "[model]\ndtype = \"bf16\"\n", vec!["model.dtype", "bf16"]));
    }
    // a KV cache layer past the runtime's largest binding (wgpu: 128 MiB on lavapipe; 819 MB
    // here) is refused naming the key, before wgpu's validation fails on the device thread
    if shared_kernels::device::max_tensor_bytes(&shared_kernels::device::default_device()).is_some_and(|limit| limit < 800_000_000) {
        cases.push(("binding.toml", "[sampler]\ncontext = 100000\n", vec!["sampler.context", "binds at most", "KV cache"]));
    }
    for (file, text, needles) in cases {
        std::fs::write(dir.join(file), text).unwrap();
        let out = lockstep(&["train", file], &dir);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{file}: {err}");
        for n in needles {
            assert!(err.contains(n), "{file}: error should mention {n:?}: {err}");
        }
        assert!(!err.contains("panicked"), "{file}: {err}");
    }
    // an unknown kernel choice in the environment names the variable (no silent default), and
    // so does a kernel this device cannot run (tensor-core attention on an f32 CPU run)
    for (var, value) in [("LOCKSTEP_MATMUL", "pipelinedd"), ("LOCKSTEP_ATTENTION", "flash"), ("LOCKSTEP_DECODE_FUSION", "maybe"), ("LOCKSTEP_ATTENTION", "split_kv_tc"), ("LOCKSTEP_SKINNY", "8/4"), ("LOCKSTEP_TC_TILES", "4/4/4/4"), ("LOCKSTEP_WGMMA_PICK", "fastest"), ("LOCKSTEP_DECODE_LAUNCH", "8x3"), ("LOCKSTEP_DECODE_GRAPHS", "maybe"), ("LOCKSTEP_DECODE_GRAPH_PADDING", "maybe"), ("LOCKSTEP_NORM_PLANES", "maybe"), ("LOCKSTEP_FAULT_GRAPH_CAPTURE", "bogus")] {
        std::fs::write(dir.join("small.toml"), SMALL).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_lockstep")).args(["train", "small.toml", "--set", "log.run_name=env"]).env(var, value).current_dir(&dir).output().expect("run lockstep");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{var}={value}: {err}");
        assert!(err.contains(var) && err.contains(value), "{var}={value}: {err}");
        assert!(!err.contains("panicked"), "{var}={value}: {err}");
    }
    // a benchmark size of 0 is refused by name before any device work
    let out = lockstep(&["bench", "--preset", "tiny", "--concurrency", "none", "--matmul-only", "--matmul-m", "4,0"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("--matmul-m") && !err.contains("panicked"), "{err}");
    // sampler rows that could not run (no requests, no prompt, no new tokens) are refused by name
    // and so are timings of no runs and trainer sequences of no tokens or past the preset's
    // positions (each used to be replaced silently: 0 runs by 1, 0 tokens by 128, too many by the limit)
    for (args, flag) in [(&["--concurrency", "0"][..], "--concurrency"), (&["--concurrency", "2", "--new-tokens", "0"][..], "--new-tokens"), (&["--concurrency", "2", "--prompt-len", "0"][..], "--prompt-len"), (&["--repeats", "0"][..], "--repeats"), (&["--trainer-only", "--trainer-len", "0"][..], "--trainer-len"), (&["--trainer-only", "--trainer-len", "100000"][..], "--trainer-len 100000"), (&["--memory-only", "--json", "missing-folder/rows.json"][..], "--json missing-folder/rows.json")] {
        let out = lockstep(&[&["bench", "--preset", "tiny", "--skip-ops"][..], args].concat(), &dir);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.contains(flag) && !err.contains("panicked"), "{args:?}: {err}");
    }
    let out = lockstep(&["check", "--preset", "tiny", "--dtypes", "f64"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--dtypes") && err.contains("f64"), "{err}");
    // bf16 where the device has none names the flag (it failed inside the kernel compiler)
    if !shared_kernels::device::supports_dtype(&shared_kernels::device::default_device(), burn::tensor::DType::BF16) {
        for args in [&["check", "--preset", "tiny", "--dtypes", "f32,bf16"][..], &["bench", "--preset", "tiny", "--dtype", "bf16", "--concurrency", "none", "--trainer-only"][..]] {
            let out = lockstep(args, &dir);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert!(err.contains(args[3]) && err.contains("no bf16 support") && !err.contains("internal failure"), "{args:?}: {err}");
        }
    }
    // the warpgroup tile sweep on a device without `wgmma` is an error naming the kernel
    let out = lockstep(&["bench", "--preset", "tiny", "--tile-sweep", "--matmul-m", "64", "--repeats", "1"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    if shared_kernels::device::runtime_name() != "cuda" {
        assert_ne!(out.status.code(), Some(0), "{err}");
        assert!(err.contains("warpgroup") && !err.contains("panicked"), "{err}");
    }
    // a preset whose random checkpoint cannot fit the host's free memory is refused by name,
    // not killed by the OS (Qwen3-8B's shape: ~139 GB on the CPU runtime)
    let out = lockstep(&["bench", "--preset", "qwen3-8b", "--concurrency", "none", "--trainer-only"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("--preset qwen3-8b") && err.contains("host memory") && !err.contains("panicked"), "{err}");
    // and so is `check`'s (it ran into the OS's out-of-memory kill)
    let out = lockstep(&["check", "--preset", "qwen3-8b"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("--preset qwen3-8b") && err.contains("host memory"), "{err}");
    // --save-model onto a folder holding a checkpoint would replace it with random weights
    std::fs::create_dir_all(dir.join("users-model")).unwrap();
    std::fs::write(dir.join("users-model/model.safetensors"), b"the user's weights").unwrap();
    let out = lockstep(&["bench", "--preset", "tiny", "--concurrency", "none", "--trainer-only", "--save-model", "users-model"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("--save-model users-model") && err.contains("holds a checkpoint"), "{err}");
    assert_eq!(std::fs::read(dir.join("users-model/model.safetensors")).unwrap(), b"the user's weights");
    let out = lockstep(&["bench", "--preset", "tiny", "--concurrency", "none", "--trainer-only", "--trainer-batches", "0"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("--trainer-batches") && !err.contains("panicked"), "{err}");
    // a run folder that cannot be made fails before the warm start, naming the key
    std::fs::write(dir.join("a-file"), b"").unwrap();
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let out = lockstep(&["train", "small.toml", "--set", "log.runs_dir=a-file/runs"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("log.runs_dir") && err.contains("a-file/runs") && !err.contains("sft step") && !err.contains("panicked"), "{err}");
    let out = lockstep(&["train", "missing.toml"], &dir);
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
    let out = lockstep(&["train", "--set", "train.steps"], &dir);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("section.key=value"));

    // a dataset line without an answer names the file and line
    std::fs::write(dir.join("data.jsonl"), "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n{\"prompt\": \"2+2=\"}\n").unwrap();
    let out = lockstep(&["train", "--set", "task.name=jsonl", "--set", "task.path=data.jsonl", "--set", "train.sft_steps=0"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(err.contains("data.jsonl:2") && err.contains("answer"), "{err}");

    // a dataset prompt that cannot fit the context names the line and sampler.context
    std::fs::write(dir.join("long.jsonl"), format!("{{\"prompt\": \"1+1=\", \"answer\": \"2\"}}\n{{\"prompt\": \"{}=\", \"answer\": \"2\"}}\n", "1+".repeat(30))).unwrap();
    let out = lockstep(&["train", "--set", "task.name=jsonl", "--set", "task.path=long.jsonl", "--set", "log.run_name=long"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("long.jsonl:2") && err.contains("sampler.context") && err.contains("sampler.max_new_tokens"), "{err}");

    // resuming with a model of another shape refuses and leaves the checkpoint intact
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let out = lockstep(&["train", "small.toml", "--set", "train.steps=1", "--set", "train.sft_steps=0", "--set", "log.run_name=shape"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ck = dir.join("runs/shape/checkpoints/step-000001/model.safetensors");
    let before = std::fs::read(&ck).unwrap();
    // (a changed config is refused first, naming the keys; allowed explicitly, the checkpoint's
    // shape is checked)
    let out = lockstep(&["train", "small.toml", "--set", "train.steps=2", "--set", "model.hidden_size=32", "--set", "log.run_name=shape", "--resume"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("model.hidden_size: 64 -> 32") && err.contains("train.steps: 1 -> 2") && err.contains("--allow-config-change"), "{err}");
    let resolved = std::fs::read(dir.join("runs/shape/config.resolved.toml")).unwrap();
    let out = lockstep(&["train", "small.toml", "--set", "train.steps=2", "--set", "model.hidden_size=32", "--set", "log.run_name=shape", "--resume", "--allow-config-change"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(err.contains("another shape"), "{err}");
    assert_eq!(std::fs::read(&ck).unwrap(), before);
    assert_eq!(std::fs::read(dir.join("runs/shape/config.resolved.toml")).unwrap(), resolved, "a refused resume rewrote config.resolved.toml");
    // a checkpoint past train.steps names the key
    let out = lockstep(&["train", "small.toml", "--set", "train.steps=0", "--set", "train.sft_steps=0", "--set", "log.run_name=shape", "--resume"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("train.steps") && err.contains("step 1") && !err.contains("panicked"), "{err}");
    // and starting over on top of an existing run is refused rather than clobbering it
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=shape"], &dir);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--resume"));
    // a run folder that lost its starting config cannot be checked: refused, then allowed
    // explicitly, which writes the config again
    std::fs::remove_file(dir.join("runs/shape/config.resolved.toml")).unwrap();
    let resume = ["train", "small.toml", "--set", "train.steps=2", "--set", "train.sft_steps=0", "--set", "log.run_name=shape", "--resume"];
    let out = lockstep(&resume, &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("config.resolved.toml is missing") && err.contains("--allow-config-change") && !err.contains("step    1"), "{err}");
    let out = lockstep(&[&resume[..], &["--allow-config-change"]].concat(), &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(dir.join("runs/shape/config.resolved.toml").exists());
}

#[test]
fn bench_memory_rows_run_once_each_and_write_json() {
    // the memory-bound rows, each op called once (the profiler mode), as JSON for torch_bench.py
    let dir = scratch("bench-memory");
    let out = lockstep(&["bench", "--preset", "tiny", "--concurrency", "none", "--memory-only", "--single-call", "--no-burn", "--matmul-m", "1,8", "--json", "memory.json"], &dir);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("memory.json")).unwrap()).unwrap();
    let ops: Vec<&str> = doc["kernels"].as_array().unwrap().iter().map(|r| r["op"].as_str().unwrap()).collect();
    for op in ["rmsnorm", "add_rmsnorm", "add", "swiglu", "rope", "logprob"] {
        assert!(ops.contains(&op), "{op} missing from {ops:?}");
    }
}

#[test]
fn bench_ragged_lengths_shrink_the_batch_with_graphs_and_launches_side_by_side() {
    // answers of 8-16 tokens: the running batch falls through a tail; every set times it
    let dir = scratch("bench-ragged");
    let out = lockstep(&["bench", "--preset", "tiny", "--concurrency", "8", "--new-tokens", "16", "--ragged-lengths", "--kernels", "matched,graphs,graphs-padded", "--skip-ops", "--repeats", "1"], &dir);
    let (stdout, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(stdout.contains("(ragged: 8 to 16)") && stdout.contains("| 8 | "), "{stdout}");
    let replayed = |set: &str| err.lines().find(|l| l.starts_with(&format!("bench: {set} concurrency 8:")) && l.contains("engine steps")).and_then(|l| l.split('(').nth(1)?.split(' ').next()?.parse::<usize>().ok());
    assert_eq!(replayed("matched"), Some(0), "{err}");
    assert!(replayed("graphs").is_some_and(|n| n > 0), "{err}");
    // padded row counts share graphs through the tail: at least as many steps replayed
    assert!(replayed("graphs-padded") >= replayed("graphs"), "{err}");
}

#[test]
fn bench_times_truncated_sampling_beside_full_sampling_and_names_an_unknown_suffix() {
    let dir = scratch("bench-truncated");
    let out = lockstep(&["bench", "--preset", "tiny", "--concurrency", "4", "--new-tokens", "8", "--kernels", "matched,matched+topp,graphs+processed", "--skip-ops", "--repeats", "1"], &dir);
    let (stdout, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(stdout.contains("matched / matched+topp |") && stdout.contains("matched / graphs+processed |"), "{stdout}");
    assert!(err.contains("Matched top-p 0.95 / top-k 20 concurrency 4: warm-up"), "{err}");
    assert!(err.contains("Matched (graphs) top-p 0.95 / top-k 20, processed logprobs concurrency 4: warm-up"), "{err}");
    let out = lockstep(&["bench", "--preset", "tiny", "--concurrency", "4", "--kernels", "matched+topk", "--skip-ops"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("unknown sampling suffix `+topk` in `matched+topk`"), "{err}");
}

#[test]
fn processed_logprobs_change_no_token_and_keep_truncated_grpo_bit_exact() {
    let dir = scratch("processed-logprobs");
    std::fs::write(dir.join("prompts.jsonl"), "{\"prompt\": \"3+4=\"}\n{\"prompt_ids\": [5, 6, 7]}\n{\"prompt\": \"12\"}\n").unwrap();
    let sample = |mode: &str| -> Vec<serde_json::Value> {
        let out = lockstep(&["sample", "--set", "sampler.input=prompts.jsonl", "--set", &format!("sampler.output={mode}.jsonl"), "--set", "sampler.top_k=3", "--set", "sampler.top_p=0.9", "--set", "sampler.max_new_tokens=6", "--set", &format!("sampler.logprobs_mode={mode}"), "--set", "log.progress=false"], &dir);
        assert_eq!(out.status.code(), Some(0), "{mode}: {}", String::from_utf8_lossy(&out.stderr));
        std::fs::read_to_string(dir.join(format!("{mode}.jsonl"))).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let (raw, processed) = (sample("raw_logprobs"), sample("processed_logprobs"));
    let mut raised = 0;
    for (r, p) in raw.iter().zip(&processed) {
        // the mode changes what is reported, never what is drawn
        assert_eq!(r["token_ids"], p["token_ids"]);
        for (a, b) in r["logprobs"].as_array().unwrap().iter().zip(p["logprobs"].as_array().unwrap()) {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            // renormalised over at most 3 tokens: never below the full softmax's, never above 0
            assert!(b >= a && b <= 0.0, "raw {a} processed {b}");
            raised += (b > a) as usize;
        }
    }
    assert!(raised > 0, "no processed logprob differs from the raw one");

    // GRPO on the truncated distribution: on policy, bits equal, no warning
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let truncated = ["--set", "sampler.top_k=5", "--set", "sampler.top_p=0.9", "--set", "train.steps=2", "--set", "train.checkpoint_every=0"];
    let out = lockstep(&[&["train", "small.toml", "--set", "log.run_name=processed", "--set", "sampler.logprobs_mode=processed_logprobs"][..], &truncated[..]].concat(), &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("warning: sampler.top"), "{err}");
    let steps = metrics(&dir.join("runs/processed"));
    assert_eq!(steps.len(), 2);
    for m in &steps {
        assert_eq!(m["agreement"]["bit_equal_frac"].as_f64(), Some(1.0), "{m}");
        assert_eq!(m["agreement"]["kl_k1"].as_f64(), Some(0.0), "{m}");
    }
    // the raw mode under the same truncation runs too, and says it is not on-policy
    let out = lockstep(&[&["train", "small.toml", "--set", "log.run_name=raw", "--set", "train.sft_steps=0"][..], &truncated[..]].concat(), &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("warning: sampler.top_p = 0.9") && err.contains("processed_logprobs"), "{err}");
}

#[test]
fn sample_command_writes_completions_with_logprobs() {
    let dir = scratch("sample");
    // the third prompt has an out-of-range token: the run stops naming its line before sampling
    std::fs::write(dir.join("prompts.jsonl"), "{\"prompt\": \"3+4=\"}\n{\"prompt_ids\": [5, 6, 7], \"id\": 9}\n{\"prompt_ids\": [99999]}\n").unwrap();
    let args = ["sample", "--set", "sampler.input=prompts.jsonl", "--set", "sampler.output=out.jsonl", "--set", "log.progress=false"];
    let out = lockstep(&args, &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("prompts.jsonl:3") && err.contains("token id 99999"), "{err}");
    assert!(!dir.join("out.jsonl").exists());
    std::fs::write(dir.join("prompts.jsonl"), "{\"prompt\": \"3+4=\"}\n{\"prompt_ids\": [5, 6, 7], \"id\": 9}\n").unwrap();
    let out = lockstep(&args, &dir);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("out.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["id"], 9);
    for l in &lines {
        let ids = l["token_ids"].as_array().unwrap();
        assert!(!ids.is_empty());
        assert_eq!(ids.len(), l["logprobs"].as_array().unwrap().len());
    }
    // the config as `train` takes it (positional) and as `--config` give the same file
    std::fs::write(dir.join("s.toml"), "[sampler]\ninput = \"prompts.jsonl\"\n[log]\nprogress = false\n").unwrap();
    let mut written = Vec::new();
    for form in [&["s.toml"][..], &["--config", "s.toml"][..]] {
        let out = lockstep(&[&["sample"][..], form, &["--set", "sampler.output=out.jsonl"]].concat(), &dir);
        assert_eq!(out.status.code(), Some(0), "{form:?}: {}", String::from_utf8_lossy(&out.stderr));
        written.push(std::fs::read(dir.join("out.jsonl")).unwrap());
    }
    assert_eq!(written[0], written[1]);
    let out = lockstep(&["sample", "s.toml", "--config", "s.toml"], &dir);
    assert_eq!(out.status.code(), Some(2), "a config given twice is a usage error");
    // an output that is a symlink keeps the link (its target is replaced), and a pipe (what
    // `sampler.output=/dev/stdout` is under `| tool`) is written into: renaming over them turned
    // /dev/stdout into a regular file when run as root
    std::fs::create_dir_all(dir.join("elsewhere")).unwrap();
    std::fs::write(dir.join("elsewhere/out.jsonl"), "old").unwrap();
    std::os::unix::fs::symlink("elsewhere/out.jsonl", dir.join("link.jsonl")).unwrap();
    let fifo = dir.join("pipe.jsonl");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let reader = std::thread::spawn({
        let fifo = fifo.clone();
        move || std::fs::read(fifo).unwrap()
    });
    for output in ["link.jsonl", "pipe.jsonl"] {
        let out = lockstep(&["sample", "s.toml", "--set", &format!("sampler.output={output}")], &dir);
        assert_eq!(out.status.code(), Some(0), "{output}: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(std::fs::symlink_metadata(dir.join("link.jsonl")).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(dir.join("elsewhere/out.jsonl")).unwrap(), written[0]);
    assert_eq!(reader.join().unwrap(), written[0]);
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
}

#[test]
fn check_passes_on_lockstep_kernels_and_fails_with_a_nonzero_exit_on_split_k() {
    let dir = scratch("check");
    let seed = shared_kernels::testing::rows::test_seed().to_string();
    let out = lockstep(&["check", "--preset", "tiny", "--seed", &seed], &dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("all engine checks bit-identical") && !stdout.contains("FAILED"), "{stdout}");
    assert_eq!(stdout.matches("| bit-identical |").count(), 12, "{stdout}");
    let out = lockstep(&["check", "--preset", "tiny", "--seed", &seed, "--split-k"], &dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("sampler = trainer | FAILED"), "the split-K sampler must differ from the trainer: {stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("engine check(s) failed"));
    // a mixture-of-experts model through the same checks (its steps launched, never replayed)
    let out = lockstep(&["check", "--preset", "moe-tiny", "--seed", &seed], &dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.matches("| bit-identical |").count(), 12, "{stdout}");
    assert!(stdout.contains("no graphs for a mixture-of-experts model"), "{stdout}");
}

#[test]
fn the_bf16_logits_arm_is_batch_invariant_but_not_the_trainer_and_needs_an_f32_model() {
    let dir = scratch("bf16-logits");
    let seed = shared_kernels::testing::rows::test_seed().to_string();
    // the engine checks: every batch-invariance check holds (the rounding is per value), the
    // sampler-vs-trainer check fails (the trainer's logits are f32)
    let out = lockstep(&["check", "--preset", "tiny", "--seed", &seed, "--bf16-logits"], &dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("sampler = trainer | FAILED"), "{stdout}");
    assert_eq!(stdout.matches("| bit-identical |").count(), 11, "{stdout}");
    // GRPO on the arm: the mismatch is the rounding's, small and not zero
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=arm", "--set", "train.steps=2", "--set", "train.checkpoint_every=0", "--set", "ablation.sampler_kernels=bf16_logits", "--set", "ablation.correction=tis"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for m in metrics(&dir.join("runs/arm")) {
        let a = &m["agreement"];
        let (equal, max) = (a["bit_equal_frac"].as_f64().unwrap(), a["logprob_abs_diff_max"].as_f64().unwrap());
        assert!(equal < 1.0 && max > 0.0, "the rounded logits gave the trainer's logprobs: {m}");
        // bf16 keeps 8 significant bits: logits of this tiny model move by far less than 0.1
        assert!(max < 0.1, "{m}");
    }
    // a bf16 model's logits are bf16 on both sides: refused, naming the key
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=bf16", "--set", "model.dtype=bf16", "--set", "ablation.sampler_kernels=bf16_logits"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("ablation.sampler_kernels") && err.contains("model.dtype"), "{err}");
}

#[test]
fn sample_and_run_inputs_that_would_lose_data_or_mislabel_results_are_refused() {
    let dir = scratch("sample-bad");
    let base = |extra: &str| format!("[sampler]\nmax_new_tokens = 3\ninput = \"prompts.jsonl\"\noutput = \"out.jsonl\"\n{extra}[log]\nprogress = false\n");
    let sample = |cfg: &str, prompts: &str| {
        std::fs::write(dir.join("s.toml"), cfg).unwrap();
        std::fs::write(dir.join("prompts.jsonl"), prompts).unwrap();
        let out = lockstep(&["sample", "--config", "s.toml"], &dir);
        (out.status.code(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    // the same id twice (also an explicit id equal to another line's implicit one)
    for prompts in ["{\"prompt\": \"1+2=\", \"id\": 7}\n{\"prompt\": \"3+4=\", \"id\": 7}\n", "{\"prompt\": \"1+2=\"}\n{\"prompt\": \"3+4=\", \"id\": 0}\n", "{\"prompt\": \"1+2=\", \"id\": \"a\"}\n{\"prompt\": \"3+4=\", \"id\": \"a\"}\n"] {
        let (code, err) = sample(&base(""), prompts);
        assert_ne!(code, Some(0), "{err}");
        assert!(err.contains("prompts.jsonl:2") && err.contains("repeats line 1") && !err.contains("panicked"), "{err}");
        assert!(!dir.join("out.jsonl").exists());
    }
    // a byte-order mark before the first line is not an error
    let (code, err) = sample(&base(""), "\u{feff}{\"prompt\": \"1+2=\"}\n");
    assert_eq!(code, Some(0), "{err}");
    // string ids come back as given, next to integer ids
    let (code, err) = sample(&base(""), "{\"prompt\": \"1+2=\", \"id\": \"q-1\"}\n{\"prompt\": \"3+4=\", \"id\": 3}\n{\"prompt\": \"5+6=\", \"id\": \"3\"}\n");
    assert_eq!(code, Some(0), "{err}");
    let ids: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("out.jsonl")).unwrap().lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].clone()).collect();
    assert_eq!(ids, vec![serde_json::json!("q-1"), serde_json::json!(3), serde_json::json!("3")]);
    // an output that is the input is refused and the prompts stay as they were
    let prompts = "{\"prompt\": \"1+2=\"}\n";
    let same = base("").replace("output = \"out.jsonl\"", "output = \"./prompts.jsonl\"");
    let (code, err) = sample(&same, prompts);
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("sampler.output") && err.contains("sampler.input"), "{err}");
    assert_eq!(std::fs::read_to_string(dir.join("prompts.jsonl")).unwrap(), prompts);
    // prompts the engine would refuse are named by line before any sampling, and no output
    // is written
    for (prompts, needles) in [
        ("{\"prompt\": \"1+2=\"}\n{\"prompt_ids\": [1, 2, 99999999]}\n", &["prompts.jsonl:2", "token id 99999999", "vocabulary"][..]),
        ("{\"prompt_ids\": []}\n", &["prompts.jsonl:1", "no tokens"][..]),
        // two prompts on a line, or a per-line sampling setting the config would override silently
        ("{\"prompt\": \"1+2=\", \"prompt_ids\": [1, 2]}\n", &["prompts.jsonl:1", "`prompt` and `prompt_ids`", "exactly one"][..]),
        ("{\"prompt\": \"1+2=\"}\n{\"prompt\": \"1+3=\", \"max_tokens\": 2}\n", &["prompts.jsonl:2", "`max_tokens`", "sampler.max_new_tokens"][..]),
        (&format!("{{\"prompt\": \"1+2=\"}}\n{{\"prompt\": \"{}\"}}\n", "1".repeat(60)), &["prompts.jsonl:2", "sampler.context (48)", "sampler.max_new_tokens (3)"][..]),
    ] {
        let _ = std::fs::remove_file(dir.join("out.jsonl"));
        let (code, err) = sample(&base(""), prompts);
        assert_ne!(code, Some(0), "{err}");
        assert!(needles.iter().all(|n| err.contains(n)) && !err.contains("sampled") && !err.contains("panicked"), "{needles:?}: {err}");
        assert!(!dir.join("out.jsonl").exists());
    }
    // an output that is a folder is refused before sampling
    std::fs::create_dir_all(dir.join("folder")).unwrap();
    let (code, err) = sample(&base("").replace("output = \"out.jsonl\"", "output = \"folder\""), "{\"prompt\": \"1+2=\"}\n");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("sampler.output") && err.contains("folder") && !err.contains("sampled"), "{err}");
    // characters the tokenizer has no token for are named, not turned into <unk>
    let (code, err) = sample(&base(""), "{\"prompt\": \"1+2=\u{e9}\"}\n");
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("no token for") && err.contains('\u{e9}') && !err.contains("panicked"), "{err}");
    // run names that leave log.runs_dir are config errors
    for name in ["..", ".", ".hidden", "a\\b"] {
        let out = lockstep(&["train", "--set", &format!("log.run_name={name}")], &dir);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains("log.run_name"), "{name}: {err}");
    }
}

#[test]
fn a_last_step_that_is_also_a_checkpoint_step_is_saved_once_and_never_deleted() {
    let dir = scratch("double-save");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    // 6 steps, a checkpoint every 3: step 6 is saved by the loop, the final save must keep it
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=d", "--set", "train.keep_checkpoints=1"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ck = dir.join("runs/d/checkpoints");
    let names: Vec<String> = std::fs::read_dir(&ck).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names, vec!["step-000006".to_string()], "{names:?}");
    // the revision recorded is lockstep's own (the run's folder is in no git repository: asking
    // git at run time gave "unknown" here, and a user's project's commit inside theirs)
    let own = std::process::Command::new("git").args(["rev-parse", "--short", "HEAD"]).current_dir(env!("CARGO_MANIFEST_DIR")).output().ok().filter(|o| o.status.success()).map_or("unknown".to_string(), |o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let state: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(ck.join("step-000006/state.json")).unwrap()).unwrap();
    assert_eq!(state["git_revision"], own.as_str());
    assert!(std::fs::read_to_string(dir.join("runs/d/config.resolved.toml")).unwrap().starts_with(&format!("# resolved config; git revision {own}\n")));
}

#[test]
fn tensorboard_equals_metrics_after_a_resume_and_in_a_reused_folder() {
    let dir = scratch("tb-resume");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let args = ["train", "small.toml", "--set", "train.steps=4", "--set", "train.checkpoint_every=2", "--set", "train.sft_steps=0", "--set", "log.run_name=r"];
    // 3 steps logged, the checkpoint at 2: the resume redoes step 2
    let out = lockstep(&[&args[..], &["--max-steps", "3"]].concat(), &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(dir.join("runs/r/checkpoints/step-000003"));
    let out = lockstep(&[&args[..], &["--resume"]].concat(), &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let points = tensorboard_points(&dir.join("runs/r/tb"));
    assert_eq!(points["train/loss"], vec![0, 1, 2, 3], "{points:?}");
    assert_eq!(metrics(&dir.join("runs/r")).len(), 4);
    // a fresh run in a folder whose checkpoints were removed starts its curves afresh
    std::fs::remove_dir_all(dir.join("runs/r/checkpoints")).unwrap();
    let out = lockstep(&["train", "small.toml", "--set", "train.steps=2", "--set", "train.sft_steps=0", "--set", "log.run_name=r"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(tensorboard_points(&dir.join("runs/r/tb"))["rollout/reward_mean"], vec![0, 1]);
}

#[test]
fn sigterm_finishes_the_step_writes_a_checkpoint_and_resume_continues() {
    let dir = scratch("sigterm");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let args = ["train", "small.toml", "--set", "train.steps=200", "--set", "train.sft_steps=0", "--set", "train.checkpoint_every=0", "--set", "log.run_name=t"];
    let child = Command::new(env!("CARGO_BIN_EXE_lockstep")).args(args).current_dir(&dir).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let metrics_path = dir.join("runs/t/metrics.jsonl");
    let started = std::time::Instant::now();
    while std::fs::read_to_string(&metrics_path).map_or(0, |t| t.lines().count()) < 2 {
        assert!(started.elapsed().as_secs() < 300, "no steps logged");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // the shell's own `kill` (no procps needed)
    let status = Command::new("sh").args(["-c", &format!("kill -TERM {}", child.id())]).status().unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("stopped by a signal") && err.contains("--resume"), "{err}");
    // the checkpoint holds every logged step (checkpoint_every = 0: none before the signal)
    let logged = metrics(&dir.join("runs/t")).len();
    let latest = std::fs::read_dir(dir.join("runs/t/checkpoints")).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with("step-")).max().unwrap();
    assert_eq!(latest, format!("step-{logged:06}"), "{err}");
    let out = lockstep(&[&args[..], &["--resume", "--max-steps", "1"]].concat(), &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(metrics(&dir.join("runs/t")).len(), logged + 1);
}

#[test]
fn micro_batches_and_recomputation_keep_the_logprob_and_update_bits_and_repeat_run_to_run() {
    let dir = scratch("micro");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    // 8 rollouts of ~9-10 tokens: 20 tokens a micro-batch cuts each step into 4-8 passes
    let run = |name: &str, budget: &str| {
        // char_f1: partial credit, so every step's advantages (and update) are non-zero
        let out = lockstep(&["train", "small.toml", "--set", &format!("log.run_name={name}"), "--set", "train.steps=3", "--set", &format!("train.micro_batch_tokens={budget}"), "--set", "task.reward=char_f1"], &dir);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        metrics(&dir.join("runs").join(name))
    };
    let (whole, micro_a, micro_b) = (run("whole", "0"), run("micro-a", "20"), run("micro-b", "20"));
    // step 0 runs on the same weights: micro-batching changes no logprob bit (the scoring pass
    // and each tracked micro-batch are checked against each other inside the step, too)
    assert_eq!(whole[0]["agreement"], micro_a[0]["agreement"], "step 0 agreement");
    for m in &micro_a {
        assert_eq!(m["agreement"]["bit_equal_frac"], 1.0, "{m}");
    }
    // the update's bits do not depend on the micro-batching (folded weight gradients): every
    // step's weights and gradient norm equal the one-pass run's, and the updates are real
    for (w, m) in whole.iter().zip(&micro_a) {
        for key in ["trainer_weights_fingerprint", "sampler_weights_fingerprint", "grad_norm", "agreement", "reward_mean"] {
            assert_eq!(w[key], m[key], "step {}: {key} differs between one pass and micro-batches", w["step"]);
        }
    }
    assert!(whole.iter().filter(|m| m["grad_norm"].as_f64().unwrap() > 0.0).count() >= 2, "too few real updates to compare: {whole:?}");
    let (lw, lm) = (whole[0]["loss"].as_f64().unwrap(), micro_a[0]["loss"].as_f64().unwrap());
    assert!((lw - lm).abs() <= 1e-5 * lw.abs().max(1e-3), "step 0 loss {lw} vs {lm}");
    assert_eq!(micro_a, micro_b, "two micro-batched runs differ");
    // per-layer recomputation (one pass and micro-batches) changes no bit either
    for (name, budget) in [("recompute", "0"), ("recompute-micro", "20")] {
        let out = lockstep(&["train", "small.toml", "--set", &format!("log.run_name={name}"), "--set", "train.steps=3", "--set", &format!("train.micro_batch_tokens={budget}"), "--set", "task.reward=char_f1", "--set", "train.recompute_layers=true"], &dir);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for (w, m) in whole.iter().zip(&metrics(&dir.join("runs").join(name))) {
            for key in ["trainer_weights_fingerprint", "sampler_weights_fingerprint", "grad_norm", "agreement", "reward_mean"] {
                assert_eq!(w[key], m[key], "step {}: {key} differs between the one-graph backward and {name}", w["step"]);
            }
        }
    }
}

#[test]
fn training_on_the_norm_plane_kernels_changes_no_bit() {
    // heads of 128, the rows the plane kernels take (the per-head q/k norms, forward and
    // backward), forced onto lavapipe's planes: every logged bit equals the cube kernels' run
    let dir = scratch("norm-planes");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let run = |name: &str, planes: &str| {
        let args = ["train", "small.toml", "--set", &format!("log.run_name={name}"), "--set", "train.steps=2", "--set", "model.head_dim=128", "--set", "task.reward=char_f1"];
        let out = Command::new(env!("CARGO_BIN_EXE_lockstep")).args(args).env("LOCKSTEP_NORM_PLANES", planes).current_dir(&dir).output().expect("run lockstep");
        assert!(out.status.success(), "LOCKSTEP_NORM_PLANES={planes}: {}", String::from_utf8_lossy(&out.stderr));
        metrics(&dir.join("runs").join(name))
    };
    let (cubes, planes) = (run("cubes", "off"), run("planes", "force"));
    assert_eq!(cubes.len(), 2);
    for (c, p) in cubes.iter().zip(&planes) {
        assert_eq!(p["agreement"]["bit_equal_frac"], 1.0, "{p}");
        for key in ["trainer_weights_fingerprint", "sampler_weights_fingerprint", "grad_norm", "agreement", "reward_mean", "loss"] {
            assert_eq!(c[key], p[key], "step {}: {key} differs between the cube and the plane kernels", c["step"]);
        }
    }
    assert!(cubes.iter().any(|m| m["grad_norm"].as_f64().unwrap() > 0.0), "no real update to compare: {cubes:?}");
}

/// A copy of the tiny HF fixture in `dir/name`, damaged by `damage`.
fn damaged_checkpoint(dir: &Path, name: &str, damage: impl FnOnce(&Path)) -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared-kernels/tests/fixtures/tiny-qwen3");
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(fixture.join(f), out.join(f)).unwrap();
    }
    damage(&out);
    out
}

/// The safetensors header of `file` as JSON and the byte offset of the data.
fn safetensors_header(file: &Path) -> (Vec<u8>, serde_json::Map<String, serde_json::Value>, usize) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (bytes, header.as_object().unwrap().clone(), 8 + n)
}

fn edit_config(dir: &Path, key: &str, value: serde_json::Value) {
    let path = dir.join("config.json");
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c[key] = value;
    std::fs::write(path, c.to_string()).unwrap();
}

#[test]
fn config_json_stop_ids_end_sampling_without_a_generation_config_and_are_overridden_by_one() {
    let dir = scratch("stop-ids");
    let vocab = serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(damaged_checkpoint(&dir, "probe", |_| {}).join("config.json")).unwrap()).unwrap()["vocab_size"].as_u64().unwrap();
    // every id a stop id: each completion ends at its first token, as transformers' generate would
    let every: Vec<u64> = (0..vocab).collect();
    std::fs::write(dir.join("prompts.jsonl"), "{\"prompt_ids\": [5, 6, 7]}\n{\"prompt_ids\": [8, 9]}\n").unwrap();
    let lengths = |ck: &Path| -> Vec<usize> {
        let out = lockstep(&["sample", "--set", &format!("model.path={}", ck.display()), "--set", "sampler.input=prompts.jsonl", "--set", "sampler.output=out.jsonl", "--set", "sampler.max_new_tokens=6", "--set", "log.progress=false"], &dir);
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        std::fs::read_to_string(dir.join("out.jsonl")).unwrap().lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["token_ids"].as_array().unwrap().len()).collect()
    };
    assert_eq!(lengths(&damaged_checkpoint(&dir, "config-eos", |d| edit_config(d, "eos_token_id", serde_json::json!(every)))), [1, 1]);
    // a generation_config.json takes precedence, and here it names no stop id the model samples
    let overridden = damaged_checkpoint(&dir, "generation-eos", |d| {
        edit_config(d, "eos_token_id", serde_json::json!(every));
        std::fs::write(d.join("generation_config.json"), r#"{"eos_token_id": null}"#).unwrap();
    });
    assert!(lengths(&overridden).iter().any(|&n| n > 1), "generation_config.json's stop ids replace config.json's");
}

#[test]
fn damaged_checkpoints_are_errors_naming_the_file_and_are_left_as_they_were() {
    let dir = scratch("bad-ckpt");
    type Damage = Box<dyn FnOnce(&Path)>;
    let cases: Vec<(&str, Damage, &str)> = vec![
        ("truncated", Box::new(|d| {
            let bytes = std::fs::read(d.join("model.safetensors")).unwrap();
            std::fs::write(d.join("model.safetensors"), &bytes[..1000]).unwrap();
        }), "model.safetensors"),
        ("dtype", Box::new(|d| {
            let file = d.join("model.safetensors");
            let (bytes, mut header, data) = safetensors_header(&file);
            let key = header.keys().find(|k| *k != "__metadata__").unwrap().clone();
            header[&key]["dtype"] = "I64".into();
            let mut text = serde_json::Value::Object(header).to_string().into_bytes();
            text.resize(text.len().next_multiple_of(8), b' ');
            std::fs::write(&file, [&(text.len() as u64).to_le_bytes()[..], &text, &bytes[data..]].concat()).unwrap();
        }), "model.safetensors"),
        ("nan", Box::new(|d| {
            let file = d.join("model.safetensors");
            let (mut bytes, header, data) = safetensors_header(&file);
            let (_, t) = header.iter().find(|(k, v)| *k != "__metadata__" && v["dtype"] == "F32").unwrap();
            let at = data + t["data_offsets"][0].as_u64().unwrap() as usize;
            bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
            std::fs::write(&file, bytes).unwrap();
        }), "non-finite"),
        // finite weights whose activations overflow (the final norm scaled to 1e38: the logits
        // pass f32's range): the loss is NaN, and the error points at the checkpoint
        ("overflow", Box::new(|d| {
            let file = d.join("model.safetensors");
            let (mut bytes, header, data) = safetensors_header(&file);
            let t = &header["model.norm.weight"];
            assert_eq!(t["dtype"], "F32");
            let (from, to) = (t["data_offsets"][0].as_u64().unwrap() as usize, t["data_offsets"][1].as_u64().unwrap() as usize);
            for at in (data + from..data + to).step_by(4) {
                bytes[at..at + 4].copy_from_slice(&1e38f32.to_le_bytes());
            }
            std::fs::write(&file, bytes).unwrap();
        }), "the checkpoint's weights (model.path"),
        ("shape", Box::new(|d| edit_config(d, "hidden_size", 128.into())), "config.json"),
        // fewer positions than sampler.context (48 by default): the key to lower, not the engine's words
        ("positions", Box::new(|d| edit_config(d, "max_position_embeddings", 16.into())), "config key `sampler.context`: 48 is past the model's 16 positions"),
        ("vocab", Box::new(|d| edit_config(d, "vocab_size", 100.into())), "model.safetensors"),
        ("index", Box::new(|d| {
            std::fs::remove_file(d.join("model.safetensors")).unwrap();
            std::fs::write(d.join("model.safetensors.index.json"), r#"{"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}"#).unwrap();
        }), "model-00001-of-00002.safetensors"),
        ("tokenizer", Box::new(|d| std::fs::write(d.join("tokenizer.json"), "garbage").unwrap()), "tokenizer.json"),
        ("config", Box::new(|d| std::fs::write(d.join("config.json"), "{").unwrap()), "config.json"),
        // a Qwen3 checkpoint labelled Llama: the forward would skip its q_norm and k_norm
        ("architecture", Box::new(|d| edit_config(d, "architectures", serde_json::json!(["LlamaForCausalLM"]))), "self_attn.k_norm.weight`: in the checkpoint but not in the model config.json describes"),
        // stop ids past the vocabulary: config.json's count where there is no generation_config.json
        ("eos-config", Box::new(|d| edit_config(d, "eos_token_id", serde_json::json!([1, 500]))), "config.json: eos_token_id 500"),
        ("eos-generation", Box::new(|d| {
            edit_config(d, "eos_token_id", serde_json::json!(500));
            std::fs::write(d.join("generation_config.json"), r#"{"eos_token_id": [1, 600]}"#).unwrap();
        }), "generation_config.json: eos_token_id 600"),
        ("eos-name", Box::new(|d| std::fs::write(d.join("tokenizer_config.json"), r#"{"eos_token": "<|no such token|>"}"#).unwrap()), "eos_token \"<|no such token|>\" is not a token"),
    ];
    for (name, damage, needle) in cases {
        let ck = damaged_checkpoint(&dir, name, damage);
        let before: Vec<(String, Vec<u8>)> = std::fs::read_dir(&ck).unwrap().map(|e| e.unwrap()).map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap())).collect();
        let out = lockstep(&["train", "--set", &format!("model.path={}", ck.display()), "--set", "train.steps=1", "--set", "train.sft_steps=0", "--set", &format!("log.run_name={name}")], &dir);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{name}: {err}");
        assert!(err.contains(needle) && !err.contains("panicked"), "{name}: error should name {needle:?}: {err}");
        for (file, bytes) in before {
            assert_eq!(std::fs::read(ck.join(&file)).unwrap(), bytes, "{name}: {file} was modified");
        }
    }
}

#[test]
fn loss_variants_run_and_each_changes_the_update() {
    let dir = scratch("loss-variants");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let run = |name: &str, extra: &[&str]| {
        let run_name = format!("log.run_name={name}");
        let args = [&["train", "small.toml", "--set", &run_name, "--set", "train.steps=2", "--set", "task.reward=char_f1"][..], extra].concat();
        let out = lockstep(&args, &dir);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        metrics(&dir.join("runs").join(name))
    };
    let base = run("base", &[]);
    let fingerprint = |m: &[serde_json::Value]| m.last().unwrap()["trainer_weights_fingerprint"].clone();
    // (sequence_mean equals token_mean when every completion has the same length, so it is
    // only run)
    for (name, extra, differs) in [
        ("drgrpo", vec!["--set", "train.advantage=group_mean", "--set", "train.loss_aggregation=constant"], true),
        ("seqmean", vec!["--set", "train.loss_aggregation=sequence_mean"], false),
        ("overlong", vec!["--set", "train.overlong_buffer=2", "--set", "train.overlong_penalty=0.5"], true),
    ] {
        let m = run(name, &extra);
        assert_eq!(m[0]["agreement"]["bit_equal_frac"], 1.0);
        if differs {
            assert_ne!(fingerprint(&m), fingerprint(&base), "{name} left the update as the default's");
        }
    }
    let out = lockstep(&["train", "small.toml", "--set", "train.loss_aggregation=mean"], &dir);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("train.loss_aggregation"));
}

#[test]
fn ppo_epochs_clip_against_the_sampler_logprobs_and_repeat_with_micro_batches() {
    let dir = scratch("ppo-epochs");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let run = |name: &str, extra: &[&str]| {
        let run_name = format!("log.run_name={name}");
        let args = [&["train", "small.toml", "--set", &run_name, "--set", "train.steps=2", "--set", "task.reward=char_f1", "--set", "train.lr=0.02"][..], extra].concat();
        let out = lockstep(&args, &dir);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        metrics(&dir.join("runs").join(name))
    };
    let base = run("one-update", &[]);
    let dapo = ["--set", "train.ppo_epochs=2", "--set", "train.mini_batches=2", "--set", "train.clip_high=0.28"];
    let ppo = run("ppo", &dapo);
    for m in &ppo {
        // the sampler and the trainer still agree as bits before the step's first update
        assert_eq!(m["agreement"]["bit_equal_frac"], 1.0, "{m}");
        // later updates see moved weights: genuine ratios around 1
        let (lo, hi) = (m["is_ratio_min"].as_f64().unwrap(), m["is_ratio_max"].as_f64().unwrap());
        assert!(lo <= 1.0 && hi >= 1.0 && hi > lo, "ratios {lo}..{hi}: {m}");
    }
    assert_ne!(ppo.last().unwrap()["trainer_weights_fingerprint"], base.last().unwrap()["trainer_weights_fingerprint"], "4 updates a step left the weights of 1");
    // micro-batches inside each PPO mini-batch keep every bit; GSPO's sequence ratios run too
    let micro = run("ppo-micro", &[&dapo[..], &["--set", "train.micro_batch_tokens=20"]].concat());
    for (a, b) in ppo.iter().zip(&micro) {
        for key in ["trainer_weights_fingerprint", "grad_norm", "is_ratio_max", "masked_frac"] {
            assert_eq!(a[key], b[key], "step {}: {key}", a["step"]);
        }
    }
    let gspo = run("gspo", &[&dapo[..], &["--set", "train.ratio_level=sequence"]].concat());
    assert_ne!(gspo.last().unwrap()["trainer_weights_fingerprint"], ppo.last().unwrap()["trainer_weights_fingerprint"]);
    for (bad, key) in [("train.ppo_epochs=0", "train.ppo_epochs"), ("train.ratio_level=group", "train.ratio_level"), ("train.clip_low=1.5", "train.clip_low")] {
        let out = lockstep(&["train", "small.toml", "--set", bad], &dir);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(key), "{bad}");
    }
}

#[test]
fn evaluation_every_n_steps_logs_pass_at_1_and_pass_at_k_and_repeats() {
    let dir = scratch("eval");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    std::fs::write(dir.join("eval.jsonl"), (0..5).map(|i| format!("{{\"prompt\": \"{i}+1=\", \"answer\": \"{}\"}}\n", i + 1)).collect::<String>()).unwrap();
    let run = |name: &str| {
        let out = lockstep(&["train", "small.toml", "--set", &format!("log.run_name={name}"), "--set", "train.steps=3", "--set", "train.eval_every=2", "--set", "task.eval_path=eval.jsonl", "--set", "train.eval_samples=3"], &dir);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{err}");
        (metrics(&dir.join("runs").join(name)), err)
    };
    let ((a, err), (b, _)) = (run("a"), run("b"));
    let evals: Vec<usize> = a.iter().filter(|m| m.get("eval").is_some()).map(|m| m["step"].as_u64().unwrap() as usize).collect();
    assert_eq!(evals, vec![1], "after steps 2, 4, ...: {a:?}");
    let e = &a[1]["eval"];
    assert_eq!((e["problems"].as_u64(), e["k"].as_u64()), (Some(5), Some(3)), "{e}");
    for key in ["pass1_greedy", "pass_at_k", "sampled_accuracy", "sampled_reward_mean"] {
        let v = e[key].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&v), "{key} = {v}");
    }
    assert!(e["pass_at_k"].as_f64() >= e["sampled_accuracy"].as_f64(), "pass@k below the sampled accuracy: {e}");
    assert!(err.contains("eval: pass@1"), "{err}");
    assert_eq!(a, b, "two runs with evaluation differ");
    let tb = tensorboard_points(&dir.join("runs/a/tb"));
    assert_eq!(tb.get("eval/pass_at_k"), Some(&vec![1]), "{tb:?}");
    // a dataset task needs its eval split named (a generator draws its own)
    let out = lockstep(&["train", "small.toml", "--set", "task.name=jsonl", "--set", "task.path=eval.jsonl", "--set", "train.eval_every=2"], &dir);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("task.eval_path"));
    // and an eval split without evaluations would never be read (it was ignored, missing or not)
    let out = lockstep(&["train", "small.toml", "--set", "task.eval_path=missing.jsonl"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("task.eval_path") && err.contains("train.eval_every"), "{err}");
}

#[test]
fn dynamic_sampling_drops_groups_without_signal_and_refills_them() {
    let dir = scratch("dynamic-sampling");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let run = |name: &str, extra: &[&str]| {
        let run_name = format!("log.run_name={name}");
        // exact-match rewards on a barely trained model: most groups score all 0
        let args = [&["train", "small.toml", "--set", &run_name, "--set", "train.steps=2", "--set", "train.sft_steps=5"][..], extra].concat();
        let out = lockstep(&args, &dir);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        metrics(&dir.join("runs").join(name))
    };
    let off = run("off", &[]);
    assert!(off.iter().all(|m| m.get("dynamic_sampling").is_none()), "{off:?}");
    let on = run("on", &["--set", "train.dynamic_sampling_rounds=3", "--set", "task.reward=char_f1"]);
    let again = run("again", &["--set", "train.dynamic_sampling_rounds=3", "--set", "task.reward=char_f1"]);
    assert_eq!(on, again, "dynamic sampling is not deterministic");
    // SMALL has 2 prompts a step: 2 groups with signal kept, refilled from more rounds
    for m in &on {
        let d = &m["dynamic_sampling"];
        assert_eq!(d["groups_kept"], 2, "{d}");
        assert!(d["groups_sampled"].as_u64().unwrap() >= 2, "{d}");
        assert_eq!(m["agreement"]["bit_equal_frac"], 1.0);
    }
    assert!(on.iter().any(|m| m["dynamic_sampling"]["groups_sampled"].as_u64().unwrap() > 2), "no step needed a refill round: {on:?}");
    // a run where every group is degenerate keeps training on the first round
    let flat = run("flat", &["--set", "train.dynamic_sampling_rounds=1", "--set", "task.reward=command", "--set", "task.reward_command=sh -c 'while read l; do echo 0; done'"]);
    for m in &flat {
        assert_eq!(m["dynamic_sampling"]["groups_kept"], 0, "{m}");
        assert_eq!(m["grad_norm"], 0.0, "{m}");
    }
}
