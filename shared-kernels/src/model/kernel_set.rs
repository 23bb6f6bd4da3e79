//! Which kernels a forward's projections and norms run on: lockstep's batch-invariant ones (the
//! product) or, for the ablation, kernels whose bits depend on the batch, or lockstep's with the
//! logits rounded to bf16. Attention, RoPE and the logprob reduction are lockstep's in every set.

use crate::{KernelError, WeightLayout};
use burn::tensor::{DType, Tensor};

/// The kernel set a forward runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelSet {
    /// lockstep's batch-invariant kernels: the product.
    #[default]
    Matched,
    /// burn's default matmul and an rmsnorm built from burn ops (autotuned, split reductions,
    /// not batch invariant): the ablation's "fast" sampler.
    Fast,
    /// lockstep's kernels except the matmul, which splits K by batch size
    /// ([`crate::ops::ablation::matmul_split_k`]): the ablation's deterministic, non-invariant sampler.
    SplitK,
    /// lockstep's kernels with an f32 model's logits rounded to bf16
    /// ([`crate::ops::ablation::round_bf16`]): the ablation's sampler with an inference engine's
    /// bf16 LM head against the trainer's f32 one. Batch invariant: the mismatch is the rounding alone.
    Bf16Logits,
}

impl KernelSet {
    /// Whether this set is lockstep's batch-invariant arithmetic.
    pub fn is_matched(self) -> bool {
        matches!(self, KernelSet::Matched)
    }

    /// Whether the decoder layers run lockstep's kernels (the product's, or the bf16_logits
    /// arm's, which differs after the LM head only): the engine's fused decode projections and
    /// its captured graphs, built from those kernels, apply.
    pub fn lockstep_layers(self) -> bool {
        matches!(self, KernelSet::Matched | KernelSet::Bf16Logits)
    }

    /// Whether this set runs on a model of `dtype`: `Bf16Logits` rounds f32 logits, so it needs
    /// an f32 model (a bf16 model's logits are bf16 already); every other set runs on any.
    pub fn runs_on(self, dtype: DType) -> Result<(), String> {
        match self {
            KernelSet::Bf16Logits if dtype != DType::F32 => Err(format!("the bf16_logits kernels round f32 logits to bf16, so they need an f32 model (got {dtype:?}, whose logits are bf16 already)")),
            _ => Ok(()),
        }
    }

    /// `x @ w` (or `x @ w^T` for `[out, in]` weights) on this set's matmul.
    pub fn matmul(self, x: Tensor<2>, w: Tensor<2>, layout: WeightLayout) -> Result<Tensor<2>, KernelError> {
        match self {
            KernelSet::Matched | KernelSet::Bf16Logits => crate::matmul(x, w, layout),
            KernelSet::SplitK => crate::ops::ablation::matmul_split_k::matmul_split_k(x, w, layout),
            KernelSet::Fast => Ok(match layout {
                WeightLayout::OutIn => x.matmul(w.transpose()),
                WeightLayout::InOut => x.matmul(w),
            }),
        }
    }

    /// The LM head's output as this set hands it on: rounded to bf16 under
    /// [`KernelSet::Bf16Logits`], as computed otherwise.
    pub fn logits(self, logits: Tensor<2>) -> Result<Tensor<2>, KernelError> {
        match self {
            KernelSet::Bf16Logits => crate::ops::ablation::round_bf16::round_to_bf16(logits),
            _ => Ok(logits),
        }
    }

    /// RMSNorm over the last dimension, scaled by `w`, on this set's kernel.
    pub fn rmsnorm<const D: usize>(self, x: Tensor<D>, w: Tensor<1>, eps: f32) -> Result<Tensor<D>, KernelError> {
        match self {
            KernelSet::Matched | KernelSet::SplitK | KernelSet::Bf16Logits => crate::rmsnorm(x, w, eps),
            KernelSet::Fast => {
                let dtype = x.dtype();
                let x32 = x.cast(DType::F32);
                let inv = (x32.clone() * x32.clone()).mean_dim(D - 1).add_scalar(eps as f64).sqrt().recip();
                let shape: [usize; D] = std::array::from_fn(|i| if i + 1 == D { w.dims()[0] } else { 1 });
                Ok((x32 * inv).cast(dtype) * w.reshape(shape))
            }
        }
    }
}
