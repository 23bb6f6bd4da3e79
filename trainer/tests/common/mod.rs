//! Helpers shared by the `lockstep` binary's end-to-end tests.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

pub use shared_kernels::testing::Scratch;

pub fn lockstep(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockstep")).args(args).current_dir(cwd).output().expect("run lockstep")
}

/// The test's own folder: removed when it passes, kept when it fails.
pub fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("cli-{name}"))
}

pub const SMALL: &str = r#"
[train]
steps = 6
prompts_per_step = 2
group_size = 4
sft_steps = 4
sft_batch = 8
checkpoint_every = 3
keep_checkpoints = 5

[sampler]
max_new_tokens = 4

[log]
progress = false
"#;

/// metrics.jsonl without the wall-clock fields.
pub fn metrics(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            let o = v.as_object_mut().unwrap();
            o.remove("step_s");
            o.remove("tokens_per_s");
            o.remove("timing");
            v
        })
        .collect()
}

/// Points per TensorBoard scalar tag of `tb_dir`, read back by the real TensorBoard.
pub fn tensorboard_points(tb_dir: &Path) -> std::collections::BTreeMap<String, Vec<i64>> {
    let script = r#"
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1]); acc.Reload()
for tag in sorted(acc.Tags()["scalars"]):
    print(tag, " ".join(str(e.step) for e in acc.Scalars(tag)))
"#;
    let out = Command::new("python3").args(["-c", script, tb_dir.to_str().unwrap()]).output().expect("python3 with tensorboard");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| {
        let mut parts = l.split(' ');
        (parts.next().unwrap().to_string(), parts.map(|p| p.parse().unwrap()).collect())
    }).collect()
}
