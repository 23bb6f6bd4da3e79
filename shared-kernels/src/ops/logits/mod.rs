//! From hidden states to tokens: the logprob of a chosen token (forward and backward), the LM head
//! fused with it in fixed row chunks (the trainer never makes `[rows, vocab]` logits), and the
//! sampler's token choice, and a row's most likely tokens (`top_logprobs`). Each row's reduction order is fixed, whatever the batch.

pub mod head_logprobs;
pub mod logprob;
pub mod logprob_grad;
pub mod rows;
pub mod sampling;
pub mod top_tokens;
pub mod truncation;
pub mod truncation_definition;
pub mod truncation_kernel;
