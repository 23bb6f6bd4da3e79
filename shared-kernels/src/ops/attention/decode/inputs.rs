//! The decode path's attention inputs in one launch: from the fused q/k/v projection
//! `[rows, (q_heads + 2 kv_heads) * head_dim]` to RoPE'd (and, for Qwen3, per-head RMS-normed)
//! queries, with keys and values written straight into the KV cache.
//!
//! The unfused path runs six launches for this (q-norm, k-norm, two RoPEs, two cache writes)
//! plus three projections instead of one; at decode sizes each launch costs more than its
//! arithmetic. Bits: one cube per (row, head) of `ROW_BLOCK` units calls the same
//! [`row_inv_rms`] / [`normed`] as [`crate::rmsnorm`] and the same rotation as [`crate::rope`],
//! so the cache and the queries hold exactly what the unfused ops (and the training path)
//! compute. The model contract checks this as bits in CI.
//!
//! Where the device's planes have one fixed size that divides `ROW_BLOCK` (CUDA's 32), a plane
//! does a head instead (`inputs_planes.rs`): the same tree over the same
//! `ROW_BLOCK` partials, its upper levels by shuffles and its lower ones within a unit, and no
//! cube sync (the cube kernel spent 13.6 µs a Qwen3-8B layer at 256 rows on 8 syncs a head).

use crate::ops::kv_cache::{cache_row, cache_shape, writable, BlockRows};
use crate::ops::reduce::cube_linear;
use crate::ops::rmsnorm::row_inv_rms;
use crate::ops::rmsnorm_math::normed;
use super::inputs_planes::attention_inputs_plane_kernel;
use crate::ops::rmsnorm_planes::{check_given_plane, plane_for_rows};
pub use super::inputs_planes::fixed_plane_size;
use crate::ops::rope::{rotated_high, rotated_low};
use crate::ops::{cube_count_for, storage, ROW_BLOCK};
use crate::bridge::{dims, float_in, float_out, int_in, same_device};
use crate::{ensure, KernelError, RopeTables};
use burn::tensor::{Int as BInt, Tensor as BTensor};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

#[cube(launch)]
fn attention_inputs_kernel<F: Float, I: Int>(
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
    #[comptime] qk_norm: bool,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let rows = rows_arg as usize;
    let q_heads = q_heads_arg as usize;
    let kv_heads = kv_heads_arg as usize;
    let width = width_arg as usize;
    let max_positions = max_positions_arg as usize;
    let heads = q_heads + 2 * kv_heads;
    let item = cube_linear(); // row * heads + head: uniform over the cube, so syncs are safe
    if item < rows * heads {
        let row = item / heads;
        let head = item % heads;
        let unit = UNIT_POS_X as usize;
        let block = comptime!(ROW_BLOCK);
        let base = item * head_dim;
        let slot = u32::cast_from(slots[row]) as usize;
        let pos = u32::cast_from(positions[row]) as usize;
        if head >= q_heads + kv_heads {
            // values: a plain copy, as write_kv_cache does
            let dst = (cache_row(block_rows, slot, width, pos) * kv_heads + head - q_heads - kv_heads) * head_dim;
            let mut i = unit;
            while i < head_dim {
                v_cache[dst + i] = qkv[base + i];
                i += block;
            }
        } else {
            // the head's values as the RoPE kernel reads them: normed and rounded to F first
            let mut x = Shared::<[f32]>::new_slice(head_dim);
            if comptime!(qk_norm) {
                let inv_rms = row_inv_rms(qkv, base, head_dim, eps, block, comptime!(head_dim.div_ceil(ROW_BLOCK)));
                let mut j = unit;
                while j < head_dim {
                    let w = if head < q_heads { q_norm[j] } else { k_norm[j] };
                    x[j] = f32::cast_from(normed::<F>(qkv[base + j], w, inv_rms));
                    j += block;
                }
            } else {
                let mut j = unit;
                while j < head_dim {
                    x[j] = f32::cast_from(qkv[base + j]);
                    j += block;
                }
            }
            sync_cube();
            let half = head_dim / 2;
            let mut rope_pos = pos;
            if rope_pos >= max_positions {
                rope_pos = max_positions - 1; // unreachable through the launcher's checks
            }
            let mut pair = unit;
            while pair < half {
                let a = x[pair];
                let b = x[pair + half];
                let c = cos[rope_pos * half + pair];
                let s = sin[rope_pos * half + pair];
                let low = F::cast_from(rotated_low(a, b, c, s));
                let high = F::cast_from(rotated_high(a, b, c, s));
                if head < q_heads {
                    let dst = (row * q_heads + head) * head_dim;
                    q_out[dst + pair] = low;
                    q_out[dst + pair + half] = high;
                } else {
                    let dst = (cache_row(block_rows, slot, width, pos) * kv_heads + head - q_heads) * head_dim;
                    k_cache[dst + pair] = low;
                    k_cache[dst + pair + half] = high;
                }
                pair += block;
            }
        }
    }
}

/// Per-head RMSNorm weights of Qwen3's attention (`None` for Llama-style models).
pub struct QkNorm {
    pub q: BTensor<1>,
    pub k: BTensor<1>,
    pub eps: f32,
}

/// Splits the fused projection `qkv` `[rows, (q_heads + 2 kv_heads) * head_dim]` into
/// RoPE'd queries `[rows, q_heads, head_dim]` (returned) and RoPE'd keys / values written at
/// (slot, position) of `k_cache` / `v_cache` (updated in place when they are not shared).
/// Bit-identical to q/k-norm + rope + [`crate::write_kv_cache`] on the split projection.
/// `pages`: where the caches' sequences live (`None`: contiguous `[slots, max_len, ..]`).
#[allow(clippy::too_many_arguments)]
pub fn attention_inputs(
    qkv: BTensor<2>,
    q_heads: usize,
    qk_norm: Option<&QkNorm>,
    slots: BTensor<1, BInt>,
    positions: BTensor<1, BInt>,
    tables: &RopeTables,
    k_cache: BTensor<4>,
    v_cache: BTensor<4>,
    pages: Option<&BlockRows>,
) -> Result<(BTensor<3>, BTensor<4>, BTensor<4>), KernelError> {
    attention_inputs_with_planes(None, qkv, q_heads, qk_norm, slots, positions, tables, k_cache, v_cache, pages)
}

/// [`attention_inputs`] with the plane size of its plane kernel given (`None`: the device's
/// choice, as [`attention_inputs`]): lets CI run the plane kernel's tree on runtimes where cubecl
/// does not pick it (lavapipe). A given plane must be the device's real one ([`fixed_plane_size`]).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn attention_inputs_with_planes(
    plane: Option<usize>,
    qkv: BTensor<2>,
    q_heads: usize,
    qk_norm: Option<&QkNorm>,
    slots: BTensor<1, BInt>,
    positions: BTensor<1, BInt>,
    tables: &RopeTables,
    k_cache: BTensor<4>,
    v_cache: BTensor<4>,
    pages: Option<&BlockRows>,
) -> Result<(BTensor<3>, BTensor<4>, BTensor<4>), KernelError> {
    const OP: &str = "attention_inputs";
    let device = qkv.device();
    ensure!(!qkv.is_autodiff(), OP, "inference only: the training path runs the unfused ops");
    let qkv = float_in(OP, "qkv", qkv)?;
    let slots = int_in(OP, "slots", slots)?;
    let positions = int_in(OP, "positions", positions)?;
    let (cos, sin) = (float_in(OP, "cos", tables.cos.clone())?, float_in(OP, "sin", tables.sin.clone())?);
    let k_cache = writable(float_in(OP, "k_cache", k_cache)?);
    let v_cache = writable(float_in(OP, "v_cache", v_cache)?);
    same_device(OP, &qkv, &k_cache, "k_cache")?;
    same_device(OP, &qkv, &positions, "positions")?;
    let shape = cache_shape(OP, &dims(&k_cache))?;
    ensure!(dims(&v_cache) == dims(&k_cache), OP, "k_cache is {:?} but v_cache is {:?}", dims(&k_cache), dims(&v_cache));
    let (d, kv) = (shape.head_dim, shape.kv_heads);
    ensure!(d == tables.head_dim, OP, "the cache's head_dim is {d} but the RoPE tables are for {}", tables.head_dim);
    let qd = dims(&qkv);
    let rows = qd[0];
    ensure!(rows > 0 && q_heads > 0, OP, "empty input: qkv {qd:?}, {q_heads} query heads");
    ensure!(qd[1] == (q_heads + 2 * kv) * d, OP, "qkv is {qd:?}; expected [{rows}, {}] = ({q_heads} query + 2 x {kv} kv heads) x {d}", (q_heads + 2 * kv) * d);
    ensure!(dims(&slots) == [rows] && dims(&positions) == [rows], OP, "qkv has {rows} rows but slots is {:?} and positions {:?}", dims(&slots), dims(&positions));
    ensure!(qkv.dtype == k_cache.dtype && qkv.dtype == v_cache.dtype, OP, "qkv is {:?} but the caches are {:?} / {:?}", qkv.dtype, k_cache.dtype, v_cache.dtype);
    let (q_norm, k_norm, eps) = match qk_norm {
        Some(n) => {
            let (q, k) = (float_in(OP, "q_norm", n.q.clone())?, float_in(OP, "k_norm", n.k.clone())?);
            ensure!(dims(&q) == [d] && dims(&k) == [d], OP, "q_norm is {:?}, k_norm {:?}; expected [{d}]", dims(&q), dims(&k));
            ensure!(q.dtype == qkv.dtype && k.dtype == qkv.dtype, OP, "q_norm/k_norm dtypes {:?}/{:?} differ from qkv's {:?}", q.dtype, k.dtype, qkv.dtype);
            ensure!(n.eps.is_finite() && n.eps > 0.0, OP, "eps must be finite and > 0, got {}", n.eps);
            (q, k, n.eps)
        }
        None => (qkv.clone(), qkv.clone(), 1.0), // never read
    };
    let pages = match pages {
        Some(p) => p.clone(),
        None => BlockRows::contiguous(&shape, slots.dtype, &device)?,
    };
    ensure!(pages.table.dtype == slots.dtype, OP, "the block table is {:?} but slots are {:?}", pages.table.dtype, slots.dtype);
    let q_out = empty_device_contiguous_dtype(qkv.client.clone(), qkv.device.clone(), vec![rows, q_heads, d].into(), qkv.dtype);
    let plane = match plane {
        Some(p) => {
            check_given_plane(OP, &qkv.client, p, d)?;
            Some(p)
        }
        None => plane_for_rows(&qkv.client, d),
    };
    // one argument list for both kernels; the plane kernel also takes its plane size
    macro_rules! launch_with {
        ($kernel:ident, $cubes:expr $(, $plane:expr)?) => {
            $kernel::launch(
                &qkv.client,
                cube_count_for($cubes, 1),
                CubeDim::new_1d(ROW_BLOCK as u32),
                qkv.clone().into_tensor_arg(),
                q_norm.into_tensor_arg(),
                k_norm.into_tensor_arg(),
                slots.clone().into_tensor_arg(),
                positions.clone().into_tensor_arg(),
                pages.table.clone().into_tensor_arg(),
                cos.into_tensor_arg(),
                sin.into_tensor_arg(),
                q_out.clone().into_tensor_arg(),
                k_cache.clone().into_tensor_arg(),
                v_cache.clone().into_tensor_arg(),
                rows as u32,
                q_heads as u32,
                kv as u32,
                pages.width as u32,
                tables.max_positions as u32,
                eps,
                d,
                $($plane,)?
                qk_norm.is_some(),
                [storage(qkv.dtype), storage(positions.dtype)],
            )
        };
    }
    let items = rows * (q_heads + 2 * kv);
    match plane {
        Some(plane) => launch_with!(attention_inputs_plane_kernel, items.div_ceil(ROW_BLOCK / plane), plane),
        None => launch_with!(attention_inputs_kernel, items),
    }
    Ok((float_out(q_out), float_out(k_cache), float_out(v_cache)))
}
