//! What every attention kernel shares, below all of them: the fixed key splits (the numerics'
//! unit: `KV_SPLIT` keys from key 0, whatever the chunking), the per-split score and max steps of
//! the CUDA-core kernels, and the device copies of host tables (block tables, row lists).

use crate::bridge::int_in;
use crate::ops::reduce::NEG_BIG;
use crate::{ensure, KernelError};
use burn::tensor::{DType, Int as BInt, Tensor as BTensor, TensorData};
use burn_cubecl::cubecl::prelude::*;

/// Keys per split, and units per cube. Part of the numerics: fixed for every shape.
pub const KV_SPLIT: usize = 64;

/// How many keys from `first` on a query with `keys` keys has in the split (at most KV_SPLIT).
#[cube]
pub(crate) fn keys_in_split(keys: usize, first: usize) -> usize {
    let mut valid = keys - first;
    if valid > comptime!(KV_SPLIT) {
        valid = comptime!(KV_SPLIT);
    }
    valid
}

/// The query row at `q_base` as f32 into `q_sh` (unit u loads dims u, u + KV_SPLIT, ...); ends
/// with a cube sync. Shared by both attention kernels.
#[cube]
pub(crate) fn load_query<F: Float>(q: &Tensor<F>, q_sh: &mut Shared<[f32]>, q_base: usize, #[comptime] head_dim: usize) {
    let mut d = UNIT_POS_X as usize;
    while d < head_dim {
        q_sh[d] = f32::cast_from(q[q_base + d]);
        d += comptime!(KV_SPLIT);
    }
    sync_cube();
}

/// Scores of one split: unit u < valid writes q . k (a sequential dot product over head_dim) x
/// `scale` for the key at cache row `first_pos + u` (first_pos: the split's first row)
/// into `scores`; ends with a cube sync. Shared by both attention kernels.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn split_scores<F: Float>(
    q_sh: &Shared<[f32]>,
    k_cache: &Tensor<F>,
    scores: &mut Shared<[f32]>,
    first_pos: usize,
    kv_heads: usize,
    kv_head: usize,
    valid: usize,
    scale: f32,
    #[comptime] head_dim: usize,
) {
    let unit = UNIT_POS_X as usize;
    if unit < valid {
        let k_base = ((first_pos + unit) * kv_heads + kv_head) * head_dim;
        let mut dot = 0.0f32;
        for e in 0..head_dim {
            dot += q_sh[e] * f32::cast_from(k_cache[k_base + e]);
        }
        scores[unit] = dot * scale;
    }
    sync_cube();
}

/// The split's largest score, walked in key order by every unit.
#[cube]
pub(crate) fn split_max(scores: &Shared<[f32]>, valid: usize) -> f32 {
    let mut max = f32::new(NEG_BIG);
    for j in 0..valid {
        if scores[j] > max {
            max = scores[j];
        }
    }
    max
}

/// `values` as a device int tensor of `dtype`, shared with an earlier upload of equal content.
pub(crate) fn device_table(op: &'static str, values: Vec<i32>, dtype: DType, device: &burn::tensor::Device) -> Result<burn_cubecl::tensor::CubeTensor, KernelError> {
    if let Some(t) = cached_table(&values, dtype, device) {
        return Ok(t);
    }
    let n = values.len();
    let t = int_in(op, "table", BTensor::<1, BInt>::from_data(TensorData::new(values.clone(), [n]).convert_dtype(dtype), device))?;
    ensure!(t.dtype == dtype, op, "table is {:?}, expected {:?}", t.dtype, dtype);
    remember_table(values, dtype, device, &t);
    Ok(t)
}

/// Tile tables recently put on a device, newest first. Every layer of a forward step launches
/// attention over the same rows, so it needs the same tables: one host-to-device upload per
/// step instead of one per layer (28 at Qwen3-0.6B). A table's content is all its meaning, so
/// equal content may share one read-only buffer.
type TileTable = (Vec<i32>, DType, burn::tensor::Device, burn_cubecl::tensor::CubeTensor);
const CACHED_TABLES: usize = 8;
thread_local! {
    static TABLES: std::cell::RefCell<Vec<TileTable>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn cached_table(values: &[i32], dtype: DType, device: &burn::tensor::Device) -> Option<burn_cubecl::tensor::CubeTensor> {
    TABLES.with(|tables| tables.borrow().iter().find(|t| t.0 == values && t.1 == dtype && &t.2 == device).map(|t| t.3.clone()))
}

fn remember_table(values: Vec<i32>, dtype: DType, device: &burn::tensor::Device, table: &burn_cubecl::tensor::CubeTensor) {
    TABLES.with(|tables| {
        let mut tables = tables.borrow_mut();
        tables.insert(0, (values, dtype, device.clone(), table.clone()));
        tables.truncate(CACHED_TABLES);
    });
}
