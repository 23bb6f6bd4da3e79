//! Every entry point that trains passes the run folder's one guard (`trainer::run_folder`): a
//! fresh start over a run's checkpoints is refused and leaves its metrics alone, a resume with a
//! changed config is refused naming the key, and the run's records are written. (`--gpus` and
//! torchrun ranks run `train`'s path, rank 0 holding the guard.)

mod common;

use common::*;

#[test]
fn each_entry_point_refuses_an_existing_run_and_a_changed_resume_and_writes_the_records() {
    let entry_points: [(&str, &[&str]); 2] = [("train", &[]), ("ranks-in-threads", &["--ranks-in-threads", "2"])];
    for (name, extra) in entry_points {
        let dir = scratch(&format!("entry-{name}"));
        std::fs::write(dir.join("small.toml"), SMALL).unwrap();
        fn args<'a>(extra: &[&'a str], more: &[&'a str]) -> Vec<&'a str> {
            [&["train", "small.toml", "--set", "log.run_name=r", "--set", "train.steps=2", "--set", "train.sft_steps=1", "--set", "train.checkpoint_every=1"][..], extra, more].concat()
        }
        let args = |more: &[&'static str]| args(extra, more);
        let out = lockstep(&args(&["--max-steps", "1"]), &dir);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let run = dir.join("runs/r");
        for record in ["config.resolved.toml", "inputs.resolved.json", "environment.resolved.json"] {
            assert!(run.join(record).exists(), "{name}: no {record}");
        }
        let metrics_before = std::fs::read(run.join("metrics.jsonl")).unwrap();
        // a fresh start over the run: refused, the run's files as they were
        let out = lockstep(&args(&[]), &dir);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("already has checkpoints") && err.contains("--resume"), "{name}: {err}");
        assert_eq!(std::fs::read(run.join("metrics.jsonl")).unwrap(), metrics_before, "{name}: the metrics changed");
        // a resume under another config: refused naming the key
        let out = lockstep(&args(&["--resume", "--set", "train.lr=0.05"]), &dir);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains("train.lr") && err.contains("--allow-config-change"), "{name}: {err}");
        assert_eq!(std::fs::read(run.join("metrics.jsonl")).unwrap(), metrics_before, "{name}: the metrics changed");
        // --allow-config-change without --resume, and --resume with no checkpoint
        let out = lockstep(&[&["train", "small.toml", "--set", "log.run_name=other", "--allow-config-change"][..], extra].concat(), &dir);
        assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--allow-config-change applies to --resume only"), "{name}");
        let out = lockstep(&[&["train", "small.toml", "--set", "log.run_name=none", "--resume"][..], extra].concat(), &dir);
        assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no checkpoint"), "{name}");
        // the same config resumes
        let out = lockstep(&args(&["--resume"]), &dir);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    }
}
