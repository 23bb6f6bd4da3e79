//! The run configuration: TOML, one section per concern, every key with a default
//! (documented in docs/config.md), unknown keys refused, `--set section.key=value` overrides.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// A config mode: a closed set of choices, spelled in the TOML as the strings below (an unknown
/// one is a parse error naming the file, the line and the allowed spellings).
macro_rules! config_mode {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant),+
        }
        impl $name {
            /// The TOML spelling.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

config_mode! {
    /// What a sampler/trainer logprob that differs in bits does in matched mode.
    OnMismatch { Stop = "stop", Warn = "warn" }
}
config_mode! {
    /// The kernels the sampler runs on.
    SamplerKernels {
        /// lockstep's batch-invariant kernels, bit-equal to the trainer's.
        Matched = "matched",
        /// burn's default (autotuned, not batch-invariant) matmul and rmsnorm.
        Fast = "fast",
        /// lockstep's kernels but a matmul that splits K by batch size.
        SplitK = "split_k",
    }
}
config_mode! {
    /// The ablation's importance-sampling correction.
    Correction { None = "none", Tis = "tis", Mis = "mis", PpoClip = "ppo_clip" }
}
config_mode! {
    /// Where an importance ratio is taken: per token, or per sequence (GSPO).
    RatioLevel { Token = "token", Sequence = "sequence" }
}
config_mode! {
    /// Group advantages: GRPO's (r - mean) / (std + 1e-6), or Dr. GRPO's r - mean.
    Advantage { GroupStd = "group_std", GroupMean = "group_mean" }
}
config_mode! {
    /// What a sequence's token terms are divided by (see `losses::aggregation_divisor`).
    LossAggregation { TokenMean = "token_mean", SequenceMean = "sequence_mean", Constant = "constant" }
}
config_mode! {
    /// The prompt as written, or rendered with a chat template.
    PromptFormat { Raw = "raw", Chat = "chat" }
}

impl SamplerKernels {
    /// The model's kernel set for this choice.
    pub fn kernel_set(self) -> shared_kernels::model::KernelSet {
        use shared_kernels::model::KernelSet;
        match self {
            SamplerKernels::Matched => KernelSet::Matched,
            SamplerKernels::Fast => KernelSet::Fast,
            SamplerKernels::SplitK => KernelSet::SplitK,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub model: ModelSection,
    pub sampler: SamplerSection,
    pub train: TrainSection,
    pub task: TaskSection,
    pub log: LogSection,
    pub ablation: AblationSection,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// HF checkpoint folder; empty = the embedded tiny Qwen3 (random init, char vocabulary).
    pub path: String,
    /// Seed of the embedded model's random init.
    pub init_seed: u64,
    /// Training and sampling dtype: "f32" or "bf16".
    pub dtype: String,
    /// Embedded model only: hidden size, layers, heads, kv heads, head dim, ffn size.
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub init_std: f32,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self { path: String::new(), init_seed: 1, dtype: "f32".into(), hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, head_dim: 16, intermediate_size: 128, init_std: 0.08 }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SamplerSection {
    pub max_batch: usize,
    pub context: usize,
    pub chunk_size: usize,
    /// Same-prompt requests (a GRPO group) prefill the prompt once and copy its KV.
    pub share_prompt_prefix: bool,
    /// Enqueue each engine step before reading the previous step's tokens (same bits).
    pub overlap_steps: bool,
    /// KV cache memory budget in MiB: as many 64-position blocks as fit (0 = enough for
    /// max_batch requests of `context` tokens); when none is left the newest request is
    /// preempted and rerun later (same bits).
    pub kv_budget_mib: f64,
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub max_new_tokens: usize,
    /// `lockstep sample`: input JSONL (`{"prompt": "..."}` or `{"prompt_ids": [...]}`) and output.
    pub input: String,
    pub output: String,
    pub seed: u64,
}

impl Default for SamplerSection {
    fn default() -> Self {
        Self { max_batch: 64, context: 48, chunk_size: 16, share_prompt_prefix: true, overlap_steps: true, kv_budget_mib: 0.0, temperature: 1.0, top_k: 0, top_p: 1.0, max_new_tokens: 8, input: String::new(), output: String::new(), seed: 0 }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// GRPO steps.
    pub steps: usize,
    /// Prompts per step; each gets `group_size` completions.
    pub prompts_per_step: usize,
    pub group_size: usize,
    pub lr: f64,
    pub warmup_steps: usize,
    /// Cosine decay to lr * min_lr_ratio at the last step.
    pub min_lr_ratio: f64,
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub adam_eps: f64,
    /// Global gradient-norm clip; 0 disables.
    pub grad_clip: f64,
    /// KL-to-reference (k3) penalty coefficient; 0 disables.
    pub kl_coef: f64,
    pub seed: u64,
    /// What a sampler/trainer logprob that differs in bits does in matched mode: "stop" or "warn".
    pub on_mismatch: OnMismatch,
    /// Checkpoint every N steps (and at the end); 0 = only at the end.
    pub checkpoint_every: usize,
    pub keep_checkpoints: usize,
    /// Activation recomputation per decoder layer: the training forward keeps each layer's
    /// input only and the backward re-runs the layer (same bits, less memory, one more forward).
    pub recompute_layers: bool,
    /// Write a checkpoint after the last step (false: benchmarks, whose weights nobody resumes;
    /// a 4B model's weights and AdamW state are 56 GB).
    pub final_checkpoint: bool,
    /// Supervised warm start before RL (`lockstep train` runs it when > 0 and no checkpoint exists).
    pub sft_steps: usize,
    pub sft_lr: f64,
    pub sft_batch: usize,
    /// Trainer tokens per forward/backward pass (whole sequences, greedily in order; a longer
    /// sequence runs alone); the update's bits do not depend on it (weight gradients folded
    /// over the tokens in one order, `shared_kernels::grad_fold`). 0 = the whole step.
    pub micro_batch_tokens: usize,
    /// "group_std" (GRPO: (r - group mean) / (group std + 1e-6)) or "group_mean" (Dr. GRPO:
    /// r - group mean, no std normalisation).
    pub advantage: Advantage,
    /// How token terms are averaged: "token_mean" (every rollout token of the step weighs the
    /// same: DAPO, TRL's default), "sequence_mean" (each sequence's tokens averaged, then the
    /// sequences: the original GRPO) or "constant" (Dr. GRPO: divided by rollouts x
    /// sampler.max_new_tokens, length-unbiased).
    pub loss_aggregation: LossAggregation,
    /// DAPO's soft overlong punishment: a completion longer than sampler.max_new_tokens -
    /// overlong_buffer loses up to overlong_penalty of reward, linearly over the buffer (0 = off).
    pub overlong_buffer: usize,
    pub overlong_penalty: f64,
    /// PPO epochs: passes over a step's rollouts, each made of `mini_batches` optimizer steps
    /// with the clipped surrogate against the sampler's logprobs (1 x 1: one update, no clip).
    pub ppo_epochs: usize,
    pub mini_batches: usize,
    /// The surrogate's clip range [1 - clip_low, 1 + clip_high] (DAPO's clip-higher: 0.2, 0.28).
    pub clip_low: f64,
    pub clip_high: f64,
    /// "token" (PPO/GRPO: a ratio per token) or "sequence" (GSPO: exp of the mean log-ratio of
    /// the completion, clipped per sequence, its tokens averaged).
    pub ratio_level: RatioLevel,
    /// Evaluate on `task.eval_path` after every N steps (0 = never): pass@1 greedy and pass@k
    /// over `eval_samples` sampled completions, on the first `eval_problems` problems.
    pub eval_every: usize,
    pub eval_samples: usize,
    pub eval_problems: usize,
    /// DAPO's dynamic sampling: groups whose rewards are all equal are dropped and up to this
    /// many refill rounds of `prompts_per_step` prompts keep the step at `prompts_per_step`
    /// groups with signal (0 = off).
    pub dynamic_sampling_rounds: usize,
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            steps: 20, prompts_per_step: 8, group_size: 8, lr: 2e-3, warmup_steps: 2, min_lr_ratio: 0.1, weight_decay: 0.0,
            beta1: 0.9, beta2: 0.99, adam_eps: 1e-8, grad_clip: 1.0, kl_coef: 0.0, seed: 0, on_mismatch: OnMismatch::Stop,
            checkpoint_every: 10, keep_checkpoints: 2, final_checkpoint: true, recompute_layers: false, sft_steps: 150, sft_lr: 3e-3, sft_batch: 32, micro_batch_tokens: 0, advantage: Advantage::GroupStd, loss_aggregation: LossAggregation::TokenMean, overlong_buffer: 0, overlong_penalty: 1.0,
            ppo_epochs: 1, mini_batches: 1, clip_low: 0.2, clip_high: 0.2, ratio_level: RatioLevel::Token,
            eval_every: 0, eval_samples: 4, eval_problems: 64, dynamic_sampling_rounds: 0,
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TaskSection {
    /// "addition", "sort", "countdown", "word_problems", or "dataset" (alias "jsonl"): the
    /// file at `path`, JSON lines or Parquet by its extension.
    pub name: String,
    /// addition: digits per operand.
    pub digits: usize,
    /// sort / countdown: how many numbers.
    pub count: usize,
    /// jsonl: a file of `{"prompt": "...", "answer": "..."}` lines.
    pub path: String,
    /// "exact" (1 for the right answer, else 0), "char_f1" (partial credit: the F1 of the
    /// completion's and the answer's characters as multisets, in [0, 1]) or "math" (the final
    /// answer, `\boxed{}` / `####` / the last number, compared numerically or as normalised
    /// LaTeX with the task's answer: `math_verify`).
    pub reward: String,
    /// reward "command": a shell command given one JSON line per rollout on stdin
    /// (`{"index", "prompt", "completion", "answer"}`), printing one reward per line
    /// (`trainer/src/reward_command.rs`).
    pub reward_command: String,
    /// Seconds the reward command may take for one step's rollouts.
    pub reward_timeout_s: f64,
    /// jsonl: the key of the prompt (dots walk nested objects): a string, or with
    /// prompt_format "chat" a list of `{"role", "content"}` messages.
    pub prompt_key: String,
    /// jsonl: the key of the answer, e.g. "reward_model.ground_truth" (verl's layout).
    pub answer_key: String,
    /// "raw" (the prompt text as is) or "chat" (rendered with the checkpoint's chat template,
    /// a string prompt as one user message, ending with the assistant's opening).
    pub prompt_format: PromptFormat,
    /// chat: a system message put before every prompt that has none ("" for none).
    pub system_prompt: String,
    /// chat: a template file instead of the checkpoint's own.
    pub chat_template: String,
    /// chat: extra template variables, e.g. `{ enable_thinking = false }`.
    pub chat_args: toml::Table,
    /// The eval split: a dataset file read as `path` is ("" for none; `train.eval_every`).
    pub eval_path: String,
    /// reward "math": what a wrong completion whose final answer is marked (`\boxed{}`, `####`,
    /// "answer is") earns (verl's format score; 0 = nothing).
    pub format_score: f64,
}

impl Default for TaskSection {
    fn default() -> Self {
        Self { name: "addition".into(), digits: 1, count: 3, path: String::new(), reward: "exact".into(), reward_command: String::new(), reward_timeout_s: 60.0, prompt_key: "prompt".into(), answer_key: "answer".into(), prompt_format: PromptFormat::Raw, system_prompt: String::new(), chat_template: String::new(), chat_args: toml::Table::new(), eval_path: String::new(), format_score: 0.0 }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    pub run_name: String,
    pub runs_dir: String,
    pub tensorboard: bool,
    pub progress: bool,
}

impl Default for LogSection {
    fn default() -> Self {
        Self { run_name: "quickstart".into(), runs_dir: "runs".into(), tensorboard: true, progress: true }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AblationSection {
    /// "matched": the sampler runs lockstep's kernels (bit-equal to the trainer); "fast": burn's
    /// default (autotuned, not batch-invariant) matmul and rmsnorm in the sampler.
    pub sampler_kernels: SamplerKernels,
    /// "none", "tis" (truncated IS), "mis" (masked IS) or "ppo_clip".
    pub correction: Correction,
    /// "token" or "sequence": where the importance ratio is taken.
    pub level: RatioLevel,
    /// tis: weights are min(ratio, tis_cap).
    pub tis_cap: f64,
    /// mis: tokens (or sequences) with ratio outside [1/mis_threshold, mis_threshold] are masked.
    pub mis_threshold: f64,
    /// ppo_clip: epsilon of the clipped surrogate.
    pub ppo_clip: f64,
}

impl Default for AblationSection {
    fn default() -> Self {
        Self { sampler_kernels: SamplerKernels::Matched, correction: Correction::None, level: RatioLevel::Token, tis_cap: 2.0, mis_threshold: 2.0, ppo_clip: 0.2 }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("{file}: cannot read: {message}")]
    Read { file: String, message: String },
    #[error("--set {spec}: {message}")]
    Override { spec: String, message: String },
    #[error("config key `{key}`: {message}")]
    Invalid { key: String, message: String },
}

impl Config {
    /// Reads `path` (if given), applies `overrides` ("section.key=value", value in TOML syntax,
    /// bare words taken as strings), and validates.
    pub fn load(path: Option<&Path>, overrides: &[String]) -> Result<Self, ConfigError> {
        let (text, file) = match path {
            Some(p) => (std::fs::read_to_string(p).map_err(|e| ConfigError::Read { file: p.display().to_string(), message: e.to_string() })?, p.display().to_string()),
            None => (String::new(), "<defaults>".to_string()),
        };
        let mut doc: toml::Table = text.parse().map_err(|e: toml::de::Error| ConfigError::Parse { file: file.clone(), message: e.to_string() })?;
        for spec in overrides {
            apply_override(&mut doc, spec)?;
        }
        let merged = toml::to_string(&doc).expect("table serialises");
        // parse the original text when there are no overrides, so errors point at its lines
        let source = if overrides.is_empty() { text } else { merged };
        let config: Config = toml::from_str(&source).map_err(|e| {
            // name the dotted key the error is at (a mode's unknown spelling, a wrong type)
            let key = e.span().and_then(|span| key_at(&source, span.start));
            let message = match key {
                Some(key) => format!("config key `{key}`: {e}"),
                None => e.to_string(),
            };
            ConfigError::Parse { file: if overrides.is_empty() { file } else { format!("{file} (with --set overrides)") }, message }
        })?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| Err(ConfigError::Invalid { key: key.into(), message });
        let one_of = |key: &str, value: &str, allowed: &[&str]| if allowed.contains(&value) { Ok(()) } else { bad(key, format!("`{value}` is not one of {allowed:?}")) };
        one_of("model.dtype", &self.model.dtype, &["f32", "bf16"])?;
        one_of("task.name", &self.task.name, &["addition", "sort", "countdown", "word_problems", "dataset", "jsonl"])?;
        one_of("task.reward", &self.task.reward, &["exact", "char_f1", "math", "command"])?;
        if self.task.reward == "command" && self.task.reward_command.trim().is_empty() {
            return bad("task.reward_command", "task.reward = \"command\" needs the command that prints the rewards".into());
        }
        if !(self.task.reward_timeout_s.is_finite() && self.task.reward_timeout_s > 0.0) {
            return bad("task.reward_timeout_s", format!("must be a finite number of seconds > 0, got {}", self.task.reward_timeout_s));
        }
        let rollouts = self.train.prompts_per_step * self.train.group_size;
        if self.train.ppo_epochs == 0 || self.train.ppo_epochs > 64 {
            return bad("train.ppo_epochs", format!("must be in 1..=64, got {}", self.train.ppo_epochs));
        }
        if self.train.mini_batches == 0 || self.train.mini_batches > rollouts.max(1) {
            return bad("train.mini_batches", format!("must be in 1..={rollouts} (train.prompts_per_step x train.group_size rollouts a step), got {}", self.train.mini_batches));
        }
        for (key, v) in [("train.clip_low", self.train.clip_low), ("train.clip_high", self.train.clip_high)] {
            if !(v > 0.0 && v < 10.0) {
                return bad(key, format!("must be in (0, 10), got {v}"));
            }
        }
        if self.train.clip_low >= 1.0 {
            return bad("train.clip_low", format!("must be below 1 (the ratio's lower bound is 1 - clip_low), got {}", self.train.clip_low));
        }
        if !(0.0..1.0).contains(&self.task.format_score) {
            return bad("task.format_score", format!("must be in [0, 1) (a correct answer earns 1), got {}", self.task.format_score));
        }
        if self.task.format_score > 0.0 && self.task.reward != "math" {
            return bad("task.format_score", format!("applies to task.reward = \"math\" only, not {:?}", self.task.reward));
        }
        if self.train.dynamic_sampling_rounds > 16 {
            return bad("train.dynamic_sampling_rounds", format!("at most 16 refill rounds, got {}", self.train.dynamic_sampling_rounds));
        }
        if self.train.eval_every > 0 && self.task.eval_path.is_empty() {
            return bad("task.eval_path", "train.eval_every is set but there is no eval split: name a dataset file".into());
        }
        if self.train.eval_every > 0 && (self.train.eval_problems == 0 || self.train.eval_samples > 1024) {
            return bad("train.eval_problems / train.eval_samples", format!("need at least 1 problem and at most 1024 samples, got {} and {}", self.train.eval_problems, self.train.eval_samples));
        }
        if self.train.ppo_epochs * self.train.mini_batches > 1 && self.train.kl_coef != 0.0 {
            return bad("train.kl_coef", "the KL-to-reference penalty is not applied in PPO epochs (train.ppo_epochs x train.mini_batches > 1) yet; set it to 0 or use one update a step".into());
        }
        if self.train.ppo_epochs * self.train.mini_batches > 1 && self.ablation.correction != Correction::None {
            return bad("ablation.correction", "PPO epochs (train.ppo_epochs x train.mini_batches > 1) clip against the sampler's logprobs themselves; leave ablation.correction = \"none\"".into());
        }
        if self.train.overlong_buffer >= self.sampler.max_new_tokens && self.train.overlong_buffer > 0 {
            return bad("train.overlong_buffer", format!("is {} but must be below sampler.max_new_tokens ({})", self.train.overlong_buffer, self.sampler.max_new_tokens));
        }
        if !(self.train.overlong_penalty.is_finite() && self.train.overlong_penalty >= 0.0) {
            return bad("train.overlong_penalty", format!("must be a finite number >= 0, got {}", self.train.overlong_penalty));
        }
        for (key, v) in [("sampler.max_batch", self.sampler.max_batch), ("sampler.context", self.sampler.context), ("sampler.chunk_size", self.sampler.chunk_size), ("sampler.max_new_tokens", self.sampler.max_new_tokens), ("train.prompts_per_step", self.train.prompts_per_step), ("train.sft_batch", self.train.sft_batch), ("train.keep_checkpoints", self.train.keep_checkpoints)] {
            if v == 0 {
                return bad(key, "must be at least 1".into());
            }
        }
        if !(self.sampler.kv_budget_mib >= 0.0 && self.sampler.kv_budget_mib.is_finite()) {
            return bad("sampler.kv_budget_mib", format!("must be a finite number >= 0 (0 = no budget), got {}", self.sampler.kv_budget_mib));
        }
        if self.train.group_size < 2 {
            return bad("train.group_size", format!("GRPO needs at least 2 completions per prompt, got {}", self.train.group_size));
        }
        if !(self.sampler.temperature.is_finite() && self.sampler.temperature >= 0.0) {
            return bad("sampler.temperature", format!("must be >= 0, got {}", self.sampler.temperature));
        }
        if !(self.sampler.top_p > 0.0 && self.sampler.top_p <= 1.0) {
            return bad("sampler.top_p", format!("must be in (0, 1], got {}", self.sampler.top_p));
        }
        for (key, v) in [("train.lr", self.train.lr), ("train.sft_lr", self.train.sft_lr), ("train.adam_eps", self.train.adam_eps)] {
            if !(v.is_finite() && v > 0.0) {
                return bad(key, format!("must be > 0, got {v}"));
            }
        }
        for (key, v) in [("train.beta1", self.train.beta1), ("train.beta2", self.train.beta2), ("train.min_lr_ratio", self.train.min_lr_ratio)] {
            if !(0.0..=1.0).contains(&v) {
                return bad(key, format!("must be in [0, 1], got {v}"));
            }
        }
        for (key, v) in [("train.weight_decay", self.train.weight_decay), ("train.grad_clip", self.train.grad_clip), ("train.kl_coef", self.train.kl_coef)] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(key, format!("must be >= 0, got {v}"));
            }
        }
        if self.ablation.tis_cap < 1.0 || self.ablation.mis_threshold < 1.0 {
            return bad("ablation.tis_cap / ablation.mis_threshold", "must be >= 1".into());
        }
        if !(self.ablation.ppo_clip > 0.0 && self.ablation.ppo_clip < 1.0) {
            return bad("ablation.ppo_clip", format!("must be in (0, 1), got {}", self.ablation.ppo_clip));
        }
        for (key, value) in [("task.prompt_key", &self.task.prompt_key), ("task.answer_key", &self.task.answer_key)] {
            if value.is_empty() || value.split('.').any(str::is_empty) {
                return bad(key, format!("must be a key or a dotted path of keys, got {value:?}"));
            }
        }
        if self.task.prompt_format == PromptFormat::Chat && self.model.path.is_empty() && self.task.chat_template.is_empty() {
            return bad("task.prompt_format", "\"chat\" needs a chat template: model.path (a checkpoint with one) or task.chat_template".into());
        }
        if matches!(self.task.name.as_str(), "dataset" | "jsonl") && self.task.path.is_empty() {
            return bad("task.path", "task `jsonl` needs a path to a JSONL file".into());
        }
        let name = &self.log.run_name;
        if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." || name.starts_with('.') {
            return bad("log.run_name", format!("must be a folder name under log.runs_dir (no '/', '\\', and not starting with '.'), got {name:?}"));
        }
        Ok(())
    }
}

/// The `section.key` of the TOML line holding byte `offset` of `source` (a key line under a
/// `[section]` header, as config files and the serialised overrides are written).
fn key_at(source: &str, offset: usize) -> Option<String> {
    let offset = offset.min(source.len());
    let line_start = source[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line = source[line_start..].lines().next()?;
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    let section = source[..line_start].lines().rev().find_map(|l| l.trim().strip_prefix('[')?.strip_suffix(']').map(str::trim))?;
    Some(format!("{section}.{key}"))
}

fn apply_override(doc: &mut toml::Table, spec: &str) -> Result<(), ConfigError> {
    let err = |message: String| ConfigError::Override { spec: spec.to_string(), message };
    let (path, raw) = spec.split_once('=').ok_or_else(|| err("expected section.key=value".into()))?;
    let (section, key) = path.trim().split_once('.').ok_or_else(|| err("expected section.key=value".into()))?;
    let mut value: toml::Value = match format!("v = {}", raw.trim()).parse::<toml::Table>() {
        Ok(mut t) => t.remove("v").expect("parsed key"),
        Err(_) => toml::Value::String(raw.trim().to_string()),
    };
    // a string key takes the text as written: `log.run_name=nan` is the name "nan", not NaN
    let defaults = toml::Value::try_from(Config::default()).ok();
    let wants_string = defaults.as_ref().and_then(|d| d.get(section)?.get(key)).is_some_and(toml::Value::is_str);
    if wants_string && !value.is_str() {
        value = toml::Value::String(raw.trim().to_string());
    }
    let table = doc.entry(section.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let table = table.as_table_mut().ok_or_else(|| err(format!("`{section}` is not a section")))?;
    table.insert(key.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Config;

    #[test]
    fn an_unknown_mode_names_its_dotted_key_and_the_allowed_spellings() {
        for (set, key) in [("train.on_mismatch=maybe", "train.on_mismatch"), ("ablation.sampler_kernels=fastest", "ablation.sampler_kernels"), ("ablation.correction=is", "ablation.correction"), ("train.steps=many", "train.steps")] {
            let e = Config::load(None, &[set.into()]).unwrap_err().to_string();
            assert!(e.contains(&format!("config key `{key}`")), "{set}: {e}");
        }
        let e = Config::load(None, &["train.on_mismatch=maybe".into()]).unwrap_err().to_string();
        assert!(e.contains("stop") && e.contains("warn"), "{e}");
        let dir = std::env::temp_dir().join(format!("lockstep-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(&file, "[train]\nsteps = 2\n\n[ablation]\ncorrection = \"tiss\"\n").unwrap();
        let e = Config::load(Some(&file), &[]).unwrap_err().to_string();
        assert!(e.contains("c.toml") && e.contains("line 5") && e.contains("config key `ablation.correction`") && e.contains("ppo_clip"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_string_key_takes_an_override_as_written_even_when_it_reads_as_a_number() {
        let c = Config::load(None, &["log.run_name=nan".into(), "log.runs_dir=1e3".into(), "train.steps=3".into()]).unwrap();
        assert_eq!((c.log.run_name.as_str(), c.log.runs_dir.as_str(), c.train.steps), ("nan", "1e3", 3));
    }
}
