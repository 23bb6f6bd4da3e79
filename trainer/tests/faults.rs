//! lockstep's fault suite: SIGKILL at seeded random moments (also inside checkpoint writes and
//! right after a step's metrics and TensorBoard writes), each followed by a restart, must end in
//! the uninterrupted run's metrics, weights and TensorBoard curves; a full disk (a file-size
//! limit: writes fail with EFBIG) during a checkpoint write must be a clear error that leaves the
//! previous checkpoint intact, and the run must then resume to the same result; so must a real
//! full file system (a tmpfs in a mount namespace of its own); a panic on cubecl's device
//! thread must stop the run, naming it; a second process in a run folder is refused.
//!
//! CI runs a reduced set (`LOCKSTEP_FAULT_KILLS`, default 4 kills); the full set:
//! `LOCKSTEP_FAULT_KILLS=40 cargo test --locked -p trainer --test faults`.

mod common;

use common::{lockstep, metrics, scratch, tensorboard_points, SMALL};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RUN: &[&str] = &["train", "small.toml", "--set", "train.checkpoint_every=1"];

/// The run's checkpoint folders (`step-N`), sorted.
fn checkpoint_names(run: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(run.join("checkpoints")).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with("step-")).collect();
    names.sort();
    names
}

/// A complete checkpoint exists (the run can `--resume`).
fn has_checkpoint(run: &Path) -> bool {
    std::fs::read_dir(run.join("checkpoints")).map_or(false, |entries| {
        entries.filter_map(|e| e.ok()).any(|e| e.file_name().to_string_lossy().starts_with("step-") && e.path().join("state.json").exists())
    })
}

/// The arguments that continue `name`: `--resume` when it has a checkpoint, else a fresh start
/// (a folder without checkpoints starts afresh, as documented).
fn restart_args(dir: &Path, name: &str) -> Vec<String> {
    let mut args: Vec<String> = RUN.iter().map(|s| s.to_string()).collect();
    args.extend(["--set".into(), format!("log.run_name={name}")]);
    if has_checkpoint(&dir.join("runs").join(name)) {
        args.push("--resume".into());
    }
    args
}

/// SplitMix64: the kill schedule from one seed, printed so a failure can be replayed.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Whether a checkpoint is being written (its temporary folder exists).
fn writing_checkpoint(run: &Path) -> bool {
    std::fs::read_dir(run.join("checkpoints")).map_or(false, |entries| entries.filter_map(|e| e.ok()).any(|e| e.file_name().to_string_lossy().ends_with(".tmp")))
}

fn logged_steps(run: &Path) -> usize {
    std::fs::read_to_string(run.join("metrics.jsonl")).map_or(0, |t| t.lines().count())
}

/// `lockstep train small.toml` (no SFT warm start) in a fresh scratch folder `name`, with the
/// failpoint `var=value` set: (exit code, stderr, the folder).
fn train_with_failpoint(name: &str, var: &str, value: &str) -> (Option<i32>, String, common::Scratch) {
    let dir = scratch(name);
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(["train", "small.toml", "--set", "log.run_name=f", "--set", "train.sft_steps=0"])
        .env(var, value)
        .env_remove("RUST_BACKTRACE")
        .current_dir(&dir)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned(), dir)
}

#[test]
fn kills_at_random_moments_then_restarts_end_in_the_uninterrupted_run() {
    let dir = scratch("faults-kill");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let out = lockstep(&[RUN, &["--set", "log.run_name=straight"]].concat(), &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let straight = metrics(&dir.join("runs/straight"));
    assert_eq!(straight.len(), 6);
    let kills: usize = std::env::var("LOCKSTEP_FAULT_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(4);
    let seed: u64 = std::env::var("LOCKSTEP_TEST_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x5eed);
    let mut state = seed;
    let run = dir.join("runs/killed");
    let mut schedule = Vec::new();
    for i in 0..kills {
        let args = restart_args(&dir, "killed");
        let mut child = Command::new(env!("CARGO_BIN_EXE_lockstep")).args(&args).current_dir(&dir).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        // the moment: a random delay, the inside of a checkpoint write, or just after a step's
        // metrics and TensorBoard writes
        let kind = i % 3;
        let delay = Duration::from_millis(200 + next(&mut state) % 6000);
        let steps_before = logged_steps(&run);
        let started = Instant::now();
        let finished = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            let now = match kind {
                0 => started.elapsed() >= delay,
                1 => writing_checkpoint(&run),
                _ => logged_steps(&run) > steps_before,
            };
            if now || started.elapsed() > Duration::from_secs(120) {
                break None;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        if let Some(status) = finished {
            schedule.push(format!("kill {i} ({kind}): the run ended first ({status})"));
            assert!(status.success(), "a restarted run failed ({status}); schedule so far {schedule:?} (seed {seed})");
            break;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        schedule.push(format!("kill {i} (kind {kind}) after {:.2} s with {} steps logged", started.elapsed().as_secs_f64(), logged_steps(&run)));
    }
    // then to the end
    let args = restart_args(&dir, "killed");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = lockstep(&args, &dir);
    assert!(out.status.success(), "{} (schedule {schedule:?}, seed {seed})", String::from_utf8_lossy(&out.stderr));
    assert_eq!(metrics(&run), straight, "metrics after {schedule:?} (seed {seed}) differ from the uninterrupted run");
    let weights = |name: &str| std::fs::read(dir.join("runs").join(name).join("checkpoints/step-000006/model.safetensors")).unwrap();
    assert!(weights("killed") == weights("straight"), "final weights differ after {schedule:?}");
    eprintln!("fault schedule (seed {seed}): {schedule:?}");
    assert!(schedule.iter().filter(|s| s.contains("after")).count() >= kills.min(3), "too few kills landed: {schedule:?}");
    let points = tensorboard_points(&run.join("tb"));
    assert_eq!(points, tensorboard_points(&dir.join("runs/straight/tb")), "TensorBoard curves differ after {schedule:?}");
}

#[test]
fn a_full_disk_during_a_checkpoint_write_is_an_error_and_the_previous_checkpoint_survives() {
    let dir = scratch("faults-disk");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let out = lockstep(&[RUN, &["--set", "log.run_name=straight"]].concat(), &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let straight = metrics(&dir.join("runs/straight"));
    // 3 steps, then a resume whose writes may not pass 50 KB a file: metrics lines and TensorBoard
    // events fit, the next checkpoint's weights (~350 KB) do not
    let out = lockstep(&[RUN, &["--set", "log.run_name=full", "--max-steps", "3"]].concat(), &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let complete_before = checkpoint_names(&dir.join("runs/full"));
    assert_eq!(complete_before.last().map(String::as_str), Some("step-000003"));
    let last = dir.join("runs/full/checkpoints/step-000003");
    let before: Vec<(String, Vec<u8>)> = ["model.safetensors", "optimizer.safetensors", "state.json"].iter().map(|f| (f.to_string(), std::fs::read(last.join(f)).unwrap())).collect();
    let cmd = format!("trap '' XFSZ; ulimit -f 100; exec {} {} --set log.run_name=full --resume", env!("CARGO_BIN_EXE_lockstep"), RUN.join(" "));
    let out = Command::new("sh").args(["-c", &cmd]).current_dir(&dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the run passed a full disk: {err}");
    assert_ne!(out.status.code(), Some(101), "a panic: {err}");
    assert!(err.contains("checkpoint") && (err.contains("too large") || err.contains("No space")), "not a clear error: {err}");
    eprintln!("the full-disk error: {}", err.lines().filter(|l| l.contains("error")).collect::<Vec<_>>().join(" | "));
    for (f, bytes) in &before {
        assert!(std::fs::read(last.join(f)).unwrap() == *bytes, "{f} of the previous checkpoint changed");
    }
    // no half-written checkpoint is taken for a complete one
    assert_eq!(checkpoint_names(&dir.join("runs/full")), complete_before, "{err}");
    // with room again, the resume ends where the uninterrupted run did
    let out = lockstep(&[RUN, &["--set", "log.run_name=full", "--resume"]].concat(), &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(metrics(&dir.join("runs/full")), straight);
}

#[test]
fn a_panic_inside_a_kernel_launch_is_an_error_naming_the_op_and_its_sizes() {
    // the failpoint panics when the rmsnorm launcher is entered, as a panic inside burn or
    // cubecl would at that launch
    let (code, err, _) = train_with_failpoint("faults-panic", "LOCKSTEP_FAULT_PANIC", "rmsnorm");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("internal failure") && err.contains("fault injection"), "{err}");
    // (the failpoint fires as the first input is checked, so the message names that one)
    assert!(err.contains("`rmsnorm` with x [") && err.contains("] F32"), "the op and its input sizes are not named: {err}");
    assert!(!err.contains("panicked at"), "a raw panic reached the user: {err}");
}

#[test]
fn a_kernel_that_fails_to_compile_stops_the_run_at_once() {
    // the failpoint logs the warning cubecl's device thread logs for a kernel that does not
    // compile; cubecl itself would retry that kernel at every launch, seconds each
    let started = std::time::Instant::now();
    let (code, err, dir) = train_with_failpoint("fault-compile", "LOCKSTEP_FAULT_COMPILE", "1");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("failed to compile") && err.contains("fault injection"), "{err}");
    assert!(started.elapsed().as_secs() < 60, "the run did not stop at once");
    assert!(!dir.join("runs/f/checkpoints").exists(), "the run went on after the failure");
}

#[test]
fn a_full_disk_while_sample_writes_is_an_error_and_the_earlier_output_survives() {
    let dir = scratch("faults-sample-disk");
    let prompts: String = (0..400).map(|i| format!("{{\"prompt\": \"{}+{}=\"}}\n", i % 10, i % 7)).collect();
    std::fs::write(dir.join("prompts.jsonl"), &prompts).unwrap();
    let args = ["sample", "--set", "sampler.input=prompts.jsonl", "--set", "sampler.output=out.jsonl", "--set", "sampler.max_new_tokens=8", "--set", "log.progress=false"];
    std::fs::write(dir.join("out.jsonl"), "an earlier output\n").unwrap();
    // 400 completions with their token ids and logprobs pass the 50 KB a file allows
    let cmd = format!("trap '' XFSZ; ulimit -f 100; exec {} {}", env!("CARGO_BIN_EXE_lockstep"), args.join(" "));
    let out = Command::new("sh").args(["-c", &cmd]).current_dir(&dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "sample passed a full disk: {err}");
    assert_ne!(out.status.code(), Some(101), "a panic: {err}");
    assert!(err.contains("sampler.output is left as it was") && (err.contains("too large") || err.contains("No space")), "not a clear error: {err}");
    assert_eq!(std::fs::read_to_string(dir.join("out.jsonl")).unwrap(), "an earlier output\n");
    assert_eq!(std::fs::read_to_string(dir.join("prompts.jsonl")).unwrap(), prompts);
    let leftovers: Vec<String> = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.ends_with(".tmp")).collect();
    assert!(leftovers.is_empty(), "a partial file was left: {leftovers:?}");
}

#[test]
fn a_full_tmpfs_during_a_checkpoint_write_is_an_error_and_the_previous_checkpoint_survives() {
    // a real full file system (ENOSPC), where the test above only limits the file size: the
    // run's folder on a tmpfs of its own mount namespace (`unshare -rm`, no privileges needed)
    if !Command::new("unshare").args(["-rm", "true"]).status().is_ok_and(|s| s.success()) {
        eprintln!("skipped: this machine gives no mount namespace (unshare -rm); the file-size test above covers the write path");
        return;
    }
    let dir = scratch("faults-tmpfs");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let out = lockstep(&[RUN, &["--set", "log.run_name=straight"]].concat(), &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let straight = metrics(&dir.join("runs/straight"));
    let out = lockstep(&[RUN, &["--set", "log.run_name=full", "--max-steps", "3"]].concat(), &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let last = |runs: &Path| runs.join("full/checkpoints/step-000003");
    let files = ["model.safetensors", "optimizer.safetensors", "state.json"];
    let before: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(last(&dir.join("runs")).join(f)).unwrap()).collect();
    // inside the namespace: the run folder moved onto a 64 MB tmpfs filled up to its last
    // 150 KB (metrics lines and TensorBoard events fit, a checkpoint's ~350 KB weights do not),
    // the resume, then the folder copied back out for the checks
    let script = format!(
        "set -u; mkdir -p disk after; mount -t tmpfs -o size=64m tmpfs disk || exit 90; cp -a small.toml disk/ && mkdir disk/runs && cp -a runs/full disk/runs/ || exit 91; \
         avail=$(df -k --output=avail disk | tail -1); dd if=/dev/zero of=disk/filler bs=1k count=$((avail - 150)) 2>/dev/null; \
         (cd disk && {bin} {run} --set log.run_name=full --resume) 2> resume.err; echo $? > resume.exit; rm disk/filler; cp -a disk/runs after/",
        bin = env!("CARGO_BIN_EXE_lockstep"),
        run = RUN.join(" ")
    );
    let status = Command::new("unshare").args(["-rm", "sh", "-c", &script]).current_dir(&dir).status().unwrap();
    assert!(status.success(), "the tmpfs script failed: {status:?}");
    let err = std::fs::read_to_string(dir.join("resume.err")).unwrap();
    let code: i32 = std::fs::read_to_string(dir.join("resume.exit")).unwrap().trim().parse().unwrap();
    assert_ne!(code, 0, "the run passed a full disk: {err}");
    assert_ne!(code, 101, "a panic: {err}");
    assert!(err.contains("No space left on device"), "not a clear error: {err}");
    eprintln!("the full-tmpfs error: {}", err.lines().filter(|l| l.contains("error")).collect::<Vec<_>>().join(" | "));
    let after = dir.join("after/runs");
    for (f, bytes) in files.iter().zip(&before) {
        assert!(std::fs::read(last(&after).join(f)).unwrap() == *bytes, "{f} of the previous checkpoint changed");
    }
    let complete = checkpoint_names(&after.join("full"));
    assert_eq!(complete.last().map(String::as_str), Some("step-000003"), "a partial checkpoint was taken for complete: {complete:?}");
    // with room again (the folder back on the real disk), the resume ends where the
    // uninterrupted run did
    let again = scratch("faults-tmpfs-again");
    std::fs::write(again.join("small.toml"), SMALL).unwrap();
    assert!(Command::new("cp").args(["-a"]).arg(&after).arg(again.join("runs")).status().unwrap().success());
    let out = lockstep(&[RUN, &["--set", "log.run_name=full", "--resume"]].concat(), &again);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(metrics(&again.join("runs/full")), straight);
}

#[test]
fn a_panic_on_the_device_thread_stops_the_run_naming_it() {
    // the failpoint queues a panicking task on cubecl's device runner thread as the rmsnorm
    // launcher is entered; cubecl catches such a panic there and only logs it
    let (code, err, dir) = train_with_failpoint("faults-device-panic", "LOCKSTEP_FAULT_DEVICE_PANIC", "rmsnorm");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("device thread") && err.contains("fault injection: LOCKSTEP_FAULT_DEVICE_PANIC=rmsnorm"), "{err}");
    assert!(err.contains("the last kernel launch entered: `"), "the launch is not named: {err}");
    assert!(!err.contains("panicked at"), "a raw panic reached the user: {err}");
    assert!(!dir.join("runs/f/checkpoints").exists(), "the run went on after the failure");
}

#[test]
fn a_one_bit_sampler_trainer_difference_stops_the_run_with_and_without_micro_batches() {
    // the failpoint flips the lowest bit of one sampled logprob at step 1. One pass: the scoring
    // pass finds it. Micro-batches: no scoring pass runs (matched mode), and the update's own
    // check of each micro-batch must find it before the optimizer step. "warn" logs it and goes on.
    let cases: [(&str, &[&str]); 3] = [
        ("one-pass", &["--set", "train.micro_batch_tokens=0"]),
        ("micro-batched", &["--set", "train.micro_batch_tokens=12"]),
        ("warn", &["--set", "train.micro_batch_tokens=12", "--set", "train.on_mismatch=warn"]),
    ];
    for (name, extra) in cases {
        let dir = scratch(&format!("faults-bit-{name}"));
        std::fs::write(dir.join("small.toml"), SMALL).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
            .args(["train", "small.toml", "--set", "log.run_name=f", "--set", "train.sft_steps=0", "--set", "train.steps=2"])
            .args(extra)
            .env("LOCKSTEP_FAULT_SAMPLER_LOGPROB", "1")
            .env_remove("RUST_BACKTRACE")
            .current_dir(&dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{name}: {err}");
        let logged = metrics(&dir.join("runs/f"));
        if name == "warn" {
            assert!(out.status.success(), "{name}: {err}");
            assert_eq!(logged.len(), 2, "{name}");
            assert_eq!(logged[0]["agreement"]["bit_equal_frac"], 1.0, "{name}");
            let frac = logged[1]["agreement"]["bit_equal_frac"].as_f64().unwrap();
            assert!(frac < 1.0 && frac > 0.9, "{name}: step 1's bit_equal_frac {frac}");
        } else {
            assert_eq!(out.status.code(), Some(1), "{name}: {err}");
            assert!(err.contains("step 1: sampler and trainer logprobs differ in bits for 1 of"), "{name}: {err}");
            // micro-batched: found by the update's own check (no scoring pass ran)
            assert_eq!(err.contains("found by the update's check of micro-batch 1 of"), name == "micro-batched", "{name}: {err}");
            assert_eq!(logged.len(), 1, "{name}: step 1 must stop before it is logged");
        }
    }
}

#[test]
fn replayed_steps_and_a_failed_capture_give_the_launched_steps_output_byte_for_byte() {
    // `lockstep sample` on the embedded model three ways: every step launched; steps replayed as
    // graphs; and every capture failing (an upload inside its window), where the engine must
    // warn and launch those steps instead, with nothing of the failed recording left behind
    let dir = scratch("faults-graph-capture");
    let prompts: String = (0..24).map(|i| format!("{{\"prompt\": \"{}+{}=\"}}\n", i * 7 % 10, i % 10)).collect();
    std::fs::write(dir.join("prompts.jsonl"), prompts).unwrap();
    let run = |out: &str, env: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockstep"));
        cmd.args(["sample", "--set", "sampler.input=prompts.jsonl", "--set", &format!("sampler.output={out}"), "--set", "sampler.max_new_tokens=12", "--set", "sampler.max_batch=8", "--set", "log.progress=false"]);
        cmd.env_remove("LOCKSTEP_DECODE_GRAPHS").env_remove("LOCKSTEP_FAULT_GRAPH_CAPTURE").envs(env.iter().copied()).current_dir(&dir);
        let o = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{env:?}: {err}");
        (std::fs::read(dir.join(out)).unwrap(), err)
    };
    let (launched, _) = run("launched.jsonl", &[("LOCKSTEP_DECODE_GRAPHS", "off")]);
    let (replayed, err) = run("replayed.jsonl", &[]); // the default
    assert!(!err.contains("(0 replayed as graphs)") && err.contains("replayed as graphs"), "no step was replayed: {err}");
    assert!(replayed == launched, "replayed steps changed the output");
    let (fallback, err) = run("fallback.jsonl", &[("LOCKSTEP_DECODE_GRAPHS", "on"), ("LOCKSTEP_FAULT_GRAPH_CAPTURE", "upload")]);
    assert!(err.contains("launched, not replayed") && err.contains("(0 replayed as graphs)"), "the failed capture is not reported: {err}");
    assert!(fallback == launched, "a failed capture changed the output");
}

#[test]
fn a_second_process_in_a_run_folder_is_refused_while_the_first_trains() {
    let dir = scratch("two-processes");
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    // the first run's reward program waits for `go`, so it is mid-step when the second starts
    std::fs::write(dir.join("wait.py"), "import os, sys, time\nlines = sys.stdin.readlines()\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\nfor _ in lines:\n    print(0)\n").unwrap();
    let args = ["train", "small.toml", "--set", "train.steps=1", "--set", "train.sft_steps=0", "--set", "log.run_name=shared", "--set", "task.reward=command", "--set", "task.reward_command=python3 wait.py"];
    let first = Command::new(env!("CARGO_BIN_EXE_lockstep")).args(args).current_dir(&dir).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let lock = dir.join("runs/shared/.lockstep.lock");
    let started = Instant::now();
    while std::fs::read_to_string(&lock).map_or(true, |pid| pid.trim().is_empty()) {
        assert!(started.elapsed() < Duration::from_secs(120), "the first run never locked its folder");
        std::thread::sleep(Duration::from_millis(50));
    }
    // both would start fresh, interleave metrics.jsonl and overwrite checkpoints, each exiting 0
    for extra in [&[][..], &["--resume"][..]] {
        let out = lockstep(&[&args[..], extra].concat(), &dir);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {err}");
        assert!(err.contains(&format!("another lockstep process (pid {})", first.id())) && err.contains("log.run_name") && !err.contains("step    0"), "{extra:?}: {err}");
    }
    std::fs::write(dir.join("go"), "").unwrap();
    let out = first.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(metrics(&dir.join("runs/shared")).len(), 1, "one run's steps only");
    // the lock ends with its process: the folder takes the next run (here: a finished run's
    // resume, refused for its own reason)
    let out = lockstep(&[&args[..], &["--resume"]].concat(), &dir);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("another lockstep process"), "{}", String::from_utf8_lossy(&out.stderr));
}
