//! The LM head fused with the token logprob: `token_logprobs(x @ Wᵀ, targets, T)` computed one
//! chunk of rows at a time, forward and backward, so `[rows, vocab]` logits never exist at once
//! (17k rows x Qwen3's 151936 logits were 5 GB in bf16, 10 GB more for their gradient, and
//! past 2^32 elements they could not be indexed at all).
//!
//! Bits: a row's logits, logprob, entropy and input gradient do not depend on which rows share
//! its launch (every kernel here is batch invariant), so they equal the unchunked op's for any
//! chunking. The head's weight gradient is a sum over rows, so its bits follow the chunks: it is
//! each chunk's `dlogitsᵀ @ x` (one matmul, the unchunked op's kernel) added in f32 in chunk
//! order, then cast to W's dtype; with one chunk it is that matmul alone, the unchunked bits.
//! The chunk is fixed by the vocabulary alone ([`head_chunk_rows`]), never by the batch, so the
//! update's bits depend only on the rows' order.

use crate::ops::logits::logprob::{truncated_token_logprobs, TokenLogprobs};
use crate::ops::logits::truncation::Truncation;
use crate::ops::matmul::{fold_weight_grad, matmul_backward, matmul_input_grad, WeightLayout};
use crate::autodiff::{cube, from_tracked, inner, plain, tracked, tracked_in, untracked};
use crate::ops::weight_grad::FOLD_ROWS;
use crate::{ensure, KernelError};
use burn::tensor::{DType, Int as BInt, Tensor as BTensor};

/// Logits computed at once, at most: 2^29 (1 GiB in bf16, 3533 rows of Qwen3's vocabulary).
/// Part of the arithmetic of the head's weight gradient, so a constant.
pub const HEAD_CHUNK_LOGITS: usize = 1 << 29;

/// Rows per chunk for a vocabulary of `vocab` tokens.
pub fn head_chunk_rows(vocab: usize) -> usize {
    let rows = HEAD_CHUNK_LOGITS / vocab.max(1);
    // whole fold granules, so a folded weight gradient's bits do not see the chunks
    (rows / FOLD_ROWS * FOLD_ROWS).max(FOLD_ROWS)
}

/// Logprob of `targets[r]` and entropy under `softmax(x[r] @ headᵀ / temperatures[r])`, for
/// `x` [rows, hidden] and `head` [vocab, hidden] (`nn.Linear` layout), in chunks of
/// [`head_chunk_rows`]. Differentiable in `x` and `head` on an autodiff device.
pub fn head_logprobs(x: BTensor<2>, head: BTensor<2>, targets: BTensor<1, BInt>, temperatures: BTensor<1>) -> Result<TokenLogprobs, KernelError> {
    truncated_head_logprobs(x, head, targets, temperatures, None)
}

/// [`head_logprobs`] under the distribution `truncation` keeps, renormalised (processed
/// logprobs, [`crate::ops::logits::logprob::truncated_token_logprobs`]; `None`: the full one).
pub fn truncated_head_logprobs(x: BTensor<2>, head: BTensor<2>, targets: BTensor<1, BInt>, temperatures: BTensor<1>, truncation: Option<&Truncation>) -> Result<TokenLogprobs, KernelError> {
    let vocab = head.dims()[0];
    head_logprobs_chunked(x, head, targets, temperatures, truncation, head_chunk_rows(vocab))
}

/// [`truncated_head_logprobs`] in chunks of `chunk_rows` rows (tests compare chunkings).
pub fn head_logprobs_chunked(x: BTensor<2>, head: BTensor<2>, targets: BTensor<1, BInt>, temperatures: BTensor<1>, truncation: Option<&Truncation>, chunk_rows: usize) -> Result<TokenLogprobs, KernelError> {
    const OP: &str = "head_logprobs";
    let ([rows, hidden], [vocab, head_hidden]) = (x.dims(), head.dims());
    ensure!(rows > 0 && vocab > 0, OP, "empty input: x [{rows}, {hidden}], head [{vocab}, {head_hidden}]");
    ensure!(hidden == head_hidden, OP, "x is [{rows}, {hidden}] but head is [{vocab}, {head_hidden}]: hidden sizes differ");
    ensure!(targets.dims() == [rows], OP, "x has {rows} rows but targets is {:?}", targets.dims());
    ensure!(temperatures.dims() == [rows], OP, "x has {rows} rows but temperatures is {:?}", temperatures.dims());
    ensure!(chunk_rows > 0, OP, "chunk_rows must be positive");
    if let Some(t) = truncation {
        ensure!(t.top_k.dims() == [rows] && t.top_p.dims() == [rows], OP, "x has {rows} rows but top_k is {:?} and top_p {:?}", t.top_k.dims(), t.top_p.dims());
    }
    let truncation = truncation.cloned();
    let spans: Vec<(usize, usize)> = (0..rows).step_by(chunk_rows).map(|a| (a, (a + chunk_rows).min(rows))).collect();
    if !x.is_autodiff() {
        return forward(&spans, x, head, targets, temperatures, truncation.as_ref());
    }
    let (xa, wa) = (tracked_in(OP, "x", x)?, tracked_in(OP, "head", head)?);
    let (xp, wp) = (plain::<2>(inner(&xa)), plain::<2>(inner(&wa)));
    let (targets, temperatures) = (untracked(targets), untracked(temperatures));
    let out = forward(&spans, xp.clone(), wp.clone(), targets.clone(), temperatures.clone(), truncation.as_ref())?;
    let lp = cube(out.logprobs);
    let w_id = wa.id().value;
    // a frozen head (LoRA) gets no gradient: only the input's is computed
    let w_frozen = !wa.is_tracked();
    let logprobs = from_tracked(tracked([&xa, &wa], lp, move |dl| {
        let dl = plain::<1>(dl);
        let fold = !w_frozen && crate::grad_fold::folds(w_id);
        if w_frozen || fold {
            // the head's weight gradient folded chunk after chunk into one accumulator
            let mut dx = Vec::with_capacity(spans.len());
            for &(a, b) in &spans {
                let xc = xp.clone().slice([a..b, 0..hidden]);
                let logits = crate::matmul(xc.clone(), wp.clone(), WeightLayout::OutIn).expect("head_logprobs backward: shapes checked in forward");
                let dlogits = crate::ops::logits::logprob::token_logprobs_grad(logits, targets.clone().slice([a..b]), temperatures.clone().slice([a..b]), truncation.as_ref().map(|t| t.slice(a..b)).as_ref(), dl.clone().slice([a..b]))
                    .expect("head_logprobs backward: inputs checked in forward");
                dx.push(matmul_input_grad(dlogits.clone(), wp.clone(), WeightLayout::OutIn));
                if fold {
                    crate::grad_fold::fold_into(w_id, crate::grad_fold::FoldUse::Head, |acc| fold_weight_grad(acc, dlogits, xc, WeightLayout::OutIn));
                }
            }
            let dx = if dx.len() == 1 { dx.pop().expect("one chunk") } else { BTensor::cat(dx, 0) };
            return [Some(cube(dx)), None];
        }
        let mut dx = Vec::with_capacity(spans.len());
        let mut dw: Option<BTensor<2>> = None;
        for &(a, b) in &spans {
            let xc = xp.clone().slice([a..b, 0..hidden]);
            let logits = crate::matmul(xc.clone(), wp.clone(), WeightLayout::OutIn).expect("head_logprobs backward: shapes checked in forward");
            let dlogits = crate::ops::logits::logprob::token_logprobs_grad(logits, targets.clone().slice([a..b]), temperatures.clone().slice([a..b]), truncation.as_ref().map(|t| t.slice(a..b)).as_ref(), dl.clone().slice([a..b]))
                .expect("head_logprobs backward: inputs checked in forward");
            let (dxc, dwc) = matmul_backward(dlogits, xc, wp.clone(), WeightLayout::OutIn);
            dx.push(dxc);
            dw = Some(match dw {
                None if spans.len() == 1 => dwc,
                None => dwc.cast(DType::F32),
                Some(acc) => acc + dwc.cast(DType::F32),
            });
        }
        let dw = dw.expect("at least one chunk").cast(wp.dtype());
        let dx = if dx.len() == 1 { dx.pop().expect("one chunk") } else { BTensor::cat(dx, 0) };
        [Some(cube(dx)), Some(cube(dw))]
    }));
    Ok(TokenLogprobs { logprobs, entropy: out.entropy })
}

/// The untracked forward: per chunk, the logits, their logprobs and entropies; the logits are
/// dropped before the next chunk's are made.
fn forward(spans: &[(usize, usize)], x: BTensor<2>, head: BTensor<2>, targets: BTensor<1, BInt>, temperatures: BTensor<1>, truncation: Option<&Truncation>) -> Result<TokenLogprobs, KernelError> {
    let hidden = x.dims()[1];
    let (mut lps, mut ents) = (Vec::with_capacity(spans.len()), Vec::with_capacity(spans.len()));
    for &(a, b) in spans {
        let logits = crate::matmul(x.clone().slice([a..b, 0..hidden]), head.clone(), WeightLayout::OutIn)?;
        let out = truncated_token_logprobs(logits, targets.clone().slice([a..b]), temperatures.clone().slice([a..b]), truncation.map(|t| t.slice(a..b)).as_ref())?;
        lps.push(out.logprobs);
        ents.push(out.entropy);
    }
    let join = |mut parts: Vec<BTensor<1>>| if parts.len() == 1 { parts.pop().expect("one chunk") } else { BTensor::cat(parts, 0) };
    Ok(TokenLogprobs { logprobs: join(lps), entropy: join(ents) })
}
