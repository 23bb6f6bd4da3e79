//! Attention parallel over KV splits on CUDA cores: `LOCKSTEP_ATTENTION=split_kv`, and `auto`'s
//! kernel where the tensor-core one (`split_kv_tc`) cannot run (f32, other runtimes, other head
//! sizes); 1.7-17x faster decode than the sequential kernel at 1k-4k keys on the H200.
//!
//! [`crate::ops::attention`]'s default kernel walks a query's KV prefix split after split inside one
//! cube of `KV_SPLIT` units, so a 4k-token prefix is 64 sequential splits. Here every
//! (row, head, split) is its own cube, and a second kernel combines the splits:
//! 1. split s of a query at position p covers keys [64s, min(64s + 64, p + 1)); its cube writes
//!    the split's max score m_s, the sum l_s of exp(score - m_s) in key order, and
//!    o_s[d] = sum over its keys, in key order, of exp(score - m_s) * v[d];
//! 2. one cube per (row, head) takes M = max over splits of m_s, then l = sum of
//!    l_s * exp(m_s - M) and o[d] = sum of o_s[d] * exp(m_s - M), both in split order, and
//!    writes o[d] / l.
//! Split boundaries are multiples of 64 from key 0 and every sum runs in a fixed order, so a
//! (query, prefix) pair gets the same bits in any launch, prefill or decode, chunked or not,
//! exactly as with the default kernel. The two kernels' arithmetic differs (one rescales a
//! running sum, the other combines split maxima), so a process uses one of them for the sampler
//! and the trainer alike; with a single split (p < 64) they agree bit for bit.
//!
//! Prefill rows of one sequence run as tiles ([`row_tiles`]): the split's keys and values are
//! staged in shared memory once per tile, and each row then does the per-row arithmetic above.

use crate::ops::kv_cache::{cache_row, BlockRows};
use crate::ops::attention::common::splits::{keys_in_split, load_query, split_max, split_scores, KV_SPLIT};
use crate::ops::reduce::{cube_linear, NEG_BIG};
use crate::ops::{cube_count_for, storage};
use burn::tensor::DType;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

#[cube(launch)]
fn split_partial_kernel<F: Float, I: Int>(
    q: &Tensor<F>,
    k_cache: &Tensor<F>,
    v_cache: &Tensor<F>,
    slots: &Tensor<I>,
    positions: &Tensor<I>,
    block_rows: &Tensor<I>,
    partials: &mut Tensor<f32>,
    pairs_arg: u32,
    q_heads_arg: u32,
    kv_heads_arg: u32,
    width_arg: u32,
    splits_arg: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let pairs = pairs_arg as usize;
    let q_heads = q_heads_arg as usize;
    let kv_heads = kv_heads_arg as usize;
    let width = width_arg as usize;
    let splits = splits_arg as usize;
    let work = cube_linear(); // pair * splits + split
    let pair = work / splits; // row * q_heads + head
    let split = work % splits;
    let unit = UNIT_POS_X as usize;
    if pair < pairs {
        let row = pair / q_heads;
        let head = pair % q_heads;
        let kv_head = head / (q_heads / kv_heads);
        let slot = u32::cast_from(slots[row]) as usize;
        let keys = u32::cast_from(positions[row]) as usize + 1;
        let first = split * comptime!(KV_SPLIT);
        // uniform per cube: a split past the prefix has nothing to do (the combine skips it)
        if first < keys {
            let valid = keys_in_split(keys, first);
            let mut q_sh = Shared::new_slice(head_dim);
            let mut scores = Shared::<[f32]>::new_slice(comptime!(KV_SPLIT));
            load_query(q, &mut q_sh, pair * head_dim, head_dim);
            let split_row = cache_row(block_rows, slot, width, first);
            split_scores(&q_sh, k_cache, &mut scores, split_row, kv_heads, kv_head, valid, scale, head_dim);
            let split_max = split_max(&scores, valid);
            let base = work * (head_dim + 2);
            let mut d = unit;
            while d < head_dim {
                let mut acc = 0.0f32;
                for j in 0..valid {
                    let v_index = ((split_row + j) * kv_heads + kv_head) * head_dim + d;
                    acc += (scores[j] - split_max).exp() * f32::cast_from(v_cache[v_index]);
                }
                partials[base + 2 + d] = acc;
                d += comptime!(KV_SPLIT);
            }
            if unit == 0 {
                let mut split_sum = 0.0f32;
                for j in 0..valid {
                    split_sum += (scores[j] - split_max).exp();
                }
                partials[base] = split_max;
                partials[base + 1] = split_sum;
            }
        }
    }
}

/// Prefill form of [`split_partial_kernel`]: one cube per (tile, head, split), where a tile is
/// up to [`TILE_ROWS`] rows of one sequence. The split's keys and values are staged in shared
/// memory once and every row of the tile reads them there (the per-row kernel reads them from
/// global memory once per row, which made long prompts memory bound). Each row then runs the
/// per-row kernel's arithmetic, operation for operation, on the same values, and writes the
/// same partial: the tile only changes where K and V are read from, never a bit.
#[cube(launch)]
fn split_partial_tiled_kernel<F: Float, I: Int>(
    q: &Tensor<F>,
    k_cache: &Tensor<F>,
    v_cache: &Tensor<F>,
    slots: &Tensor<I>,
    positions: &Tensor<I>,
    tiles: &Tensor<I>,
    block_rows: &Tensor<I>,
    partials: &mut Tensor<f32>,
    tiles_arg: u32,
    q_heads_arg: u32,
    kv_heads_arg: u32,
    width_arg: u32,
    splits_arg: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let q_heads = q_heads_arg as usize;
    let kv_heads = kv_heads_arg as usize;
    let width = width_arg as usize;
    let splits = splits_arg as usize;
    let work = cube_linear(); // (tile * q_heads + head) * splits + split
    let tile = work / (q_heads * splits);
    let head = (work / splits) % q_heads;
    let split = work % splits;
    let unit = UNIT_POS_X as usize;
    if tile < tiles_arg as usize {
        let first_row = u32::cast_from(tiles[2 * tile]) as usize;
        let count = u32::cast_from(tiles[2 * tile + 1]) as usize;
        let kv_head = head / (q_heads / kv_heads);
        let slot = u32::cast_from(slots[first_row]) as usize;
        let first = split * comptime!(KV_SPLIT);
        let mut most_keys = 0usize;
        for t in 0..count {
            let keys = u32::cast_from(positions[first_row + t]) as usize + 1;
            if keys > most_keys {
                most_keys = keys;
            }
        }
        if first < most_keys {
            // stage the split's keys and values (as stored) for every row of the tile
            let staged = keys_in_split(most_keys, first);
            // key rows padded by 2 elements: unit u reads key u's row, so an unpadded 256-byte
            // stride would put all 32 lanes of a warp on one shared-memory bank
            let k_stride = comptime!(head_dim + 2);
            let mut k_sh = Shared::<[F]>::new_slice(comptime!(KV_SPLIT * (head_dim + 2)));
            let mut v_sh = Shared::<[F]>::new_slice(comptime!(KV_SPLIT * head_dim));
            let split_row = cache_row(block_rows, slot, width, first);
            let mut i = unit;
            while i < staged * head_dim {
                let j = i / head_dim;
                let e = i % head_dim;
                let at = ((split_row + j) * kv_heads + kv_head) * head_dim + e;
                k_sh[j * k_stride + e] = k_cache[at];
                v_sh[i] = v_cache[at];
                i += comptime!(KV_SPLIT);
            }
            sync_cube();
            let mut q_sh = Shared::new_slice(head_dim);
            let mut scores = Shared::<[f32]>::new_slice(comptime!(KV_SPLIT));
            for t in 0..count {
                let row = first_row + t;
                let keys = u32::cast_from(positions[row]) as usize + 1;
                if first < keys {
                    let valid = keys_in_split(keys, first);
                    let pair = row * q_heads + head;
                    load_query(q, &mut q_sh, pair * head_dim, head_dim);
                    if unit < valid {
                        let mut dot = 0.0f32;
                        for e in 0..head_dim {
                            dot += q_sh[e] * f32::cast_from(k_sh[unit * k_stride + e]);
                        }
                        scores[unit] = dot * scale;
                    }
                    sync_cube();
                    let split_max = split_max(&scores, valid);
                    let base = (pair * splits + split) * (head_dim + 2);
                    let mut d = unit;
                    while d < head_dim {
                        let mut acc = 0.0f32;
                        for j in 0..valid {
                            acc += (scores[j] - split_max).exp() * f32::cast_from(v_sh[j * head_dim + d]);
                        }
                        partials[base + 2 + d] = acc;
                        d += comptime!(KV_SPLIT);
                    }
                    if unit == 0 {
                        let mut split_sum = 0.0f32;
                        for j in 0..valid {
                            split_sum += (scores[j] - split_max).exp();
                        }
                        partials[base] = split_max;
                        partials[base + 1] = split_sum;
                    }
                }
                sync_cube(); // the next row overwrites q_sh and scores
            }
        }
    }
}

#[cube(launch)]
fn split_combine_kernel<F: Float, I: Int>(
    partials: &Tensor<f32>,
    positions: &Tensor<I>,
    rows_list: &Tensor<I>,
    out: &mut Tensor<F>,
    pairs_arg: u32,
    q_heads_arg: u32,
    splits_arg: u32,
    #[comptime] head_dim: usize,
    #[comptime] listed: bool,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let pairs = pairs_arg as usize;
    let q_heads = q_heads_arg as usize;
    let splits = splits_arg as usize;
    let work = cube_linear();
    if work < pairs {
        // every row, or only the rows listed (the others are written by another kernel), whose
        // partials and positions are compact: the i-th listed row's at i
        let compact = work / q_heads;
        let mut row = compact;
        if comptime!(listed) {
            row = u32::cast_from(rows_list[compact]) as usize;
        }
        let pair = compact * q_heads + work % q_heads;
        let out_pair = row * q_heads + work % q_heads;
        let used = (u32::cast_from(positions[compact]) as usize + 1).div_ceil(comptime!(KV_SPLIT));
        let stride = head_dim + 2;
        let first = pair * splits * stride;
        let mut max = f32::new(NEG_BIG);
        for s in 0..used {
            let m = partials[first + s * stride];
            if m > max {
                max = m;
            }
        }
        let mut total = 0.0f32;
        for s in 0..used {
            let at = first + s * stride;
            total += partials[at + 1] * (partials[at] - max).exp();
        }
        let mut d = UNIT_POS_X as usize;
        while d < head_dim {
            let mut acc = 0.0f32;
            for s in 0..used {
                let at = first + s * stride;
                acc += partials[at + 2 + d] * (partials[at] - max).exp();
            }
            out[out_pair * head_dim + d] = F::cast_from(acc / total);
            d += comptime!(KV_SPLIT);
        }
    }
}

/// Runs both kernels for inputs `attention_with` has checked: `q` [rows, q_heads, head_dim],
/// caches laid out by `pages`. One partial cube per possible split of a
/// sequence (max_len / 64), since the positions live on the device; cubes past a row's prefix exit.
#[allow(clippy::too_many_arguments)]
pub(crate) fn split_kv_attention(
    q: &CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    slots: &CubeTensor,
    positions: CubeTensor,
    pages: &BlockRows,
    (rows, q_heads, kv_heads, max_len, head_dim): (usize, usize, usize, usize, usize),
    scale: f32,
    tiles: Option<(CubeTensor, usize)>,
) -> CubeTensor {
    let pairs = rows * q_heads;
    let splits = max_len.div_ceil(KV_SPLIT);
    let partials = empty_device_contiguous_dtype(q.client.clone(), q.device.clone(), [pairs * splits * (head_dim + 2)].into(), DType::F32);
    let dtypes = [storage(q.dtype), storage(slots.dtype)];
    if let Some((tiles, count)) = tiles {
        split_partial_tiled_kernel::launch(
            &q.client,
            cube_count_for(count * q_heads * splits, 1),
            CubeDim::new_1d(KV_SPLIT as u32),
            q.clone().into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            slots.clone().into_tensor_arg(),
            positions.clone().into_tensor_arg(),
            tiles.into_tensor_arg(),
            pages.table.clone().into_tensor_arg(),
            partials.clone().into_tensor_arg(),
            count as u32,
            q_heads as u32,
            kv_heads as u32,
            pages.width as u32,
            splits as u32,
            scale,
            head_dim,
            dtypes,
        );
    } else {
        split_partial_kernel::launch(
            &q.client,
            cube_count_for(pairs * splits, 1),
            CubeDim::new_1d(KV_SPLIT as u32),
            q.clone().into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            slots.clone().into_tensor_arg(),
            positions.clone().into_tensor_arg(),
            pages.table.clone().into_tensor_arg(),
            partials.clone().into_tensor_arg(),
            pairs as u32,
            q_heads as u32,
            kv_heads as u32,
            pages.width as u32,
            splits as u32,
            scale,
            head_dim,
            dtypes,
        );
    }
    combine_splits(q, partials, positions, (rows, q_heads, splits, head_dim))
}

/// The combine kernel over `partials` ([pairs * splits * (head_dim + 2)], f32) into a fresh
/// output shaped and typed like `q`; shared by the scalar and tensor-core partial kernels.
pub(crate) fn combine_splits(q: &CubeTensor, partials: CubeTensor, positions: CubeTensor, (rows, q_heads, splits, head_dim): (usize, usize, usize, usize)) -> CubeTensor {
    let out = empty_device_contiguous_dtype(q.client.clone(), q.device.clone(), [rows, q_heads, head_dim].into(), q.dtype);
    combine_rows(&out, partials, positions, None, (rows, q_heads, splits, head_dim));
    out
}

/// The combine kernel into `out` [rows, q_heads, head_dim] for every row, or for the `listed`
/// rows only (`(row list, its length)`; the rest of `out` is left as it is), whose partials and
/// positions are then compact (the i-th listed row's at i).
pub(crate) fn combine_rows(out: &CubeTensor, partials: CubeTensor, positions: CubeTensor, listed: Option<(CubeTensor, usize)>, (rows, q_heads, splits, head_dim): (usize, usize, usize, usize)) -> CubeTensor {
    let dtypes = [storage(out.dtype), storage(positions.dtype)];
    let (list, n, is_listed) = match listed {
        Some((list, n)) => (list, n, true),
        None => (positions.clone(), rows, false),
    };
    split_combine_kernel::launch(
        &out.client,
        cube_count_for(n * q_heads, 1),
        CubeDim::new_1d(KV_SPLIT as u32),
        partials.into_tensor_arg(),
        positions.into_tensor_arg(),
        list.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        (n * q_heads) as u32,
        q_heads as u32,
        splits as u32,
        head_dim,
        is_listed,
        dtypes,
    );
    out.clone()
}

/// Rows of one sequence per prefill tile: at most this many share a staged split.
pub const TILE_ROWS: usize = 16;

/// Tiles for [`split_partial_tiled_kernel`] from the rows' slots on the host: runs of
/// consecutive rows with the same slot, cut every [`TILE_ROWS`], as (first row, rows) pairs.
/// `None` when no tile would hold two rows (decode), where the per-row kernel does the same.
pub(crate) fn row_tiles(slots: &[u32]) -> Option<Vec<(usize, usize)>> {
    let tiles = sequence_runs(slots, TILE_ROWS);
    tiles.iter().any(|&(_, n)| n > 1).then_some(tiles)
}

/// Runs of consecutive rows with the same slot, cut every `max_rows`, as (first row, rows).
pub(crate) fn sequence_runs(slots: &[u32], max_rows: usize) -> Vec<(usize, usize)> {
    let mut tiles: Vec<(usize, usize)> = Vec::new();
    for (r, &s) in slots.iter().enumerate() {
        match tiles.last_mut() {
            Some((first, n)) if *n < max_rows && slots[*first] == s => *n += 1,
            _ => tiles.push((r, 1)),
        }
    }
    tiles
}
