//! The one type every matmul kernel takes from the family: how a weight is laid out.

/// How the weight matrix is laid out in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// `[N, K]`: the output features first, as torch's `nn.Linear.weight`.
    OutIn,
    /// `[K, N]`: the input features first.
    InOut,
}
