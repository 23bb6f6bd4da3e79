//! Kernels that are deliberately not batch invariant, for the ablation that shows what the
//! mismatch costs (`ablation.sampler_kernels = "split_k"`), and the `bf16_logits` arm's rounding.
//! Never on the product's path.

pub mod matmul_split_k;
pub mod round_bf16;
