//! Rotary position embedding, HF "rotate half" convention:
//! `out[i] = x[i]*cos[p,i] - x[i+h]*sin[p,i]`, `out[i+h] = x[i+h]*cos[p,i] + x[i]*sin[p,i]`
//! for i < h = head_dim/2, with a position per row so batched rows can sit at different
//! positions. Tables are computed in f64 on the host and cast once to f32 (as slime does), so
//! the sampler and trainer read the very same table values.

use crate::ops::reduce::cube_linear;
use crate::ops::unfused::{add_unfused, opaque};
use crate::ops::{cube_count_for, storage, vector_width};
use crate::bridge::{dims, float_in, float_out, int_in, int_out, same_device};
use crate::autodiff::{cube, from_tracked, inner, plain, tracked, tracked_in, untracked};
use crate::{ensure, KernelError};
use burn::tensor::{DType, Device, Int as BInt, Tensor as BTensor, TensorData};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

const BLOCK: usize = 256;

/// cos/sin tables `[max_positions, head_dim/2]` in f32, built from f64.
#[derive(Clone, Debug)]
pub struct RopeTables {
    pub cos: BTensor<2>,
    pub sin: BTensor<2>,
    pub max_positions: usize,
    pub head_dim: usize,
}

impl RopeTables {
    /// `inv_freq[i] = theta^(-2i/head_dim)`, angle = position * inv_freq, all in f64.
    pub fn new(head_dim: usize, max_positions: usize, theta: f64, device: &Device) -> Result<Self, KernelError> {
        ensure!(theta.is_finite() && theta > 0.0, "rope", "rope theta must be > 0, got {theta}");
        Self::from_frequencies(head_dim, max_positions, &default_inv_freq(head_dim, theta), 1.0, device)
    }

    /// Tables for given inverse frequencies (`head_dim / 2` of them: a scaled RoPE's, see
    /// `model::rope_scaling`), cos and sin multiplied by `scale` in f64 before the cast.
    pub fn from_frequencies(head_dim: usize, max_positions: usize, inv_freq: &[f64], scale: f64, device: &Device) -> Result<Self, KernelError> {
        ensure!(head_dim >= 2 && head_dim % 2 == 0, "rope", "head_dim must be even and >= 2, got {head_dim}");
        ensure!(max_positions > 0, "rope", "max_positions must be > 0");
        ensure!(inv_freq.len() == head_dim / 2, "rope", "{} inverse frequencies for head_dim {head_dim} (need {})", inv_freq.len(), head_dim / 2);
        ensure!(inv_freq.iter().all(|f| f.is_finite() && *f > 0.0), "rope", "inverse frequencies must be finite and > 0");
        ensure!(scale.is_finite() && scale > 0.0, "rope", "cos/sin scale must be > 0, got {scale}");
        let half = head_dim / 2;
        let (cos, sin) = Self::host_values_of(inv_freq, max_positions, scale);
        let to = |v: Vec<f32>| BTensor::<2>::from_data(TensorData::new(v, [max_positions, half]), device);
        Ok(Self { cos: to(cos), sin: to(sin), max_positions, head_dim })
    }

    /// The f32 table values, for host references.
    pub fn host_values(head_dim: usize, max_positions: usize, theta: f64) -> (Vec<f32>, Vec<f32>) {
        Self::host_values_of(&default_inv_freq(head_dim, theta), max_positions, 1.0)
    }

    /// `scale * cos(p * inv_freq[i])` and the same for sin, in f64, each rounded once to f32.
    pub fn host_values_of(inv_freq: &[f64], max_positions: usize, scale: f64) -> (Vec<f32>, Vec<f32>) {
        let half = inv_freq.len();
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for &f in inv_freq {
                let angle = p as f64 * f;
                cos.push((scale * angle.cos()) as f32);
                sin.push((scale * angle.sin()) as f32);
            }
        }
        (cos, sin)
    }
}

/// Plain RoPE's inverse frequencies `theta^(-2i/head_dim)`, in f64.
pub fn default_inv_freq(head_dim: usize, theta: f64) -> Vec<f64> {
    (0..head_dim / 2).map(|i| theta.powf(-((2 * i) as f64) / head_dim as f64)).collect()
}

/// The rotation of the pair (a, b) = (x[i], x[i + half]), shared with the fused decode kernel
/// ([`crate::ops::attention::decode::inputs`]) so both compile the same expression.
#[cube]
pub(crate) fn rotated_low(a: f32, b: f32, c: f32, s: f32) -> f32 {
    a * c - b * s
}

#[cube]
pub(crate) fn rotated_high(a: f32, b: f32, c: f32, s: f32) -> f32 {
    b * c + a * s
}

/// One unit per vector of `vs` pairs: lanes l of `x[i..i + vs]` and `x[i + h..i + h + vs]` are
/// rotated one by one with [`rotated_low`] / [`rotated_high`] (scalar table reads), so the
/// vector width changes the loads only, never the bits. `backward`: the rotation by the
/// opposite angle, `(a c + b s, b c - a s)`, each product and the sum rounded apart as the burn
/// op chain that defined it rounded them ([`rope_backward_ops`]; `ops/unfused.rs`).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn rope_kernel<F: Float, N: Size, I: Int>(
    x: &Tensor<Vector<F, N>>,
    positions: &Tensor<I>,
    cos: &Tensor<f32>,
    sin: &Tensor<f32>,
    y: &mut Tensor<Vector<F, N>>,
    rows_arg: u32,
    heads_arg: u32,
    half_arg: u32,
    max_positions_arg: u32,
    #[comptime] vs: usize,
    #[comptime] backward: bool,
    #[comptime] cuda: bool,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let rows = rows_arg as usize;
    let heads = heads_arg as usize;
    let half = half_arg as usize;
    let half_vecs = half / vs;
    let max_positions = max_positions_arg as usize;
    let i = cube_linear() * comptime!(BLOCK) + UNIT_POS_X as usize;
    if i < rows * heads * half_vecs {
        let pv = i % half_vecs;
        let head_row = i / half_vecs; // row * heads + head
        let row = head_row / heads;
        let mut pos = u32::cast_from(positions[row]) as usize;
        if pos >= max_positions {
            pos = max_positions - 1; // unreachable through the launcher's checks; never read OOB
        }
        let base = head_row * half_vecs * 2;
        let (av, bv) = (x[base + pv], x[base + pv + half_vecs]);
        let mut low = Vector::<F, N>::new(F::from_int(0));
        let mut high = Vector::<F, N>::new(F::from_int(0));
        #[unroll]
        for l in 0..vs {
            let a = f32::cast_from(av.extract(l));
            let b = f32::cast_from(bv.extract(l));
            let c = cos[pos * half + pv * vs + l];
            let s = sin[pos * half + pv * vs + l];
            if comptime!(backward) {
                low.insert(l, F::cast_from(add_unfused(opaque(a * c, cuda), opaque(b * s, cuda), cuda)));
                high.insert(l, F::cast_from(add_unfused(opaque(b * c, cuda), -opaque(a * s, cuda), cuda)));
            } else {
                low.insert(l, F::cast_from(rotated_low(a, b, c, s)));
                high.insert(l, F::cast_from(rotated_high(a, b, c, s)));
            }
        }
        y[base + pv] = low;
        y[base + pv + half_vecs] = high;
    }
}

/// Apply RoPE to `x` [rows, heads, head_dim] with `positions` [rows].
pub fn rope(x: BTensor<3>, positions: BTensor<1, BInt>, tables: &RopeTables) -> Result<BTensor<3>, KernelError> {
    if !x.is_autodiff() {
        return rope_plain(x, positions, tables, Direction::Forward);
    }
    let xa = tracked_in("rope", "x", x)?;
    let xp = plain::<3>(inner(&xa));

    let positions = untracked(positions);
    let y = rope_plain(xp, positions.clone(), tables, Direction::Forward)?;
    let tables = tables.clone();
    Ok(from_tracked(tracked([&xa], cube(y), move |dy| {
        // the transpose of a rotation is the rotation by the opposite angle
        [Some(cube(rope_backward(plain::<3>(dy), positions, &tables).expect("rope backward: shapes checked in forward")))]
    })))
}

/// The op chain the rope backward computes, in burn's f32 tensor ops: the definition its bits
/// are checked against (tests, `lockstep-battery`).
pub fn rope_backward_ops(dy: BTensor<3>, positions: BTensor<1, BInt>, tables: &RopeTables) -> BTensor<3> {
    let dtype = dy.dtype();
    let dy = dy.cast(DType::F32);
    let [rows, heads, dim] = dy.dims();
    let half = dim / 2;
    let c = tables.cos.clone().select(0, positions.clone()).reshape([rows, 1, half]);
    let s = tables.sin.clone().select(0, positions).reshape([rows, 1, half]);
    let a = dy.clone().slice([0..rows, 0..heads, 0..half]);
    let b = dy.slice([0..rows, 0..heads, half..dim]);
    let da = a.clone() * c.clone() + b.clone() * s.clone();
    let db = b * c - a * s;
    BTensor::cat(vec![da, db], 2).cast(dtype)
}

/// [`rope_backward_ops`] in one launch (the tracked rope's backward; the op chain itself on a
/// runtime the kernel's backward does not run on by default, `ops/unfused.rs`).
pub fn rope_backward(dy: BTensor<3>, positions: BTensor<1, BInt>, tables: &RopeTables) -> Result<BTensor<3>, KernelError> {
    rope_plain(dy, positions, tables, Direction::Backward { forced: false })
}

/// [`rope_backward`] in one launch on any runtime with plane shuffles (the checks on lavapipe).
pub fn rope_backward_one_launch(dy: BTensor<3>, positions: BTensor<1, BInt>, tables: &RopeTables) -> Result<BTensor<3>, KernelError> {
    rope_plain(dy, positions, tables, Direction::Backward { forced: true })
}

/// Which rotation [`rope_plain`] applies; the backward's `forced` runs the kernel where it would
/// otherwise run the op chain (`ops/unfused.rs`).
#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Forward,
    Backward { forced: bool },
}

fn rope_plain(x: BTensor<3>, positions: BTensor<1, BInt>, tables: &RopeTables, direction: Direction) -> Result<BTensor<3>, KernelError> {
    const OP: &str = "rope";
    let x = float_in(OP, "x", x)?;
    let positions = int_in(OP, "positions", positions)?;
    let cos = float_in(OP, "cos", tables.cos.clone())?;
    let sin = float_in(OP, "sin", tables.sin.clone())?;
    same_device(OP, &x, &positions, "positions")?;
    same_device(OP, &x, &cos, "rope tables")?;
    let (xd, pd) = (dims(&x), dims(&positions));
    let (rows, heads, head_dim) = (xd[0], xd[1], xd[2]);
    ensure!(head_dim == tables.head_dim, OP, "x is {xd:?} but the tables are for head_dim {}", tables.head_dim);
    ensure!(pd == [rows], OP, "x has {rows} rows but positions is {pd:?}");
    ensure!(rows > 0 && heads > 0, OP, "empty input {xd:?}");
    if let Direction::Backward { forced } = direction {
        if !crate::ops::unfused::one_launch(&x.client, forced) {
            return Ok(rope_backward_ops(float_out(x), int_out(positions), tables));
        }
    }
    let half = head_dim / 2;
    let y = empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), xd.clone().into(), x.dtype);
    let vs = vector_width(x.dtype, half);
    rope_kernel::launch(
        &x.client,
        cube_count_for(rows * heads * half / vs, BLOCK),
        CubeDim::new_1d(BLOCK as u32),
        vs,
        x.clone().into_tensor_arg(),
        positions.clone().into_tensor_arg(),
        cos.into_tensor_arg(),
        sin.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        rows as u32,
        heads as u32,
        half as u32,
        tables.max_positions as u32,
        vs,
        direction != Direction::Forward,
        crate::device::runtime_name() == "cuda",
        [storage(x.dtype), storage(positions.dtype)],
    );
    Ok(float_out(y))
}
