//! What a parsed config must satisfy beyond its types: ranges, keys that need each other,
//! combinations that cannot work; each error names the key.

use super::{Config, ConfigError, Correction, LogprobsMode, PromptFormat, SamplerKernels};

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| Err(ConfigError::Invalid { key: key.into(), message });
        let one_of = |key: &str, value: &str, allowed: &[&str]| if allowed.contains(&value) { Ok(()) } else { bad(key, format!("`{value}` is not one of {allowed:?}")) };
        one_of("model.dtype", &self.model.dtype, &["f32", "bf16"])?;
        self.lora.check().map_err(|(key, message)| ConfigError::Invalid { key: key.into(), message })?;
        self.environment.check(&self.task.name).map_err(|(key, message)| ConfigError::Invalid { key: key.into(), message })?;
        if self.model.path.is_empty() {
            self.validate_embedded_shape()?;
        }
        one_of("task.name", &self.task.name, &["addition", "sort", "countdown", "word_problems", "dataset", "jsonl", "environment", "long_arithmetic"])?;
        one_of("task.reward", &self.task.reward, &["exact", "char_f1", "math", "command"])?;
        if self.task.reward == "command" && self.task.reward_command.trim().is_empty() {
            return bad("task.reward_command", "task.reward = \"command\" needs the command that prints the rewards".into());
        }
        if !(self.task.reward_timeout_s.is_finite() && self.task.reward_timeout_s > 0.0 && self.task.reward_timeout_s <= crate::child::MAX_TIMEOUT_S) {
            return bad("task.reward_timeout_s", format!("must be a finite number of seconds > 0 and at most {} (a week), got {}", crate::child::MAX_TIMEOUT_S, self.task.reward_timeout_s));
        }
        if self.task.name == "environment" {
            if self.train.sft_steps > 0 && self.task.prompt_format != PromptFormat::Chat {
                return bad("task.prompt_format", "the SFT warm start of an environment task renders each record's demo with the chat template: set task.prompt_format = \"chat\"".into());
            }
            if self.train.eval_every > 0 {
                return bad("train.eval_every", "an environment task's reward comes from its episodes; the single-turn evaluation does not apply (set 0)".into());
            }
            if self.train.overlong_buffer > 0 {
                return bad("train.overlong_buffer", "DAPO's overlong penalty is for single completions; an environment's program reports the episode's reward, so fold any length penalty into it (set 0)".into());
            }
            if self.task.reward != super::TaskSection::default().reward {
                return bad("task.reward", "is set but an environment task's reward is the one environment.command reports; leave it out".into());
            }
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
        if self.train.eval_every > 0 && self.task.eval_path.is_empty() && self.task.is_dataset() {
            return bad("task.eval_path", "train.eval_every is set but a dataset task has no eval split: name a dataset file".into());
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
        if self.sampler.max_new_tokens >= self.sampler.context {
            return bad("sampler.context", format!("is {} tokens, which leaves no room for a prompt beside sampler.max_new_tokens = {} (a request needs prompt + max_new_tokens positions)", self.sampler.context, self.sampler.max_new_tokens));
        }
        for (key, v) in [("serve.request_timeout_s", self.serve.request_timeout_s), ("serve.shutdown_grace_s", self.serve.shutdown_grace_s)] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(key, format!("must be finite and >= 0 seconds, got {v}"));
            }
        }
        if self.serve.workers > 256 {
            return bad("serve.workers", format!("is {} threads; at most 256 (0: chosen from the machine's cores)", self.serve.workers));
        }
        if !(0.0..=1.0).contains(&self.sampler.kv_reserve) {
            return bad("sampler.kv_reserve", format!("must be in [0, 1] (the fraction of each running request's remaining max_new_tokens kept in KV blocks), got {}", self.sampler.kv_reserve));
        }
        if self.train.group_size < 2 {
            return bad("train.group_size", format!("GRPO needs at least 2 completions per prompt, got {}", self.train.group_size));
        }
        if !(self.sampler.temperature.is_finite() && self.sampler.temperature >= 0.0) {
            return bad("sampler.temperature", format!("must be finite and >= 0, got {}", self.sampler.temperature));
        }
        if self.sampler.temperature > 0.0 && !(1.0 / self.sampler.temperature).is_finite() {
            // the logits are scaled by 1 / temperature: an infinite scale makes every logprob NaN
            return bad("sampler.temperature", format!("{:e} is too small: its reciprocal overflows f32 (at least about 2.9e-39; 0 means greedy)", self.sampler.temperature));
        }
        if !(self.sampler.top_p > 0.0 && self.sampler.top_p <= 1.0) {
            return bad("sampler.top_p", format!("must be in (0, 1], got {}", self.sampler.top_p));
        }
        if let Some(i) = self.sampler.stop.iter().position(String::is_empty) {
            return bad("sampler.stop", format!("entry {i} is an empty string (it would end every completion at its first token)"));
        }
        for (key, v) in [("train.lr", self.train.lr), ("train.sft_lr", self.train.sft_lr), ("train.adam_eps", self.train.adam_eps)] {
            if !(v.is_finite() && v > 0.0) {
                return bad(key, format!("must be > 0, got {v}"));
            }
        }
        // AdamW divides by 1 - beta^t: a beta of 1 divides by zero and NaNs every weight
        for (key, v) in [("train.beta1", self.train.beta1), ("train.beta2", self.train.beta2)] {
            if !(0.0..1.0).contains(&v) {
                return bad(key, format!("must be in [0, 1) (AdamW divides by 1 - {key}^step), got {v}"));
            }
        }
        if !(0.0..=1.0).contains(&self.train.min_lr_ratio) {
            return bad("train.min_lr_ratio", format!("must be in [0, 1], got {}", self.train.min_lr_ratio));
        }
        for (key, v) in [("train.weight_decay", self.train.weight_decay), ("train.grad_clip", self.train.grad_clip), ("train.kl_coef", self.train.kl_coef), ("train.router_aux_loss_coef", self.train.router_aux_loss_coef)] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(key, format!("must be finite and >= 0, got {v}"));
            }
        }
        let blocks = self.train.gradient_blocks;
        if blocks != 0 && (!blocks.is_power_of_two() || blocks > 1024) {
            return bad("train.gradient_blocks", format!("must be 0 (one block per rank) or a power of two up to 1024, got {blocks}"));
        }
        if self.ablation.tis_cap < 1.0 || self.ablation.mis_threshold < 1.0 {
            return bad("ablation.tis_cap / ablation.mis_threshold", "must be >= 1".into());
        }
        if !(self.ablation.ppo_clip > 0.0 && self.ablation.ppo_clip < 1.0) {
            return bad("ablation.ppo_clip", format!("must be in (0, 1), got {}", self.ablation.ppo_clip));
        }
        // a bf16 model's logits are bf16 on both sides already: the arm would be the matched run
        if self.ablation.sampler_kernels == SamplerKernels::Bf16Logits && self.model.dtype != "f32" {
            return bad("ablation.sampler_kernels", format!("\"bf16_logits\" rounds the sampler's f32 logits to bf16 against the trainer's f32 ones, so it needs model.dtype = \"f32\" (got \"{}\": a bf16 model's logits are bf16 in both already)", self.model.dtype));
        }
        for (key, value) in [("task.prompt_key", &self.task.prompt_key), ("task.answer_key", &self.task.answer_key)] {
            if value.is_empty() || value.split('.').any(str::is_empty) {
                return bad(key, format!("must be a key or a dotted path of keys, got {value:?}"));
            }
        }
        if self.task.prompt_format == PromptFormat::Chat && self.model.path.is_empty() && self.task.chat_template.is_empty() {
            return bad("task.prompt_format", "\"chat\" needs a chat template: model.path (a checkpoint with one) or task.chat_template".into());
        }
        // keys a run would read nothing from: set, they mean the user expects something else
        if !self.task.reads_path() && !self.task.path.is_empty() {
            return bad("task.path", format!("is set ({:?}) but task.name = \"{}\" generates its problems and would never read it; set task.name = \"jsonl\" to train on the file", self.task.path, self.task.name));
        }
        if self.task.reward != "command" && !self.task.reward_command.trim().is_empty() {
            return bad("task.reward_command", format!("is set but task.reward = \"{}\" never runs it; set task.reward = \"command\"", self.task.reward));
        }
        if self.task.reward != "command" && self.task.reward_timeout_s != super::TaskSection::default().reward_timeout_s {
            return bad("task.reward_timeout_s", format!("is set but task.reward = \"{}\" runs no program; set task.reward = \"command\"", self.task.reward));
        }
        // the embedded model's shape and draw under a checkpoint, which brings its own
        if !self.model.path.is_empty() {
            let (m, d) = (&self.model, super::ModelSection::default());
            let embedded = [
                ("model.hidden_size", m.hidden_size != d.hidden_size),
                ("model.num_layers", m.num_layers != d.num_layers),
                ("model.num_heads", m.num_heads != d.num_heads),
                ("model.num_kv_heads", m.num_kv_heads != d.num_kv_heads),
                ("model.head_dim", m.head_dim != d.head_dim),
                ("model.intermediate_size", m.intermediate_size != d.intermediate_size),
                ("model.init_std", m.init_std != d.init_std),
                ("model.init_seed", m.init_seed != d.init_seed),
            ];
            if let Some((key, _)) = embedded.into_iter().find(|(_, set)| *set) {
                return bad(key, format!("is set but model.path = {:?} loads a checkpoint, whose config.json gives the shape and whose weights are not drawn; it applies to the embedded model only (model.path empty)", self.model.path));
            }
        }
        // each ablation setting with the corrections that read it
        let (a, d) = (&self.ablation, super::AblationSection::default());
        let settings = [
            ("ablation.level", a.level != d.level, &[Correction::Tis, Correction::Mis, Correction::PpoClip][..]),
            ("ablation.tis_cap", a.tis_cap != d.tis_cap, &[Correction::Tis][..]),
            ("ablation.mis_threshold", a.mis_threshold != d.mis_threshold, &[Correction::Mis][..]),
            ("ablation.ppo_clip", a.ppo_clip != d.ppo_clip, &[Correction::PpoClip][..]),
        ];
        if let Some((key, _, _)) = settings.iter().find(|(_, set, readers)| *set && !readers.contains(&a.correction)) {
            return bad(key, format!("is set but ablation.correction = \"{}\" does not use it", a.correction.as_str()));
        }
        if self.task.reads_path() && self.task.path.is_empty() {
            return bad("task.path", format!("task `{}` needs a path to a JSONL (or Parquet) file", self.task.name));
        }
        if let Some((key, value, range)) = self.task.generated_size().filter(|(_, v, r)| !r.contains(v)) {
            return bad(key, format!("must be in {}..={} for task `{}`, got {value}", range.start(), range.end(), self.task.name));
        }
        let name = &self.log.run_name;
        if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." || name.starts_with('.') {
            return bad("log.run_name", format!("must be a folder name under log.runs_dir (no '/', '\\', and not starting with '.'), got {name:?}"));
        }
        Ok(())
    }

    /// What only `lockstep train` needs: a sampler that samples (GRPO's groups), and no chat
    /// settings under a raw prompt format, which training would ignore (`lockstep sample`
    /// renders `messages` lines with them whatever the format).
    /// Settings `lockstep train` runs as asked but whose effect a user may not expect, a
    /// sentence each naming the key (printed as warnings before the run).
    pub fn training_warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        let s = &self.sampler;
        if (s.top_p < 1.0 || s.top_k > 0) && s.logprobs_mode == LogprobsMode::Raw {
            let key = if s.top_p < 1.0 { format!("sampler.top_p = {}", s.top_p) } else { format!("sampler.top_k = {}", s.top_k) };
            warnings.push(format!("{key}: rollouts are drawn from the truncated distribution, while sampler.logprobs_mode = \"raw_logprobs\" takes the sampler's logprobs and the loss under the full softmax at the temperature (equal as bits on both sides, docs/sampler.md); the gradient misses the truncation's own term, so the update is not exactly on-policy for what was sampled. For on-policy GRPO set sampler.logprobs_mode = \"processed_logprobs\" (both sides then take the truncated distribution), or keep sampler.top_p = 1 and sampler.top_k = 0"));
        }
        warnings
    }

    /// `self` after printing [`Self::training_warnings`] to stderr (on rank 0 only, where ranks
    /// are processes).
    pub fn with_warnings_printed(self) -> Self {
        if std::env::var_os("RANK").is_none_or(|r| r == "0") {
            for warning in self.training_warnings() {
                eprintln!("warning: {warning}");
            }
        }
        self
    }

    pub fn validate_training(&self) -> Result<(), ConfigError> {
        // a greedy sampler gives a group the same completion G times: every advantage is 0 and
        // the update learns nothing from rewards
        if self.sampler.temperature == 0.0 || self.sampler.top_k == 1 {
            let key = if self.sampler.temperature == 0.0 { "sampler.temperature" } else { "sampler.top_k" };
            return Err(ConfigError::Invalid { key: key.into(), message: "makes sampling greedy, so each GRPO group is train.group_size copies of one completion with equal rewards and zero advantages; sample (temperature > 0, top_k 0 or > 1) for training (evaluation's greedy pass is separate: train.eval_every)".into() });
        }
        // a mismatched sampler's token may lie outside the trainer's own top-k / top-p set,
        // where the truncated distribution gives it probability 0 (logprob -inf)
        if self.sampler.logprobs_mode == LogprobsMode::Processed && self.ablation.sampler_kernels != SamplerKernels::Matched {
            return Err(ConfigError::Invalid { key: "sampler.logprobs_mode".into(), message: format!("\"processed_logprobs\" needs the trainer's top-k / top-p set to be the sampler's, which only ablation.sampler_kernels = \"matched\" guarantees (got \"{}\": a sampled token outside the trainer's set would have probability 0); use \"raw_logprobs\" for the ablation", self.ablation.sampler_kernels.as_str()) });
        }
        // the same for a policy one optimizer step on (PPO's later mini-batches) and for the
        // reference model: their sets are their own, so a sampled token may lie outside them
        if self.sampler.logprobs_mode == LogprobsMode::Processed {
            let others = [("train.ppo_epochs / train.mini_batches", self.train.ppo_epochs * self.train.mini_batches > 1, "a mini-batch after the first scores with updated weights"), ("train.kl_coef", self.train.kl_coef > 0.0, "the reference model")];
            if let Some((key, _, whose)) = others.into_iter().find(|(_, set, _)| *set) {
                return Err(ConfigError::Invalid { key: key.into(), message: format!("sampler.logprobs_mode = \"processed_logprobs\" scores each token under the top-k / top-p set of the weights that sampled it; {whose} has its own set, where a sampled token can have probability 0. Use one policy-gradient update a step without the KL penalty, or \"raw_logprobs\"") });
            }
        }
        // an evaluation file without evaluations: never read, missing or not (it was accepted
        // and ignored)
        if !self.task.eval_path.is_empty() && self.train.eval_every == 0 {
            return Err(ConfigError::Invalid { key: "task.eval_path".into(), message: format!("is set ({:?}) but train.eval_every = 0 runs no evaluation, so the file would never be read; set train.eval_every = N to evaluate every N steps", self.task.eval_path) });
        }
        if self.task.prompt_format == PromptFormat::Raw {
            let set = [("task.system_prompt", !self.task.system_prompt.is_empty()), ("task.chat_template", !self.task.chat_template.is_empty()), ("task.chat_args", !self.task.chat_args.is_empty())];
            if let Some((key, _)) = set.into_iter().find(|(_, set)| *set) {
                return Err(ConfigError::Invalid { key: key.into(), message: "is set but task.prompt_format = \"raw\" trains on the prompts as written; set task.prompt_format = \"chat\" to render them with the chat template".into() });
            }
        }
        Ok(())
    }

    /// The embedded model's shape, checked under the `[model]` keys a user sets (the model
    /// loader would name the Hugging Face keys they map to).
    fn validate_embedded_shape(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| Err(ConfigError::Invalid { key: key.into(), message });
        let m = &self.model;
        for (key, v) in [("model.hidden_size", m.hidden_size), ("model.num_layers", m.num_layers), ("model.num_heads", m.num_heads), ("model.num_kv_heads", m.num_kv_heads), ("model.head_dim", m.head_dim), ("model.intermediate_size", m.intermediate_size)] {
            if v == 0 {
                return bad(key, "must be at least 1".into());
            }
        }
        if m.num_heads % m.num_kv_heads != 0 {
            return bad("model.num_kv_heads", format!("{} does not divide model.num_heads ({})", m.num_kv_heads, m.num_heads));
        }
        if m.head_dim % 2 != 0 {
            return bad("model.head_dim", format!("must be even (RoPE rotates pairs), got {}", m.head_dim));
        }
        if !(m.init_std.is_finite() && m.init_std > 0.0) {
            return bad("model.init_std", format!("must be a finite number > 0, got {}", m.init_std));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn truncated_sampling_in_training_is_a_warning_naming_the_key_unless_logprobs_are_processed() {
        assert!(Config::load_training(None, &[]).unwrap().training_warnings().is_empty());
        for (set, key) in [("sampler.top_p=0.9", "sampler.top_p = 0.9"), ("sampler.top_k=50", "sampler.top_k = 50")] {
            let warnings = Config::load_training(None, &[set.into()]).unwrap().training_warnings();
            assert!(warnings.len() == 1 && warnings[0].starts_with(key) && warnings[0].contains("processed_logprobs"), "{set}: {warnings:?}");
            let processed = Config::load_training(None, &[set.into(), "sampler.logprobs_mode=processed_logprobs".into()]).unwrap();
            assert!(processed.training_warnings().is_empty(), "{set}: {:?}", processed.training_warnings());
        }
    }

    #[test]
    fn processed_logprobs_with_a_mismatched_sampler_are_refused_naming_the_key() {
        for kernels in ["fast", "split_k"] {
            let sets = ["sampler.top_p=0.9".into(), "sampler.logprobs_mode=processed_logprobs".into(), format!("ablation.sampler_kernels={kernels}")];
            let e = Config::load_training(None, &sets).unwrap_err().to_string();
            assert!(e.contains("sampler.logprobs_mode") && e.contains(kernels), "{kernels}: {e}");
        }
        for (set, key) in [("train.mini_batches=2", "train.ppo_epochs / train.mini_batches"), ("train.ppo_epochs=2", "train.ppo_epochs / train.mini_batches"), ("train.kl_coef=0.01", "train.kl_coef")] {
            let e = Config::load_training(None, &["sampler.logprobs_mode=processed_logprobs".into(), set.into()]).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("processed_logprobs"), "{set}: {e}");
        }
        let e = Config::load(None, &["sampler.logprobs_mode=processed".into()]).unwrap_err().to_string();
        assert!(e.contains("sampler.logprobs_mode") && e.contains("processed_logprobs"), "{e}");
    }

    #[test]
    fn serve_workers_are_bounded_and_chosen_from_the_cores_at_0() {
        let e = Config::load(None, &["serve.workers=257".into()]).unwrap_err().to_string();
        assert!(e.contains("serve.workers") && e.contains("at most 256"), "{e}");
        assert!(Config::load(None, &["serve.workers=3".into()]).is_ok());
        assert_eq!(crate::serve::http_workers(3), 3);
        assert!((2..=4).contains(&crate::serve::http_workers(0)));
    }

    #[test]
    fn non_finite_values_are_refused_naming_the_key_and_that_they_must_be_finite() {
        for key in ["sampler.temperature", "train.weight_decay", "train.grad_clip", "train.kl_coef", "serve.request_timeout_s", "serve.shutdown_grace_s"] {
            for v in ["inf", "nan", "-1"] {
                let e = Config::load_training(None, &[format!("{key}={v}")]).unwrap_err().to_string();
                assert!(e.contains(key) && e.contains("must be finite and >= 0"), "{key}={v}: {e}");
            }
        }
    }
}
