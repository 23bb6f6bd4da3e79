mod base;
mod coordinates;
mod r#virtual;

pub use base::*;
pub use coordinates::*;
pub use r#virtual::*;

pub mod as_dyn;
pub mod chain;
pub mod dynamic_rank_strided;
pub mod fixed_dim;
pub mod linear;
pub mod permuted;
pub mod plain;
pub mod simple;
pub mod slice;
pub mod strided;
pub mod tiled_view;
