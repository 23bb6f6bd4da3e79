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
fn a_missing_or_empty_prompt_file_names_sampler_input() {
    let dir = scratch("empty-input");
    std::fs::write(dir.join("blank.jsonl"), "\n  \n").unwrap();
    std::fs::create_dir_all(dir.join("folder.jsonl")).unwrap();
    for (input, needle) in [("blank.jsonl", "no prompts"), ("missing.jsonl", "cannot read"), ("folder.jsonl", "Is a directory")] {
        let out = lockstep(&["sample", "--set", &format!("sampler.input={input}"), "--set", "sampler.output=out.jsonl"], &dir);
        assert_refused(&out, 2, &["sampler.input", input, needle]);
        assert!(!dir.join("out.jsonl").exists(), "{input}: an output was written");
    }
}

#[test]
fn a_missing_or_blank_dataset_names_the_file() {
    let dir = scratch("empty-dataset");
    std::fs::write(dir.join("blank.jsonl"), "\n\n").unwrap();
    std::fs::create_dir_all(dir.join("folder.jsonl")).unwrap();
    for (path, needle) in [("blank.jsonl", "no problems in the file"), ("missing.jsonl", "cannot read"), ("folder.jsonl", "cannot read: Is a directory")] {
        let out = lockstep(&["train", "--set", "task.name=dataset", "--set", &format!("task.path={path}"), "--set", "log.progress=false"], &dir);
        assert_refused(&out, 1, &[&format!("{path}: {needle}")]);
    }
}

#[test]
fn a_dataset_or_eval_row_with_an_empty_prompt_or_answer_or_too_long_is_named_before_training() {
    let dir = scratch("empty-fields");
    let good = "{\"prompt\": \"1+1=\", \"answer\": \"2\"}\n";
    for (rows, needles) in [
        (format!("{good}{{\"prompt\": \"\", \"answer\": \"1\"}}\n"), &["rows.jsonl:2", "prompt", "no tokens"][..]),
        (format!("{good}{good}{{\"prompt\": \"2+2=\", \"answer\": \" \"}}\n"), &["rows.jsonl:3", "answer", "empty", "task.reward"][..]),
    ] {
        std::fs::write(dir.join("rows.jsonl"), rows).unwrap();
        let out = lockstep(&["train", "--set", "task.name=jsonl", "--set", "task.path=rows.jsonl", "--set", "train.sft_steps=0", "--set", "log.progress=false"], &dir);
        assert_refused(&out, 1, needles);
        assert!(!String::from_utf8_lossy(&out.stderr).contains("step    0"), "refused before the first step");
    }
    // the eval split is checked the same way before training, not at the first evaluation
    std::fs::write(dir.join("rows.jsonl"), good).unwrap();
    for (rows, code, needles) in [
        ("{\"prompt\": \"\", \"answer\": \"1\"}\n".to_string(), 1, &["eval.jsonl:1", "no tokens"][..]),
        (format!("{good}{{\"prompt\": \"{}\", \"answer\": \"1\"}}\n", "1".repeat(200)), 2, &["sampler.context", "eval.jsonl:2"][..]),
    ] {
        std::fs::write(dir.join("eval.jsonl"), rows).unwrap();
        let out = lockstep(&["train", "--set", "task.name=jsonl", "--set", "task.path=rows.jsonl", "--set", "task.eval_path=eval.jsonl", "--set", "train.eval_every=1", "--set", "train.sft_steps=0", "--set", "log.progress=false"], &dir);
        assert_refused(&out, code, needles);
        assert!(!String::from_utf8_lossy(&out.stderr).contains("step    0"), "refused before the first step");
    }
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
    // a program that answers and leaves a helper holding its stdout (a log shipper, say): the
    // step goes on at once (it waited for the helper before) and the helper ends with it
    let started = std::time::Instant::now();
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=helper", "--set", "task.reward=command", "--set", "task.reward_command=python3 length.py; sleep 600 &", "--set", "task.reward_timeout_s=120"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(started.elapsed().as_secs() < 60, "the step waited for the helper: {:?}", started.elapsed());
    assert_eq!(common::metrics(&dir.join("runs/helper")).len(), 2);
    // rewards too large to add up are the reward program's fault, named before the update
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=overflow", "--set", "task.reward=command", "--set", "task.reward_command=i=0; while read line; do i=$((i+1)); echo \"${i}e200\"; done", "--set", "train.checkpoint_every=0"], &dir);
    assert_refused(&out, 1, &["step 0", "task.reward_command", "not a finite number"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("init_std"));
    // "no timeout" written as a huge number is refused by name before anything runs
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=huge", "--set", "task.reward=command", "--set", "task.reward_command=python3 length.py", "--set", "task.reward_timeout_s=1e30"], &dir);
    assert_refused(&out, 2, &["task.reward_timeout_s", "a week"]);
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=crash", "--set", "task.reward=command", "--set", "task.reward_command=echo broken >&2; exit 1"], &dir);
    assert_refused(&out, 1, &["task.reward_command", "broken"]);
    let out = lockstep(&["train", "small.toml", "--set", "task.reward=command"], &dir);
    assert_refused(&out, 2, &["task.reward_command"]);
    // a program that answers step 0 and crashes at step 1: the state after step 0 is saved as
    // step 1's checkpoint, and a resume with the program fixed ends as the uninterrupted run did
    std::fs::write(dir.join("flaky.py"), "import sys, os\nif os.path.exists('called'):\n    sys.exit('reward server down')\nopen('called', 'w').close()\nexec(open('length.py').read())\n").unwrap();
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=flaky", "--set", "task.reward=command", "--set", "task.reward_command=python3 flaky.py", "--set", "train.checkpoint_every=0"], &dir);
    assert_refused(&out, 1, &["step 1", "reward server down", "saved in", "--resume"]);
    assert!(dir.join("runs/flaky/checkpoints/step-000001/model.safetensors").exists());
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=flaky", "--set", "task.reward=command", "--set", "task.reward_command=python3 length.py", "--set", "train.checkpoint_every=0", "--resume", "--allow-config-change"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let resumed = common::metrics(&dir.join("runs/flaky"));
    assert_eq!(resumed.last().unwrap()["step"], 1);
    assert_eq!(resumed.last().unwrap()["trainer_weights_fingerprint"], m.last().unwrap()["trainer_weights_fingerprint"], "the resumed run's weights differ from the uninterrupted run's");
}

#[test]
fn evaluation_is_graded_by_the_reward_program_as_training_is() {
    // a program that says 1 to everything: training's reward and evaluation's pass@1 agree (the
    // evaluation graded by exact match gave pass@1 0 beside a reward of 1)
    let dir = scratch("reward-command-eval");
    let small = "[train]\nsteps = 2\nprompts_per_step = 2\ngroup_size = 4\nsft_steps = 0\neval_every = 1\neval_problems = 3\neval_samples = 2\n[sampler]\nmax_new_tokens = 4\n[log]\nprogress = false\n";
    std::fs::write(dir.join("small.toml"), small).unwrap();
    let out = lockstep(&["train", "small.toml", "--set", "log.run_name=e", "--set", "task.reward=command", "--set", "task.reward_command=while read line; do echo 1; done"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for step in common::metrics(&dir.join("runs/e")) {
        assert_eq!(step["reward_mean"], 1.0, "{step}");
        for key in ["pass1_greedy", "pass_at_k", "sampled_accuracy", "sampled_reward_mean"] {
            assert_eq!(step["eval"][key], 1.0, "{key}: {step}");
        }
    }
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

#[test]
fn a_verl_layout_dataset_trains_with_chat_prompts_and_its_faults_name_file_line_and_key() {
    let dir = scratch("chat-dataset");
    // verl's layout: a message list under `prompt`, the answer under reward_model.ground_truth;
    // the embedded model has no chat template, so a template file stands in for a checkpoint's
    // (its output keeps to the embedded vocabulary's characters)
    std::fs::write(dir.join("t.jinja"), "{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}{% if add_generation_prompt %}assistant:{% endif %}").unwrap();
    let row = |q: &str, a: &str| format!("{{\"prompt\": [{{\"role\": \"user\", \"content\": \"{q}\"}}], \"reward_model\": {{\"ground_truth\": \"{a}\"}}}}\n");
    std::fs::write(dir.join("task.jsonl"), row("1+1=", "2") + &row("2+3=", "5")).unwrap();
    let chat = ["--set", "task.name=jsonl", "--set", "task.path=task.jsonl", "--set", "task.prompt_format=chat", "--set", "task.chat_template=t.jinja", "--set", "task.answer_key=reward_model.ground_truth", "--set", "train.sft_steps=2", "--set", "train.steps=1", "--set", "log.progress=false"];
    let out = lockstep(&[&["train"], &chat[..]].concat(), &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // the same layout as Parquet (written by pyarrow: experiments/fixtures/make_parquet_fixture.py)
    std::fs::copy(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/datasets/verl_math.parquet"), dir.join("math.parquet")).unwrap();
    let out = lockstep(&[&["train", "--set", "log.run_name=parquet"], &chat[..], &["--set", "task.name=dataset", "--set", "task.path=math.parquet"]].concat(), &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(dir.join("broken.parquet"), b"PAR1 not really").unwrap();
    let out = lockstep(&[&["train", "--set", "log.run_name=broken"], &chat[..], &["--set", "task.name=dataset", "--set", "task.path=broken.parquet"]].concat(), &dir);
    assert_refused(&out, 1, &["broken.parquet", "Parquet"]);

    // the same file as raw prompts: the message list is named, with the key that renders it
    // (with the template file still set, the config itself is refused: raw prompts never use it)
    let raw: Vec<&str> = chat.iter().map(|&a| if a == "task.prompt_format=chat" { "task.prompt_format=raw" } else { a }).collect();
    let out = lockstep(&[&["train", "--set", "log.run_name=raw"], &raw[..]].concat(), &dir);
    assert_refused(&out, 2, &["task.chat_template", "task.prompt_format = \"raw\""]);
    let raw: Vec<&str> = raw.iter().map(|&a| if a == "task.chat_template=t.jinja" { "task.chat_template=" } else { a }).collect();
    let out = lockstep(&[&["train", "--set", "log.run_name=raw"], &raw[..]].concat(), &dir);
    assert_refused(&out, 1, &["task.jsonl:1", "task.prompt_format", "chat"]);

    // a row without the answer key
    std::fs::write(dir.join("task.jsonl"), row("1+1=", "2") + "{\"prompt\": [{\"role\": \"user\", \"content\": \"3=\"}], \"reward_model\": {}}\n").unwrap();
    let out = lockstep(&[&["train", "--set", "log.run_name=missing"], &chat[..]].concat(), &dir);
    assert_refused(&out, 1, &["task.jsonl:2", "reward_model.ground_truth", "task.answer_key"]);

    // a template that fails on line 2, and a prompt that the template makes too long
    std::fs::write(dir.join("task.jsonl"), row("1+1=", "2")).unwrap();
    std::fs::write(dir.join("t.jinja"), "ok\n{{ raise_exception('only system and user roles') }}").unwrap();
    let out = lockstep(&[&["train", "--set", "log.run_name=template"], &chat[..]].concat(), &dir);
    assert_refused(&out, 1, &["t.jinja", "line 2", "only system and user roles"]);
    // a template file that does not parse names task.chat_template, its file and line
    std::fs::write(dir.join("t.jinja"), "ok\n{{ messages[0].content }").unwrap();
    let out = lockstep(&[&["train", "--set", "log.run_name=syntax"], &chat[..]].concat(), &dir);
    assert_refused(&out, 2, &["task.chat_template", "t.jinja", "line 2"]);
    std::fs::write(dir.join("t.jinja"), "{% for i in range(300) %}x{% endfor %}{{ messages[0].content }}").unwrap();
    let out = lockstep(&[&["train", "--set", "log.run_name=long"], &chat[..]].concat(), &dir);
    assert_refused(&out, 2, &["task.jsonl:1", "sampler.context"]);

    // keys that cannot work are config errors
    let out = lockstep(&["train", "--set", "task.prompt_format=messages"], &dir);
    assert_refused(&out, 2, &["task.prompt_format", "raw", "chat"]);
    let out = lockstep(&["train", "--set", "task.prompt_format=chat"], &dir);
    assert_refused(&out, 2, &["task.prompt_format", "model.path", "task.chat_template"]);
    let out = lockstep(&["train", "--set", "task.answer_key=a..b"], &dir);
    assert_refused(&out, 2, &["task.answer_key"]);
}

/// A line's sampling noise is keyed by its own identity (its `id`, else its prompt and which
/// repeat of it it is) and its `seed`, never by its place in the file: at T = 1, a file sampled
/// in reverse order gives every line the same completion and logprobs, as bytes.
#[test]
fn a_reordered_prompt_file_samples_each_line_as_before() {
    let dir = scratch("sample-order");
    let lines = [
        "{\"id\": \"a\", \"prompt\": \"1+1=\"}",
        "{\"prompt\": \"2+2=\"}",
        "{\"id\": 7, \"prompt\": \"3+4=\", \"seed\": 11}",
        "{\"prompt\": \"2+2=\"}",
        "{\"id\": \"b\", \"prompt\": \"1+1=\"}",
    ];
    let sample = |name: &str, order: &[usize]| -> Vec<serde_json::Value> {
        let text: String = order.iter().map(|&i| format!("{}\n", lines[i])).collect();
        std::fs::write(dir.join(format!("{name}.jsonl")), text).unwrap();
        let out = lockstep(&["sample", "--set", &format!("sampler.input={name}.jsonl"), "--set", &format!("sampler.output={name}-out.jsonl"), "--set", "sampler.max_new_tokens=12", "--set", "sampler.temperature=1.0"], &dir);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        std::fs::read_to_string(dir.join(format!("{name}-out.jsonl"))).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let forward = sample("forward", &[0, 1, 2, 3, 4]);
    let reverse = sample("reverse", &[4, 3, 2, 1, 0]);
    // lines with ids: the same completion under the same id
    for id in [serde_json::json!("a"), serde_json::json!("b"), serde_json::json!(7)] {
        let find = |rows: &[serde_json::Value]| rows.iter().find(|r| r["id"] == id).cloned().unwrap();
        let (f, r) = (find(&forward), find(&reverse));
        assert_eq!((&f["token_ids"], &f["logprobs"]), (&r["token_ids"], &r["logprobs"]), "id {id}");
    }
    // the two repeats of one prompt without an id: the same pair of completions, the first
    // repeat's first (their implicit ids are line numbers, which the reversal swaps)
    let repeats = |rows: &[serde_json::Value], ids: [u64; 2]| ids.map(|i| rows.iter().find(|r| r["id"] == serde_json::json!(i)).unwrap()["token_ids"].clone());
    assert_eq!(repeats(&forward, [1, 3]), repeats(&reverse, [1, 3]));
    // the same prompt under two ids, and a line's own seed, are other draws
    let tokens = |rows: &[serde_json::Value], id: serde_json::Value| rows.iter().find(|r| r["id"] == id).unwrap()["token_ids"].clone();
    assert_ne!(tokens(&forward, serde_json::json!("a")), tokens(&forward, serde_json::json!("b")), "two ids drew the same 12 tokens");
    std::fs::write(dir.join("badseed.jsonl"), "{\"prompt\": \"1+1=\", \"seed\": -1}\n").unwrap();
    let out = lockstep(&["sample", "--set", "sampler.input=badseed.jsonl", "--set", "sampler.output=x.jsonl"], &dir);
    assert_refused(&out, 1, &["badseed.jsonl:1", "`seed`"]);
}

#[test]
fn sample_renders_message_prompts_reports_throughput_and_runs_the_ablation_kernels() {
    let dir = scratch("sample-chat");
    std::fs::write(dir.join("t.jinja"), "{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}assistant:").unwrap();
    std::fs::write(dir.join("prompts.jsonl"), "{\"id\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"1+1=\"}]}\n{\"id\": \"b\", \"prompt\": \"2+2=\"}\n").unwrap();
    for kernels in ["matched", "fast"] {
        let out = lockstep(&["sample", "--set", "sampler.input=prompts.jsonl", "--set", "sampler.output=out.jsonl", "--set", "task.chat_template=t.jinja", "--set", &format!("ablation.sampler_kernels={kernels}")], &dir);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(err.contains(&format!("on the {kernels} kernels")) && err.contains("tokens/s"), "{err}");
        let lines = std::fs::read_to_string(dir.join("out.jsonl")).unwrap();
        assert_eq!(lines.lines().count(), 2, "{lines}");
    }
    // messages without a template, and messages that are not a list of role/content objects
    let out = lockstep(&["sample", "--set", "sampler.input=prompts.jsonl", "--set", "sampler.output=out2.jsonl"], &dir);
    assert_refused(&out, 1, &["prompts.jsonl:1", "chat template", "task.chat_template"]);
    std::fs::write(dir.join("bad.jsonl"), "{\"messages\": \"hi\"}\n").unwrap();
    let out = lockstep(&["sample", "--set", "sampler.input=bad.jsonl", "--set", "sampler.output=out3.jsonl", "--set", "task.chat_template=t.jinja"], &dir);
    assert_refused(&out, 1, &["bad.jsonl:1", "messages"]);
}

#[test]
fn a_resumed_dataset_run_continues_at_the_same_example() {
    let dir = scratch("dataset-resume");
    std::fs::write(dir.join("task.jsonl"), (0..5).map(|i| format!("{{\"prompt\": \"{i}+{i}=\", \"answer\": \"{}\"}}\n", 2 * i)).collect::<String>()).unwrap();
    // 5 problems, 2 a step: 4 steps cross an epoch boundary (step 2 takes the last of epoch 0
    // and the first of epoch 1)
    let run = ["train", "--set", "task.name=dataset", "--set", "task.path=task.jsonl", "--set", "task.reward=char_f1", "--set", "train.steps=4", "--set", "train.prompts_per_step=2", "--set", "train.group_size=4", "--set", "train.sft_steps=3", "--set", "train.checkpoint_every=2", "--set", "sampler.max_new_tokens=4", "--set", "log.progress=false"];
    let out = lockstep(&[&run[..], &["--set", "log.run_name=straight"]].concat(), &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = lockstep(&[&run[..], &["--set", "log.run_name=resumed", "--max-steps", "2"]].concat(), &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // the same config over an edited dataset is refused (inputs.resolved.json), then restored
    let data = std::fs::read(dir.join("task.jsonl")).unwrap();
    std::fs::write(dir.join("task.jsonl"), [&data[..], b"{\"prompt\": \"9+9=\", \"answer\": \"18\"}\n"].concat()).unwrap();
    let out = lockstep(&[&run[..], &["--set", "log.run_name=resumed", "--resume"]].concat(), &dir);
    assert_refused(&out, 2, &["task.path", "task.jsonl", "--allow-config-change"]);
    std::fs::write(dir.join("task.jsonl"), data).unwrap();
    let out = lockstep(&[&run[..], &["--set", "log.run_name=resumed", "--resume"]].concat(), &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (a, b) = (common::metrics(&dir.join("runs/straight")), common::metrics(&dir.join("runs/resumed")));
    assert_eq!(a.len(), 4);
    assert_eq!(a, b, "the resumed run drew other examples or other bits");
}
