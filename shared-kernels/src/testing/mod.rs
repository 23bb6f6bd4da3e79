//! Testing, not the product: the kernel invariance battery (`lockstep-battery`, the CI tests and
//! `lockstep check` read it) and the size boundaries real runs cross. Nothing in the model or
//! the samplers calls into here.

pub mod attention_backward;
pub mod battery;
pub mod boundaries;
pub mod contract;
pub mod definitions;
pub mod fused_backward;
pub mod rows;
pub mod scratch;

pub use scratch::Scratch;
