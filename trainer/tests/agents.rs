//! Agent episodes end to end (`task.name = "environment"`, docs/agents.md), on the embedded
//! model: the ids the episode server handed out are the ids trained on (every turn extends the
//! earlier ids, the sampled tokens sit at the trained rows with the server's logprobs as bits),
//! episodes do not depend on their programs' timing, a rewritten history is refused, and an
//! environment that crashes, hangs, calls badly or hangs up stops the step with its name, the
//! state before it saved, and a resume that loses no step.

mod common;

use common::{lockstep, metrics, scratch};
use std::path::Path;

/// A chat format in the embedded model's characters (the calculator example's).
const TEMPLATE: &str = "{% for m in messages %}{% if m.role == 'assistant' %}A:{{ m.content }}<eos>{% elif m.role == 'tool' %}R:{{ m.content }}.{% else %}Q:{{ m.content }}.{% endif %}{% endfor %}{% if add_generation_prompt %}A:{% endif %}";

const CONFIG: &str = r#"
[task]
name = "environment"
path = "records.jsonl"
prompt_format = "chat"
chat_template = "template.jinja"

[environment]
command = "python3 env.py"
concurrency = 4
timeout_s = 60
max_turns = 4
save_trajectories = true

[train]
steps = 2
prompts_per_step = 2
group_size = 3
sft_steps = 0
checkpoint_every = 1

[sampler]
context = 64
max_new_tokens = 6

[log]
progress = false
"#;

/// Plays 3 turns: each reply comes back with a tool result made from it, the server's ids and
/// logprobs logged per session (`MODE` changes one thing to make a fault).
const ENV: &str = r#"
import json, os, random, subprocess, sys, time, urllib.request, urllib.error
mode = os.environ.get("MODE", "")
record = json.loads(sys.stdin.readline())
if mode in ("slow", "stuck"):
    # the program and a helper it leaves running, by pid, for the signal test to look for
    os.makedirs("pids", exist_ok=True)
    helper = subprocess.Popen(["sleep", "300"])
    for pid in (os.getpid(), helper.pid):
        open("pids/%d" % pid, "w").close()
    time.sleep(600 if mode == "stuck" else 1.0)
url = os.environ["LOCKSTEP_BASE_URL"] + "/chat/completions"
messages = [{"role": "user", "content": record["q"]}]
log = []
# the program's own timing varies, which must not change an episode's tokens
time.sleep(random.random() * 0.2)
for turn in range(3):
    body = {"messages": messages, "max_tokens": 6, "logprobs": True}
    if mode == "malformed" and turn == 1:
        body["temperature"] = 0.25
    if mode == "rewrite" and turn == 2:
        messages[0]["content"] = "changed"
    if mode == "disconnect" and turn == 1:
        # send the turn's request and hang up at once, mid-generation
        import socket
        host, port = os.environ["LOCKSTEP_BASE_URL"].split("/")[2].split(":")
        data = json.dumps(dict(body, max_tokens=40)).encode()
        s = socket.create_connection((host, int(port)))
        s.sendall(b"POST " + url.split(port, 1)[1].encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
        s.close()
        time.sleep(0.5)
        break
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}), timeout=60) as r:
            answer = json.load(r)
    except urllib.error.HTTPError as e:
        print("refused:", e.read().decode(), file=sys.stderr)
        break
    choice = answer["choices"][0]
    log.append({"prompt": answer["prompt_token_ids"], "tokens": choice["token_ids"], "logprobs": [t["logprob"] for t in choice["logprobs"]["content"]]})
    reply = choice["message"]["content"]
    messages.append({"role": "assistant", "content": reply})
    messages.append({"role": "tool", "content": str(len(reply))})
if mode == "crash":
    sys.exit("the environment broke")
if mode == "hang":
    time.sleep(600)
os.makedirs("log", exist_ok=True)
json.dump(log, open("log/" + os.environ["LOCKSTEP_SESSION"] + ".json", "w"))
print("a line of the program's own output")
print(json.dumps({"reward": sum(c in "aeiou" for m in messages if m["role"] == "assistant" for c in m["content"]) / 10}))
"#;

fn setup(name: &str) -> common::Scratch {
    let dir = scratch(name);
    std::fs::write(dir.join("config.toml"), CONFIG).unwrap();
    std::fs::write(dir.join("template.jinja"), TEMPLATE).unwrap();
    std::fs::write(dir.join("env.py"), ENV).unwrap();
    let records: String = ["abc", "hello", "xyz", "q", "seven"].iter().map(|q| format!("{{\"q\": \"{q}\"}}\n")).collect();
    std::fs::write(dir.join("records.jsonl"), records).unwrap();
    dir
}

fn trajectories(run: &Path) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    for step in 0..2 {
        let text = std::fs::read_to_string(run.join(format!("trajectories/step-{step:06}.jsonl"))).unwrap();
        out.extend(text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()));
    }
    out
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

#[test]
fn the_ids_the_server_handed_out_are_the_ids_trained_on_and_timing_changes_no_token() {
    let dir = setup("agents-exact");
    let out = lockstep(&["train", "config.toml", "--set", "log.run_name=a"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let run = dir.join("runs/a");
    for m in metrics(&run) {
        assert_eq!(m["agreement"]["bit_equal_frac"], 1.0, "{m}");
        assert_eq!(m["agreement"]["kl_k1"], 0.0, "{m}");
        assert_eq!(m["episodes"]["episodes"], 6, "{m}");
    }
    let saved = trajectories(&run);
    assert_eq!(saved.len(), 12);
    let mut multi_turn = 0;
    for t in &saved {
        let session = t["session"].as_str().unwrap();
        let log: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(dir.join(format!("log/{session}.json"))).unwrap()).unwrap();
        let sequence = ids(&t["sequence"]);
        let rows = ids(&t["sampled_rows"]);
        let trained_lp: Vec<f32> = t["logprobs"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        let (mut at, mut before) = (0, Vec::new());
        for turn in &log {
            let (prompt, tokens) = (ids(&turn["prompt"]), ids(&turn["tokens"]));
            assert!(prompt.starts_with(&before), "{session}: a turn's prompt does not extend the earlier turns' ids");
            for (k, &token) in tokens.iter().enumerate() {
                let row = rows[at + k] as usize;
                assert_eq!(row, prompt.len() + k - 1, "{session}: sampled token {k}'s row");
                assert_eq!(sequence[row + 1], token, "{session}: the trained sequence holds the sampled token");
                let served = turn["logprobs"][k].as_f64().unwrap() as f32;
                assert_eq!(served.to_bits(), trained_lp[at + k].to_bits(), "{session}: logprob bits");
            }
            at += tokens.len();
            before = [prompt, tokens].concat();
        }
        assert_eq!(at, rows.len(), "{session}: every trained row is a sampled token");
        assert_eq!(sequence, before, "{session}: the trained sequence is the last prompt and its reply");
        multi_turn += (log.len() >= 2) as usize;
    }
    assert!(multi_turn >= 6, "most episodes have several turns: {multi_turn}");
    // one episode at a time instead of four: the same tokens, rewards and weights
    let out = lockstep(&["train", "config.toml", "--set", "log.run_name=b", "--set", "environment.concurrency=1"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let other = dir.join("runs/b");
    assert_eq!(trajectories(&other), saved, "episodes depend on the program's timing");
    let weights = |run: &Path| metrics(run).iter().map(|m| m["trainer_weights_fingerprint"].clone()).collect::<Vec<_>>();
    assert_eq!(weights(&other), weights(&run));
}

/// Runs the faulty program (`MODE`), expects exit 1 with every `says`, and that a run with the
/// program fixed resumes at step 0 and finishes both steps (no step lost).
fn faulty(mode: &str, extra: &[&str], says: &[&str], resumes: bool) {
    let dir = setup(&format!("agents-{mode}"));
    let mut args = vec!["train", "config.toml", "--set", "log.run_name=f"];
    args.extend_from_slice(extra);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lockstep")).args(&args).env("MODE", mode).current_dir(&dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{mode}: {err}");
    assert!(!err.contains("panicked"), "{mode}: {err}");
    for s in says {
        assert!(err.contains(s), "{mode}: no {s:?} in: {err}");
    }
    assert!(err.contains("step 0: episode") && err.contains("session s0-r0-e") && err.contains("records.jsonl:"), "{mode}: the episode is not named: {err}");
    assert!(dir.join("runs/f/checkpoints/step-000000/state.json").exists(), "{mode}: the state before the step is not saved: {err}");
    if !resumes {
        return;
    }
    // the program fixed, with time to spare (a deadline changes no bit: a resume may change it)
    args.extend(["--resume", "--set", "environment.timeout_s=120"]);
    let out = lockstep(&args, &dir);
    assert!(out.status.success(), "{mode}: the fixed run did not resume: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(metrics(&dir.join("runs/f")).len(), 2, "{mode}: a step was lost");
    if mode == "crash" {
        // the resumed run is the uninterrupted one, token for token and weight for weight
        let out = lockstep(&["train", "config.toml", "--set", "log.run_name=clean"], &dir);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(trajectories(&dir.join("runs/f")), trajectories(&dir.join("runs/clean")));
        let weights = |run: &str| metrics(&dir.join(run)).iter().map(|m| m["trainer_weights_fingerprint"].clone()).collect::<Vec<_>>();
        assert_eq!(weights("runs/f"), weights("runs/clean"));
    }
}

#[test]
fn a_rewritten_history_is_refused_naming_where_it_differs() {
    faulty("rewrite", &[], &["does not extend the session's earlier tokens", "earlier message", "turn 2"], true);
}

#[test]
fn a_crash_a_hang_a_bad_call_and_a_hang_up_each_stop_the_step_by_name() {
    faulty("crash", &[], &["environment.command failed", "the environment broke"], true);
    faulty("hang", &["--set", "environment.timeout_s=3"], &["environment.timeout_s = 3"], true);
    faulty("malformed", &[], &["`temperature` is 0.25", "sampler.temperature"], true);
    faulty("disconnect", &["--set", "sampler.max_new_tokens=40", "--set", "sampler.context=160"], &["closed its connection"], true);
}

#[test]
fn the_turn_and_token_limits_are_named_when_an_episode_passes_them() {
    faulty("", &["--set", "environment.max_turns=2"], &["environment.max_turns"], false);
    faulty("", &["--set", "environment.max_tokens=20"], &["environment.max_tokens"], false);
}

#[test]
fn environment_keys_that_cannot_work_are_refused_by_name() {
    let dir = setup("agents-config");
    for (set, says) in [
        (vec!["environment.command="], "environment.command"),
        (vec!["environment.concurrency=0"], "environment.concurrency"),
        (vec!["environment.timeout_s=0"], "environment.timeout_s"),
        (vec!["environment.max_turns=0"], "environment.max_turns"),
        (vec!["task.reward=math"], "task.reward"),
        (vec!["train.sft_steps=5", "task.prompt_format=raw"], "task.prompt_format"),
        (vec!["train.overlong_buffer=2"], "train.overlong_buffer"),
        (vec!["task.name=sort", "task.path="], "[environment] is set"),
        (vec!["task.path=missing.jsonl"], "missing.jsonl"),
    ] {
        let mut args = vec!["train", "config.toml"];
        for s in &set {
            args.extend(["--set", s]);
        }
        let out = lockstep(&args, &dir);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && !err.contains("panicked") && err.contains(says), "{set:?}: {err}");
    }
    // SFT imitates demos: a record without one is named by line
    let out = lockstep(&["train", "config.toml", "--set", "train.sft_steps=2"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("records.jsonl:1") && err.contains("demo"), "{err}");
}

/// The loss variants train on episodes as on single turns: PPO epochs, the original GRPO's
/// sequence mean with a KL penalty, DAPO's dynamic sampling, the ablation's mismatched sampler
/// with TIS; and micro-batches of 64 tokens give the one-pass update's weights as bits.
#[test]
fn every_loss_variant_trains_on_episodes_and_micro_batches_change_no_bit() {
    let dir = setup("agents-variants");
    let run = |name: &str, sets: &[&str]| {
        let mut args = vec!["train", "config.toml", "--set", "environment.save_trajectories=false"];
        let name = format!("log.run_name={name}");
        args.extend(["--set", &name]);
        for s in sets {
            args.extend(["--set", s]);
        }
        let out = lockstep(&args, &dir);
        assert!(out.status.success(), "{sets:?}: {}", String::from_utf8_lossy(&out.stderr));
        metrics(&dir.join("runs").join(&name[13..]))
    };
    for (name, sets) in [("ppo", &["train.ppo_epochs=2", "train.mini_batches=2"][..]), ("seqmean", &["train.loss_aggregation=sequence_mean", "train.kl_coef=0.01"][..]), ("dapo", &["train.dynamic_sampling_rounds=1"][..])] {
        for m in run(name, sets) {
            assert_eq!(m["agreement"]["bit_equal_frac"], 1.0, "{name}: {m}");
            assert!(m["loss"].as_f64().unwrap().is_finite(), "{name}: {m}");
        }
    }
    for m in run("fast", &["ablation.sampler_kernels=fast", "ablation.correction=tis"]) {
        assert!(m["is_weight_mean"].as_f64().unwrap().is_finite() && m["episodes"]["episodes"] == 6, "{m}");
    }
    let weights = |ms: Vec<serde_json::Value>| ms.iter().map(|m| m["trainer_weights_fingerprint"].clone()).collect::<Vec<_>>();
    assert_eq!(weights(run("whole", &[])), weights(run("micro", &["train.micro_batch_tokens=64"])), "micro-batches changed the update");
}

/// The shipped calculator example runs from its config as the README gives it (shortened): its
/// SFT warm start on the demos, then episodes of the Python environment, bits equal.
#[test]
fn the_calculator_example_runs_from_its_config() {
    let dir = scratch("agents-calculator");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let runs = format!("log.runs_dir={}", dir.display());
    let out = lockstep(&["train", "configs/agents-calculator.toml", "--set", "train.sft_steps=5", "--set", "train.steps=2", "--set", &runs, "--set", "train.prompts_per_step=2"], &root);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m = metrics(&dir.join("agents-calculator"));
    assert_eq!(m.len(), 2);
    for step in &m {
        assert_eq!(step["agreement"]["bit_equal_frac"], 1.0, "{step}");
        assert!(step["episodes"]["episodes"] == 16 && step["episodes"]["turns_mean"].as_f64().unwrap() >= 1.0, "{step}");
    }
}

/// Whether process `pid` still exists (a zombie not yet reaped counts as gone).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| stat.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
}

/// Starts a run whose programs record their pids, and sends SIGTERM `signals` times once the
/// first episode has begun; returns the run's output and the pids the programs recorded.
fn signalled(dir: &Path, mode: &str, run_name: &str, signals: usize) -> (std::process::Output, Vec<u32>) {
    let args = ["train", "config.toml", "--set", &format!("log.run_name={run_name}")];
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_lockstep")).args(args).env("MODE", mode).current_dir(dir).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let started = std::time::Instant::now();
    while std::fs::read_dir(dir.join("pids")).map_or(true, |d| d.count() == 0) {
        assert!(started.elapsed().as_secs() < 120, "no episode began");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for _ in 0..signals {
        assert!(std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let out = child.wait_with_output().unwrap();
    let pids = std::fs::read_dir(dir.join("pids")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().parse().unwrap()).collect();
    (out, pids)
}

/// SIGTERM in the episode phase: the step's episodes finish, its update runs, its checkpoint is
/// written, no program or helper it started is left, and the resumed run is the uninterrupted
/// one. A second SIGTERM (episodes stuck) ends every program's group at once (exit 130).
#[test]
fn sigterm_in_the_episode_phase_finishes_the_step_ends_every_program_and_resumes_bit_identically() {
    let dir = setup("agents-sigterm");
    let (out, pids) = signalled(&dir, "slow", "t", 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("stopped by a signal after step 0") && err.contains("--resume"), "{err}");
    assert!(pids.len() >= 2 && pids.iter().all(|&p| !alive(p)), "programs or their helpers outlived the run: {pids:?}");
    assert_eq!(metrics(&dir.join("runs/t")).len(), 1, "{err}");
    let out = lockstep(&["train", "config.toml", "--set", "log.run_name=t", "--resume"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = lockstep(&["train", "config.toml", "--set", "log.run_name=clean"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(trajectories(&dir.join("runs/t")), trajectories(&dir.join("runs/clean")));
    let weights = |run: &str| metrics(&dir.join(run)).iter().map(|m| m["trainer_weights_fingerprint"].clone()).collect::<Vec<_>>();
    assert_eq!(weights("runs/t"), weights("runs/clean"));

    let dir = setup("agents-sigterm-twice");
    let started = std::time::Instant::now();
    let (out, pids) = signalled(&dir, "stuck", "s", 2);
    assert_eq!(out.status.code(), Some(130), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(started.elapsed().as_secs() < 50, "the second SIGTERM did not stop the run at once");
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(pids.len() >= 2 && pids.iter().all(|&p| !alive(p)), "stuck programs or their helpers outlived the run: {pids:?}");
}
