//! The configs shipped in `configs/` load and validate as they are, and the word-problems
//! example runs from its file (a shortened run: its SFT and GRPO stages, the math verifier on
//! `\boxed{}` solutions, an evaluation on the generator's own problems, KL exactly 0).

mod common;

use common::{lockstep, metrics, scratch};
use std::path::{Path, PathBuf};
use trainer::config::Config;

fn configs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs")
}

#[test]
fn every_shipped_config_loads_and_validates() {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(configs_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            // the real-shape configs name a checkpoint the user brings (model.path); give them one
            let overrides = if path.file_name().unwrap().to_string_lossy().starts_with("qwen3-") { vec!["model.path=/models/x".to_string()] } else { vec![] };
            Config::load_training(Some(&path), &overrides).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            names.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    for expected in ["quickstart.toml", "word_problems.toml", "h200.toml"] {
        assert!(names.iter().any(|n| n == expected), "{expected} missing from {names:?}");
    }
    // docs/tasks.md's command pointing the word-problems config at verl's GSM8K parquet
    let gsm8k = ["model.path=/models/Qwen3-0.6B", "task.name=dataset", "task.path=gsm8k/train.parquet", "task.prompt_format=chat", "task.answer_key=reward_model.ground_truth",
        "task.eval_path=gsm8k/test.parquet", "train.eval_every=10", "train.sft_steps=0", "sampler.max_new_tokens=1024", "sampler.context=1536", "task.chat_args={ enable_thinking = false }"];
    let c = Config::load(Some(&configs_dir().join("word_problems.toml")), &gsm8k.map(String::from)).unwrap();
    assert_eq!((c.task.answer_key.as_str(), c.train.sft_steps, c.sampler.context), ("reward_model.ground_truth", 0, 1536));
}

#[test]
fn the_word_problems_example_runs_from_its_config_with_boxed_answers() {
    let dir = scratch("word-problems");
    let config = configs_dir().join("word_problems.toml");
    let out = lockstep(
        &["train", config.to_str().unwrap(), "--set", "train.sft_steps=5", "--set", "train.steps=2", "--set", "train.prompts_per_step=2", "--set", "train.group_size=4",
            "--set", "log.runs_dir=runs", "--set", "log.progress=false", "--set", "log.tensorboard=false", "--set", "train.checkpoint_every=0",
            "--set", "train.eval_every=1", "--set", "train.eval_problems=4", "--set", "train.eval_samples=2"],
        &dir,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let m = metrics(&dir.join("runs/word_problems"));
    assert_eq!(m.len(), 2);
    for step in &m {
        assert_eq!(step["agreement"]["bit_equal_frac"], 1.0, "{step}");
        assert_eq!(step["agreement"]["kl_k1"], 0.0, "{step}");
        // the generator's own evaluation problems (no task.eval_path)
        assert_eq!(step["eval"]["problems"], 4, "{step}");
        assert_eq!(step["eval"]["k"], 2, "{step}");
    }
    // the run's tokenizer has the task's `\`, `{`, `}` (saved with the final checkpoint)
    let checkpoints = dir.join("runs/word_problems/checkpoints");
    let last = std::fs::read_dir(&checkpoints).unwrap().map(|e| e.unwrap().path()).max().unwrap();
    let tokenizer = std::fs::read_to_string(last.join("tokenizer.json")).unwrap();
    for c in ["\"\\\\\"", "\"{\"", "\"}\""] {
        assert!(tokenizer.contains(c), "{c} not in the saved tokenizer");
    }
}
