//! Prefill tiles (and the training forward's), flash-style: `mma_flash` by default, `cmma_flash`
//! for the `cmma` set.

pub mod mma_flash;
pub mod cmma_flash;
