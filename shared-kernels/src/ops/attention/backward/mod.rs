//! The training path's causal attention backward, one sequence at a time, so each sequence's
//! gradients come from arithmetic that depends on that sequence alone, never on the other
//! sequences of the batch or micro-batch (the folded weight gradients need this,
//! [`crate::grad_fold`]). Rows of one sequence must be contiguous and in position order (the
//! training layout, [`crate::model::Rows::whole_padded`]).
//!
//! [`sequence_backward`] runs every sequence on tensor cores where
//! [`crate::ops::attention::backward::mma_backward`] takes the inputs (CUDA, 16-bit, head_dim 64 or 128), else
//! picks per sequence, by its length and head count alone:
//! - dense attention in burn's f32 ops (`[1, heads, t, t]` scores, tensor-core matmuls) where
//!   `heads * t * t` is within [`DENSE_SEQUENCE_SCORES`]: the fast path, t up to 5,792 at 16
//!   heads;
//! - past that, [`attention_backward`]: memory linear in the tokens, no atomics, two launches,
//!   f32 arithmetic from the inputs' dtype, cubes of [`KV_SPLIT`] units (row `start + j` holds
//!   key j of the sequence starting at row `start`):
//! 1. per (query row, query head): the row's softmax statistics recomputed over its keys in
//!    splits of KV_SPLIT (running max and sum, as the forward kernel), `D = dO . O` (a sequential
//!    dot product), and `dQ = scale * sum_j dS_j K_j` (unit u owns dims u, u + KV_SPLIT, ..., and
//!    adds each split's keys in order); each split's K and V rows are staged in shared memory
//!    by coalesced loads, one row per unit for the dot products;
//! 2. per (key row, KV head): `dV = sum_i P_i dO_i` and `dK = scale * sum_i dS_i Q_i` over the
//!    sequence's queries at or after the key, in splits of KV_SPLIT in order and, inside a split,
//!    over the KV head's query heads in head order.
//! `dS = P (dP - D)` with `dP = dO . V`. Scores are `(q . k) * scale` in the forward's order.
//!
//! One file past 400 lines: the per-sequence dispatch and the CUDA-core fallback kernels it
//! picks between share the sequence layout checks (`contiguous_sequences`).

pub mod mma_backward;

use crate::ops::attention::common::splits::{keys_in_split, split_max, KV_SPLIT};
use crate::ops::reduce::{cube_linear, NEG_BIG};
use burn::tensor::{Bool, TensorData};
use crate::ops::{cube_count_for, storage};
use crate::{ensure, KernelError};
use crate::bridge::{dims, float_in, float_out, int_in};
use burn::tensor::{DType, Int as BInt, Tensor as BTensor};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

/// Loads `head_dim` values of `t` from `base` into `sh` as f32 (unit u loads u, u + KV_SPLIT, ..).
#[cube]
fn load_row<F: Float>(t: &Tensor<F>, sh: &mut Shared<[f32]>, base: usize, #[comptime] head_dim: usize) {
    let mut d = UNIT_POS_X as usize;
    while d < head_dim {
        sh[d] = f32::cast_from(t[base + d]);
        d += comptime!(KV_SPLIT);
    }
}

/// Stages rows `first_row ..+ valid` of `src` ([rows, heads, head_dim], head `head`) into
/// `tile` as f32, row stride head_dim + 1 (a unit reading its own row then hits its own bank);
/// consecutive units load consecutive elements. Ends with a cube sync.
#[cube]
fn stage_rows<F: Float>(src: &Tensor<F>, tile: &mut Shared<[f32]>, first_row: usize, valid: usize, heads: usize, head: usize, #[comptime] head_dim: usize) {
    let mut i = UNIT_POS_X as usize;
    while i < valid * head_dim {
        let r = i / head_dim;
        let e = i % head_dim;
        tile[r * comptime!(head_dim + 1) + e] = f32::cast_from(src[((first_row + r) * heads + head) * head_dim + e]);
        i += comptime!(KV_SPLIT);
    }
    sync_cube();
}

/// `sum_e a[e] * tile[row][e]` in e order.
#[cube]
fn dot_tile_row(a: &Shared<[f32]>, tile: &Shared<[f32]>, row: usize, #[comptime] head_dim: usize) -> f32 {
    let mut dot = 0.0f32;
    for e in 0..head_dim {
        dot += a[e] * tile[row * comptime!(head_dim + 1) + e];
    }
    dot
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn attention_backward_query_kernel<F: Float, I: Int>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    out: &Tensor<F>,
    d_out: &Tensor<F>,
    starts: &Tensor<I>,
    positions: &Tensor<I>,
    d_q: &mut Tensor<f32>,
    stats: &mut Tensor<f32>,
    rows_arg: u32,
    q_heads_arg: u32,
    kv_heads_arg: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let rows = rows_arg as usize;
    let q_heads = q_heads_arg as usize;
    let kv_heads = kv_heads_arg as usize;
    let work = cube_linear(); // row * q_heads + head
    if work < rows * q_heads {
        let unit = UNIT_POS_X as usize;
        let row = work / q_heads;
        let head = work % q_heads;
        let kv_head = head / (q_heads / kv_heads);
        let start = u32::cast_from(starts[row]) as usize;
        let pos = u32::cast_from(positions[row]) as usize;
        let base = work * head_dim;
        let mut q_sh = Shared::<[f32]>::new_slice(head_dim);
        let mut do_sh = Shared::<[f32]>::new_slice(head_dim);
        let mut o_sh = Shared::<[f32]>::new_slice(head_dim);
        let mut dq_sh = Shared::<[f32]>::new_slice(head_dim);
        let mut scores = Shared::<[f32]>::new_slice(comptime!(KV_SPLIT));
        let mut ds = Shared::<[f32]>::new_slice(comptime!(KV_SPLIT));
        let mut tile = Shared::<[f32]>::new_slice(comptime!(KV_SPLIT * (head_dim + 1)));
        load_row(q, &mut q_sh, base, head_dim);
        load_row(d_out, &mut do_sh, base, head_dim);
        load_row(out, &mut o_sh, base, head_dim);
        let mut d = unit;
        while d < head_dim {
            dq_sh[d] = 0.0f32;
            d += comptime!(KV_SPLIT);
        }
        sync_cube();
        // D = dO . O, one sequential dot product (every unit, same order, same value)
        let mut big_d = 0.0f32;
        for e in 0..head_dim {
            big_d += do_sh[e] * o_sh[e];
        }
        let keys = pos + 1;
        let splits = keys.div_ceil(comptime!(KV_SPLIT));
        // pass 1: the row's softmax max and sum, split by split in key order
        let mut run_max = f32::new(NEG_BIG);
        let mut run_sum = 0.0f32;
        for split in 0..splits {
            let first = split * comptime!(KV_SPLIT);
            let valid = keys_in_split(keys, first);
            stage_rows(k, &mut tile, start + first, valid, kv_heads, kv_head, head_dim);
            if unit < valid {
                scores[unit] = dot_tile_row(&q_sh, &tile, unit, head_dim) * scale;
            }
            sync_cube();
            let split_max = split_max(&scores, valid);
            let mut new_max = run_max;
            if split_max > new_max {
                new_max = split_max;
            }
            let mut split_sum = 0.0f32;
            for j in 0..valid {
                split_sum += (scores[j] - new_max).exp();
            }
            run_sum = run_sum * (run_max - new_max).exp() + split_sum;
            run_max = new_max;
            sync_cube();
        }
        // pass 2: dP (V staged), then dS (K staged), then dQ lane by lane in key order
        for split in 0..splits {
            let first = split * comptime!(KV_SPLIT);
            let valid = keys_in_split(keys, first);
            stage_rows(v, &mut tile, start + first, valid, kv_heads, kv_head, head_dim);
            let mut dp = 0.0f32;
            if unit < valid {
                dp = dot_tile_row(&do_sh, &tile, unit, head_dim);
            }
            sync_cube();
            stage_rows(k, &mut tile, start + first, valid, kv_heads, kv_head, head_dim);
            if unit < valid {
                let p = (dot_tile_row(&q_sh, &tile, unit, head_dim) * scale - run_max).exp() / run_sum;
                ds[unit] = p * (dp - big_d);
            }
            sync_cube();
            let mut d = unit;
            while d < head_dim {
                let mut acc = 0.0f32;
                for j in 0..valid {
                    acc += ds[j] * tile[j * comptime!(head_dim + 1) + d];
                }
                dq_sh[d] += acc;
                d += comptime!(KV_SPLIT);
            }
            sync_cube();
        }
        let mut d = unit;
        while d < head_dim {
            d_q[base + d] = dq_sh[d] * scale;
            d += comptime!(KV_SPLIT);
        }
        if unit == 0 {
            stats[work * 3] = run_max;
            stats[work * 3 + 1] = run_sum;
            stats[work * 3 + 2] = big_d;
        }
    }
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn attention_backward_key_kernel<F: Float, I: Int>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    d_out: &Tensor<F>,
    stats: &Tensor<f32>,
    starts: &Tensor<I>,
    positions: &Tensor<I>,
    lens: &Tensor<I>,
    d_k: &mut Tensor<f32>,
    d_v: &mut Tensor<f32>,
    rows_arg: u32,
    q_heads_arg: u32,
    kv_heads_arg: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let rows = rows_arg as usize;
    let q_heads = q_heads_arg as usize;
    let kv_heads = kv_heads_arg as usize;
    let group = q_heads / kv_heads;
    let work = cube_linear(); // key row * kv_heads + kv head
    if work < rows * kv_heads {
        let unit = UNIT_POS_X as usize;
        let row = work / kv_heads;
        let kv_head = work % kv_heads;
        let start = u32::cast_from(starts[row]) as usize;
        let key = u32::cast_from(positions[row]) as usize;
        let len = u32::cast_from(lens[row]) as usize;
        let base = work * head_dim;
        let mut k_sh = Shared::<[f32]>::new_slice(head_dim);
        let mut v_sh = Shared::<[f32]>::new_slice(head_dim);
        let mut dk_sh = Shared::<[f32]>::new_slice(head_dim);
        let mut dv_sh = Shared::<[f32]>::new_slice(head_dim);
        let mut p_sh = Shared::<[f32]>::new_slice(comptime!(KV_SPLIT));
        let mut ds_sh = Shared::<[f32]>::new_slice(comptime!(KV_SPLIT));
        let mut tile = Shared::<[f32]>::new_slice(comptime!(KV_SPLIT * (head_dim + 1)));
        load_row(k, &mut k_sh, base, head_dim);
        load_row(v, &mut v_sh, base, head_dim);
        let mut d = unit;
        while d < head_dim {
            dk_sh[d] = 0.0f32;
            dv_sh[d] = 0.0f32;
            d += comptime!(KV_SPLIT);
        }
        sync_cube();
        // the queries at positions key..len of the sequence
        let queries = len - key;
        let splits = queries.div_ceil(comptime!(KV_SPLIT));
        for split in 0..splits {
            let first = split * comptime!(KV_SPLIT);
            let valid = keys_in_split(queries, first);
            let first_row = start + key + first;
            for h in 0..group {
                let head = kv_head * group + h;
                // dP = dO . V with dO staged; then the scores with Q staged
                stage_rows(d_out, &mut tile, first_row, valid, q_heads, head, head_dim);
                let mut dp = 0.0f32;
                if unit < valid {
                    dp = dot_tile_row(&v_sh, &tile, unit, head_dim);
                }
                sync_cube();
                stage_rows(q, &mut tile, first_row, valid, q_heads, head, head_dim);
                if unit < valid {
                    let qw = (first_row + unit) * q_heads + head;
                    let p = (dot_tile_row(&k_sh, &tile, unit, head_dim) * scale - stats[qw * 3]).exp() / stats[qw * 3 + 1];
                    p_sh[unit] = p;
                    ds_sh[unit] = p * (dp - stats[qw * 3 + 2]);
                }
                sync_cube();
                let mut d = unit;
                while d < head_dim {
                    let mut acc_v = 0.0f32;
                    let mut acc_k = 0.0f32;
                    for j in 0..valid {
                        acc_v += p_sh[j] * f32::cast_from(d_out[((first_row + j) * q_heads + head) * head_dim + d]);
                        acc_k += ds_sh[j] * tile[j * comptime!(head_dim + 1) + d];
                    }
                    dv_sh[d] += acc_v;
                    dk_sh[d] += acc_k;
                    d += comptime!(KV_SPLIT);
                }
                sync_cube();
            }
        }
        let mut d = unit;
        while d < head_dim {
            d_k[base + d] = dk_sh[d] * scale;
            d_v[base + d] = dv_sh[d];
            d += comptime!(KV_SPLIT);
        }
    }
}

/// Scores a sequence's dense backward may hold, at most (`heads * t * t` f32 elements, 2 GiB:
/// a few tensors that size live at once). Past it the linear-memory kernels run.
pub const DENSE_SEQUENCE_SCORES: usize = 1 << 29;

/// `(dQ, dK, dV)` in the inputs' dtype for rows made of the contiguous `sequences` (first row,
/// length) in row order: each sequence's backward alone ([`dense_sequence`] or
/// [`attention_backward`] by its size), the results joined in row order. `forward_stats`: the
/// training forward's softmax statistics, which the tensor-core backward takes (ignored by the
/// other paths).
#[allow(clippy::too_many_arguments)]
pub fn sequence_backward(
    q: BTensor<3>,
    k: BTensor<3>,
    v: BTensor<3>,
    out: BTensor<3>,
    d_out: BTensor<3>,
    sequences: &[(usize, usize)],
    scale: f32,
    forward_stats: Option<BTensor<1>>,
) -> Result<(BTensor<3>, BTensor<3>, BTensor<3>), KernelError> {
    let dtype = q.dtype();
    let device = q.device();
    let ([_, q_heads, head_dim], [_, kv_heads, _]) = (q.dims(), k.dims());
    if crate::ops::attention::backward::mma_backward::backward_route(&q, head_dim, q_heads / kv_heads)? == crate::ops::attention::route::Kernel::MmaBackward {
        // every sequence at once on tensor cores: each tile reads its own sequence's rows only
        let fast = crate::kernel_choice::KernelChoice::current()?.backward_fast_math;
        let g = crate::ops::attention::backward::mma_backward::mma_attention_backward(q, k, v, out, d_out, sequences, scale, forward_stats, fast)?;
        return Ok((g.d_q, g.d_k, g.d_v));
    }
    let (mut dqs, mut dks, mut dvs) = (Vec::new(), Vec::new(), Vec::new());
    for &(start, len) in sequences {
        let rows = |t: &BTensor<3>, h: usize| t.clone().slice([start..start + len, 0..h, 0..head_dim]);
        let (q, k, v, d_out) = (rows(&q, q_heads), rows(&k, kv_heads), rows(&v, kv_heads), rows(&d_out, q_heads));
        // (the linear-memory kernels stage head_dim <= 128; wider heads stay dense)
        let (dq, dk, dv) = if q_heads * len * len <= DENSE_SEQUENCE_SCORES || head_dim > 128 {
            dense_sequence(q, k, v, d_out, scale)
        } else {
            let ints = |v: Vec<i32>| BTensor::<1, BInt>::from_data(TensorData::new(v, [len]), &device);
            let layout = (ints(vec![0; len]), ints(vec![len as i32; len]), ints((0..len as i32).collect()));
            attention_backward(q, k, v, rows(&out, q_heads), d_out, layout, scale)?
        };
        dqs.push(dq.cast(dtype));
        dks.push(dk.cast(dtype));
        dvs.push(dv.cast(dtype));
    }
    let join = |mut parts: Vec<BTensor<3>>| if parts.len() == 1 { parts.pop().expect("one sequence") } else { BTensor::cat(parts, 0) };
    Ok((join(dqs), join(dks), join(dvs)))
}

/// One sequence's causal attention backward in burn's f32 ops: `q` [t, q_heads, d], `k`/`v`
/// [t, kv_heads, d], `d_out` like q; returns f32 gradients in the inputs' shapes.
pub fn dense_sequence(q: BTensor<3>, k: BTensor<3>, v: BTensor<3>, d_out: BTensor<3>, scale: f32) -> (BTensor<3>, BTensor<3>, BTensor<3>) {
    let ([t, q_heads, head_dim], [_, kv_heads, _]) = (q.dims(), k.dims());
    let group = q_heads / kv_heads;
    let device = q.device();
    let heads_first = |x: BTensor<3>, heads: usize| x.cast(DType::F32).reshape([1, t, heads, head_dim]).swap_dims(1, 2);
    let expand = |x: BTensor<4>| x.unsqueeze_dim::<5>(2).repeat_dim(2, group).reshape([1, q_heads, t, head_dim]);
    // the query heads of one KV head added in head order
    let fold = |x: BTensor<4>| {
        let x = x.reshape([1, kv_heads, group, t, head_dim]);
        let head = |h: usize| x.clone().slice([0..1, 0..kv_heads, h..h + 1, 0..t, 0..head_dim]);
        (1..group).fold(head(0), |acc, h| acc + head(h)).reshape([1, kv_heads, t, head_dim])
    };
    let (qs, ks, vs, dos) = (heads_first(q, q_heads), expand(heads_first(k, kv_heads)), expand(heads_first(v, kv_heads)), heads_first(d_out, q_heads));
    let future = BTensor::<4, Bool>::tril_mask([1, 1, t, t], 0, &device).repeat_dim(1, q_heads);
    let scores = qs.clone().matmul(ks.clone().swap_dims(2, 3)).mul_scalar(scale as f64).mask_fill(future, -1.0e30);
    let probs = burn::tensor::activation::softmax(scores, 3);
    let d_v = probs.clone().swap_dims(2, 3).matmul(dos.clone());
    let d_p = dos.matmul(vs.swap_dims(2, 3));
    let d_s = probs.clone() * (d_p.clone() - (d_p * probs).sum_dim(3));
    let d_q = d_s.clone().matmul(ks).mul_scalar(scale as f64);
    let d_k = d_s.swap_dims(2, 3).matmul(qs).mul_scalar(scale as f64);
    let rows_first = |x: BTensor<4>, heads: usize| x.swap_dims(1, 2).reshape([t, heads, head_dim]);
    (rows_first(d_q, q_heads), rows_first(fold(d_k), kv_heads), rows_first(fold(d_v), kv_heads))
}

/// Where each row's sequence starts and how long it is, when every sequence's rows are
/// contiguous and in position order (`None` otherwise: the caller then takes the dense path).
pub fn contiguous_sequences(slots: &[u32], positions: &[u32]) -> Option<(Vec<i32>, Vec<i32>)> {
    let rows = slots.len();
    let mut starts = vec![0i32; rows];
    let mut lens = vec![0i32; rows];
    let mut r = 0;
    while r < rows {
        if positions[r] != 0 {
            return None;
        }
        let mut end = r + 1;
        while end < rows && slots[end] == slots[r] && positions[end] as usize == end - r {
            end += 1;
        }
        if end < rows && slots[end] == slots[r] {
            return None;
        }
        for i in r..end {
            starts[i] = r as i32;
            lens[i] = (end - r) as i32;
        }
        r = end;
    }
    Some((starts, lens))
}

/// `(dQ, dK, dV)` in f32 of causal attention over `q` [rows, q_heads, d], `k`/`v` [rows,
/// kv_heads, d] with forward output `out` and its gradient `d_out` (q's shape), for rows laid
/// out as [`contiguous_sequences`] found (`starts`, `lens` from it; `positions` the rows').
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    q: BTensor<3>,
    k: BTensor<3>,
    v: BTensor<3>,
    out: BTensor<3>,
    d_out: BTensor<3>,
    (starts, lens, positions): (BTensor<1, BInt>, BTensor<1, BInt>, BTensor<1, BInt>),
    scale: f32,
) -> Result<(BTensor<3>, BTensor<3>, BTensor<3>), KernelError> {
    const OP: &str = "attention_backward";
    let (q, k, v, out, d_out) = (float_in(OP, "q", q)?, float_in(OP, "k", k)?, float_in(OP, "v", v)?, float_in(OP, "out", out)?, float_in(OP, "d_out", d_out)?);
    let (starts, lens, positions) = (int_in(OP, "starts", starts)?, int_in(OP, "lens", lens)?, int_in(OP, "positions", positions)?);
    let (qd, kd) = (dims(&q), dims(&k));
    ensure!(qd.len() == 3 && kd.len() == 3 && kd == dims(&v), OP, "q {qd:?}, k {kd:?}, v {:?}", dims(&v));
    let (rows, q_heads, head_dim) = (qd[0], qd[1], qd[2]);
    let kv_heads = kd[1];
    ensure!(kd[0] == rows && kd[2] == head_dim && kv_heads > 0 && q_heads % kv_heads == 0, OP, "q {qd:?} and k {kd:?} do not pair");
    ensure!(dims(&out) == qd && dims(&d_out) == qd, OP, "out and d_out must be {qd:?}");
    ensure!(dims(&starts) == [rows] && dims(&lens) == [rows] && dims(&positions) == [rows], OP, "starts, lens and positions must have {rows} rows");
    ensure!(q.dtype == k.dtype && q.dtype == v.dtype && q.dtype == out.dtype && q.dtype == d_out.dtype, OP, "dtypes differ");
    // a staged tile of KV_SPLIT rows must fit the 48 KB of shared memory every device gives
    ensure!(head_dim <= 128, OP, "head_dim {head_dim}: the linear-memory backward stages {KV_SPLIT} x (head_dim + 1) f32 values, at most head_dim 128");
    let client = q.client.clone();
    let device = q.device.clone();
    let f32_of = |shape: Vec<usize>| empty_device_contiguous_dtype(client.clone(), device.clone(), shape.into(), DType::F32);
    let d_q = f32_of(qd.clone());
    let stats = f32_of(vec![rows * q_heads * 3]);
    let (d_k, d_v) = (f32_of(kd.clone()), f32_of(kd.clone()));
    let (fdt, idt) = (storage(q.dtype), storage(starts.dtype));
    attention_backward_query_kernel::launch(
        &client,
        cube_count_for(rows * q_heads, 1),
        CubeDim::new_1d(KV_SPLIT as u32),
        q.clone().into_tensor_arg(),
        k.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        out.into_tensor_arg(),
        d_out.clone().into_tensor_arg(),
        starts.clone().into_tensor_arg(),
        positions.clone().into_tensor_arg(),
        d_q.clone().into_tensor_arg(),
        stats.clone().into_tensor_arg(),
        rows as u32,
        q_heads as u32,
        kv_heads as u32,
        scale,
        head_dim,
        [fdt, idt],
    );
    attention_backward_key_kernel::launch(
        &client,
        cube_count_for(rows * kv_heads, 1),
        CubeDim::new_1d(KV_SPLIT as u32),
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        d_out.into_tensor_arg(),
        stats.into_tensor_arg(),
        starts.into_tensor_arg(),
        positions.into_tensor_arg(),
        lens.into_tensor_arg(),
        d_k.clone().into_tensor_arg(),
        d_v.clone().into_tensor_arg(),
        rows as u32,
        q_heads as u32,
        kv_heads as u32,
        scale,
        head_dim,
        [fdt, idt],
    );
    Ok((float_out(d_q), float_out(d_k), float_out(d_v)))
}

#[cfg(test)]
mod tests {
    use super::contiguous_sequences;

    #[test]
    fn finds_contiguous_sequences_and_refuses_other_layouts() {
        let (starts, lens) = contiguous_sequences(&[0, 0, 0, 1, 1, 2], &[0, 1, 2, 0, 1, 0]).expect("contiguous");
        assert_eq!(starts, vec![0, 0, 0, 3, 3, 5]);
        assert_eq!(lens, vec![3, 3, 3, 2, 2, 1]);
        assert!(contiguous_sequences(&[0, 1, 0], &[0, 0, 1]).is_none(), "a sequence split by another");
        assert!(contiguous_sequences(&[0, 0], &[1, 0]).is_none(), "positions out of order");
    }
}
