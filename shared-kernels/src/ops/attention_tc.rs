//! Split-KV attention on tensor cores (CUDA, bf16/f16): the default attention where it runs.
//!
//! The scheme is [`super::attention_split_kv`]'s: keys in splits of 64 from key 0, one partial
//! (split max m, sum l, unnormalised output o) per (query, split), then the same fixed-order
//! combine kernel. Only the partial changes: the split's two products run on `cmma`
//! 16x16x16 instructions with f32 accumulators, k ascending from a zero accumulator:
//! 1. S = Q K^T over head_dim (chunks 0, 16, ...), scaled by `scale` in f32;
//! 2. m = max of the query's valid scores, p_j = exp(s_j - m) rounded to the input dtype (the
//!    `mma` operand), l = the sum of those rounded p_j: four sums of 16 keys each in key
//!    order, added in quarter order;
//! 3. O = P V over the split's 64 keys (chunks 0, 16, 32, 48), p_j = 0 past the query's keys.
//!
//! Bits. A query's partial depends only on its own Q row and the split's K/V rows: an `mma`
//! output element is the dot product of one A row and one B column, and the battery checks
//! that tensor-core rows do not depend on the other rows of the fragment or on the fragment
//! row they land in (`matmul ... tc = pipelined`, and this kernel's own rows). Keys past a
//! query's prefix enter S (their scores are never read) and O with p = 0, and keys past the
//! cube's staged keys are staged as zeros, so a prefill row in a tile of 32 queries and the
//! same row decoded alone run the same instructions on the same values. Prefill, chunked
//! prefill and decode of a (query, prefix) pair therefore give the same bits, in any batch.
//!
//! The arithmetic differs from the scalar kernels (P is rounded to bf16 before O, as in flash
//! attention), so a process uses this kernel for every attention call of a dtype and head
//! size, sampler and trainer alike, whatever the cache length.
//!
//! Work: one cube of 4 planes per (tile, KV head, head part, split). A tile is up to
//! [`TC_QUERIES`] queries sharing one KV head and one sequence: consecutive rows of a sequence
//! (prefill) times the query heads of the group; decode rows are tiles of one row. The split's
//! K, then V, is staged in shared memory once per tile.

use super::attention::{keys_in_split, KV_SPLIT};
use super::attention_split_kv::combine_splits;
use super::matmul_tc::tensor_cores_available_for;
use super::reduce::{cube_linear, NEG_BIG};
use super::{cube_count_for, storage};
use burn::tensor::DType;
use burn_cubecl::cubecl::cmma::{self, MatrixIdent, MatrixLayout};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

/// Queries per cube: two 16-row fragments.
pub const TC_QUERIES: usize = 32;
/// Planes per cube; plane p works on query block p / 2 (S: key blocks, O: output dims, by p % 2).
const PLANES: usize = 4;
const PLANE_DIM: usize = 32;
const UNITS: usize = PLANES * PLANE_DIM;
/// Row padding of the 16-bit stages, in elements (16 bytes: keeps `mma` rows 16-byte aligned
/// and shifts consecutive rows by 4 banks).
const PAD: usize = 8;
/// f32 score rows: 64 scores + 4.
const LDS: usize = KV_SPLIT + 4;
/// 16-bit p rows: 64 + PAD.
const LDP: usize = KV_SPLIT + PAD;
/// One plane's 16x16 f32 output window in the score stage.
const WINDOW: usize = 256;
const SMEM_ALIGN: usize = 128;

/// Stage keys (or values) `first_pos .. first_pos + staged` of `kv_head` as `[64][head_dim + PAD]`
/// rows; rows past `staged` are zeros.
#[cube]
fn stage_split<F: Float, N: Size>(
    cache: &Tensor<Vector<F, N>>,
    stage: &mut Shared<[Vector<F, N>]>,
    first_pos: usize,
    kv_heads: usize,
    kv_head: usize,
    staged: usize,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
) {
    let hd_vecs = comptime!(head_dim / vs);
    let ld_vecs = comptime!((head_dim + PAD) / vs);
    #[unroll]
    for it in 0..comptime!((KV_SPLIT * head_dim / vs).div_ceil(UNITS)) {
        let i = UNIT_POS as usize + it * comptime!(UNITS);
        if i < comptime!(KV_SPLIT * head_dim / vs) {
            let j = i / hd_vecs;
            let c = i % hd_vecs;
            let mut val = Vector::<F, N>::new(F::from_int(0));
            if j < staged {
                val = cache[((first_pos + j) * kv_heads + kv_head) * hd_vecs + c];
            }
            stage[j * ld_vecs + c] = val;
        }
    }
}

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn tc_partial_kernel<F: Float, N: Size, I: Int>(
    q: &Tensor<Vector<F, N>>,
    k_cache: &Tensor<Vector<F, N>>,
    v_cache: &Tensor<Vector<F, N>>,
    slots: &Tensor<I>,
    positions: &Tensor<I>,
    tiles: &Tensor<I>,
    partials: &mut Tensor<f32>,
    tiles_arg: u32,
    q_heads_arg: u32,
    kv_heads_arg: u32,
    max_len_arg: u32,
    splits_arg: u32,
    heads_per_cube_arg: u32,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let q_heads = q_heads_arg as usize;
    let kv_heads = kv_heads_arg as usize;
    let max_len = max_len_arg as usize;
    let splits = splits_arg as usize;
    let hpc = heads_per_cube_arg as usize;
    let group = q_heads / kv_heads;
    let parts = group / hpc;
    let work = cube_linear(); // ((tile * kv_heads + kv_head) * parts + part) * splits + split
    let split = work % splits;
    let part = (work / splits) % parts;
    let kv_head = (work / (splits * parts)) % kv_heads;
    let tile = work / (splits * parts * kv_heads);
    let unit = UNIT_POS as usize;
    let lane = UNIT_POS_X as usize;
    let plane = UNIT_POS_Y as usize;
    // cube-uniform conditions only around the syncs below
    if tile < tiles_arg as usize {
        let first_row = u32::cast_from(tiles[2 * tile]) as usize;
        let count = u32::cast_from(tiles[2 * tile + 1]) as usize;
        let queries = count * hpc;
        let slot = u32::cast_from(slots[first_row]) as usize;
        let first = split * comptime!(KV_SPLIT);
        let hd_vecs = comptime!(head_dim / vs);
        let ld = comptime!(head_dim + PAD);
        let ld_vecs = comptime!((head_dim + PAD) / vs);
        let kv_len = comptime!(KV_SPLIT * (head_dim + PAD) / vs);
        let q_len = comptime!(TC_QUERIES * (head_dim + PAD) / vs);
        let blocks = comptime!(head_dim / 32); // output blocks of 16 dims per plane
        let s_len = comptime!(if TC_QUERIES * LDS > PLANES * (head_dim / 32) * WINDOW { TC_QUERIES * LDS } else { PLANES * (head_dim / 32) * WINDOW });
        let mut q_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(q_len, comptime!(SMEM_ALIGN));
        let mut kv_sh = Shared::<[Vector<F, N>]>::new_aligned_slice(kv_len, comptime!(SMEM_ALIGN));
        let mut s_sh = Shared::<[f32]>::new_aligned_slice(s_len, comptime!(SMEM_ALIGN));
        let mut p_sh = Shared::<[F]>::new_aligned_slice(comptime!(TC_QUERIES * LDP), comptime!(SMEM_ALIGN));
        let mut valid_sh = Shared::<[u32]>::new_slice(comptime!(TC_QUERIES));
        let mut quarter_sh = Shared::<[f32]>::new_slice(comptime!(TC_QUERIES * 4));
        let mut keys_sh = Shared::<[u32]>::new_slice(comptime!(TC_QUERIES));
        // every query's prefix length, read in parallel (a loop over the tile's rows would
        // wait for one global load after another), and its keys in this split (0: the split
        // is past its prefix)
        if unit < comptime!(TC_QUERIES) {
            let mut keys = 0usize;
            let mut valid = 0usize;
            if unit < queries {
                keys = u32::cast_from(positions[first_row + unit / hpc]) as usize + 1;
                if first < keys {
                    valid = keys_in_split(keys, first);
                }
            }
            keys_sh[unit] = keys as u32;
            valid_sh[unit] = valid as u32;
        }
        sync_cube();
        let mut most_keys = 0usize;
        #[unroll]
        for t in 0..comptime!(TC_QUERIES) {
            let keys = keys_sh[t] as usize;
            if keys > most_keys {
                most_keys = keys;
            }
        }
        if first < most_keys {
            let staged = keys_in_split(most_keys, first);
            // queries as [32][head_dim + PAD], zeros past the tile's queries
            #[unroll]
            for it in 0..comptime!((TC_QUERIES * head_dim / vs).div_ceil(UNITS)) {
                let i = unit + it * comptime!(UNITS);
                if i < comptime!(TC_QUERIES * head_dim / vs) {
                    let qi = i / hd_vecs;
                    let c = i % hd_vecs;
                    let mut val = Vector::<F, N>::new(F::from_int(0));
                    if qi < queries {
                        let row = first_row + qi / hpc;
                        let head = kv_head * group + part * hpc + qi % hpc;
                        val = q[(row * q_heads + head) * hd_vecs + c];
                    }
                    q_sh[qi * ld_vecs + c] = val;
                }
            }
            stage_split::<F, N>(k_cache, &mut kv_sh, slot * max_len + first, kv_heads, kv_head, staged, head_dim, vs);
            // V's loads are issued now and land in shared memory once K is no longer read
            let v_regs_len = comptime!((KV_SPLIT * head_dim / vs).div_ceil(UNITS));
            let mut v_regs = Array::<Vector<F, N>>::new(v_regs_len);
            #[unroll]
            for it in 0..v_regs_len {
                let i = unit + it * comptime!(UNITS);
                let j = i / hd_vecs;
                let mut val = Vector::<F, N>::new(F::from_int(0));
                if i < comptime!(KV_SPLIT * head_dim / vs) && j < staged {
                    val = v_cache[((slot * max_len + first + j) * kv_heads + kv_head) * hd_vecs + i % hd_vecs];
                }
                v_regs[it] = val;
            }
            sync_cube();

            // 1. S = Q K^T: plane p computes query block p / 2 against key blocks 2 (p % 2), +1
            let qb = plane / 2;
            let busy = qb * 16 < queries; // plane-uniform
            let kb = (plane % 2) * 2;
            if busy {
                let s0 = cmma::Matrix::<f32>::from_value(MatrixIdent::Accumulator, 16usize, 16usize, 16usize, MatrixLayout::Undefined, 0.0f32);
                let s1 = cmma::Matrix::<f32>::from_value(MatrixIdent::Accumulator, 16usize, 16usize, 16usize, MatrixLayout::Undefined, 0.0f32);
                #[unroll]
                for kk in 0..comptime!(head_dim / 16) {
                    let mut a = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::A, 16usize, 16usize, 16usize, MatrixLayout::RowMajor) };
                    cmma::load(&mut a, q_sh.slice((qb * 16 * ld + kk * 16) / vs, q_len), comptime!(ld as u32));
                    // kv_sh[key][e]: element (e, key) of K^T at key * ld + e -> column-major B
                    let mut b0 = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::B, 16usize, 16usize, 16usize, MatrixLayout::ColMajor) };
                    cmma::load(&mut b0, kv_sh.slice((kb * 16 * ld + kk * 16) / vs, kv_len), comptime!(ld as u32));
                    let mut b1 = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::B, 16usize, 16usize, 16usize, MatrixLayout::ColMajor) };
                    cmma::load(&mut b1, kv_sh.slice(((kb + 1) * 16 * ld + kk * 16) / vs, kv_len), comptime!(ld as u32));
                    cmma::execute(&a, &b0, &s0, &s0);
                    cmma::execute(&a, &b1, &s1, &s1);
                }
                cmma::store(s_sh.slice_mut(qb * 16 * comptime!(LDS) + kb * 16, s_len), &s0, comptime!(LDS as u32), MatrixLayout::RowMajor);
                cmma::store(s_sh.slice_mut(qb * 16 * comptime!(LDS) + (kb + 1) * 16, s_len), &s1, comptime!(LDS as u32), MatrixLayout::RowMajor);
            }
            sync_cube();

            // 2. unit u takes query u / 4, keys 16 (u % 4) .. +16: the quarter's max (max is
            // exact, so any order gives the query's max), then K's stage takes V
            let qi = unit / 4;
            let quarter = unit % 4;
            let valid = valid_sh[qi] as usize;
            let mut quarter_max = f32::new(NEG_BIG);
            #[unroll]
            for jj in 0..16usize {
                let j = quarter * 16 + jj;
                if j < valid {
                    let score = s_sh[qi * comptime!(LDS) + j] * scale;
                    if score > quarter_max {
                        quarter_max = score;
                    }
                }
            }
            quarter_sh[unit] = quarter_max;
            #[unroll]
            for it in 0..v_regs_len {
                let i = unit + it * comptime!(UNITS);
                if i < comptime!(KV_SPLIT * head_dim / vs) {
                    kv_sh[(i / hd_vecs) * ld_vecs + i % hd_vecs] = v_regs[it];
                }
            }
            sync_cube();
            let mut max = quarter_sh[qi * 4];
            #[unroll]
            for c in 1..4usize {
                if quarter_sh[qi * 4 + c] > max {
                    max = quarter_sh[qi * 4 + c];
                }
            }
            // p_j = exp(s_j - max) rounded to F (the mma operand); the quarter's sum of the
            // rounded p_j in key order
            let mut quarter_sum = 0.0f32;
            #[unroll]
            for jj in 0..16usize {
                let j = quarter * 16 + jj;
                let mut p = F::from_int(0);
                if j < valid {
                    p = F::cast_from((s_sh[qi * comptime!(LDS) + j] * scale - max).exp());
                    quarter_sum += f32::cast_from(p);
                }
                p_sh[qi * comptime!(LDP) + j] = p;
            }
            sync_cube(); // every unit has read its quarter max: the sums take their place
            quarter_sh[unit] = quarter_sum;
            sync_cube();
            // the (max, sum) half of the partial: the four quarter sums in quarter order
            if quarter == 0 && qi < queries && valid > 0 {
                let sum = ((quarter_sh[qi * 4] + quarter_sh[qi * 4 + 1]) + quarter_sh[qi * 4 + 2]) + quarter_sh[qi * 4 + 3];
                let head = kv_head * group + part * hpc + qi % hpc;
                let base = (((first_row + qi / hpc) * q_heads + head) * splits + split) * comptime!(head_dim + 2);
                partials[base] = max;
                partials[base + 1] = sum;
            }

            // 3. O = P V: plane p computes query block p / 2, output dims half p % 2, and stages
            // its fragments in its own windows of the (no longer read) score stage
            if busy {
                let mut accs = Sequence::<cmma::Matrix<f32>>::new();
                #[unroll]
                for _b in 0..blocks {
                    accs.push(cmma::Matrix::<f32>::from_value(MatrixIdent::Accumulator, 16usize, 16usize, 16usize, MatrixLayout::Undefined, 0.0f32));
                }
                #[unroll]
                for kc in 0..comptime!(KV_SPLIT / 16) {
                    let mut a = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::A, 16usize, 16usize, 16usize, MatrixLayout::RowMajor) };
                    cmma::load(&mut a, p_sh.slice(qb * 16 * comptime!(LDP) + kc * 16, comptime!(TC_QUERIES * LDP)), comptime!(LDP as u32));
                    #[unroll]
                    for b in 0..blocks {
                        let db = (plane % 2) * comptime!(head_dim / 32) + b;
                        // kv_sh[key][d]: element (key, d) at key * ld + d -> row-major B
                        let mut v = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::B, 16usize, 16usize, 16usize, MatrixLayout::RowMajor) };
                        cmma::load(&mut v, kv_sh.slice((kc * 16 * ld + db * 16) / vs, kv_len), comptime!(ld as u32));
                        let acc = accs.index(b);
                        cmma::execute(&a, &v, acc, acc);
                    }
                }
                #[unroll]
                for b in 0..blocks {
                    let w = (plane * comptime!(head_dim / 32) + b) * comptime!(WINDOW);
                    cmma::store(s_sh.slice_mut(w, w + comptime!(WINDOW)), accs.index(b), 16u32, MatrixLayout::RowMajor);
                }
            }
            sync_cube();
            if busy {
                #[unroll]
                for b in 0..blocks {
                    let db = (plane % 2) * comptime!(head_dim / 32) + b;
                    let w = (plane * comptime!(head_dim / 32) + b) * comptime!(WINDOW);
                    #[unroll]
                    for e_it in 0..comptime!(WINDOW / PLANE_DIM) {
                        let e = lane + e_it * comptime!(PLANE_DIM);
                        let oq = qb * 16 + e / 16;
                        if oq < queries {
                            if valid_sh[oq] > 0 {
                                let head = kv_head * group + part * hpc + oq % hpc;
                                let base = (((first_row + oq / hpc) * q_heads + head) * splits + split) * comptime!(head_dim + 2);
                                partials[base + 2 + db * 16 + e % 16] = s_sh[w + e];
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Query heads per cube for a group of `group` query heads per KV head: the largest divisor of
/// the group that fits [`TC_QUERIES`]. A property of the model, never of the batch.
pub fn heads_per_cube(group: usize) -> usize {
    (1..=group.min(TC_QUERIES)).rev().find(|h| group % h == 0).unwrap_or(1)
}

/// Whether this device runs the tensor-core attention for `dtype` and `head_dim`: CUDA-style
/// 16x16x16 `cmma` for the dtype (bf16, f16), and a head size of 32, 64, 96 or 128 (the shared
/// stages hold a 64-key split of whole head rows).
pub fn tc_attention_available(client: &burn_cubecl::cubecl::client::Client, dtype: DType, head_dim: usize) -> bool {
    head_dim % 32 == 0 && (32..=128).contains(&head_dim) && tensor_cores_available_for(client, dtype)
}

/// Tiles for the tensor-core kernel: with the rows' slots on the host, runs of consecutive rows
/// of one sequence cut every `rows_per_tile`; without, one row per tile. `(first row, rows)`.
pub(crate) fn tc_tiles(host_slots: Option<&[u32]>, rows: usize, rows_per_tile: usize) -> Vec<(usize, usize)> {
    let Some(slots) = host_slots else { return (0..rows).map(|r| (r, 1)).collect() };
    let mut tiles: Vec<(usize, usize)> = Vec::new();
    for (r, &s) in slots.iter().enumerate() {
        match tiles.last_mut() {
            Some((first, n)) if *n < rows_per_tile && slots[*first] == s => *n += 1,
            _ => tiles.push((r, 1)),
        }
    }
    tiles
}

/// Runs the partial and combine kernels for inputs `attention_impl` has checked, with
/// [`tc_attention_available`] true: `q` [rows, q_heads, head_dim] and the caches
/// [slots, max_len, kv_heads, head_dim], all contiguous; `tiles` from [`tc_tiles`] on the device
/// (`count` of them), cut for [`heads_per_cube`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn tc_split_kv_attention(
    q: &CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    slots: &CubeTensor,
    positions: CubeTensor,
    (rows, q_heads, kv_heads, max_len, head_dim): (usize, usize, usize, usize, usize),
    scale: f32,
    (tiles, count): (CubeTensor, usize),
) -> CubeTensor {
    let pairs = rows * q_heads;
    let splits = max_len.div_ceil(KV_SPLIT);
    let hpc = heads_per_cube(q_heads / kv_heads);
    let parts = q_heads / kv_heads / hpc;
    let partials = empty_device_contiguous_dtype(q.client.clone(), q.device.clone(), [pairs * splits * (head_dim + 2)].into(), DType::F32);
    let vs = 8;
    tc_partial_kernel::launch(
        &q.client,
        cube_count_for(count * kv_heads * parts * splits, 1),
        CubeDim::new_2d(PLANE_DIM as u32, PLANES as u32),
        vs,
        q.clone().into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        slots.clone().into_tensor_arg(),
        positions.clone().into_tensor_arg(),
        tiles.into_tensor_arg(),
        partials.clone().into_tensor_arg(),
        count as u32,
        q_heads as u32,
        kv_heads as u32,
        max_len as u32,
        splits as u32,
        hpc as u32,
        scale,
        head_dim,
        vs,
        [storage(q.dtype), storage(slots.dtype)],
    );
    combine_splits(q, partials, positions, (rows, q_heads, splits, head_dim))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_per_cube_divides_the_group_and_fits_a_cube() {
        for group in 1..=64 {
            let h = heads_per_cube(group);
            assert!(group % h == 0 && h <= TC_QUERIES, "group {group}: {h}");
            assert!((h + 1..=group.min(TC_QUERIES)).all(|g| group % g != 0), "group {group}: {h} is not the largest");
        }
        assert_eq!((heads_per_cube(2), heads_per_cube(12), heads_per_cube(48)), (2, 12, 24));
    }

    #[test]
    fn tiles_are_runs_of_one_sequence_cut_at_the_tile_size() {
        let slots = [3, 3, 3, 3, 3, 1, 1, 3, 0];
        assert_eq!(tc_tiles(Some(&slots), 9, 2), vec![(0, 2), (2, 2), (4, 1), (5, 2), (7, 1), (8, 1)]);
        assert_eq!(tc_tiles(Some(&slots), 9, 16), vec![(0, 5), (5, 2), (7, 1), (8, 1)]);
        // without the slots on the host every row is its own tile (decode's shape)
        assert_eq!(tc_tiles(None, 3, 16), vec![(0, 1), (1, 1), (2, 1)]);
    }
}
