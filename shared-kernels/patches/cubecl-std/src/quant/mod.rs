mod base;
mod dequantize;
pub mod fp4;
pub mod round;
pub mod view;

pub use base::*;
pub use dequantize::*;
