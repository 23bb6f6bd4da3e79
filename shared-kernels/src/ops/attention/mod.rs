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
pub mod common;
pub mod decode;
pub mod prefill;
pub mod causal;
pub mod route;
pub mod tensor_cores;

use crate::ops::reduce::{cube_linear, NEG_BIG};
pub use crate::ops::kv_cache::{copy_cache_rows, write_kv_cache, KvCacheShape};
pub(crate) use crate::ops::kv_cache::{cache_row, cache_shape};
pub use crate::ops::kv_cache::{BlockRows, BLOCK};
pub use causal::causal_attention;
pub use common::splits::KV_SPLIT;
pub(crate) use common::splits::{device_table, keys_in_split, load_query, split_max, split_scores};
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


pub use crate::kernel_choice::AttentionKernel;

/// The process's `LOCKSTEP_ATTENTION` ([`crate::kernel_choice::KernelChoice`]); `None`: auto.
pub fn process_attention_kernel() -> Result<Option<AttentionKernel>, KernelError> {
    Ok(crate::kernel_choice::KernelChoice::current()?.attention)
}

/// The kernel [`attention`] runs on `device` for `dtype` and `head_dim` under this process's
/// `LOCKSTEP_ATTENTION` (for report headers and the battery).
pub fn attention_kernel_on(device: &burn::tensor::Device, dtype: DType, head_dim: usize) -> Result<AttentionKernel, KernelError> {
    let probe = float_in("attention", "probe", BTensor::<1>::zeros([1], device))?;
    Ok(route::family(&crate::ops::attention::tensor_cores::call_on(&probe.client, dtype, head_dim, 1, 0), &choices_with(None)?))
}

/// This thread's choices ([`tensor_cores::choices`]) with `requested` in place of the process's
/// `LOCKSTEP_ATTENTION` when a call names a kernel.
fn choices_with(requested: Option<AttentionKernel>) -> Result<route::Choices, KernelError> {
    let mut c = crate::ops::attention::tensor_cores::choices()?;
    if requested.is_some() {
        c.attention = requested;
    }
    Ok(c)
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
    attention_impl(kernel, q, k_cache, v_cache, slots, positions, scale, None, None, None)
}

/// [`attention_with`] for rows whose slots the caller also has on the host (`host_slots`, equal
/// to `slots`): runs of rows of one sequence (prefill) then share each staged KV split
/// ([`crate::ops::attention::decode::split_kv`]'s tiled kernel). The same bits as without.
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
    attention_impl(kernel, q, k_cache, v_cache, slots, positions, scale, Some(host_slots), None, None)
}

/// Whether [`attention_for_rows`] gives every row its own tile: no two neighbouring rows are of
/// one sequence (`host_slots`). The kernels build their tile tables from the host's slots, and a
/// captured graph keeps its capture's tables, so only steps tiled this way replay for any rows.
pub fn one_row_per_tile(host_slots: &[u32]) -> bool {
    decode::split_kv::sequence_runs(host_slots, 2).len() == host_slots.len()
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
    attention_impl(None, q, k_cache, v_cache, slots, positions, scale, tiles, pages, None)
}

/// [`attention_for_rows`] for the training forward: where the training backward runs on tensor
/// cores ([`crate::ops::attention::backward::mma_backward`]) and `LOCKSTEP_BACKWARD_STATS` is `forward`,
/// the flash kernel also returns every (row, query head)'s softmax statistics (f32 `[rows *
/// q_heads * 2]`), folded as the backward folds them, so the backward skips its own pass over
/// the keys. The output's bits are [`attention_for_rows`]'s either way.
#[allow(clippy::too_many_arguments)]
pub fn attention_for_rows_with_stats(
    q: BTensor<3>,
    k_cache: BTensor<4>,
    v_cache: BTensor<4>,
    slots: BTensor<1, BInt>,
    positions: BTensor<1, BInt>,
    host_slots: &[u32],
    scale: f32,
    pages: Option<&BlockRows>,
) -> Result<(BTensor<3>, Option<BTensor<1>>), KernelError> {
    let [rows, q_heads, head_dim] = q.dims();
    let dtype = q.dtype();
    let probe = float_in("attention", "q", q.clone())?;
    let call = crate::ops::attention::tensor_cores::call_on(&probe.client, dtype, head_dim, 1, 0);
    let choices = choices_with(None)?;
    let wanted = crate::kernel_choice::KernelChoice::current()?.backward_stats_from_forward
        && route::route(route::Phase::Backward, &call, &choices) == route::Kernel::MmaBackward
        && route::family(&call, &choices) == AttentionKernel::SplitKvTensorCore;
    if !wanted {
        return Ok((attention_for_rows(q, k_cache, v_cache, slots, positions, host_slots, scale, pages)?, None));
    }
    // (mma_backward_available holds: CUDA with the mma kernels)
    let stats = empty_device_contiguous_dtype(probe.client.clone(), probe.device.clone(), [rows * q_heads * 2].into(), DType::F32);
    let out = attention_impl(None, q, k_cache, v_cache, slots, positions, scale, Some(host_slots), pages, Some(&stats))?;
    Ok((out, Some(float_out(stats))))
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
    stats: Option<&burn_cubecl::tensor::CubeTensor>,
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
    let choices = choices_with(kernel)?;
    let call = |max_len| crate::ops::attention::tensor_cores::call_on(&q.client, q.dtype, head_dim, q_heads / shape.kv_heads, max_len);
    let tc_ok = route::tensor_core_family_runs(&call(0));
    let kernel = route::family(&call(0), &choices);
    ensure!(stats.is_none() || kernel == AttentionKernel::SplitKvTensorCore, OP, "softmax statistics for the backward come from the split_kv_tc kernel only, not {}", kernel.name());
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
        let (decode, prefill) = (route::route(route::Phase::Decode, &call(max_len), &choices), route::route(route::Phase::Prefill, &call(max_len), &choices));
        let prefill_set = if prefill == route::Kernel::MmaFlash { crate::kernel_choice::TcKernels::Mma } else { crate::kernel_choice::TcKernels::Cmma };
        let rows_per_tile = prefill_set.prefill_queries()? / crate::ops::attention::tensor_cores::heads_per_cube(q_heads / shape.kv_heads);
        let tiles = crate::ops::attention::tensor_cores::tc_tiles(host_slots, rows, rows_per_tile);
        let contiguous = |x: burn_cubecl::tensor::CubeTensor| if x.is_contiguous() { x } else { burn_cubecl::kernel::into_contiguous(x) };
        let q = contiguous(q);
        return Ok(float_out(crate::ops::attention::tensor_cores::tc_split_kv_attention(&q, contiguous(k), contiguous(v), &slots, positions, &pages, dims, scale, &tiles, (decode, prefill), upload, stats)?));
    }
    if route::route(route::Phase::Decode, &call(max_len), &choices) == route::Kernel::SplitKv {
        let tiles = match host_slots.and_then(crate::ops::attention::decode::split_kv::row_tiles) {
            Some(tiles) => Some((upload(tiles.iter().flat_map(|&(first, n)| [first as i32, n as i32]).collect())?, tiles.len())),
            None => None,
        };
        return Ok(float_out(crate::ops::attention::decode::split_kv::split_kv_attention(&q, k, v, &slots, positions, &pages, dims, scale, tiles)));
    }
    // route::Kernel::Sequential
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
