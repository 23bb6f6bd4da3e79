//! The arithmetic every rmsnorm kernel shares (forward and backward, one cube or one plane a
//! row, the attention inputs' q/k norms), defined once so that they all give the same bits for
//! the same row: the kernels differ only in how a row's sums are laid out over units.

use crate::ops::unfused::{add_unfused, opaque};
use burn_cubecl::cubecl::prelude::*;

/// `1 / sqrt(total / hidden + eps)`: one expression for every kernel that ends a row's tree.
#[cube]
pub(crate) fn inv_rms_of_total(total: f32, hidden: usize, eps: f32) -> f32 {
    1.0f32 / (total / f32::cast_from(hidden as u32) + eps).sqrt()
}

/// One normalised element: normalise in f32, cast to the storage type, then scale (HF order).
#[cube]
pub(crate) fn normed<F: Float>(x: F, weight: F, inv_rms: f32) -> F {
    weight * F::cast_from(f32::cast_from(x) * inv_rms)
}

/// The backward's row factors `(r, r³, sum(dy w x) / n)` from its two sums over `n` values,
/// each step rounded on its own (`ops/unfused.rs`).
#[cube]
pub(crate) fn row_factors(squares: f32, products: f32, n: f32, eps: f32, three: f32, #[comptime] cuda: bool) -> (f32, f32, f32) {
    let mean = opaque(squares / n, cuda);
    let root = opaque(opaque(mean + eps, cuda).sqrt(), cuda);
    let r = opaque(root.recip(), cuda);
    let r3 = opaque(r.powf(three), cuda);
    let dot = opaque(products / n, cuda);
    (r, r3, dot)
}

/// One element's `dx` (f32, before the cast to the dtype) and weight term `(dy x) r`.
#[cube]
pub(crate) fn element_grads(xv: f32, dyv: f32, wv: f32, r: f32, r3: f32, dot: f32, #[comptime] cuda: bool) -> (f32, f32) {
    let gw = opaque(dyv * wv, cuda);
    let along = opaque(gw * r, cuda);
    let across = opaque(opaque(xv * r3, cuda) * dot, cuda);
    (add_unfused(along, -across, cuda), opaque(dyv * xv, cuda) * r)
}
