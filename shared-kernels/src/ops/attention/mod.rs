//! Causal grouped-query attention over a KV cache, one code path for prefill, chunked prefill
//! and decode.
//!
//! Every query row names a cache slot (its sequence) and its position p; it attends to keys
//! 0..=p of that slot. Prefill writes a chunk's K/V into the cache first ([`write_kv_cache`]),
//! then runs this kernel for the chunk's rows; decode is the same with one row per sequence.
//! So the arithmetic for a (query, KV prefix) pair never depends on chunk boundaries or on the
//! other rows in the launch:
//! - keys are visited in fixed splits of `KV_SPLIT` starting at key 0 (split boundaries are
//!   multiples of KV_SPLIT, not of any chunk size);
//! - inside a split, each score is one sequential dot product over head_dim;
//! - splits are combined in key order with the online-softmax update (running max, running
//!   denominator, running output), always the same sequence of operations for a given p.

pub mod backward;
pub mod inputs;
pub mod mma;
pub mod mma_backward;
pub mod mma_decode;
pub mod mma_flash;
pub mod cmma;
pub mod cmma_flash;
pub mod split_kv;
pub mod splits;
pub mod tensor_cores;

use crate::ops::reduce::{cube_linear, NEG_BIG};
pub use crate::ops::kv_cache::{copy_cache_rows, write_kv_cache, KvCacheShape};
pub(crate) use crate::ops::kv_cache::{cache_row, cache_shape};
pub use crate::ops::kv_cache::{BlockRows, BLOCK};
pub use splits::KV_SPLIT;
pub(crate) use splits::{device_table, keys_in_split, load_query, split_max, split_scores};
use crate::ops::{cube_count_for, storage};
use crate::bridge::{dims, float_in, float_out, int_in, same_device};
use crate::{ensure, KernelError};
use burn::tensor::{DType, Int as BInt, Tensor as BTensor, TensorData};
use crate::autodiff::{cube, from_tracked, inner, plain, tracked, tracked_in};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;


#[cube(launch)]
fn attention_kernel<F: Float, I: Int>(
    q: &Tensor<F>,
    k_cache: &Tensor<F>,
    v_cache: &Tensor<F>,
    slots: &Tensor<I>,
    positions: &Tensor<I>,
    block_rows: &Tensor<I>,
    out: &mut Tensor<F>,
    rows_arg: u32,
    q_heads_arg: u32,
    kv_heads_arg: u32,
    width_arg: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let rows = rows_arg as usize;
    let q_heads = q_heads_arg as usize;
    let kv_heads = kv_heads_arg as usize;
    let width = width_arg as usize;
    let work = cube_linear(); // row * q_heads + head
    if work < rows * q_heads {
        let unit = UNIT_POS_X as usize;
        let row = work / q_heads;
        let head = work % q_heads;
        let kv_head = head / (q_heads / kv_heads);
        let slot = u32::cast_from(slots[row]) as usize;
        let pos = u32::cast_from(positions[row]) as usize;
        let q_base = work * head_dim;

        let mut q_sh = Shared::new_slice(head_dim);
        let mut o_sh = Shared::new_slice(head_dim);
        let mut scores = Shared::<[f32]>::new_slice(comptime!(KV_SPLIT));
        // each unit owns output dims d = unit, unit + KV_SPLIT, ...
        let mut d = unit;
        while d < head_dim {
            o_sh[d] = 0.0f32;
            d += comptime!(KV_SPLIT);
        }
        load_query(q, &mut q_sh, q_base, head_dim);

        let keys = pos + 1;
        let splits = keys.div_ceil(comptime!(KV_SPLIT));
        let mut run_max = f32::new(NEG_BIG);
        let mut run_sum = 0.0f32;
        for split in 0..splits {
            let first = split * comptime!(KV_SPLIT);
            let valid = keys_in_split(keys, first);
            let split_row = cache_row(block_rows, slot, width, first);
            // 1. one score per unit, sequential dot product over head_dim
            split_scores(&q_sh, k_cache, &mut scores, split_row, kv_heads, kv_head, valid, scale, head_dim);
            // 2. every unit walks the split's scores in key order (same values, same order)
            let split_max = split_max(&scores, valid);
            let mut new_max = run_max;
            if split_max > new_max {
                new_max = split_max;
            }
            let rescale = (run_max - new_max).exp();
            let mut split_sum = 0.0f32;
            for j in 0..valid {
                split_sum += (scores[j] - new_max).exp();
            }
            run_sum = run_sum * rescale + split_sum;
            // 3. each unit owns output dims d = unit, unit + KV_SPLIT, ...
            let mut d = unit;
            while d < head_dim {
                let mut acc = 0.0f32;
                for j in 0..valid {
                    let v_index = ((split_row + j) * kv_heads + kv_head) * head_dim + d;
                    acc += (scores[j] - new_max).exp() * f32::cast_from(v_cache[v_index]);
                }
                o_sh[d] = o_sh[d] * rescale + acc;
                d += comptime!(KV_SPLIT);
            }
            run_max = new_max;
            sync_cube();
        }
        let mut d = unit;
        while d < head_dim {
            out[q_base + d] = F::cast_from(o_sh[d] / run_sum);
            d += comptime!(KV_SPLIT);
        }
    }
}

/// Attention for query rows `q` [rows, q_heads, head_dim]: row r attends to keys 0..=positions[r]
/// of cache slot slots[r]. `scale` is usually 1/sqrt(head_dim). Output has q's shape and dtype.
pub fn attention(
    q: BTensor<3>,
    k_cache: BTensor<4>,
    v_cache: BTensor<4>,
    slots: BTensor<1, BInt>,
    positions: BTensor<1, BInt>,
    scale: f32,
) -> Result<BTensor<3>, KernelError> {
    attention_with(None, q, k_cache, v_cache, slots, positions, scale)
}

/// The attention kernels; all batch and chunk invariant, with different arithmetic, so one is
/// chosen per process (`LOCKSTEP_ATTENTION`) and device, dtype and head size, never per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionKernel {
    /// One cube per (row, head) walking the splits in order (this file's kernel).
    Sequential,
    /// One cube per (row, head, split), then a fixed-order combine ([`crate::ops::attention::split_kv`]).
    SplitKv,
    /// Split-KV with the split's products on tensor cores ([`crate::ops::attention::cmma`]; CUDA, bf16/f16).
    SplitKvTensorCore,
}

/// `LOCKSTEP_ATTENTION` = sequential | split_kv | split_kv_tc | auto (read once per process);
/// unset or `auto` gives `None`: split_kv_tc where [`crate::ops::attention::tensor_cores::tc_attention_available`]
/// holds, split_kv elsewhere (a function of device, dtype and head size only). An unknown value
/// is an error naming the variable.
pub fn process_attention_kernel() -> Result<Option<AttentionKernel>, KernelError> {
    static KERNEL: std::sync::OnceLock<Result<Option<AttentionKernel>, String>> = std::sync::OnceLock::new();
    KERNEL
        .get_or_init(|| match crate::knobs::var("LOCKSTEP_ATTENTION").as_deref().ok_or(()) {
            Ok("sequential") => Ok(Some(AttentionKernel::Sequential)),
            Ok("split_kv") => Ok(Some(AttentionKernel::SplitKv)),
            Ok("split_kv_tc") => Ok(Some(AttentionKernel::SplitKvTensorCore)),
            Err(_) | Ok("auto") => Ok(None),
            Ok(other) => Err(format!("LOCKSTEP_ATTENTION={other:?} is not one of auto, split_kv_tc, split_kv, sequential")),
        })
        .clone()
        .map_err(|e| KernelError::new("attention", e))
}

/// The kernel [`attention`] runs on `device` for `dtype` and `head_dim` under this process's
/// `LOCKSTEP_ATTENTION` (for report headers and the battery).
pub fn attention_kernel_on(device: &burn::tensor::Device, dtype: DType, head_dim: usize) -> Result<AttentionKernel, KernelError> {
    let probe = float_in("attention", "probe", BTensor::<1>::zeros([1], device))?;
    resolve_kernel(None, crate::ops::attention::tensor_cores::tc_attention_available(&probe.client, dtype, head_dim))
}

/// The kernel a call runs: the one it names, else the process's `LOCKSTEP_ATTENTION`, else
/// (`auto`) split_kv_tc where the tensor-core kernel runs (`tc_ok`) and split_kv elsewhere.
fn resolve_kernel(requested: Option<AttentionKernel>, tc_ok: bool) -> Result<AttentionKernel, KernelError> {
    Ok(match requested.map_or_else(process_attention_kernel, |k| Ok(Some(k)))? {
        Some(k) => k,
        None if tc_ok => AttentionKernel::SplitKvTensorCore,
        None => AttentionKernel::SplitKv,
    })
}

/// "F32 split_kv, BF16 split_kv_tc": the attention kernel each dtype runs on `device` at
/// `head_dim`, for report headers.
pub fn attention_kernels_summary(device: &burn::tensor::Device, head_dim: usize) -> String {
    [DType::F32, DType::BF16]
        .iter()
        .map(|&d| format!("{d:?} {}", attention_kernel_on(device, d, head_dim).map_or("unavailable", |k| k.name())))
        .collect::<Vec<_>>()
        .join(", ")
}

impl AttentionKernel {
    pub fn name(self) -> &'static str {
        match self {
            AttentionKernel::Sequential => "sequential",
            AttentionKernel::SplitKv => "split_kv",
            AttentionKernel::SplitKvTensorCore => "split_kv_tc",
        }
    }
}

/// [`attention`] on a named kernel instead of the process's choice (tests and benchmarks).
pub fn attention_with(
    kernel: Option<AttentionKernel>,
    q: BTensor<3>,
    k_cache: BTensor<4>,
    v_cache: BTensor<4>,
    slots: BTensor<1, BInt>,
    positions: BTensor<1, BInt>,
    scale: f32,
) -> Result<BTensor<3>, KernelError> {
    attention_impl(kernel, q, k_cache, v_cache, slots, positions, scale, None, None)
}

/// [`attention_with`] for rows whose slots the caller also has on the host (`host_slots`, equal
/// to `slots`): runs of rows of one sequence (prefill) then share each staged KV split
/// ([`crate::ops::attention::split_kv`]'s tiled kernel). The same bits as without.
pub fn attention_rows(
    kernel: Option<AttentionKernel>,
    q: BTensor<3>,
    k_cache: BTensor<4>,
    v_cache: BTensor<4>,
    slots: BTensor<1, BInt>,
    positions: BTensor<1, BInt>,
    host_slots: &[u32],
    scale: f32,
) -> Result<BTensor<3>, KernelError> {
    attention_impl(kernel, q, k_cache, v_cache, slots, positions, scale, Some(host_slots), None)
}

/// The forward's attention for rows known on the host: split-KV's prefill tiles where they
/// were measured to pay (CUDA: 1.5-1.8x on 1024-token prompts, docs/perf.md), the per-row
/// kernel elsewhere (lavapipe: tiles 1.3-1.4x slower, `lockstep bench` attention prefill rows).
/// Tiles or not, the bits are the same, so the choice may follow the runtime. `pages`: where
/// the cache's sequences live (`None`: a contiguous `[slots, max_len, ..]` cache).
#[allow(clippy::too_many_arguments)]
pub fn attention_for_rows(
    q: BTensor<3>,
    k_cache: BTensor<4>,
    v_cache: BTensor<4>,
    slots: BTensor<1, BInt>,
    positions: BTensor<1, BInt>,
    host_slots: &[u32],
    scale: f32,
    pages: Option<&BlockRows>,
) -> Result<BTensor<3>, KernelError> {
    let tiles = (crate::device::runtime_name() == "cuda").then_some(host_slots);
    attention_impl(None, q, k_cache, v_cache, slots, positions, scale, tiles, pages)
}



#[allow(clippy::too_many_arguments)]
fn attention_impl(
    kernel: Option<AttentionKernel>,
    q: BTensor<3>,
    k_cache: BTensor<4>,
    v_cache: BTensor<4>,
    slots: BTensor<1, BInt>,
    positions: BTensor<1, BInt>,
    scale: f32,
    host_slots: Option<&[u32]>,
    pages: Option<&BlockRows>,
) -> Result<BTensor<3>, KernelError> {
    const OP: &str = "attention";
    let device = q.device();
    let q = float_in(OP, "q", q)?;
    let k = float_in(OP, "k_cache", k_cache)?;
    let v = float_in(OP, "v_cache", v_cache)?;
    let slots = int_in(OP, "slots", slots)?;
    let positions = int_in(OP, "positions", positions)?;
    same_device(OP, &q, &k, "k_cache")?;
    same_device(OP, &q, &v, "v_cache")?;
    let shape = cache_shape(OP, &dims(&k))?;
    ensure!(dims(&v) == dims(&k), OP, "k_cache is {:?} but v_cache is {:?}", dims(&k), dims(&v));
    let qd = dims(&q);
    let (rows, q_heads, head_dim) = (qd[0], qd[1], qd[2]);
    ensure!(head_dim == shape.head_dim, OP, "q is {qd:?} but the cache has head_dim {}", shape.head_dim);
    ensure!(q_heads > 0 && q_heads % shape.kv_heads == 0, OP, "q_heads {q_heads} is not a multiple of kv_heads {}", shape.kv_heads);
    ensure!(dims(&slots) == [rows] && dims(&positions) == [rows], OP, "q has {rows} rows but slots is {:?} and positions {:?}", dims(&slots), dims(&positions));
    ensure!(q.dtype == k.dtype && k.dtype == v.dtype, OP, "dtypes differ: q {:?}, k {:?}, v {:?}", q.dtype, k.dtype, v.dtype);
    ensure!(scale.is_finite(), OP, "scale must be finite, got {scale}");
    ensure!(rows > 0, OP, "no query rows");
    let tc_ok = crate::ops::attention::tensor_cores::tc_attention_available(&q.client, q.dtype, head_dim);
    let kernel = resolve_kernel(kernel, tc_ok)?;
    if let Some(h) = host_slots {
        ensure!(h.len() == rows, OP, "{} host slots for {rows} rows", h.len());
    }
    // (first row, rows) tables on the device, in the slots' integer type (the kernels read them so)
    let int_dtype = slots.dtype;
    let upload = |values: Vec<i32>| device_table(OP, values, int_dtype, &device);
    // the positions a sequence may have: the cache's second dimension, or the block table's
    let pages = match pages {
        Some(p) => p.clone(),
        None => BlockRows::contiguous(&shape, int_dtype, &device)?,
    };
    ensure!(pages.table.dtype == int_dtype, OP, "the block table is {:?} but slots are {:?}", pages.table.dtype, int_dtype);
    let max_len = pages.max_len();
    let dims = (rows, q_heads, shape.kv_heads, max_len, head_dim);
    if kernel == AttentionKernel::SplitKvTensorCore {
        ensure!(tc_ok, OP, "the split_kv_tc attention kernel (LOCKSTEP_ATTENTION=split_kv_tc) needs CUDA tensor cores, bf16 or f16 and head_dim 32, 64, 96 or 128; got {:?}, head_dim {head_dim} on {}", q.dtype, crate::device::runtime_name());
        // every cache length: this kernel's bits differ from the sequential kernel's even
        // within one split
        let kernels = crate::ops::attention::tensor_cores::tc_kernels()?;
        let rows_per_tile = kernels.prefill_queries()? / crate::ops::attention::tensor_cores::heads_per_cube(q_heads / shape.kv_heads);
        let tiles = crate::ops::attention::tensor_cores::tc_tiles(host_slots, rows, rows_per_tile);
        let contiguous = |x: burn_cubecl::tensor::CubeTensor| if x.is_contiguous() { x } else { burn_cubecl::kernel::into_contiguous(x) };
        let q = contiguous(q);
        return Ok(float_out(crate::ops::attention::tensor_cores::tc_split_kv_attention(&q, contiguous(k), contiguous(v), &slots, positions, &pages, dims, scale, &tiles, kernels, upload)?));
    }
    // With at most KV_SPLIT cache positions every prefix fits one split, where the two kernels
    // give the same bits (tests/kernels/attention_chunking.rs, battery): the one-launch kernel
    // then does split_kv's work. The rule depends on the cache shape only, never on the rows.
    if kernel == AttentionKernel::SplitKv && max_len > KV_SPLIT {
        let tiles = match host_slots.and_then(crate::ops::attention::split_kv::row_tiles) {
            Some(tiles) => Some((upload(tiles.iter().flat_map(|&(first, n)| [first as i32, n as i32]).collect())?, tiles.len())),
            None => None,
        };
        return Ok(float_out(crate::ops::attention::split_kv::split_kv_attention(&q, k, v, &slots, positions, &pages, dims, scale, tiles)));
    }
    let out = empty_device_contiguous_dtype(q.client.clone(), q.device.clone(), qd.clone().into(), q.dtype);
    attention_kernel::launch(
        &q.client,
        cube_count_for(rows * q_heads, 1),
        CubeDim::new_1d(KV_SPLIT as u32),
        q.clone().into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        slots.clone().into_tensor_arg(),
        positions.into_tensor_arg(),
        pages.table.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        rows as u32,
        q_heads as u32,
        shape.kv_heads as u32,
        pages.width as u32,
        scale,
        head_dim,
        [storage(q.dtype), storage(slots.dtype)],
    );
    Ok(float_out(out))
}

/// Causal self-attention for whole sequences given as rows (the training path): row r is token
/// `positions[r]` of sequence `slots[r]`, and every sequence's positions 0..len must all be
/// present. It writes the rows' K/V into a fresh cache and runs [`attention`], the very kernels
/// the sampler's prefill and decode run, so its bits equal theirs. Differentiable when the
/// inputs are on an autodiff device (backward: one sequence at a time,
/// [`crate::ops::attention::backward::sequence_backward`], where every sequence's rows are contiguous
/// and in order; else dense attention over padded groups of sequences in burn ops).
pub fn causal_attention(
    q: BTensor<3>,
    k: BTensor<3>,
    v: BTensor<3>,
    slots: &[u32],
    positions: &[u32],
    scale: f32,
) -> Result<BTensor<3>, KernelError> {
    const OP: &str = "causal_attention";
    let rows = slots.len();
    ensure!(positions.len() == rows && q.dims()[0] == rows, OP, "q has {} rows, slots {rows}, positions {}", q.dims()[0], positions.len());
    let n_slots = slots.iter().max().map_or(0, |&s| s as usize + 1);
    let mut lens = vec![0usize; n_slots];
    for &s in slots {
        lens[s as usize] += 1;
    }
    let mut seen: Vec<Vec<bool>> = lens.iter().map(|&l| vec![false; l]).collect();
    for (&s, &p) in slots.iter().zip(positions) {
        let slot_seen = &mut seen[s as usize];
        ensure!((p as usize) < slot_seen.len() && !slot_seen[p as usize], OP, "sequence {s}: position {p} is repeated or beyond its {} rows; each sequence needs positions 0..len exactly once", slot_seen.len());
        slot_seen[p as usize] = true;
    }
    let max_len = lens.iter().copied().max().unwrap_or(0).max(1);
    if !q.is_autodiff() {
        return causal_attention_plain(q, k, v, slots, positions, n_slots, max_len, scale);
    }
    let (qa, ka, va) = (tracked_in(OP, "q", q)?, tracked_in(OP, "k", k)?, tracked_in(OP, "v", v)?);
    let (qp, kp, vp) = (plain::<3>(inner(&qa)), plain::<3>(inner(&ka)), plain::<3>(inner(&va)));
    let out = causal_attention_plain(qp.clone(), kp.clone(), vp.clone(), slots, positions, n_slots, max_len, scale)?;
    if let Some((starts, seq_lens)) = crate::ops::attention::backward::contiguous_sequences(slots, positions) {
        // the training layout: each sequence's backward alone, so its bits are its own
        let sequences: Vec<(usize, usize)> = (0..rows).filter(|&r| starts[r] as usize == r).map(|r| (r, seq_lens[r] as usize)).collect();
        let saved_out = out.clone();
        return Ok(from_tracked(tracked([&qa, &ka, &va], cube(out), move |d_out| {
            let (dq, dk, dv) = crate::ops::attention::backward::sequence_backward(qp, kp, vp, saved_out, plain::<3>(d_out), &sequences, scale)
                .expect("attention backward: shapes checked in forward");
            [Some(cube(dq)), Some(cube(dk)), Some(cube(dv))]
        })));
    }
    let q_heads = qp.dims()[1];
    let groups = backward_groups(&lens, q_heads);
    if let Some(&(first, _, t)) = groups.iter().find(|&&(first, end, t)| (end - first) * q_heads * t * t > u32::MAX as usize) {
        let longest = ((u32::MAX as usize / q_heads) as f64).sqrt() as usize;
        return Err(KernelError::new(OP, format!("sequence {first} has {t} tokens: the dense attention backward's [1, {q_heads}, {t}, {t}] scores exceed the 32-bit index range (at most {longest} tokens a sequence with {q_heads} heads)")));
    }
    // row r sits at place `padded[r]` of the groups' padded rows laid end to end
    let mut group_of = vec![0usize; n_slots];
    let mut group_base = Vec::with_capacity(groups.len());
    let mut base = 0;
    for (g, &(first, end, t)) in groups.iter().enumerate() {
        group_of[first..end].iter_mut().for_each(|x| *x = g);
        group_base.push(base);
        base += (end - first) * t;
    }
    let padded_rows = base;
    let mut place = vec![0i32; rows];
    // per group: padded [sequence, position] -> row index; padding points at an extra all-zero row
    let pad_row = rows as i32;
    let mut index: Vec<Vec<i32>> = groups.iter().map(|&(first, end, t)| vec![pad_row; (end - first) * t]).collect();
    for (r, (&s, &p)) in slots.iter().zip(positions).enumerate() {
        let g = group_of[s as usize];
        let (first, _, t) = groups[g];
        let at = (s as usize - first) * t + p as usize;
        index[g][at] = r as i32;
        place[r] = (group_base[g] + at) as i32;
    }
    Ok(from_tracked(tracked([&qa, &ka, &va], cube(out), move |d_out| {
        // dense attention backward, a group of sequences at a time (each padded to its longest),
        // so the [sequences, heads, t, t] scores stay within BACKWARD_SCORES elements
        let d_out = plain::<3>(d_out);
        let dtype = qp.dtype();
        let device = qp.device();
        let [_, q_heads, head_dim] = qp.dims();
        let kv_heads = kp.dims()[1];
        let group = q_heads / kv_heads;
        let (mut dqs, mut dks, mut dvs) = (Vec::new(), Vec::new(), Vec::new());
        for (g, &(first, end, t)) in groups.iter().enumerate() {
            let b = end - first;
            let idx = BTensor::<1, BInt>::from_data(TensorData::new(index[g].clone(), [b * t]), &device);
            let padded = |x: BTensor<3>, heads: usize| -> BTensor<4> {
                let x = x.cast(DType::F32);
                let zero = BTensor::<3>::zeros([1, heads, head_dim], &device);
                BTensor::cat(vec![x, zero], 0).select(0, idx.clone()).reshape([b, t, heads, head_dim]).swap_dims(1, 2)
            };
            let expand = |x: BTensor<4>| x.unsqueeze_dim::<5>(2).repeat_dim(2, group).reshape([b, q_heads, t, head_dim]);
            // the query heads of one KV head added in head order (burn's reduce over a middle axis
            // of size `group` is one unit per output walking a strided axis: slow, measured)
            let fold = |x: BTensor<4>| {
                let x = x.reshape([b, kv_heads, group, t, head_dim]);
                let head = |h: usize| x.clone().slice([0..b, 0..kv_heads, h..h + 1, 0..t, 0..head_dim]);
                (1..group).fold(head(0), |acc, h| acc + head(h)).reshape([b, kv_heads, t, head_dim])
            };
            let (qs, ks, vs, dos) = (padded(qp.clone(), q_heads), expand(padded(kp.clone(), kv_heads)), expand(padded(vp.clone(), kv_heads)), padded(d_out.clone(), q_heads));
            let mask = causal_mask(&lens[first..end], t, &device);
            let scores = qs.clone().matmul(ks.clone().swap_dims(2, 3)).mul_scalar(scale as f64) + mask;
            let probs = burn::tensor::activation::softmax(scores, 3);
            let d_v = probs.clone().swap_dims(2, 3).matmul(dos.clone());
            let d_p = dos.matmul(vs.swap_dims(2, 3));
            let d_s = probs.clone() * (d_p.clone() - (d_p * probs).sum_dim(3));
            let d_q = d_s.clone().matmul(ks).mul_scalar(scale as f64);
            let d_k = d_s.swap_dims(2, 3).matmul(qs).mul_scalar(scale as f64);
            let flat = |x: BTensor<4>, heads: usize| x.swap_dims(1, 2).reshape([b * t, heads, head_dim]);
            dqs.push(flat(d_q, q_heads));
            dks.push(flat(fold(d_k), kv_heads));
            dvs.push(flat(fold(d_v), kv_heads));
        }
        // each row's gradient is read back from its padded place (a gather: burn's select_assign
        // into zeros took 0.4 ms a call on the H200)
        let row_place = BTensor::<1, BInt>::from_data(TensorData::new(place.clone(), [rows]), &device);
        let unpad = |mut parts: Vec<BTensor<3>>| -> BTensor<3> {
            let all = if parts.len() == 1 { parts.pop().expect("one group") } else { BTensor::cat(parts, 0) };
            debug_assert_eq!(all.dims()[0], padded_rows);
            all.select(0, row_place.clone()).cast(dtype)
        };
        [Some(cube(unpad(dqs))), Some(cube(unpad(dks))), Some(cube(unpad(dvs)))]
    })))
}

/// Elements of one backward group's `[sequences, heads, t, t]` f32 scores, at most (1 GiB): a
/// step's sequences are walked in order and cut into groups that stay within it (a sequence
/// longer than that alone is its own group). Steps that fit in one group are computed as one
/// padded batch, as before groups existed.
pub const BACKWARD_SCORES: usize = 1 << 28;


/// Consecutive sequences `[first, end)` and their longest length `t`, each group's
/// `(end - first) * heads * t * t` within [`BACKWARD_SCORES`] unless it holds one sequence.
fn backward_groups(lens: &[usize], heads: usize) -> Vec<(usize, usize, usize)> {
    let mut groups = Vec::new();
    let mut first = 0;
    while first < lens.len() {
        let mut end = first + 1;
        let mut t = lens[first].max(1);
        while end < lens.len() {
            let wider = t.max(lens[end]);
            if (end + 1 - first) * heads * wider * wider > BACKWARD_SCORES {
                break;
            }
            t = wider;
            end += 1;
        }
        groups.push((first, end, t));
        first = end;
    }
    groups
}

/// The backward's additive mask `[sequences, 1, t, t]`: -1e30 where key j is after query i or
/// past its sequence's length. Every layer's backward in a step has the same sequences, so the
/// mask is built and uploaded once per step, not once per layer (at 32 x 128 tokens and 28
/// layers that was 14.7 M host iterations and 56 MB of uploads per step); equal content, equal
/// tensor.
fn causal_mask(lens: &[usize], t: usize, device: &burn::tensor::Device) -> BTensor<4> {
    if let Some(mask) = MASKS.with(|masks| masks.borrow().iter().find(|m| m.0 == lens && m.1 == t && &m.2 == device).map(|m| m.3.clone())) {
        return mask;
    }
    let b = lens.len();
    let mut mask = vec![0.0f32; b * t * t];
    for (seq, len) in lens.iter().enumerate() {
        for i in 0..t {
            for j in 0..t {
                if j > i || j >= *len {
                    mask[(seq * t + i) * t + j] = -1.0e30;
                }
            }
        }
    }
    let mask = BTensor::<4>::from_data(TensorData::new(mask, [b, 1, t, t]), device);
    MASKS.with(|masks| {
        let mut masks = masks.borrow_mut();
        masks.insert(0, (lens.to_vec(), t, device.clone(), mask.clone()));
        masks.truncate(CACHED_MASKS);
    });
    mask
}

type MaskEntry = (Vec<usize>, usize, burn::tensor::Device, BTensor<4>);
const CACHED_MASKS: usize = 2;
thread_local! {
    static MASKS: std::cell::RefCell<Vec<MaskEntry>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[allow(clippy::too_many_arguments)]
fn causal_attention_plain(
    q: BTensor<3>,
    k: BTensor<3>,
    v: BTensor<3>,
    slots: &[u32],
    positions: &[u32],
    n_slots: usize,
    max_len: usize,
    scale: f32,
) -> Result<BTensor<3>, KernelError> {
    let device = q.device();
    let [_, kv_heads, head_dim] = k.dims();
    let dtype = k.dtype();
    let empty = || BTensor::<4>::zeros([n_slots, max_len, kv_heads, head_dim], &device).cast(dtype);
    let ints = |v: &[u32]| BTensor::<1, BInt>::from_data(TensorData::new(v.iter().map(|&x| x as i32).collect::<Vec<_>>(), [v.len()]), &device);
    let (slot_t, pos_t) = (ints(slots), ints(positions));
    // one block table for the two writes and the attention (each layer calls this)
    let shape = KvCacheShape { slots: n_slots, max_len, kv_heads, head_dim };
    let int_dtype = crate::bridge::int_in("causal_attention", "slots", slot_t.clone())?.dtype;
    let pages = BlockRows::contiguous(&shape, int_dtype, &device)?;
    let k_cache = crate::ops::kv_cache::write_kv_cache_paged(empty(), k, slot_t.clone(), pos_t.clone(), Some(&pages))?;
    let v_cache = crate::ops::kv_cache::write_kv_cache_paged(empty(), v, slot_t.clone(), pos_t.clone(), Some(&pages))?;
    attention_for_rows(q, k_cache, v_cache, slot_t, pos_t, slots, scale, Some(&pages))
}
