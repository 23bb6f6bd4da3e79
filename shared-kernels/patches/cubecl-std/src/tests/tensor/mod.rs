pub mod identity;
pub mod into_contiguous;

mod test_macros;
mod test_utils;
