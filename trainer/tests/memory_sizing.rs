//! `"auto"` memory sizes end to end: a run sized by the plan is the same run as hand-sized ones
//! (every step's fingerprints and metrics; only the logged loss's last bits may differ), a
//! config that cannot fit is refused before loading naming the keys with values that fit, and a
//! device allocation that fails mid-run is named as such, saves the state before the step and
//! resumes with another size bit-identically.

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Output};
use trainer::config::{Config, Sizing};
use trainer::memory_plan::{auto::choose, DeviceMemory, Purpose};

/// `lockstep` with `env` set (and the fault variables of other tests cleared).
fn lockstep_env(args: &[&str], dir: &Path, env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockstep"));
    cmd.args(args).current_dir(dir).env_remove("LOCKSTEP_FAKE_DEVICE_MEMORY").env_remove("LOCKSTEP_FAULT_OOM").env_remove("RUST_BACKTRACE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run lockstep")
}

/// Three steps of SMALL; a sampler of 8 requests in chunks of 4 tokens, so its step buffers are
/// smaller than a trainer pass and the plan's choice of pass shows.
const RUN: &[&str] = &["--set", "train.steps=3", "--set", "task.reward=char_f1", "--set", "train.sft_steps=2", "--set", "train.checkpoint_every=0", "--set", "sampler.max_batch=8", "--set", "sampler.chunk_size=4"];

/// SMALL with RUN's overrides, as the plan sees it.
fn small_config(dir: &Path) -> Config {
    Config::load(Some(&dir.join("small.toml")), &RUN.iter().skip(1).step_by(2).map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
}

/// The largest fake device (free = total, lavapipe's binding limit) on which the plan cuts
/// `c`'s step into passes of at most `tokens`, and the pass it picks there.
fn device_for_pass(c: &Config, tokens: usize) -> (u64, usize) {
    let shape = trainer::run::model_shape(c).unwrap();
    let pass = |total: u64| choose(c, &shape, 4, Purpose::Train, 1, &DeviceMemory { total, free: total, tensor_limit: Some(128 << 20) }).ok().map(|(s, _)| s.train.pass_tokens());
    let (mut lo, mut hi) = (1u64 << 20, 1u64 << 36);
    assert!(pass(hi).is_some_and(|p| p > tokens), "a large device must take bigger passes");
    while hi - lo > 1024 {
        let mid = lo + (hi - lo) / 2;
        match pass(mid) {
            Some(p) if p <= tokens => lo = mid,
            Some(_) => hi = mid,
            None => lo = mid,
        }
    }
    let picked = pass(lo).expect("the device found fits");
    (lo, picked)
}

#[test]
fn a_run_sized_by_the_plan_is_the_same_run_as_hand_sized_ones() {
    let dir = scratch("sizing-auto");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let c = small_config(&dir);
    // a device on which auto cuts each step (8 rollouts of 48 positions) into several passes
    let (device, picked) = device_for_pass(&c, 120);
    assert!(picked >= c.sampler.context && picked < 8 * c.sampler.context, "{picked}");
    let run = |name: &str, extra: &[&str], env: &[(&str, String)]| {
        let run_name = format!("log.run_name={name}");
        let args = [&["train", "small.toml", "--set", &run_name][..], RUN, extra].concat();
        let out = lockstep_env(&args, &dir, env);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{name}: {err}");
        (metrics(&dir.join("runs").join(name)), err)
    };
    let (auto, err) = run("auto", &[], &[("LOCKSTEP_FAKE_DEVICE_MEMORY", device.to_string())]);
    assert!(err.contains(&format!("train.micro_batch_tokens = {picked}")) && err.contains("auto sizes for"), "the plan does not say what it chose: {err}");
    let (own, err) = run("auto-own-device", &[], &[]);
    assert!(err.contains("auto sizes"), "{err}");
    assert_eq!(auto.len(), 3);
    for (name, extra) in [("whole", &["--set", "train.micro_batch_tokens=0", "--set", "sampler.kv_budget_mib=0"][..]), ("one-sequence", &["--set", "train.micro_batch_tokens=48"]), ("hand", &["--set", "train.micro_batch_tokens=200", "--set", "sampler.kv_budget_mib=1"])] {
        let (hand, _) = run(name, extra, &[]);
        for (a, h) in auto.iter().zip(&hand).chain(own.iter().zip(&hand)) {
            for key in ["trainer_weights_fingerprint", "sampler_weights_fingerprint", "grad_norm", "agreement", "reward_mean", "entropy", "lr", "response_len_mean"] {
                assert_eq!(a[key], h[key], "step {}: {key} differs between the auto-sized run and {name}", a["step"]);
            }
            let (la, lh) = (a["loss"].as_f64().unwrap(), h["loss"].as_f64().unwrap());
            assert!((la - lh).abs() <= 1e-5 * la.abs().max(1e-3), "step {}: loss {la} vs {lh} ({name})", a["step"]);
        }
    }
    assert!(auto.iter().filter(|m| m["grad_norm"].as_f64().unwrap() > 0.0).count() >= 2, "too few real updates to compare: {auto:?}");
}

#[test]
fn a_config_that_cannot_fit_is_refused_before_loading_naming_keys_with_values_that_fit() {
    let dir = scratch("sizing-refused");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let (device, _) = device_for_pass(&small_config(&dir), 100);
    let fake = [("LOCKSTEP_FAKE_DEVICE_MEMORY", device.to_string())];
    // the whole step in one pass does not fit that device without recomputation: refused
    // before the SFT warm start
    let out = lockstep_env(&[&["train", "small.toml", "--set", "log.run_name=big", "--set", "train.micro_batch_tokens=0", "--set", "train.recompute_layers=false"][..], RUN].concat(), &dir, &fake);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("train.micro_batch_tokens") && err.contains("does not fit") && err.contains("train.recompute_layers = true") && err.contains("free of"), "{err}");
    assert!(!err.contains("sft step") && !dir.join("runs/big/checkpoints").exists(), "it ran before refusing: {err}");
    // the value it names runs
    let value = err.split("train.micro_batch_tokens = ").nth(1).and_then(|r| r.split(|ch: char| !ch.is_ascii_digit()).next()).unwrap().to_string();
    let micro = format!("train.micro_batch_tokens={value}");
    let out = lockstep_env(&[&["train", "small.toml", "--set", "log.run_name=fits"][..], RUN, &["--set", "train.steps=1", "--set", &micro]].concat(), &dir, &fake);
    assert!(out.status.success(), "the named value {value}: {}", String::from_utf8_lossy(&out.stderr));
    // a device too small for the fixed state names the model's size, and sampling is planned too
    let tiny = [("LOCKSTEP_FAKE_DEVICE_MEMORY", "1000000".to_string())];
    let out = lockstep_env(&["train", "small.toml", "--set", "log.run_name=tiny"], &dir, &tiny);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("model.hidden_size") && err.contains("--gpus"), "{err}");
    std::fs::write(dir.join("p.jsonl"), "{\"prompt\": \"1+1=\"}\n").unwrap();
    let out = lockstep_env(&["sample", "--set", "sampler.input=p.jsonl", "--set", "sampler.output=o.jsonl"], &dir, &tiny);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!dir.join("o.jsonl").exists());
}

#[test]
fn out_of_device_memory_mid_run_is_named_saves_the_step_and_resumes_with_another_size_bit_identically() {
    let dir = scratch("sizing-oom");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let run = |name: &str, extra: &[&str], env: &[(&str, String)]| {
        let run_name = format!("log.run_name={name}");
        let args = [&["train", "small.toml", "--set", &run_name][..], RUN, extra].concat();
        lockstep_env(&args, &dir, env)
    };
    let whole = run("ref", &[], &[]);
    assert!(whole.status.success(), "{}", String::from_utf8_lossy(&whole.stderr));
    let reference = metrics(&dir.join("runs/ref"));
    for phase in ["sample", "score", "update"] {
        let name = format!("oom-{phase}");
        let out = run(&name, &["--set", "train.micro_batch_tokens=0"], &[("LOCKSTEP_FAULT_OOM", format!("{phase}:1"))]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{phase}: {err}");
        assert!(err.contains("step 1: out of device memory in") && err.contains("4.29 GB asked") && err.contains("train.micro_batch_tokens (now 0, the whole step)") && err.contains("sampler.kv_budget_mib"), "{phase}: {err}");
        assert!(!err.contains("IO error") && !err.contains("panicked"), "{phase}: {err}");
        assert!(dir.join(format!("runs/{name}/checkpoints/step-000001")).exists(), "{phase}: the state before step 1 is not saved: {err}");
        assert_eq!(metrics(&dir.join("runs").join(&name)).len(), 1, "{phase}");
        // the resume takes another micro-batch size, and the run is the uninterrupted one
        let out = run(&name, &["--resume", "--set", "train.micro_batch_tokens=48"], &[]);
        assert!(out.status.success(), "{phase}: {}", String::from_utf8_lossy(&out.stderr));
        let resumed = metrics(&dir.join("runs").join(&name));
        assert_eq!(resumed.len(), reference.len(), "{phase}");
        for (a, b) in reference.iter().zip(&resumed) {
            for key in ["trainer_weights_fingerprint", "sampler_weights_fingerprint", "grad_norm", "agreement", "reward_mean"] {
                assert_eq!(a[key], b[key], "{phase}: step {}: {key} differs after the out-of-memory resume", a["step"]);
            }
        }
    }
}

#[test]
fn auto_is_the_default_and_explicit_sizes_round_trip_through_the_resolved_config() {
    let c = Config::default();
    assert_eq!((c.train.micro_batch_tokens, c.sampler.kv_budget_mib), (Sizing::Auto, Sizing::Auto));
    let c = Config::load(None, &["train.micro_batch_tokens=16384".into(), "sampler.kv_budget_mib=auto".into()]).unwrap();
    assert_eq!((c.train.micro_batch_tokens, c.sampler.kv_budget_mib), (Sizing::Set(16384), Sizing::Auto));
    let back: Config = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
    assert_eq!(back, c);
    let e = Config::load(None, &["train.micro_batch_tokens=lots".into()]).unwrap_err().to_string();
    assert!(e.contains("train.micro_batch_tokens") && e.contains("\"auto\""), "{e}");
}

/// `lockstep sample` whose engine runs out of device memory: exit 1 naming it with the sizes and
/// the sampler's keys (never cubecl's "An IO error happened"), and every request's error kept in
/// the output file.
#[test]
fn out_of_device_memory_while_sampling_is_named_with_the_samplers_keys() {
    let dir = scratch("sizing-oom-sample");
    std::fs::write(dir.join("prompts.jsonl"), "{\"prompt\": \"sort 312:\"}\n{\"prompt\": \"1+1=\"}\n").unwrap();
    let args = ["sample", "--set", "sampler.input=prompts.jsonl", "--set", "sampler.output=out.jsonl", "--set", "sampler.max_new_tokens=4"];
    let out = lockstep_env(&args, &dir, &[("LOCKSTEP_FAULT_OOM", "engine".to_string())]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("out of device memory in a sampling step") && err.contains("6.89 GB asked") && err.contains("2 request(s) failed"), "{err}");
    assert!(err.contains("sampler.kv_budget_mib (now ") && err.contains("sampler.max_batch") && err.contains("sampler.chunk_size"), "{err}");
    assert!(!err.contains("An IO error happened") && !err.contains("panicked"), "{err}");
    let lines = std::fs::read_to_string(dir.join("out.jsonl")).unwrap();
    assert_eq!(lines.lines().filter(|l| l.contains("out of device memory")).count(), 2, "{lines}");
    // without the fault the same command samples both
    let out = lockstep_env(&args, &dir, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
