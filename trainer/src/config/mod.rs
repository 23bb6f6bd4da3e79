//! The run configuration: TOML, one section per concern, every key with a default
//! (documented in docs/config.md), unknown keys refused, `--set section.key=value` overrides.

use serde::{Deserialize, Serialize};

mod load;
mod environment;
mod lora;
mod modes;
mod sizing;
mod validate;

pub use modes::*;
pub use sizing::Sizing;
pub use environment::EnvironmentSection;
pub use lora::{LoraSection, TargetModules};

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub model: ModelSection,
    pub sampler: SamplerSection,
    pub train: TrainSection,
    pub task: TaskSection,
    pub log: LogSection,
    pub ablation: AblationSection,
    pub serve: ServeSection,
    pub lora: LoraSection,
    pub environment: EnvironmentSection,
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
    /// KV cache memory budget in MiB: as many 64-position blocks as fit; when none is left the
    /// newest request is preempted and rerun later (same bits). "auto": sized before step 0
    /// from the device's free memory (`memory_plan::auto`); 0 = enough for max_batch requests
    /// of `context` tokens.
    pub kv_budget_mib: Sizing<f64>,
    /// With a KV budget: the fraction of each running request's remaining `max_new_tokens`
    /// kept in free blocks before another request is admitted (1 = never preempt).
    pub kv_reserve: f32,
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    /// The distribution logprobs are taken under: `raw_logprobs` (the full softmax at the
    /// temperature) or `processed_logprobs` (the top-k / top-p set, renormalised).
    pub logprobs_mode: LogprobsMode,
    pub max_new_tokens: usize,
    /// Stop strings (vLLM's `stop`): a completion ends at the token that completes one.
    pub stop: Vec<String>,
    /// `lockstep sample`: input JSONL (`{"prompt": "..."}` or `{"prompt_ids": [...]}`) and output.
    pub input: String,
    pub output: String,
    pub seed: u64,
}

impl SamplerSection {
    /// The distribution the sampler's logprobs are taken under, which the loss scores too.
    pub fn logprob_distribution(&self) -> shared_kernels::model::LogprobDistribution {
        match self.logprobs_mode {
            LogprobsMode::Raw => shared_kernels::model::LogprobDistribution::full(self.temperature),
            LogprobsMode::Processed => shared_kernels::model::LogprobDistribution { temperature: self.temperature, top_k: self.top_k, top_p: self.top_p },
        }
    }
}

impl SamplerSection {
    /// The KV cache budget in bytes the engine is built with: 0 (enough for `max_batch` full
    /// requests) while "auto" is unresolved.
    pub fn kv_budget_bytes(&self) -> usize {
        (self.kv_budget_mib.set().unwrap_or(0.0) * 1048576.0) as usize
    }
}

impl Default for SamplerSection {
    fn default() -> Self {
        Self { max_batch: 64, context: 48, chunk_size: 16, share_prompt_prefix: true, overlap_steps: true, kv_budget_mib: Sizing::Auto, kv_reserve: 1.0, temperature: 1.0, top_k: 0, top_p: 1.0, logprobs_mode: LogprobsMode::Raw, max_new_tokens: 8, stop: Vec::new(), input: String::new(), output: String::new(), seed: 0 }
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
    /// A mixture-of-experts model's load-balancing loss (transformers' `router_aux_loss_coef`
    /// term, over each step's sequences); 0 disables.
    pub router_aux_loss_coef: f64,
    pub seed: u64,
    /// What a sampler/trainer logprob that differs in bits does in matched mode: "stop" or "warn".
    pub on_mismatch: OnMismatch,
    /// Checkpoint every N steps (and at the end); 0 = only at the end.
    pub checkpoint_every: usize,
    pub keep_checkpoints: usize,
    /// Activation recomputation per decoder layer: the training forward keeps each layer's
    /// input only and the backward re-runs the layer (same bits, less memory, one more forward).
    /// `"auto"`: on where the memory it frees lets the KV cache hold far more requests, or the
    /// run fits only with it (`memory_plan::auto`).
    pub recompute_layers: Sizing<bool>,
    /// Write a checkpoint after the last step (false: benchmarks, whose weights nobody resumes;
    /// a 4B model's weights and AdamW state are 56 GB).
    pub final_checkpoint: bool,
    /// Supervised warm start before RL (`lockstep train` runs it when > 0 and no checkpoint exists).
    pub sft_steps: usize,
    pub sft_lr: f64,
    pub sft_batch: usize,
    /// Trainer tokens per forward/backward pass (whole sequences, greedily in order; a longer
    /// sequence runs alone); the update's bits do not depend on it (weight gradients folded
    /// over the tokens in one order, `shared_kernels::grad_fold`). 0 = the whole step; "auto":
    /// sized before step 0 from the device's free memory (`memory_plan::auto`).
    pub micro_batch_tokens: Sizing<usize>,
    /// Weight gradients folded per block of the step's prompt groups (each block from zero) and
    /// the blocks added in one balanced pairwise tree (`distributed::tree`): a power of two, and
    /// then the update's bits are the same on any power-of-two number of ranks dividing it.
    /// 0 = one block per rank (one fold over every token on one rank: no extra memory).
    pub gradient_blocks: usize,
    /// With several ranks: AdamW's moments and f32 master weights split over the ranks by whole
    /// parameters (ZeRO-1, `distributed::zero`); each rank updates its own and the new weights
    /// are exchanged. The same bits as unsharded; about 1/N of the optimizer memory a rank.
    pub shard_optimizer: bool,
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

impl TrainSection {
    /// Tokens per trainer pass as the update cuts micro-batches: 0 (the whole step) while
    /// "auto" is unresolved.
    pub fn pass_tokens(&self) -> usize {
        self.micro_batch_tokens.set().unwrap_or(0)
    }
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            steps: 20, prompts_per_step: 8, group_size: 8, lr: 2e-3, warmup_steps: 2, min_lr_ratio: 0.1, weight_decay: 0.0,
            beta1: 0.9, beta2: 0.99, adam_eps: 1e-8, grad_clip: 1.0, kl_coef: 0.0, router_aux_loss_coef: 0.0, seed: 0, on_mismatch: OnMismatch::Stop,
            checkpoint_every: 10, keep_checkpoints: 2, final_checkpoint: true, recompute_layers: Sizing::Auto, sft_steps: 150, sft_lr: 3e-3, sft_batch: 32, micro_batch_tokens: Sizing::Auto, gradient_blocks: 0, shard_optimizer: true, advantage: Advantage::GroupStd, loss_aggregation: LossAggregation::TokenMean, overlong_buffer: 0, overlong_penalty: 1.0,
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

impl TaskSection {
    /// Whether the task reads its problems from `task.path` ("dataset", alias "jsonl") rather
    /// than generating them.
    pub fn is_dataset(&self) -> bool {
        matches!(self.name.as_str(), "dataset" | "jsonl")
    }

    /// Whether the task reads `task.path`: a dataset's problems or an environment's records.
    pub fn reads_path(&self) -> bool {
        self.is_dataset() || self.name == "environment"
    }

    /// A generated task's size setting and the range it must lie in: `(key, value, range)`.
    pub fn generated_size(&self) -> Option<(&'static str, usize, std::ops::RangeInclusive<usize>)> {
        match self.name.as_str() {
            "addition" => Some(("task.digits", self.digits, 1..=9)),
            "word_problems" => Some(("task.digits", self.digits, 1..=3)),
            "sort" => Some(("task.count", self.count, 2..=9)),
            "countdown" => Some(("task.count", self.count, 2..=5)),
            "long_arithmetic" => Some(("task.count", self.count, 2..=64)),
            _ => None,
        }
    }
}

impl Default for TaskSection {
    fn default() -> Self {
        Self { name: "addition".into(), digits: 1, count: 3, path: String::new(), reward: "exact".into(), reward_command: String::new(), reward_timeout_s: 60.0, prompt_key: "prompt".into(), answer_key: "answer".into(), prompt_format: PromptFormat::Raw, system_prompt: String::new(), chat_template: String::new(), chat_args: toml::Table::new(), eval_path: String::new(), format_score: 0.0 }
    }
}

/// `lockstep serve` (docs/serve.md): where it listens and the model name it answers to.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServeSection {
    /// The address to bind: the loopback interface unless set (`0.0.0.0` serves the network).
    pub host: String,
    /// 0: a free port, printed at start.
    pub port: u16,
    /// The `model` requests name (`GET /v1/models`); empty: the checkpoint folder's name, or
    /// "lockstep-tiny" for the embedded model.
    pub model_name: String,
    /// Requests (choices) in flight at most; past it a request is answered 429 with
    /// `Retry-After`. 0: no bound.
    pub max_queue: usize,
    /// When set, every request under `/v1/` must carry `Authorization: Bearer <api_key>`
    /// (compared in constant time); 401 without it. Empty: `LOCKSTEP_API_KEY`, if set.
    pub api_key: String,
    /// Seconds a request may run before its choices are cancelled and it is answered 504 (a
    /// stream: an error event, then `[DONE]`). 0: no deadline.
    pub request_timeout_s: f64,
    /// Seconds the requests in flight get to finish after SIGTERM or Ctrl-C before they are
    /// cancelled and the server exits (0 when it stopped cleanly).
    pub shutdown_grace_s: f64,
    /// Threads answering HTTP (parsing, detokenizing, writing every stream's chunks); the engine
    /// steps on its own thread. 0: the machine's cores less the engine's, at least 2, at most 8.
    pub workers: usize,
}

impl Default for ServeSection {
    fn default() -> Self {
        Self { host: "127.0.0.1".into(), port: 8000, model_name: String::new(), max_queue: 1024, api_key: String::new(), request_timeout_s: 0.0, shutdown_grace_s: 30.0, workers: 0 }
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
    /// A `LOCKSTEP_*` variable that conflicts with the run (a resume under other arithmetic).
    #[error("environment variable `{variable}`: {message}")]
    Environment { variable: String, message: String },
}
