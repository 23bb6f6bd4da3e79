//! RMSNorm and its backward over rows of exactly [`ROW_BLOCK`] values (Qwen3's per-head q/k
//! norms, head_dim 128) with one plane a row, where the cube kernels give each 256-byte row a
//! whole 128-unit cube and its syncs: 262,144 row cubes a norm in the 1.7B update of 4 x 4,096
//! tokens, 173 µs a forward and 301 µs a backward launch, 26.6 ms an update (cubecl's profile;
//! the 16,384 x 2,048 hidden-size norm takes 45 µs).
//!
//! The bits are the cube kernels': their tree adds partial u + s into u for s = 64, 32, ..., 1
//! over one partial a unit. Here lane l of a plane holds partials `per * l .. per * l + per`
//! (`per = ROW_BLOCK / plane`), so the levels s >= per add the same slot of lane l + s / per (a
//! shuffle down) and the levels below add slots within lane 0 ([`plane_tree_sum`]). Every
//! partial is the cube kernel's own value for that element, made by the same operations, and
//! each element's output comes from the same shared expressions (`ops/rmsnorm_math.rs`).

use crate::ops::reduce::cube_linear;
use crate::ops::rmsnorm_math::{element_grads, inv_rms_of_total, normed, row_factors};
use crate::ops::unfused::{add_unfused, opaque};
use crate::ops::ROW_BLOCK;
use burn_cubecl::cubecl::prelude::*;

/// The cube tree's sum of [`ROW_BLOCK`] partials held `per` a lane by a plane of `plane` lanes
/// (lane l: partials `per * l + e`), every lane returning lane 0's total. `part` is consumed.
/// The caller's branch must be uniform over the plane (the shuffles need every lane).
#[cube]
pub(crate) fn plane_tree_sum(part: &mut Array<f32>, #[comptime] plane: usize, #[comptime] per: usize) -> f32 {
    #[unroll]
    for level in 0..comptime!(plane.trailing_zeros() as usize) {
        // tree stride s = ROW_BLOCK / 2 >> level >= per: slot e of lane l + s / per
        let delta = comptime!((plane / 2) >> level) as u32;
        #[unroll]
        for e in 0..per {
            let own = part[e];
            part[e] = own + plane_shuffle_down(own, delta);
        }
    }
    #[unroll]
    for level in 0..comptime!(per.trailing_zeros() as usize) {
        // strides below per, within the lane (only lane 0's count)
        let s = comptime!(per >> (level + 1));
        #[unroll]
        for e in 0..s {
            let (own, other) = (part[e], part[e + s]);
            part[e] = own + other;
        }
    }
    plane_broadcast(part[0], 0u32)
}

/// [`crate::ops::rmsnorm`]'s forward for rows of [`ROW_BLOCK`] values, one plane a row
/// (`ROW_BLOCK / plane` rows a cube): lane l loads its `per` values as vectors of `vs`, squares
/// them (each square through a shuffle, so no compiler fuses it into the first tree add, as the
/// cube kernel's pass through shared memory prevents), sums them with [`plane_tree_sum`] and
/// writes its values normalised.
#[cube(launch)]
pub(crate) fn rmsnorm_plane_kernel<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    weight: &Tensor<Vector<F, N>>,
    y: &mut Tensor<Vector<F, N>>,
    rows_arg: u32,
    eps: f32,
    #[comptime] plane: usize,
    #[comptime] vs: usize,
    #[define(F)] _d: ElemType,
) {
    let per = comptime!(ROW_BLOCK / plane);
    let vecs = comptime!(ROW_BLOCK / plane / vs);
    let lane = UNIT_POS_X as usize % plane;
    // uniform over the plane: every shuffle below has its whole plane
    let row = cube_linear() * comptime!(ROW_BLOCK / plane) + UNIT_POS_X as usize / plane;
    if row < rows_arg as usize {
        let base_v = row * comptime!(ROW_BLOCK / vs) + lane * vecs;
        let mut own = Array::<Vector<F, N>>::new(vecs);
        #[unroll]
        for j in 0..vecs {
            own[j] = x[base_v + j];
        }
        let mut part = Array::<f32>::new(per);
        #[unroll]
        for j in 0..vecs {
            #[unroll]
            for l in 0..vs {
                let v = f32::cast_from(own[j].extract(l));
                part[j * vs + l] = plane_shuffle(v * v, lane as u32);
            }
        }
        let inv_rms = inv_rms_of_total(plane_tree_sum(&mut part, plane, per), ROW_BLOCK, eps);
        #[unroll]
        for j in 0..vecs {
            let w = weight[lane * vecs + j];
            let mut out = Vector::<F, N>::new(F::from_int(0));
            #[unroll]
            for l in 0..vs {
                out.insert(l, normed::<F>(own[j].extract(l), w.extract(l), inv_rms));
            }
            y[base_v + j] = out;
        }
    }
}

/// [`crate::ops::rmsnorm_backward`]'s kernel for rows of [`ROW_BLOCK`] values, one plane a row:
/// each element's two partials (`0 + x²`, `0 + (dy w) x`, added as the cube kernel adds a unit's
/// first element), the two row sums by [`plane_tree_sum`], then the row's factors and every
/// element's `dx` and weight term by the helpers the cube kernel uses.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn rmsnorm_backward_plane_kernel<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    weight: &Tensor<Vector<F, N>>,
    dy: &Tensor<Vector<F, N>>,
    dx: &mut Tensor<Vector<F, N>>,
    weighted: &mut Tensor<Vector<f32, N>>,
    rows_arg: u32,
    eps: f32,
    three: f32,
    #[comptime] plane: usize,
    #[comptime] vs: usize,
    #[comptime] cuda: bool,
    #[define(F)] _d: ElemType,
) {
    let per = comptime!(ROW_BLOCK / plane);
    let vecs = comptime!(ROW_BLOCK / plane / vs);
    let lane = UNIT_POS_X as usize % plane;
    let row = cube_linear() * comptime!(ROW_BLOCK / plane) + UNIT_POS_X as usize / plane;
    if row < rows_arg as usize {
        let base_v = row * comptime!(ROW_BLOCK / vs) + lane * vecs;
        let mut xs = Array::<Vector<F, N>>::new(vecs);
        let mut dys = Array::<Vector<F, N>>::new(vecs);
        let mut ws = Array::<Vector<F, N>>::new(vecs);
        #[unroll]
        for j in 0..vecs {
            xs[j] = x[base_v + j];
            dys[j] = dy[base_v + j];
            ws[j] = weight[lane * vecs + j];
        }
        // the cube kernel's running sums start at zero: the same first add
        let mut zero = Array::<f32>::new(1usize);
        zero[0usize] = 0.0f32;
        let mut squares = Array::<f32>::new(per);
        let mut products = Array::<f32>::new(per);
        #[unroll]
        for j in 0..vecs {
            #[unroll]
            for l in 0..vs {
                let xv = f32::cast_from(xs[j].extract(l));
                let gw = opaque(f32::cast_from(dys[j].extract(l)) * f32::cast_from(ws[j].extract(l)), cuda);
                squares[j * vs + l] = add_unfused(zero[0usize] * 1.0f32, opaque(xv * xv, cuda), cuda);
                products[j * vs + l] = add_unfused(zero[0usize] * 1.0f32, opaque(gw * xv, cuda), cuda);
            }
        }
        let total_squares = plane_tree_sum(&mut squares, plane, per);
        let total_products = plane_tree_sum(&mut products, plane, per);
        let (r, r3, dot) = row_factors(total_squares, total_products, f32::cast_from(ROW_BLOCK as u32), eps, three, cuda);
        #[unroll]
        for j in 0..vecs {
            let mut dx_out = Vector::<F, N>::new(F::from_int(0));
            let mut w_out = Vector::<f32, N>::new(0.0f32);
            #[unroll]
            for l in 0..vs {
                let (dxe, we) = element_grads(f32::cast_from(xs[j].extract(l)), f32::cast_from(dys[j].extract(l)), f32::cast_from(ws[j].extract(l)), r, r3, dot, cuda);
                dx_out.insert(l, F::cast_from(dxe));
                w_out.insert(l, we);
            }
            dx[base_v + j] = dx_out;
            weighted[base_v + j] = w_out;
        }
    }
}

/// Whether the plane kernels run rows of `width` values with planes of `plane` lanes: rows of
/// exactly [`ROW_BLOCK`], planes a power of two from 2 to half of it.
pub(crate) fn plane_fits(plane: usize, width: usize) -> bool {
    width == ROW_BLOCK && plane.is_power_of_two() && (2..ROW_BLOCK).contains(&plane)
}

/// A plane size given to a plane kernel (tests, the battery): it must fit rows of `width` and be
/// this device's own plane size, or the shuffles would cross planes and give wrong values.
pub(crate) fn check_given_plane(op: &'static str, client: &burn_cubecl::cubecl::client::Client, plane: usize, width: usize) -> Result<(), crate::KernelError> {
    crate::ensure!(plane_fits(plane, width), op, "planes of {plane} lanes for rows of {width}: the plane kernels need rows of {ROW_BLOCK} and a power-of-two plane below {ROW_BLOCK}");
    let own = fixed_plane(client);
    crate::ensure!(own == Some(plane), op, "planes of {plane} lanes asked for, but this device's planes are {own:?}");
    Ok(())
}

/// The plane size the plane kernels run with on this device for rows of `width`, if they do:
/// the device's one fixed plane size, with plane operations advertised.
pub(crate) fn plane_for_rows(client: &burn_cubecl::cubecl::client::Client, width: usize) -> Option<usize> {
    let ops = client.features().plane.contains(burn_cubecl::cubecl::ir::features::Plane::Ops);
    fixed_plane(client).filter(|&p| ops && plane_fits(p, width))
}

/// The device's one plane size, where its planes have a single size.
pub(crate) fn fixed_plane(client: &burn_cubecl::cubecl::client::Client) -> Option<usize> {
    let hw = &client.properties().hardware;
    (hw.plane_size_min == hw.plane_size_max).then_some(hw.plane_size_max as usize)
}

/// The plane size rows of `width` run on by default, `None` for the cube kernels: planes where
/// the process chose them (`LOCKSTEP_NORM_PLANES`) and the device has planes that fit.
fn chosen_plane(client: &burn_cubecl::cubecl::client::Client, width: usize) -> Result<Option<usize>, crate::KernelError> {
    use crate::kernel_choice::{KernelChoice, NormPlanes};
    Ok(match KernelChoice::current()?.norm_planes {
        NormPlanes::Off => None,
        NormPlanes::On => plane_for_rows(client, width),
        NormPlanes::Force => fixed_plane(client).filter(|&p| plane_fits(p, width)),
    })
}

/// Which rmsnorm kernel a call runs, forward or backward.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum NormKernel {
    /// The process's choice (`LOCKSTEP_NORM_PLANES`): planes where chosen and where the device's
    /// planes fit the rows, else one cube a row.
    Chosen,
    /// One cube a row.
    Cube,
    /// The plane kernel with planes of this size, which must be the device's own.
    Planes(usize),
}

impl NormKernel {
    /// The plane size a call on rows of `width` runs with, `None` for one cube a row.
    pub(crate) fn plane(self, op: &'static str, client: &burn_cubecl::cubecl::client::Client, width: usize) -> Result<Option<usize>, crate::KernelError> {
        match self {
            NormKernel::Planes(p) => check_given_plane(op, client, p, width).map(|()| Some(p)),
            NormKernel::Cube => Ok(None),
            NormKernel::Chosen => chosen_plane(client, width),
        }
    }
}
