//! What must not change between two runs of one request, as bits, and where two runs part.

use crate::{Completion, FinishReason};

/// The tokens, their logprob bits, the finish reason, and each token's listed alternatives
/// (`top_logprobs`: (token, logprob bits)).
pub type Bits = (Vec<u32>, Vec<u32>, FinishReason, Vec<Vec<(u32, u32)>>);

pub fn bits(c: &Completion) -> Bits {
    let top = c.top_logprobs.iter().map(|list| list.iter().map(|&(t, lp)| (t, lp.to_bits())).collect()).collect();
    (c.tokens.clone(), c.logprobs.iter().map(|v| v.to_bits()).collect(), c.finish, top)
}

/// Where two runs of one request part: `labels` name the `want` and `got` runs.
pub(super) fn first_difference(want: &Bits, got: &Bits, labels: [&str; 2]) -> String {
    let n = want.0.len().min(got.0.len());
    let [a, b] = labels;
    if let Some(i) = (0..n).find(|&i| want.0[i] != got.0[i] || want.1[i] != got.1[i]) {
        return format!("generated position {i}: {a} token {} logprob bits {:#010x}, {b} token {} bits {:#010x}", want.0[i], want.1[i], got.0[i], got.1[i]);
    }
    if want.0.len() == got.0.len() && want.2 == got.2 {
        if let Some(i) = (0..want.3.len().max(got.3.len())).find(|&i| want.3.get(i) != got.3.get(i)) {
            return format!("top_logprobs at generated position {i}: {a} {:?}, {b} {:?}", want.3.get(i), got.3.get(i));
        }
    }
    format!("lengths/finish differ: {a} {} tokens {:?}, {b} {} tokens {:?}", want.0.len(), want.2, got.0.len(), got.2)
}
