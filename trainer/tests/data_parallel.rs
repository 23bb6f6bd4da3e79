//! Data-parallel GRPO with its ranks as threads on the CPU runtime (issue 26): every rank ends
//! every step with the same weights (fingerprints compared inside the run and here), KL 0 and
//! bit_equal 1 on every rank, the rollouts of a one-rank run, and a rerun repeats bit for bit.

use shared_kernels::testing::Scratch;
use std::path::Path;
use std::time::Duration;
use trainer::config::Config;
use trainer::distributed::threads::{train_in_threads, train_ranks};
use trainer::telemetry::StepMetrics;

const BASE: &str = r#"
[train]
steps = 3
prompts_per_step = 4
group_size = 4
sft_steps = 3
sft_batch = 8
on_mismatch = "stop"
checkpoint_every = 0
final_checkpoint = false

[task]
reward = "char_f1"

[sampler]
max_new_tokens = 4

[log]
progress = false
tensorboard = false
"#;

/// A run's config and the scratch folder holding its runs (removed when the test passes).
struct TestRun {
    cfg: Config,
    _dir: Scratch,
}

impl std::ops::Deref for TestRun {
    type Target = Config;
    fn deref(&self) -> &Config {
        &self.cfg
    }
}

fn config(name: &str, overrides: &[&str]) -> TestRun {
    let dir = Scratch::new(&format!("dp-{name}"));
    let path = dir.join("run.toml");
    std::fs::write(&path, BASE).unwrap();
    let mut o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    o.push(format!("log.runs_dir={}", dir.join("runs").display()));
    TestRun { cfg: Config::load(Some(Path::new(&path)), &o).unwrap(), _dir: dir }
}

/// A step's metrics without wall-clock fields, as JSON.
fn comparable(m: &StepMetrics) -> serde_json::Value {
    let mut v = serde_json::to_value(m).unwrap();
    let o = v.as_object_mut().unwrap();
    for k in ["step_s", "tokens_per_s", "timing"] {
        o.remove(k);
    }
    v
}

fn run(cfg: &Config, world: usize) -> Vec<Vec<StepMetrics>> {
    train_in_threads(cfg, world, Duration::from_secs(300)).into_iter().map(|r| r.unwrap()).collect()
}

#[test]
fn two_ranks_keep_the_contract_share_one_ranks_rollouts_and_repeat_bit_for_bit() {
    // 24-token micro-batches: several per rank, the contract checked inside the update
    for (name, extra) in [("micro", &["train.micro_batch_tokens=24"][..]), ("ppo", &["train.mini_batches=2", "train.ppo_epochs=1"][..])] {
        let cfg = config(name, extra);
        let two = run(&cfg, 2);
        for step in 0..cfg.train.steps {
            let (a, b) = (&two[0][step], &two[1][step]);
            assert_eq!(comparable(a), comparable(b), "{name}: ranks differ at step {step}");
            assert_eq!(a.agreement.bit_equal_frac, 1.0, "{name}");
            assert_eq!(a.agreement.kl_k1, 0.0, "{name}");
            assert_eq!(a.sampler_weights_fingerprint, a.trainer_weights_fingerprint);
        }
        // the weights move (a step that changed nothing would make the test vacuous)
        assert_ne!(two[0][0].trainer_weights_fingerprint, two[0][1].trainer_weights_fingerprint, "{name}");
        // step 0's rollouts are a one-rank run's: same problems, request ids and kernels
        let one = run(&cfg, 1);
        let (a, b) = (&two[0][0], &one[0][0]);
        assert_eq!((a.reward_mean.to_bits(), a.reward_std.to_bits(), a.response_len_mean.to_bits()), (b.reward_mean.to_bits(), b.reward_std.to_bits(), b.response_len_mean.to_bits()), "{name}");
        assert_eq!(a.agreement, b.agreement, "{name}");
        eprintln!("{name}: weights after step 0, 2 ranks {} / 1 rank {} (equal as bits: {})", a.trainer_weights_fingerprint, b.trainer_weights_fingerprint, a.trainer_weights_fingerprint == b.trainer_weights_fingerprint);
        // run to run
        let again = run(&cfg, 2);
        for step in 0..cfg.train.steps {
            assert_eq!(comparable(&two[0][step]), comparable(&again[0][step]), "{name}: the rerun differs at step {step}");
        }
    }
}

#[test]
fn ranks_with_different_configs_are_refused_on_every_rank_naming_the_rank() {
    let cfg = config("mismatch", &[]);
    let mut other = cfg.clone();
    other.train.lr *= 2.0;
    let out = train_ranks(&[cfg.clone(), cfg.clone(), other], Duration::from_secs(120));
    for (rank, r) in out.iter().enumerate() {
        let e = r.as_ref().unwrap_err();
        assert!(e.contains("config") && e.contains("rank 2 has"), "rank {rank}: {e}");
    }
}

#[test]
fn more_ranks_than_groups_leave_some_ranks_idle_and_still_agree() {
    let cfg = config("idle", &["train.prompts_per_step=2", "train.steps=2"]);
    let three = run(&cfg, 3);
    for step in 0..2 {
        assert_eq!(comparable(&three[0][step]), comparable(&three[2][step]));
        assert_eq!(three[1][step].agreement.bit_equal_frac, 1.0);
    }
}

fn lockstep_with_env(args: &[&str], env: &[(&str, &str)], name: &str) -> std::process::Output {
    let dir = Scratch::new(&format!("dp-cli-{name}"));
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_lockstep"));
    cmd.args(args).current_dir(&dir);
    for k in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"] {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().copied());
    cmd.output().unwrap()
}

#[test]
fn gpus_without_nccl_fail_on_every_rank_in_bounded_time_and_bad_rank_variables_are_named() {
    // this build has no NCCL (CPU runtime): each rank says so, the launcher reports every rank
    let started = std::time::Instant::now();
    let out = lockstep_with_env(&["train", "--gpus", "2", "--set", "train.steps=1", "--set", "log.progress=false"], &[], "gpus");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("needs the CUDA build") && err.contains("rank 0:") && err.contains("rank 1:"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(120));
    // torchrun's variables, malformed: a config error (exit 2) naming them
    for (env, named) in [(&[("RANK", "3"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")][..], "below WORLD_SIZE"), (&[("RANK", "0")][..], "WORLD_SIZE")] {
        let out = lockstep_with_env(&["train", "--set", "train.steps=1"], env, "env");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(named), "{err}");
    }
}

#[test]
fn gradient_blocks_make_the_update_bits_the_same_on_one_two_and_four_ranks() {
    // 4 prompt groups in 4 gradient blocks; several micro-batches a block (the contract checked
    // inside the update); and PPO mini-batches cut into 2 blocks each
    for (name, worlds, extra) in [
        ("blocks", &[1usize, 2, 4][..], &["train.gradient_blocks=4", "train.micro_batch_tokens=24", "train.steps=2"][..]),
        ("blocks-ppo", &[1, 2][..], &["train.gradient_blocks=2", "train.mini_batches=2", "train.ppo_epochs=1", "train.steps=2"][..]),
    ] {
        let cfg = config(name, extra);
        let runs: Vec<Vec<Vec<StepMetrics>>> = worlds.iter().map(|&w| run(&cfg, w)).collect();
        for step in 0..cfg.train.steps {
            let one = &runs[0][0][step];
            assert_eq!(one.agreement.kl_k1, 0.0, "{name}");
            for (w, ranks) in worlds.iter().zip(&runs) {
                for m in ranks.iter().map(|r| &r[step]) {
                    let what = format!("{name}: step {step}, {w} ranks");
                    assert_eq!(m.trainer_weights_fingerprint, one.trainer_weights_fingerprint, "{what}: the weights differ from one rank's");
                    assert_eq!((m.grad_norm.to_bits(), m.loss.to_bits(), m.reward_mean.to_bits()), (one.grad_norm.to_bits(), one.loss.to_bits(), one.reward_mean.to_bits()), "{what}");
                    assert_eq!(m.agreement.bit_equal_frac, 1.0, "{what}");
                }
            }
        }
        assert_ne!(runs[0][0][0].trainer_weights_fingerprint, runs[0][0][1].trainer_weights_fingerprint, "{name}: the weights must move");
    }
    // a block count the ranks cannot share evenly, and one that is not a power of two
    let out = train_in_threads(&config("blocks-bad", &["train.gradient_blocks=2"]), 4, Duration::from_secs(60));
    for r in &out {
        let e = r.as_ref().unwrap_err();
        assert!(e.contains("train.gradient_blocks") && e.contains("4 ranks"), "{e}");
    }
    let dir = Scratch::new("dp-blocks3");
    std::fs::write(dir.join("run.toml"), BASE).unwrap();
    let e = Config::load(Some(&dir.join("run.toml")), &["train.gradient_blocks=3".to_string()]).unwrap_err().to_string();
    assert!(e.contains("train.gradient_blocks") && e.contains("power of two"), "{e}");
}

#[test]
fn a_sharded_optimizer_gives_the_unsharded_bits_and_a_resumed_run_repeats_an_uninterrupted_one() {
    let common = ["train.micro_batch_tokens=24", "train.final_checkpoint=true", "train.checkpoint_every=1"];
    let with = |name: &str, extra: &[&str]| config(name, &[&common[..], extra].concat());
    let plain = with("unsharded", &["train.shard_optimizer=false"]);
    let sharded = with("sharded", &[]);
    let a = run(&plain, 2);
    let b = run(&sharded, 2);
    for step in 0..plain.train.steps {
        for rank in 0..2 {
            assert_eq!(comparable(&a[rank][step]), comparable(&b[rank][step]), "step {step}, rank {rank}: sharded differs from unsharded");
        }
    }
    // the checkpoint rank 0 gathered from the owners holds the unsharded run's bytes: the f32
    // weights, and every moment
    let last = |cfg: &Config| trainer::checkpoint::list(&trainer::run::run_dir(cfg)).pop().expect("a checkpoint");
    for file in ["model.safetensors", "optimizer.safetensors", "state.json"] {
        let (x, y) = (std::fs::read(last(&plain).join(file)).unwrap(), std::fs::read(last(&sharded).join(file)).unwrap());
        assert!(x == y, "{file}: the sharded checkpoint differs from the unsharded one ({} / {} bytes)", x.len(), y.len());
    }
    // stopped after step 1 (checkpoint), resumed on 2 ranks: steps 1-2 as the uninterrupted run's
    let stopped = with("resumed", &[]);
    let first = trainer::distributed::threads::train_ranks_from(&[stopped.clone(), stopped.clone()], Duration::from_secs(300), false, Some(1));
    assert!(first.iter().all(|r| r.as_ref().is_ok_and(|m| m.len() == 1)), "{first:?}");
    let rest: Vec<Vec<StepMetrics>> = trainer::distributed::threads::train_ranks_from(&[stopped.clone(), stopped.clone()], Duration::from_secs(300), true, None).into_iter().map(|r| r.unwrap()).collect();
    for rank in 0..2 {
        assert_eq!(rest[rank].len(), 2);
        for (k, m) in rest[rank].iter().enumerate() {
            assert_eq!(comparable(m), comparable(&b[rank][1 + k]), "rank {rank}: resumed step {} differs from the uninterrupted run", 1 + k);
        }
    }
}

#[test]
fn ranks_in_threads_from_the_cli_print_one_ranks_bits_on_every_rank() {
    // `lockstep train --ranks-in-threads N`: the one-device check of data parallel (the H200
    // runs it at real shapes); two ranks with two gradient blocks print the weights, grad norm
    // and loss of a one-rank run with the same blocks, on both ranks
    let args = |n: &'static str| {
        vec!["train", "--ranks-in-threads", n, "--set", "train.steps=2", "--set", "train.sft_steps=2", "--set", "train.prompts_per_step=2", "--set", "train.group_size=4",
            "--set", "train.gradient_blocks=2", "--set", "sampler.max_new_tokens=4", "--set", "task.reward=char_f1", "--set", "log.progress=false", "--set", "log.tensorboard=false",
            "--set", "train.checkpoint_every=0", "--set", "train.final_checkpoint=false"]
    };
    let lines = |n: &'static str| {
        let out = lockstep_with_env(&args(n), &[], &format!("threads-{n}"));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).unwrap();
        // "rank R step ..." -> (R, the rest)
        text.lines().filter_map(|l| l.strip_prefix("rank ")).map(|l| l.split_once(' ').map(|(r, rest)| (r.to_string(), rest.to_string())).unwrap()).collect::<Vec<_>>()
    };
    let one = lines("1");
    let two = lines("2");
    assert_eq!(one.len(), 2, "{one:?}");
    assert!(one.iter().all(|(_, l)| l.contains("bit_equal 1.0000") && l.contains("weights ")), "{one:?}");
    let on_rank = |r: &str| two.iter().filter(|(rank, _)| rank == r).map(|(_, l)| l.clone()).collect::<Vec<_>>();
    let expected: Vec<String> = one.iter().map(|(_, l)| l.clone()).collect();
    for r in ["0", "1"] {
        assert_eq!(on_rank(r), expected, "rank {r}");
    }
    let out = lockstep_with_env(&["train", "--ranks-in-threads", "0"], &[], "threads-0");
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ranks-in-threads"));
}
