//! Fixed-order reductions shared by the row kernels.
//!
//! Each unit of a `ROW_BLOCK`-wide cube first folds its strided slice of the row sequentially
//! (elements u, u+B, u+2B, ...), then the cube combines the B partials with one binary tree of
//! fixed shape. Both orders depend only on the row length and B, never on the batch.

use burn_cubecl::cubecl::prelude::*;

/// Linear cube index for launches folded by [`super::cube_count_for`].
#[cube]
pub fn cube_linear() -> usize {
    (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize
}

/// Sum of `value` over the cube's units, the same tree for every launch; all units get it.
#[cube]
pub fn tree_sum(shared: &mut Shared<[f32]>, value: f32, #[comptime] _block: usize) -> f32 {
    let unit = UNIT_POS_X as usize;
    shared[unit] = value;
    sync_cube();
    let mut stride = (CUBE_DIM_X / 2u32) as usize; // == block / 2: launchers use block units
    while stride > 0 {
        if unit < stride {
            let other = shared[unit + stride];
            shared[unit] = shared[unit] + other;
        }
        sync_cube();
        stride /= 2;
    }
    let total = shared[0];
    sync_cube();
    total
}

/// Maximum of `value` over the cube's units (exact in any order; tree kept for symmetry).
#[cube]
pub fn tree_max(shared: &mut Shared<[f32]>, value: f32, #[comptime] _block: usize) -> f32 {
    let unit = UNIT_POS_X as usize;
    shared[unit] = value;
    sync_cube();
    let mut stride = (CUBE_DIM_X / 2u32) as usize; // == block / 2: launchers use block units
    while stride > 0 {
        if unit < stride {
            let other = shared[unit + stride];
            if other > shared[unit] {
                shared[unit] = other;
            }
        }
        sync_cube();
        stride /= 2;
    }
    let total = shared[0];
    sync_cube();
    total
}

/// Sum of u32 counts over the cube's units.
#[cube]
pub fn tree_count(shared: &mut Shared<[u32]>, value: u32, #[comptime] _block: usize) -> u32 {
    let unit = UNIT_POS_X as usize;
    shared[unit] = value;
    sync_cube();
    let mut stride = (CUBE_DIM_X / 2u32) as usize; // == block / 2: launchers use block units
    while stride > 0 {
        if unit < stride {
            let other = shared[unit + stride];
            shared[unit] = shared[unit] + other;
        }
        sync_cube();
        stride /= 2;
    }
    let total = shared[0];
    sync_cube();
    total
}

/// A large negative stand-in for -inf: WGSL cannot spell infinities, and every consumer only
/// needs "smaller than any logit".
pub const NEG_BIG: f32 = -3.0e38;
