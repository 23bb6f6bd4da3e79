//! The config's modes: closed sets of choices, typed, spelled in the TOML as strings.

use serde::{Deserialize, Serialize};

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
        /// lockstep's kernels with an f32 model's logits rounded to bf16 (an inference engine's
        /// bf16 LM head against the trainer's f32 one).
        Bf16Logits = "bf16_logits",
    }
}
config_mode! {
    /// The distribution the sampler's logprobs (and the loss's) are taken under (vLLM's
    /// `logprobs_mode`): the full softmax at the temperature, or the top-k / top-p set the
    /// tokens are drawn from, renormalised.
    LogprobsMode { Raw = "raw_logprobs", Processed = "processed_logprobs" }
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
    /// What a sequence's token terms are divided by (see `objective::aggregation_divisor`).
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
            SamplerKernels::Bf16Logits => KernelSet::Bf16Logits,
        }
    }
}
