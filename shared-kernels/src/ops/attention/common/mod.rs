//! What the attention kernels share below all of them: the fixed key splits and the CUDA-core
//! per-split steps (`splits`), the tensor-core stages (`staging`), the `mma` warp steps, and the
//! online softmax statistics (`online_stats`).

pub mod splits;
pub mod staging;
pub mod mma;
pub(crate) mod online_stats;
