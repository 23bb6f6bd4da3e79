//! The KV cache's own ops: writing new rows at (slot, position) before attention reads them,
//! and copying rows between slots (the engine's shared prompt prefixes). Plain data movement,
//! in place when the caller hands over the only reference.

use crate::ops::reduce::cube_linear;
use crate::ops::{cube_count_for, storage, vector_width};
use crate::bridge::{dims, float_in, float_out, int_in, same_device};
use crate::{ensure, KernelError};
use burn::tensor::{Int as BInt, Tensor as BTensor};
use burn_cubecl::cubecl::prelude::*;

/// Positions per cache block: the attention split ([`crate::ops::attention::common::splits::KV_SPLIT`]), so a split
/// never crosses a block.
pub const BLOCK: usize = crate::ops::attention::common::splits::KV_SPLIT;

/// Where every sequence's positions live in a cache tensor (`[units, rows_per_unit, kv_heads,
/// head_dim]` read as rows): `table[slot * width + b]` is the first row of positions
/// `b * BLOCK ..` of table row `slot`, `slots` rows of `width` blocks, `max_len = width * BLOCK`
/// positions a sequence. A contiguous `[slots, max_len, ..]` cache is the table
/// `slot * max_len + b * BLOCK` ([`BlockRows::contiguous`]); a paged one maps blocks to wherever
/// the allocator put them. The kernels read the same values in the same order either way.
#[derive(Clone, Debug)]
pub struct BlockRows {
    pub table: burn_cubecl::tensor::CubeTensor,
    pub slots: usize,
    pub width: usize,
}

impl BlockRows {
    pub fn max_len(&self) -> usize {
        self.width * BLOCK
    }
    /// The table of a device-side `[slots * width]` int tensor (entries: first rows of blocks).
    pub fn new(op: &'static str, table: BTensor<1, BInt>, slots: usize, width: usize) -> Result<Self, KernelError> {
        let table = int_in(op, "block table", table)?;
        ensure!(dims(&table) == [slots * width], op, "the block table is {:?}, expected [{slots} x {width}]", dims(&table));
        Ok(Self { table, slots, width })
    }
    /// The table of a contiguous `[slots, max_len, ..]` cache, in `int_dtype` on `device`.
    pub(crate) fn contiguous(shape: &KvCacheShape, int_dtype: burn::tensor::DType, device: &burn::tensor::Device) -> Result<Self, KernelError> {
        let width = shape.max_len.div_ceil(BLOCK);
        let values: Vec<i32> = (0..shape.slots).flat_map(|s| (0..width).map(move |b| (s * shape.max_len + b * BLOCK) as i32)).collect();
        ensure!(shape.slots * shape.max_len <= i32::MAX as usize, "kv cache", "{} x {} cache rows exceed the block table's 31-bit range", shape.slots, shape.max_len);
        let table = crate::ops::attention::common::splits::device_table("kv cache", values, int_dtype, device)?;
        Ok(Self { table, slots: shape.slots, width })
    }
}

/// Shape of one layer's K (or V) cache: `[slots, max_len, kv_heads, head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCacheShape {
    pub slots: usize,
    pub max_len: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// One vector of a new row a unit (16 bytes on CUDA, 4 values on wgpu): a row's slot, position
/// and block are read once per vector rather than once per value (one value a unit moved
/// ~0.6 TB/s in the 1.7B update, 104 µs a launch by cubecl's profile).
/// Vectors never straddle rows: the width divides the row (`kv_heads x head_dim`).
#[cube(launch)]
fn write_kv_kernel<F: Float, N: Size, I: Int>(
    new: &Tensor<Vector<F, N>>,
    slots: &Tensor<I>,
    positions: &Tensor<I>,
    block_rows: &Tensor<I>,
    cache: &mut Tensor<Vector<F, N>>,
    rows_arg: u32,
    row_vecs_arg: u32,
    width_arg: u32,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let rows = rows_arg as usize;
    let row_vecs = row_vecs_arg as usize;
    let width = width_arg as usize;
    let i = cube_linear() * 256usize + UNIT_POS_X as usize;
    if i < rows * row_vecs {
        let row = i / row_vecs;
        let within = i % row_vecs;
        let slot = u32::cast_from(slots[row]) as usize;
        let pos = u32::cast_from(positions[row]) as usize;
        cache[cache_row(block_rows, slot, width, pos) * row_vecs + within] = new[i];
    }
}

/// The cache row of position `pos` of the sequence in table row `slot`: its block's first row
/// (the table's entry) plus the offset within the block. Blocks are [`BLOCK`] positions, so the
/// keys of one attention split (a multiple of [`BLOCK`] on) are consecutive rows.
#[cube]
pub(crate) fn cache_row<I: Int>(block_rows: &Tensor<I>, slot: usize, width: usize, pos: usize) -> usize {
    u32::cast_from(block_rows[slot * width + pos / comptime!(BLOCK)]) as usize + pos % comptime!(BLOCK)
}

#[cube(launch)]
fn copy_rows_kernel<F: Float, N: Size, I: Int>(
    cache: &mut Tensor<Vector<F, N>>,
    from_rows: &Tensor<I>,
    to_rows: &Tensor<I>,
    rows_arg: u32,
    row_vecs_arg: u32,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let row_vecs = row_vecs_arg as usize;
    let i = cube_linear() * 256usize + UNIT_POS_X as usize;
    if i < rows_arg as usize * row_vecs {
        let r = i / row_vecs;
        let within = i % row_vecs;
        let from = u32::cast_from(from_rows[r]) as usize;
        let to = u32::cast_from(to_rows[r]) as usize;
        cache[to * row_vecs + within] = cache[from * row_vecs + within];
    }
}

/// A cache that kernels may write: the tensor itself when this is its only reference (callers
/// move the cache in), else a contiguous copy.
pub(crate) fn writable(cache: burn_cubecl::tensor::CubeTensor) -> burn_cubecl::tensor::CubeTensor {
    if cache.can_mut() { cache } else { burn_cubecl::kernel::into_contiguous(cache.copy()) }
}

pub(crate) fn cache_shape(op: &'static str, d: &[usize]) -> Result<KvCacheShape, KernelError> {
    ensure!(d.len() == 4, op, "cache must be [slots, max_len, kv_heads, head_dim], got {d:?}");
    Ok(KvCacheShape { slots: d[0], max_len: d[1], kv_heads: d[2], head_dim: d[3] })
}

/// Write `new` [rows, kv_heads, head_dim] into `cache` at (slots[r], positions[r]).
/// Returns the updated cache (the same buffer when burn can reuse it, else a copy).
pub fn write_kv_cache(
    cache: BTensor<4>,
    new: BTensor<3>,
    slots: BTensor<1, BInt>,
    positions: BTensor<1, BInt>,
) -> Result<BTensor<4>, KernelError> {
    write_kv_cache_paged(cache, new, slots, positions, None)
}

/// [`write_kv_cache`] into a cache laid out by `pages` (`None`: contiguous `[slots, max_len, ..]`).
pub fn write_kv_cache_paged(
    cache: BTensor<4>,
    new: BTensor<3>,
    slots: BTensor<1, BInt>,
    positions: BTensor<1, BInt>,
    pages: Option<&BlockRows>,
) -> Result<BTensor<4>, KernelError> {
    const OP: &str = "write_kv_cache";
    let device = cache.device();
    let cache = float_in(OP, "cache", cache)?;
    let new = float_in(OP, "new", new)?;
    let slots = int_in(OP, "slots", slots)?;
    let positions = int_in(OP, "positions", positions)?;
    same_device(OP, &cache, &new, "new")?;
    let shape = cache_shape(OP, &dims(&cache))?;
    let nd = dims(&new);
    let rows = nd[0];
    ensure!(nd[1..] == [shape.kv_heads, shape.head_dim], OP, "new is {nd:?} but the cache holds [{}, {}] per position", shape.kv_heads, shape.head_dim);
    ensure!(dims(&slots) == [rows] && dims(&positions) == [rows], OP, "new has {rows} rows but slots is {:?} and positions {:?}", dims(&slots), dims(&positions));
    ensure!(cache.dtype == new.dtype, OP, "cache is {:?} but new is {:?}", cache.dtype, new.dtype);
    let pages = match pages {
        Some(p) => p.clone(),
        None => BlockRows::contiguous(&shape, slots.dtype, &device)?,
    };
    ensure!(pages.table.dtype == slots.dtype, OP, "the block table is {:?} but slots are {:?}", pages.table.dtype, slots.dtype);
    let cache = writable(cache);
    let row_len = shape.kv_heads * shape.head_dim;
    if rows > 0 {
        let vs = vector_width(new.dtype, row_len);
        write_kv_kernel::launch(
            &cache.client,
            cube_count_for(rows * row_len / vs, 256),
            CubeDim::new_1d(256),
            vs,
            new.clone().into_tensor_arg(),
            slots.clone().into_tensor_arg(),
            positions.clone().into_tensor_arg(),
            pages.table.clone().into_tensor_arg(),
            cache.clone().into_tensor_arg(),
            rows as u32,
            (row_len / vs) as u32,
            pages.width as u32,
            [storage(new.dtype), storage(slots.dtype)],
        );
    }
    let out: BTensor<4> = float_out(cache);
    if crate::bridge::debug_sync() {
        // diagnostic: rule out ordering between the scatter and later reads
        let _ = out.device().sync();
    }
    Ok(out)
}

/// Copies cache rows in place: the `[kv_heads, head_dim]` row at flat row `from_rows[i]`
/// (slot * max_len + position, or a block's row) to `to_rows[i]`, for every i, in one launch. No row may be both
/// read and written (the engine copies shared prompt prefixes from donors to fresh slots).
pub fn copy_cache_rows(cache: BTensor<4>, from_rows: BTensor<1, BInt>, to_rows: BTensor<1, BInt>) -> Result<BTensor<4>, KernelError> {
    const OP: &str = "copy_cache_rows";
    let cache = float_in(OP, "cache", cache)?;
    let from_rows = int_in(OP, "from_rows", from_rows)?;
    let to_rows = int_in(OP, "to_rows", to_rows)?;
    let shape = cache_shape(OP, &dims(&cache))?;
    let rows = dims(&from_rows)[0];
    ensure!(dims(&to_rows) == [rows], OP, "from_rows has {rows} rows but to_rows is {:?}", dims(&to_rows));
    ensure!(from_rows.dtype == to_rows.dtype, OP, "from_rows is {:?} but to_rows is {:?}", from_rows.dtype, to_rows.dtype);
    let cache = writable(cache);
    let row_len = shape.kv_heads * shape.head_dim;
    if rows > 0 {
        let dtypes = [storage(cache.dtype), storage(to_rows.dtype)];
        let vs = vector_width(cache.dtype, row_len);
        copy_rows_kernel::launch(
            &cache.client,
            cube_count_for(rows * row_len / vs, 256),
            CubeDim::new_1d(256),
            vs,
            cache.clone().into_tensor_arg(),
            from_rows.into_tensor_arg(),
            to_rows.into_tensor_arg(),
            rows as u32,
            (row_len / vs) as u32,
            dtypes,
        );
    }
    Ok(float_out(cache))
}
