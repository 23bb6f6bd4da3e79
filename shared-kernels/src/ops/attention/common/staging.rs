//! What every tensor-core attention kernel stages into shared memory, shared by the default
//! `mma` kernels (prefill tiles `mma_flash.rs`, decode partials `mma_decode.rs` and
//! `mma_decode_narrow.rs`, the backward `mma_backward.rs`) and the `cmma` ones (`cmma.rs`,
//! `cmma_flash.rs`): the row padding of 16-bit stages, the tile's queries, each query's prefix
//! length, the keys of a split a query sees, and a split's keys or values copied in. One copy of
//! each, so every kernel stages a split the same way.

use crate::ops::attention::common::splits::{keys_in_split, KV_SPLIT};
use crate::ops::kv_cache::cache_row;
use burn_cubecl::cubecl::prelude::barrier::copy_async_checked;
use burn_cubecl::cubecl::prelude::*;

/// Row padding of the 16-bit stages, in elements (16 bytes: keeps `mma` rows 16-byte aligned
/// and shifts consecutive rows by 4 banks).
pub(crate) const PAD: usize = 8;

/// Every query's prefix length into `keys_sh` (`count` entries, 0 past `queries`; the cube has
/// at least `count` units), read in parallel (a loop over the tile's rows would wait for one
/// global load after another); ends with a cube sync and returns the longest.
#[cube]
pub(crate) fn query_keys<I: Int>(positions: &Tensor<I>, keys_sh: &mut Shared<[u32]>, first_row: usize, queries: usize, hpc: usize, #[comptime] count: usize) -> usize {
    let unit = UNIT_POS as usize;
    if unit < count {
        let mut keys = 0usize;
        if unit < queries {
            keys = u32::cast_from(positions[first_row + unit / hpc]) as usize + 1;
        }
        keys_sh[unit] = keys as u32;
    }
    sync_cube();
    let mut most_keys = 0usize;
    #[unroll]
    for t in 0..count {
        let keys = keys_sh[t] as usize;
        if keys > most_keys {
            most_keys = keys;
        }
    }
    most_keys
}

/// Keys of a query with `keys` keys in the split starting at `first` (0 when it has none there).
#[cube]
pub(crate) fn valid_in_split(keys: usize, first: usize) -> usize {
    let mut valid = 0usize;
    if first < keys {
        valid = keys_in_split(keys, first);
    }
    valid
}

/// Query `qi` of a tile (up to `rows`): row `first_row + qi / hpc`, head `first_head + qi % hpc`.
/// Queries as `[rows][head_dim + PAD]` from vector `base` of `q_sh`, zeros past `queries`;
/// `units` units share the copy.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn stage_queries<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    q_sh: &mut Shared<[Vector<F, N>]>,
    first_row: usize,
    queries: usize,
    hpc: usize,
    first_head: usize,
    q_heads: usize,
    base: usize,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
    #[comptime] rows: usize,
    #[comptime] units: usize,
) {
    let hd_vecs = comptime!(head_dim / vs);
    let ld_vecs = comptime!((head_dim + PAD) / vs);
    #[unroll]
    for it in 0..comptime!((rows * head_dim / vs).div_ceil(units)) {
        let i = UNIT_POS as usize + it * units;
        if i < comptime!(rows * head_dim / vs) {
            let qi = i / hd_vecs;
            let c = i % hd_vecs;
            let mut val = Vector::<F, N>::new(F::from_int(0));
            if qi < queries {
                val = q[((first_row + qi / hpc) * q_heads + first_head + qi % hpc) * hd_vecs + c];
            }
            q_sh[base + qi * ld_vecs + c] = val;
        }
    }
}

/// Keys `first_pos .. first_pos + staged` of `kv_head` into the `[64][head_dim + PAD]` stage at
/// vector `base`, asynchronously; rows past `staged` are zero-filled by the copy.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn stage_split_async<F: Float, N: Size>(
    cache: &Tensor<Vector<F, N>>,
    stage: &mut Shared<[Vector<F, N>]>,
    base: usize,
    first_pos: usize,
    kv_heads: usize,
    kv_head: usize,
    staged: usize,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
    #[comptime] units: usize,
) {
    let hd_vecs = comptime!(head_dim / vs);
    let ld_vecs = comptime!((head_dim + PAD) / vs);
    #[unroll]
    for it in 0..comptime!((KV_SPLIT * head_dim / vs).div_ceil(units)) {
        let i = UNIT_POS as usize + it * units;
        if i < comptime!(KV_SPLIT * head_dim / vs) {
            let j = i / hd_vecs;
            let mut from = 0usize;
            let mut len = 0usize;
            if j < staged {
                from = ((first_pos + j) * kv_heads + kv_head) * hd_vecs + i % hd_vecs;
                len = 1;
            }
            let to = base + j * ld_vecs + i % hd_vecs;
            copy_async_checked(
                &cache.slice(from, from + len),
                &mut stage.slice_mut(to, to + 1),
                comptime!(vs as u32),
            );
        }
    }
}

/// Copies split `split`'s keys (`cache` = k) or values into `stage`, zero-filling past the
/// tile's longest prefix.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn issue_split<F: Float, N: Size, I: Int>(
    cache: &Tensor<Vector<F, N>>,
    stage: &mut Shared<[Vector<F, N>]>,
    block_rows: &Tensor<I>,
    slot: usize,
    width: usize,
    split: usize,
    most_keys: usize,
    kv_heads: usize,
    kv_head: usize,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
    #[comptime] units: usize,
) {
    let first = split * comptime!(KV_SPLIT);
    let staged = keys_in_split(most_keys, first);
    let split_row = cache_row(block_rows, slot, width, first);
    stage_split_async::<F, N>(cache, stage, 0, split_row, kv_heads, kv_head, staged, head_dim, vs, units);
}
