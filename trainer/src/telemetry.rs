//! Per-step metrics: one JSON line in runs/<name>/metrics.jsonl and TensorBoard scalars with
//! namespaced tags. TensorBoard writing can never kill a run: tensorboard-rs panics on I/O
//! errors, so every call is isolated and a failure turns TensorBoard off with a warning.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Sampler-vs-trainer agreement over a step's rollout tokens.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Agreement {
    pub tokens: usize,
    pub bit_equal_frac: f64,
    pub kl_k1: f64,
    pub kl_k3: f64,
    pub logprob_abs_diff_max: f64,
    pub logprob_abs_diff_mean: f64,
}

impl Agreement {
    /// `sampler` and `trainer` logprobs of the same tokens. k1 = E[log q - log p], k3 =
    /// E[p/q - log(p/q) - 1] with q the sampler (behaviour) and p the trainer.
    pub fn of(sampler: &[f32], trainer: &[f32]) -> Self {
        let n = sampler.len().max(1) as f64;
        let mut a = Agreement { tokens: sampler.len(), ..Default::default() };
        let mut equal = 0usize;
        for (&q, &p) in sampler.iter().zip(trainer) {
            if q.to_bits() == p.to_bits() {
                equal += 1;
            }
            let log_ratio = p as f64 - q as f64;
            a.kl_k1 += -log_ratio / n;
            a.kl_k3 += (log_ratio.exp() - log_ratio - 1.0) / n;
            a.logprob_abs_diff_max = a.logprob_abs_diff_max.max(log_ratio.abs());
            a.logprob_abs_diff_mean += log_ratio.abs() / n;
        }
        a.bit_equal_frac = equal as f64 / n;
        a
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StepMetrics {
    pub step: usize,
    pub reward_mean: f64,
    pub reward_std: f64,
    pub response_len_mean: f64,
    pub agreement: Agreement,
    pub loss: f64,
    pub grad_norm: f64,
    pub entropy: f64,
    pub lr: f64,
    pub is_ratio_min: f64,
    pub is_ratio_mean: f64,
    pub is_ratio_max: f64,
    pub truncated_frac: f64,
    pub masked_frac: f64,
    /// The importance weights after truncation or masking (`is_ratio_*` are before); 1 without a
    /// correction.
    #[serde(default)]
    pub is_weight_min: f64,
    #[serde(default)]
    pub is_weight_mean: f64,
    #[serde(default)]
    pub is_weight_max: f64,
    pub kl_ref: f64,
    pub tokens_per_s: f64,
    pub step_s: f64,
    /// Where the step's wall-clock time went (absent in runs from before 2026-11-29's 4th session).
    #[serde(default)]
    pub timing: PhaseTimes,
    /// [`crate::grpo`]'s weight fingerprint of the sampler's and the trainer's weights (runs
    /// from older builds logged `*_weights_sha256`, a host hash of every value instead).
    #[serde(default)]
    pub sampler_weights_fingerprint: String,
    #[serde(default)]
    pub trainer_weights_fingerprint: String,
    /// The evaluation after this step, on steps `train.eval_every` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval: Option<crate::eval::EvalMetrics>,
    /// DAPO's dynamic sampling (`train.dynamic_sampling_rounds`): groups trained on and sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_sampling: Option<DynamicSampling>,
    /// Agent episodes (`task.name = "environment"`): the step's means (each episode's own
    /// line is in episodes.jsonl).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub episodes: Option<EpisodeMeans>,
    /// A mixture-of-experts model's routing: agreement with the sampler and expert load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeTelemetry>,
}

/// `crate::grpo`'s routing pass over a step's rollouts (a mixture-of-experts model).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MoeTelemetry {
    /// Of the sampled tokens, the fraction whose row the trainer sent to the same experts as the
    /// sampler did in every sparse layer (1 by construction with the matched kernels).
    pub routing_agreement: f64,
    pub routed_tokens: usize,
    /// The largest of the layers' `max_over_mean`.
    pub load_max_over_mean: f64,
    /// transformers' `load_balancing_loss_func` over the step's sequences (`num_experts_per_tok`
    /// when perfectly balanced), and what the update adds: `train.router_aux_loss_coef` times it.
    pub load_balancing_loss: f64,
    pub aux_loss: f64,
    pub layers: Vec<LayerLoad>,
    pub routing_s: f64,
}

/// One sparse layer's load over a step's sequences (prompts and completions).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LayerLoad {
    pub layer: usize,
    pub tokens_per_expert: Vec<u64>,
    /// The busiest expert's tokens over the mean (1 = balanced; the number of experts when one
    /// takes every token).
    pub max_over_mean: f64,
    /// Experts that took no token.
    pub unused_experts: usize,
}

impl LayerLoad {
    pub fn of(layer: usize, tokens_per_expert: Vec<u64>) -> Self {
        let total: u64 = tokens_per_expert.iter().sum();
        let mean = total as f64 / tokens_per_expert.len().max(1) as f64;
        let max = tokens_per_expert.iter().copied().max().unwrap_or(0) as f64;
        let unused_experts = tokens_per_expert.iter().filter(|&&c| c == 0).count();
        LayerLoad { layer, max_over_mean: if mean > 0.0 { max / mean } else { 0.0 }, unused_experts, tokens_per_expert }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct EpisodeMeans {
    pub episodes: usize,
    pub turns_mean: f64,
    pub turns_max: usize,
    pub tool_calls_mean: f64,
    /// Sampled tokens per episode (the loss's), and whole-episode tokens.
    pub sampled_tokens_mean: f64,
    pub episode_tokens_mean: f64,
    /// The environment programs' seconds per episode (their generations included).
    pub program_s_mean: f64,
}

impl EpisodeMeans {
    pub fn of(stats: &[crate::agents::EpisodeStats]) -> Self {
        let n = stats.len().max(1) as f64;
        let mean = |f: &dyn Fn(&crate::agents::EpisodeStats) -> f64| stats.iter().map(f).sum::<f64>() / n;
        EpisodeMeans {
            episodes: stats.len(),
            turns_mean: mean(&|e| e.turns as f64),
            turns_max: stats.iter().map(|e| e.turns).max().unwrap_or(0),
            tool_calls_mean: mean(&|e| e.tool_calls as f64),
            sampled_tokens_mean: mean(&|e| e.sampled_tokens as f64),
            episode_tokens_mean: mean(&|e| e.episode_tokens as f64),
            program_s_mean: mean(&|e| e.program_s),
        }
    }
}

/// Each agent episode's line (`crate::agents::EpisodeStats`), beside metrics.jsonl.
const EPISODES: &str = "episodes.jsonl";

/// Appends a step's episodes to the run's episodes.jsonl.
pub fn append_episodes(run_dir: &Path, stats: &[crate::agents::EpisodeStats]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(run_dir.join(EPISODES))?;
    let text: String = stats.iter().map(|e| format!("{}\n", serde_json::to_string(e).expect("episode stats serialise"))).collect();
    f.write_all(text.as_bytes())
}

/// Rewrites a JSON-lines log (atomically) with only its lines of steps before `from` (a
/// resumed run drops what a killed run logged past its checkpoint); returns them.
fn keep_steps_before(path: &Path, from: usize) -> std::io::Result<Vec<String>> {
    let kept: Vec<String> = std::fs::read_to_string(path)
        // by the line's `step` alone, so lines another version of lockstep wrote (other
        // fields) are kept; only a line cut short by a kill is not JSON and goes
        .map(|text| text.lines().filter(|l| serde_json::from_str::<serde_json::Value>(l).ok().and_then(|v| v.get("step")?.as_u64()).is_some_and(|step| step < from as u64)).map(str::to_string).collect())
        .unwrap_or_default();
    if path.exists() {
        let text: String = kept.iter().map(|l| format!("{l}\n")).collect();
        shared_kernels::model::save::write_atomic(path, text.as_bytes()).map_err(|e| std::io::Error::other(e.to_string()))?;
    }
    Ok(kept)
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DynamicSampling {
    pub groups_kept: usize,
    pub groups_sampled: usize,
}

/// Wall-clock seconds of a GRPO step's phases, as the host sees them. Each phase ends by reading
/// its results back (tokens, logprobs, the loss and gradient norm, the weight hashes), so the
/// device work a phase queued is inside its time.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PhaseTimes {
    /// Rollouts: the sampler's generate.
    pub gen_s: f64,
    /// The training path's logprobs of every rollout (and the reference model's, if any).
    pub logprob_s: f64,
    /// Loss, backward, clipping and the optimizer step.
    pub update_s: f64,
    /// Weights handed to the sampler (with its fused copies) and both weight hashes.
    pub sync_s: f64,
    /// Inside gen: the engine's batched steps, and where their time went (enqueueing launches,
    /// waiting for each step's tokens, copying shared prompt prefixes, scheduling).
    #[serde(default)]
    pub gen_engine_steps: usize,
    #[serde(default)]
    pub gen_launch_s: f64,
    #[serde(default)]
    pub gen_wait_s: f64,
    #[serde(default)]
    pub gen_prefix_copy_s: f64,
    #[serde(default)]
    pub gen_schedule_s: f64,
    /// Requests the engine preempted for want of KV cache blocks (rerun, same bits).
    #[serde(default)]
    pub gen_preempted: usize,
    /// Engine steps replayed as captured graphs (`LOCKSTEP_DECODE_GRAPHS=on`).
    #[serde(default)]
    pub gen_replayed_steps: usize,
    /// Graph captures that failed (warned about; those steps were launched, same bits).
    #[serde(default)]
    pub gen_failed_captures: usize,
}

impl StepMetrics {
    pub fn scalars(&self) -> Vec<(&'static str, f64)> {
        let a = &self.agreement;
        vec![
            ("rollout/reward_mean", self.reward_mean),
            ("rollout/reward_std", self.reward_std),
            ("rollout/response_len", self.response_len_mean),
            ("rollout/kl_k1", a.kl_k1),
            ("rollout/kl_k3", a.kl_k3),
            ("rollout/logprob_abs_diff_max", a.logprob_abs_diff_max),
            ("rollout/logprob_abs_diff_mean", a.logprob_abs_diff_mean),
            ("rollout/bit_equal_frac", a.bit_equal_frac),
            ("train/loss", self.loss),
            ("train/grad_norm", self.grad_norm),
            ("train/entropy", self.entropy),
            ("train/lr", self.lr),
            ("train/is_ratio_min", self.is_ratio_min),
            ("train/is_ratio_mean", self.is_ratio_mean),
            ("train/is_ratio_max", self.is_ratio_max),
            ("train/is_weight_min", self.is_weight_min),
            ("train/is_weight_mean", self.is_weight_mean),
            ("train/is_weight_max", self.is_weight_max),
            ("train/truncated_frac", self.truncated_frac),
            ("train/masked_frac", self.masked_frac),
            ("train/kl_ref", self.kl_ref),
            ("perf/tokens_per_s", self.tokens_per_s),
            ("perf/step_s", self.step_s),
            ("timing_s/gen", self.timing.gen_s),
            ("timing_s/logprob", self.timing.logprob_s),
            ("timing_s/update_actor", self.timing.update_s),
            ("timing_s/sync_weights", self.timing.sync_s),
            ("timing_s/gen_launch", self.timing.gen_launch_s),
            ("timing_s/gen_wait", self.timing.gen_wait_s),
            ("timing_s/gen_prefix_copy", self.timing.gen_prefix_copy_s),
            ("timing_s/gen_schedule", self.timing.gen_schedule_s),
            ("perf/gen_engine_steps", self.timing.gen_engine_steps as f64),
            ("perf/gen_preempted", self.timing.gen_preempted as f64),
            ("perf/gen_replayed_steps", self.timing.gen_replayed_steps as f64),
            ("perf/gen_failed_captures", self.timing.gen_failed_captures as f64),
        ]
        .into_iter()
        .chain(self.dynamic_sampling.iter().flat_map(|d| [("rollout/groups_kept", d.groups_kept as f64), ("rollout/groups_sampled", d.groups_sampled as f64)]))
        .chain(self.episodes.iter().flat_map(|e| [("episode/turns_mean", e.turns_mean), ("episode/tool_calls_mean", e.tool_calls_mean), ("episode/sampled_tokens_mean", e.sampled_tokens_mean), ("episode/tokens_mean", e.episode_tokens_mean), ("episode/program_s_mean", e.program_s_mean)]))
        .chain(self.moe.iter().flat_map(|m| [("moe/routing_agreement", m.routing_agreement), ("moe/load_max_over_mean", m.load_max_over_mean), ("moe/load_balancing_loss", m.load_balancing_loss)]))
        .chain(self.eval.iter().flat_map(|e| [("eval/pass1_greedy", e.pass1_greedy), ("eval/pass_at_k", e.pass_at_k), ("eval/sampled_accuracy", e.sampled_accuracy), ("eval/sampled_reward_mean", e.sampled_reward_mean)]))
        .chain(self.aliases())
        .collect()
    }

    /// The names other trainers log the same quantities under (Miles, verl, TRL), written beside
    /// lockstep's own to TensorBoard and, as `"aliases"`, to metrics.jsonl.
    pub fn aliases(&self) -> Vec<(&'static str, f64)> {
        let a = &self.agreement;
        vec![
            ("train_rollout_logprob_abs_diff", a.logprob_abs_diff_mean),
            ("rollout_corr/kl", a.kl_k1),
            ("rollout_corr/k3_kl", a.kl_k3),
            ("sampling/importance_sampling_ratio/min", self.is_ratio_min),
            ("sampling/importance_sampling_ratio/mean", self.is_ratio_mean),
            ("sampling/importance_sampling_ratio/max", self.is_ratio_max),
        ]
    }
}

pub struct Telemetry {
    metrics_path: PathBuf,
    tb: Option<tensorboard_rs::summary_writer::SummaryWriter>,
}

impl Telemetry {
    /// Opens the run's telemetry to record steps from `from` on: metrics.jsonl keeps only the
    /// lines of earlier steps (a resumed run drops what a killed run logged past its
    /// checkpoint), and TensorBoard's events are rewritten from those lines into a fresh file
    /// (events files only grow, so a killed run's later steps, or an earlier run's in a reused
    /// folder, would otherwise stay as duplicate points). metrics.jsonl is the record; the
    /// events are always its copy.
    pub fn open(run_dir: &Path, tensorboard: bool, from: usize) -> std::io::Result<Self> {
        std::fs::create_dir_all(run_dir)?;
        let metrics_path = run_dir.join("metrics.jsonl");
        let kept = keep_steps_before(&metrics_path, from)?;
        keep_steps_before(&run_dir.join(EPISODES), from)?;
        let tb_dir = run_dir.join("tb");
        if let Ok(entries) = std::fs::read_dir(&tb_dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("events.out.tfevents") {
                    std::fs::remove_file(e.path())?;
                }
            }
        }
        let tb = if tensorboard {
            std::fs::create_dir_all(&tb_dir)?;
            std::panic::catch_unwind(|| tensorboard_rs::summary_writer::SummaryWriter::new(&tb_dir)).ok()
        } else {
            None
        };
        let mut telemetry = Self { metrics_path, tb };
        for m in kept.iter().filter_map(|l| serde_json::from_str::<StepMetrics>(l).ok()) {
            telemetry.write_events(&m);
        }
        Ok(telemetry)
    }

    pub fn record(&mut self, m: &StepMetrics) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&self.metrics_path)?;
        let mut line = serde_json::to_value(m).expect("metrics serialise");
        line["aliases"] = m.aliases().into_iter().map(|(k, v)| (k.to_string(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>().into();
        writeln!(f, "{line}")?;
        self.write_events(m);
        Ok(())
    }

    /// One step's scalars into TensorBoard (a failing writer is dropped with a warning).
    fn write_events(&mut self, m: &StepMetrics) {
        if let Some(tb) = self.tb.as_mut() {
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                for (tag, v) in m.scalars() {
                    tb.add_scalar(tag, v as f32, m.step);
                }
                tb.flush();
            }));
            if ok.is_err() {
                tracing::warn!("TensorBoard writer failed; continuing without TensorBoard (metrics.jsonl still written)");
                self.tb = None;
            }
        }
    }

    pub fn read(run_dir: &Path) -> Vec<StepMetrics> {
        std::fs::read_to_string(run_dir.join("metrics.jsonl"))
            .map(|t| t.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
            .unwrap_or_default()
    }
}

/// The end of a `lockstep train`: the reward's first and last quarter, the sampler-trainer
/// agreement over every step, and the final checkpoint.
pub fn print_summary(history: &[StepMetrics], checkpoint: Option<&std::path::Path>) {
    let (Some(first), Some(last)) = (history.first(), history.last()) else { return };
    let window = |ms: &[StepMetrics]| ms.iter().map(|m| m.reward_mean).sum::<f64>() / ms.len().max(1) as f64;
    let k = (history.len() / 4).max(1);
    let kl_max = history.iter().map(|m| m.agreement.kl_k1.abs()).fold(0.0, f64::max);
    let diff_max = history.iter().map(|m| m.agreement.logprob_abs_diff_max).fold(0.0, f64::max);
    let bit_equal_min = history.iter().map(|m| m.agreement.bit_equal_frac).fold(1.0, f64::min);
    let tokens: usize = history.iter().map(|m| m.agreement.tokens).sum();
    println!("steps {}..={}: reward {:.3} (first {k} steps) -> {:.3} (last {k} steps)", first.step, last.step, window(&history[..k]), window(&history[history.len() - k..]));
    println!("sampler vs trainer over {tokens} rollout tokens: max |KL k1| {kl_max:.3e}, max |dlogprob| {diff_max:.3e}, min bit-equal fraction {bit_equal_min:.4}");
    match checkpoint {
        Some(path) => println!("checkpoint: {}", path.display()),
        None => println!("checkpoint: none at the end (train.final_checkpoint = false)"),
    }
}

#[cfg(test)]
mod tests {
    use super::{StepMetrics, Telemetry};

    #[test]
    fn a_resume_keeps_every_earlier_steps_line_even_in_another_versions_format() {
        let dir = shared_kernels::testing::Scratch::new("telemetry-resume");
        let current = serde_json::to_string(&StepMetrics { step: 0, ..Default::default() }).unwrap();
        // step 1 as another version wrote it (a field this one lacks, none of its own); step 3
        // past the checkpoint; and a line a kill cut short
        let other = r#"{"step": 1, "reward_mean": 0.5, "a_later_field": [1, 2]}"#;
        let later = serde_json::to_string(&StepMetrics { step: 3, ..Default::default() }).unwrap();
        std::fs::write(dir.join("metrics.jsonl"), format!("{current}\n{other}\n{later}\n{{\"step\": 2, \"rew")).unwrap();
        Telemetry::open(&dir, false, 2).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap(), format!("{current}\n{other}\n"));
    }
}
