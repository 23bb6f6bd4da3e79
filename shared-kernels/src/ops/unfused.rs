//! Keeping the roundings of separate launches inside one kernel. A kernel that fuses ops which
//! ran as separate launches must give each intermediate the f32 value the launch stored; the
//! compilers may otherwise merge steps across the boundary the launches made:
//! - NVRTC contracts a product (or the product that ends an inlined `expf`) and a following
//!   addition into one FMA (its default `-fmad=true`), one rounding instead of two. PTX's
//!   `add.rn` is never contracted, so on CUDA the addition goes through it.
//! - Mesa's shader compiler (the CI's lavapipe) also applies inexact algebra to chains it sees
//!   whole, e.g. `exp(-ln(a))` into a power of `a`. Passing a value through a plane shuffle of
//!   its own lane, which no compiler looks through, ends the chain there.

use burn_cubecl::cubecl::prelude::*;

/// Whether the kernels built on these helpers run on `client`'s runtime by default: CUDA
/// (`add.rn`), or one that advertises plane operations (the shuffles). Elsewhere their callers
/// run the op chains that define them, the same bits by definition. `forced` runs the kernel
/// anyway: the CI's lavapipe shuffles planes, but cubecl advertises no plane operations on a
/// CPU adapter, and the tests must run the kernels there.
pub(crate) fn one_launch(client: &burn_cubecl::cubecl::client::Client, forced: bool) -> bool {
    forced || crate::device::runtime_name() == "cuda" || client.features().plane.contains(burn_cubecl::cubecl::ir::features::Plane::Ops)
}

/// `a + b` rounded once, never fused with the operation that produced `a` (`cuda`: the
/// runtime is CUDA, else a plane shuffle stands between them). Neither operand may be a mutable
/// local: cubecl hands those to inline PTX by address (pass an expression such as `acc * 1.0`).
#[cube]
pub(crate) fn add_unfused(a: f32, b: f32, #[comptime] cuda: bool) -> f32 {
    if comptime!(cuda) { add_rn(a, b) } else { plane_shuffle(a, UNIT_POS_PLANE) + b }
}

/// `x`, as a value the compiler cannot trace back to the operations that made it (outside
/// CUDA, whose compiler only contracts, which [`add_unfused`] covers).
#[cube]
pub(crate) fn opaque(x: f32, #[comptime] cuda: bool) -> f32 {
    if comptime!(cuda) { x } else { plane_shuffle(x, UNIT_POS_PLANE) }
}

/// `a * b` rounded to f32 before any use (on CUDA `mul.rn`, which NVRTC never contracts into
/// an FMA with the addition that follows). The same operand rules as [`add_unfused`].
#[cube]
pub(crate) fn mul_unfused(a: f32, b: f32, #[comptime] cuda: bool) -> f32 {
    if comptime!(cuda) { mul_rn(a, b) } else { a * b }
}

#[cube]
fn mul_rn(a: f32, b: f32) -> f32 {
    let out: f32;
    gpu_asm!("mul.rn.f32 {out}, {a}, {b};", a = in(_) a, b = in(_) b, out = out(_) out, options(nomem));
    out
}

#[cube]
fn add_rn(a: f32, b: f32) -> f32 {
    let out: f32;
    gpu_asm!("add.rn.f32 {out}, {a}, {b};", a = in(_) a, b = in(_) b, out = out(_) out, options(nomem));
    out
}
