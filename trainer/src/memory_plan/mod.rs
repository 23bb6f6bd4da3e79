//! The device memory a run needs, worked out from the config before anything is allocated.
//!
//! The fixed part is exact arithmetic on the shapes: the trainer's weights and the sampler's
//! resident copy (sampling alone holds one copy), for training also the f32 master weights (a
//! narrower model dtype), AdamW's two moments, the f32 gradient accumulators (a tied embedding
//! has two: lookup and LM head) and the KL reference model, and the sampler's KV cache. The
//! activations of one trainer pass are [`activation_bytes`], an estimate calibrated against
//! measured peaks (docs/scale.md). `"auto"` sizes (the defaults) are chosen from the device's
//! free memory by [`auto`]; a config that cannot fit is refused before anything loads (exit 2),
//! naming the keys to change and values that would fit.

use crate::config::Config;
use crate::error::RunError;

pub mod auto;
mod fixed;
mod shape;

pub use fixed::MemoryPlan;
pub use shape::{Part, Purpose};

pub use auto::{resolve, DeviceMemory};

/// `c` planned for `purpose` on `device` with its `"auto"` sizes resolved: prints the plan's
/// line and the sizes chosen, refuses a config that cannot fit (exit 2). See [`auto::resolve`].
pub fn plan(c: &Config, device: &burn::tensor::Device, purpose: Purpose) -> Result<Config, RunError> {
    resolve(c, device, purpose, 1, 1)
}
