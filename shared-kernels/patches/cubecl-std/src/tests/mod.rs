/// Re-export for testgen macros.
pub use test_log;

pub mod erased;
pub mod event;
pub mod fp4;
pub mod reinterpret_slice;
pub mod round;
pub mod tensor;
pub mod trigonometry;
pub mod view;

#[macro_export]
macro_rules! testgen {
    () => {
        mod test_cubecl_std {
            use super::*;
            use half::{bf16, f16};

            cubecl_std::testgen_reinterpret_slice!();
            cubecl_std::testgen_trigonometry!();
            cubecl_std::testgen_event!();
            cubecl_std::testgen_round!();
            cubecl_std::testgen_fp4!();
            cubecl_std::testgen_erased!();
        }
    };
}
