//! Bad inputs to `lockstep train` and `lockstep sample` beyond the cases in cli.rs: each gets an
//! error naming the file and line or the config key, a non-zero exit, no panic, and leaves every
//! input as it was.

mod common;

use common::{lockstep, scratch};

fn assert_refused(out: &std::process::Output, code: i32, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` not in: {err}");
    }
}

#[test]
fn task_and_prompt_files_with_bad_utf8_name_the_line() {
    let dir = scratch("bad-utf8");
    let bytes: &[u8] = b"{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n{\"prompt\": \"\xff\xfe=\", \"answer\": \"2\"}\n";
    std::fs::write(dir.join("task.jsonl"), bytes).unwrap();
    let out = lockstep(&["train", "--set", "task.name=jsonl", "--set", "task.path=task.jsonl", "--set", "train.sft_steps=0"], &dir);
    assert_refused(&out, 1, &["task.jsonl:2", "UTF-8"]);
    let out = lockstep(&["sample", "--set", "sampler.input=task.jsonl", "--set", "sampler.output=out.jsonl"], &dir);
    assert_refused(&out, 1, &["task.jsonl:2", "UTF-8"]);
    assert_eq!(std::fs::read(dir.join("task.jsonl")).unwrap(), bytes);
    assert!(!dir.join("out.jsonl").exists());
}

#[test]
fn numeric_answers_are_read_as_their_text() {
    let dir = scratch("numeric-answer");
    std::fs::write(dir.join("task.jsonl"), "{\"prompt\": \"1+1=\", \"answer\": 2}\n{\"prompt\": \"2+3=\", \"answer\": 5}\n").unwrap();
    let out = lockstep(&["train", "--set", "task.name=jsonl", "--set", "task.path=task.jsonl", "--set", "train.sft_steps=2", "--set", "train.steps=1", "--set", "log.progress=false"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn an_output_that_cannot_be_written_is_refused_before_sampling() {
    let dir = scratch("bad-output");
    std::fs::write(dir.join("prompts.jsonl"), "{\"prompt\": \"1+1=\"}\n").unwrap();
    std::fs::write(dir.join("file"), "not a folder").unwrap();
    for output in ["file/out.jsonl", "missing-folder/out.jsonl"] {
        let out = lockstep(&["sample", "--set", "sampler.input=prompts.jsonl", "--set", &format!("sampler.output={output}")], &dir);
        assert_refused(&out, 2, &["sampler.output", output]);
    }
    assert_eq!(std::fs::read_to_string(dir.join("file")).unwrap(), "not a folder");
    assert_eq!(std::fs::read_to_string(dir.join("prompts.jsonl")).unwrap(), "{\"prompt\": \"1+1=\"}\n");
}

#[test]
fn a_reward_command_scores_the_rollouts_and_one_that_hangs_or_crashes_stops_the_run() {
    let dir = scratch("reward-command");
    let small = "[train]\nsteps = 2\nprompts_per_step = 2\ngroup_size = 4\nsft_steps = 0\n[sampler]\nmax_new_tokens = 4\n[log]\nprogress = false\n";
    std::fs::write(dir.join("small.toml"), small).unwrap();
    // reward = the completion's length: distinct rewards, so the logged mean is that length's
    std::fs::write(dir.join("length.py"), "import sys, json\nfor line in sys.stdin:\n    print(len(json.loads(line)['completion']))\n").unwrap();
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=ok", "--set", "task.reward=command", "--set", "task.reward_command=python3 length.py"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m = common::metrics(&dir.join("runs/ok"));
    assert_eq!(m.len(), 2);
    assert!(m.iter().any(|s| s["reward_mean"].as_f64().unwrap() > 0.0), "{m:?}");
    let started = std::time::Instant::now();
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=hang", "--set", "task.reward=command", "--set", "task.reward_command=sleep 60", "--set", "task.reward_timeout_s=1"], &dir);
    assert_refused(&out, 1, &["task.reward_timeout_s", "step 0"]);
    assert!(started.elapsed().as_secs() < 50, "the hang was not bounded");
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=crash", "--set", "task.reward=command", "--set", "task.reward_command=echo broken >&2; exit 1"], &dir);
    assert_refused(&out, 1, &["task.reward_command", "broken"]);
    let out = lockstep(&["train", "small.toml", "--set", "task.reward=command"], &dir);
    assert_refused(&out, 2, &["task.reward_command"]);
}

#[test]
fn a_huge_prompt_line_names_the_line_and_the_context() {
    let dir = scratch("huge-line");
    let huge = format!("{{\"prompt\": \"1+1=\", \"answer\": \"2\"}}\n{{\"prompt\": \"{}=\", \"answer\": \"2\"}}\n", "1+".repeat(500_000));
    std::fs::write(dir.join("task.jsonl"), &huge).unwrap();
    let out = lockstep(&["train", "--set", "task.name=jsonl", "--set", "task.path=task.jsonl", "--set", "train.sft_steps=0"], &dir);
    assert_refused(&out, 2, &["task.jsonl:2", "sampler.context", "1000001-token prompt"]);
    assert_eq!(std::fs::read_to_string(dir.join("task.jsonl")).unwrap(), huge);
}
