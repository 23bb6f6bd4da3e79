//! Fixed-order reductions shared by the row kernels.
//!
//! Each unit of a `ROW_BLOCK`-wide cube first folds its strided slice of the row sequentially
//! (elements u, u+B, u+2B, ...), then the cube combines the B partials with one binary tree of
//! fixed shape. Both orders depend only on the row length and B, never on the batch.

use burn_cubecl::cubecl::prelude::*;

/// Linear cube index for launches folded by [`crate::ops::cube_count_for`].
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

/// [`tree_sum`] of two values at once, each with exactly [`tree_sum`]'s additions (half the
/// syncs of two calls).
#[cube]
pub fn tree_sum_pair(shared: &mut Shared<[f32]>, other: &mut Shared<[f32]>, a: f32, b: f32, #[comptime] _block: usize) -> (f32, f32) {
    let unit = UNIT_POS_X as usize;
    shared[unit] = a;
    other[unit] = b;
    sync_cube();
    let mut stride = (CUBE_DIM_X / 2u32) as usize;
    while stride > 0 {
        if unit < stride {
            let (sa, sb) = (shared[unit + stride], other[unit + stride]);
            shared[unit] = shared[unit] + sa;
            other[unit] = other[unit] + sb;
        }
        sync_cube();
        stride /= 2;
    }
    let totals = (shared[0], other[0]);
    sync_cube();
    totals
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

/// Elements one unit folds per [`sum_all`] pass; a cube covers `ROW_BLOCK * SUM_PER_UNIT`.
const SUM_PER_UNIT: usize = 32;

/// Sum of all elements of `x` as a one-element f32 tensor, in an order fixed by the element
/// count alone: passes of fixed-size chunks until one partial is left.
///
/// burn's `sum()` on CUDA adds with float atomics (or an autotuned strategy), so its bits change
/// from run to run; the trainer's loss value and gradient norm (which scales every update
/// through clipping) use this instead, so GPU training repeats bit for bit.
pub fn sum_all<const D: usize>(x: burn::tensor::Tensor<D>) -> Result<burn::tensor::Tensor<1>, crate::KernelError> {
    use burn::tensor::DType;
    use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
    const OP: &str = "sum_all";
    let mut cur = crate::bridge::float_in(OP, "x", x)?;
    let mut n: usize = crate::bridge::dims(&cur).iter().product();
    crate::ensure!(n > 0, OP, "empty input");
    crate::ensure!(n <= u32::MAX as usize, OP, "{n} elements exceed the u32 index range");
    let per_cube = crate::ops::ROW_BLOCK * SUM_PER_UNIT;
    loop {
        let chunks = n.div_ceil(per_cube);
        let partials = empty_device_contiguous_dtype(cur.client.clone(), cur.device.clone(), [chunks].into(), DType::F32);
        // the chunks as the rows of a [chunks, per_cube] matrix whose last row stops at n
        row_sum_kernel::launch(
            &cur.client,
            crate::ops::cube_count_for(chunks, 1),
            CubeDim::new_1d(crate::ops::ROW_BLOCK as u32),
            cur.clone().into_tensor_arg(),
            partials.clone().into_tensor_arg(),
            chunks as u32,
            per_cube as u32,
            n as u32,
            crate::ops::ROW_BLOCK,
            crate::ops::storage(cur.dtype),
        );
        if chunks == 1 {
            return Ok(crate::bridge::float_out(partials));
        }
        (cur, n) = (partials, chunks);
    }
}

/// One cube per row of `x` viewed as [rows, cols] with `len` elements in all (the last row may
/// stop early): each unit folds its strided elements u, u + B, ... in order (four loads in
/// flight), then the cube tree; one f32 per row. [`row_sums`] and every pass of [`sum_all`].
#[cube(launch)]
fn row_sum_kernel<F: Float>(x: &Tensor<F>, out: &mut Tensor<f32>, rows_arg: u32, cols_arg: u32, len_arg: u32, #[comptime] block: usize, #[define(F)] _dtype: ElemType) {
    let row = cube_linear();
    if row < rows_arg as usize {
        let base = row * cols_arg as usize;
        let mut cols = len_arg as usize - base;
        if cols > cols_arg as usize {
            cols = cols_arg as usize;
        }
        let mut partial = 0.0f32;
        let mut i = UNIT_POS_X as usize;
        while i + 3 * block < cols {
            let (a, b) = (f32::cast_from(x[base + i]), f32::cast_from(x[base + i + block]));
            let (c, d) = (f32::cast_from(x[base + i + 2 * block]), f32::cast_from(x[base + i + 3 * block]));
            partial += a;
            partial += b;
            partial += c;
            partial += d;
            i += 4 * block;
        }
        while i < cols {
            partial += f32::cast_from(x[base + i]);
            i += block;
        }
        let mut shared = Shared::new_slice(block);
        let total = tree_sum(&mut shared, partial, block);
        if UNIT_POS_X == 0 {
            out[row] = total;
        }
    }
}

/// Sum of each row of `x` [rows, cols] as f32 [rows], in an order fixed by `cols` (for weight
/// gradients in the backward passes: burn's reduce without autotune gives a whole row to one
/// unit).
pub fn row_sums(x: burn::tensor::Tensor<2>) -> Result<burn::tensor::Tensor<1>, crate::KernelError> {
    use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
    const OP: &str = "row_sums";
    let x = crate::bridge::float_in(OP, "x", x)?;
    let (rows, cols) = (crate::bridge::dims(&x)[0], crate::bridge::dims(&x)[1]);
    crate::ensure!(rows > 0 && cols > 0, OP, "empty input [{rows}, {cols}]");
    crate::ensure!(rows * cols <= u32::MAX as usize, OP, "[{rows}, {cols}] exceeds the u32 index range");
    let out = empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), [rows].into(), burn::tensor::DType::F32);
    row_sum_kernel::launch(
        &x.client,
        crate::ops::cube_count_for(rows, 1),
        CubeDim::new_1d(crate::ops::ROW_BLOCK as u32),
        x.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        rows as u32,
        cols as u32,
        (rows * cols) as u32,
        crate::ops::ROW_BLOCK,
        crate::ops::storage(x.dtype),
    );
    Ok(crate::bridge::float_out(out))
}

/// The order [`sum_all`] adds in, on the host in f32: the bit-exact reference its tests use.
pub fn sum_all_host_order(x: &[f32]) -> f32 {
    let (block, per_cube) = (crate::ops::ROW_BLOCK, crate::ops::ROW_BLOCK * SUM_PER_UNIT);
    let mut cur = x.to_vec();
    loop {
        let next: Vec<f32> = cur
            .chunks(per_cube)
            .map(|chunk| {
                let mut lanes: Vec<f32> = (0..block)
                    .map(|u| (0..SUM_PER_UNIT).filter_map(|j| chunk.get(j * block + u)).fold(0.0f32, |a, &v| a + v))
                    .collect();
                let mut stride = block / 2;
                while stride > 0 {
                    for u in 0..stride {
                        lanes[u] += lanes[u + stride];
                    }
                    stride /= 2;
                }
                lanes[0]
            })
            .collect();
        if next.len() == 1 {
            return next[0];
        }
        cur = next;
    }
}
