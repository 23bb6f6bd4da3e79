//! [`super::inputs`]'s kernel with one plane a head, for devices whose planes have one fixed
//! size: the cube kernel's tree over the same `ROW_BLOCK` partials without a cube sync.

use crate::ops::kv_cache::cache_row;
use crate::ops::reduce::cube_linear;
use crate::ops::rmsnorm_math::{inv_rms_of_total, normed};
use crate::ops::rmsnorm_planes::{fixed_plane, plane_tree_sum};
use crate::ops::rope::{rotated_high, rotated_low};
use crate::ops::ROW_BLOCK;
use burn_cubecl::cubecl::prelude::*;

/// [`attention_inputs_kernel`]'s arithmetic with one plane of `plane` units per (row, head),
/// for `head_dim == ROW_BLOCK`. Unit l of a plane holds elements `per * l .. per * l + per`
/// (`per = head_dim / plane`), and the norm's sum is the cube kernel's tree on the plane
/// ([`plane_tree_sum`], `ops/rmsnorm_planes.rs`: why the bits are the same). Each square goes through a shuffle before its first add, so
/// the compiler cannot fuse the product into that add (the cube kernel's squares pass through
/// shared memory): the same roundings, the same bits. RoPE's pairs (i, i + head_dim / 2) sit on
/// units l and l + plane / 2, exchanged by an xor shuffle.
#[cube(launch)]
pub(super) fn attention_inputs_plane_kernel<F: Float, I: Int>(
    qkv: &Tensor<F>,
    q_norm: &Tensor<F>,
    k_norm: &Tensor<F>,
    slots: &Tensor<I>,
    positions: &Tensor<I>,
    block_rows: &Tensor<I>,
    cos: &Tensor<f32>,
    sin: &Tensor<f32>,
    q_out: &mut Tensor<F>,
    k_cache: &mut Tensor<F>,
    v_cache: &mut Tensor<F>,
    rows_arg: u32,
    q_heads_arg: u32,
    kv_heads_arg: u32,
    width_arg: u32,
    max_positions_arg: u32,
    eps: f32,
    #[comptime] head_dim: usize,
    #[comptime] plane: usize,
    #[comptime] qk_norm: bool,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let per = comptime!(head_dim / plane);
    let rows = rows_arg as usize;
    let q_heads = q_heads_arg as usize;
    let kv_heads = kv_heads_arg as usize;
    let heads = q_heads + 2 * kv_heads;
    let lane = UNIT_POS_X as usize % plane;
    // uniform over the plane: every shuffle below has its whole plane
    let item = cube_linear() * comptime!(ROW_BLOCK / plane) + UNIT_POS_X as usize / plane;
    if item < rows * heads {
        let row = item / heads;
        let head = item % heads;
        let base = item * head_dim;
        let first = lane * per;
        let slot = u32::cast_from(slots[row]) as usize;
        let pos = u32::cast_from(positions[row]) as usize;
        let width = width_arg as usize;
        if head >= q_heads + kv_heads {
            let dst = (cache_row(block_rows, slot, width, pos) * kv_heads + head - q_heads - kv_heads) * head_dim;
            #[unroll]
            for e in 0..per {
                v_cache[dst + first + e] = qkv[base + first + e];
            }
        } else {
            let mut x = Array::<f32>::new(per);
            if comptime!(qk_norm) {
                let mut part = Array::<f32>::new(per);
                #[unroll]
                for e in 0..per {
                    let v = f32::cast_from(qkv[base + first + e]);
                    part[e] = plane_shuffle(v * v, lane as u32);
                }
                let inv_rms = inv_rms_of_total(plane_tree_sum(&mut part, plane, per), head_dim, eps);
                #[unroll]
                for e in 0..per {
                    let j = first + e;
                    let w = if head < q_heads { q_norm[j] } else { k_norm[j] };
                    x[e] = f32::cast_from(normed::<F>(qkv[base + j], w, inv_rms));
                }
            } else {
                #[unroll]
                for e in 0..per {
                    x[e] = f32::cast_from(qkv[base + first + e]);
                }
            }
            let half = comptime!(head_dim / 2);
            let mut rope_pos = pos;
            if rope_pos >= max_positions_arg as usize {
                rope_pos = max_positions_arg as usize - 1; // unreachable through the launcher's checks
            }
            let low_half = lane < comptime!(plane / 2);
            let dst = if head < q_heads { (row * q_heads + head) * head_dim } else { (cache_row(block_rows, slot, width, pos) * kv_heads + head - q_heads) * head_dim };
            #[unroll]
            for e in 0..per {
                let other = plane_shuffle_xor(x[e], comptime!(plane / 2) as u32);
                let j = first + e;
                let pair = if low_half { j } else { j - half };
                let c = cos[rope_pos * half + pair];
                let s = sin[rope_pos * half + pair];
                let out = if low_half { F::cast_from(rotated_low(x[e], other, c, s)) } else { F::cast_from(rotated_high(other, x[e], c, s)) };
                if head < q_heads {
                    q_out[dst + j] = out;
                } else {
                    k_cache[dst + j] = out;
                }
            }
        }
    }
}

/// The plane size this device's planes always have, if one (CUDA: 32; lavapipe: its SIMD width).
pub fn fixed_plane_size(device: &burn::tensor::Device) -> Option<usize> {
    fixed_plane(&crate::device::client(device)?)
}
