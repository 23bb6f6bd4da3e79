//! The tensor-core attention (`split_kv_tc`) on one launch set: which kernels run (`mma`
//! fragments in registers by default, `cmma` through shared memory: [`TcKernels`]), how a
//! launch's rows are cut into prefill tiles and decode rows, and the launches themselves with
//! their fixed-order combine. Every choice here depends on the model's shape and the device,
//! never on the batch, so the sampler and the trainer run the same kernels row for row.

use crate::ops::attention::decode::cmma::*;
use crate::ops::attention::decode::cmma::PLANE_DIM;
use crate::ops::attention::prefill::cmma_flash::tc_flash_kernel;
use crate::ops::attention::decode::mma_decode::{decode_warps, mma_partial_kernel, DecodeLaunch, Staging};
use crate::ops::attention::decode::mma_decode_narrow::{mma_partial_narrow_kernel, NARROW_QUERIES};
use crate::ops::attention::prefill::mma_flash::mma_flash_kernel;
use crate::ops::attention::route::{tensor_core_family_runs, Call, Choices, Kernel};
use crate::ops::attention::decode::split_kv::combine_rows;
use crate::ops::kv_cache::BlockRows;
use crate::ops::attention::common::splits::KV_SPLIT;
use crate::ops::matmul::tc::tensor_cores_available_for;
use crate::ops::{cube_count_for, storage};
pub use crate::kernel_choice::TcKernels;
use crate::{ensure, KernelError};
use burn::tensor::DType;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;


impl TcKernels {
    /// Queries one prefill cube holds: a prefill tile's rows times the heads per cube.
    pub fn prefill_queries(self) -> Result<usize, crate::KernelError> {
        Ok(match self {
            TcKernels::Mma => 16 * crate::ops::attention::prefill::mma_flash::flash_warps()?,
            TcKernels::Cmma => crate::ops::attention::decode::cmma::TC_QUERIES,
        })
    }
}

/// Runs `f` with this thread's attention on `kernel` (the battery compares the two sets):
/// [`crate::kernel_choice::KernelChoice::scoped`].
pub fn with_tc_kernels<R>(kernel: TcKernels, f: impl FnOnce() -> R) -> Result<R, crate::KernelError> {
    crate::kernel_choice::KernelChoice::scoped(|c| c.attention_tc = kernel, f)
}

/// The kernel set: this thread's `LOCKSTEP_ATTENTION_TC` ([`crate::kernel_choice::KernelChoice::current`]:
/// `mma` unless set); `cmma` off CUDA, where inline PTX does not exist.
pub fn tc_kernels() -> Result<TcKernels, crate::KernelError> {
    Ok(if crate::device::runtime_name() == "cuda" { choices()?.set } else { TcKernels::Cmma })
}

pub use crate::ops::attention::route::heads_per_cube;

/// Whether this device runs the tensor-core attention for `dtype` and `head_dim`: CUDA-style
/// 16x16x16 `cmma` for the dtype (bf16, f16), and a head size of 32, 64, 96 or 128
/// ([`crate::ops::attention::route::tensor_core_family_runs`]).
pub fn tc_attention_available(client: &burn_cubecl::cubecl::client::Client, dtype: DType, head_dim: usize) -> bool {
    tensor_core_family_runs(&call_on(client, dtype, head_dim, 1, 0))
}

/// The [`Call`] of an attention launch on `client`'s device.
pub fn call_on(client: &burn_cubecl::cubecl::client::Client, dtype: DType, head_dim: usize, group: usize, max_len: usize) -> Call {
    Call { cuda: crate::device::runtime_name() == "cuda", dtype, tensor_cores: tensor_cores_available_for(client, dtype), head_dim, group, max_len }
}

/// This thread's [`Choices`]: its kernel choice ([`crate::kernel_choice::KernelChoice::current`])
/// and the decode launch ([`crate::ops::attention::decode::mma_decode::with_decode_launch`]'s, else
/// `LOCKSTEP_DECODE_LAUNCH`).
pub fn choices() -> Result<Choices, crate::KernelError> {
    let process = crate::kernel_choice::KernelChoice::current()?;
    Ok(Choices {
        attention: process.attention,
        set: process.attention_tc,
        decode_staging: DecodeLaunch::requested()?.map(|l| l.staging),
        backward_on_tensor_cores: process.attention_backward_on_tensor_cores,
    })
}

/// Tiles for the tensor-core kernel: with the rows' slots on the host, runs of consecutive rows
/// of one sequence cut every `rows_per_tile`; without, one row per tile. `(first row, rows)`.
pub(crate) fn tc_tiles(host_slots: Option<&[u32]>, rows: usize, rows_per_tile: usize) -> Vec<(usize, usize)> {
    match host_slots {
        Some(slots) => crate::ops::attention::decode::split_kv::sequence_runs(slots, rows_per_tile),
        None => (0..rows).map(|r| (r, 1)).collect(),
    }
}

thread_local! {
    /// [`single_row_tiles`]' tables by (device, rows).
    static SINGLE_ROW_TILES: std::cell::RefCell<std::collections::HashMap<(burn_cubecl::CubeDevice, DType, usize), CubeTensor>> = std::cell::RefCell::new(std::collections::HashMap::new());
}

/// The tile table of a step whose rows are all single-row tiles in row order (a decode step):
/// `[0, 1, 1, 1, 2, 1, ...]`, uploaded once per (device, rows) and kept. It is only read, and
/// a step replayed as a graph may not upload (`shared_kernels::graph`).
fn single_row_tiles(rows: usize, like: &CubeTensor, upload: &impl Fn(Vec<i32>) -> Result<CubeTensor, KernelError>) -> Result<CubeTensor, KernelError> {
    // looked up on every decode step's attention of every layer: a key of values, not text
    let key = (like.device.clone(), like.dtype, rows);
    if let Some(t) = SINGLE_ROW_TILES.with(|m| m.borrow().get(&key).cloned()) {
        return Ok(t);
    }
    let t = upload((0..rows as i32).flat_map(|r| [r, 1]).collect())?;
    SINGLE_ROW_TILES.with(|m| m.borrow_mut().insert(key, t.clone()));
    Ok(t)
}

/// Rows of one sequence that make a flash tile: prefill tiles of at least this many rows run
/// [`crate::ops::attention::prefill::cmma_flash`]'s kernel, smaller ones (decode rows) the per-split partials and
/// the combine. Both give the same bits, so this only trades parallelism over splits (decode)
/// for fewer passes over memory (prefill).
pub const FLASH_MIN_ROWS: usize = 2;

/// Whether, for KV groups of `group` query heads, the prefill tiles of either kernel set
/// ([`TcKernels::prefill_queries`] over the heads a cube holds) have at least [`FLASH_MIN_ROWS`]
/// rows, so a step's one-row tiles are its requests' last rows (at most one a request); else
/// (or if the choice cannot be read) every row of a prefill step may be one.
pub fn short_tiles_are_single_rows(group: usize) -> bool {
    let hpc = heads_per_cube(group.max(1));
    [TcKernels::Mma, TcKernels::Cmma].iter().all(|set| set.prefill_queries().is_ok_and(|q| q / hpc >= FLASH_MIN_ROWS))
}

/// How one call's tiles split between the kernels: flash tiles, single-row tiles (partials +
/// combine), and, when both kinds are present, the rows the combine must write (all of them
/// otherwise).
#[derive(Debug, PartialEq)]
pub(crate) struct TileLaunches {
    pub flash: Vec<(usize, usize)>,
    pub single: Vec<(usize, usize)>,
    pub single_rows: Option<Vec<i32>>,
}

impl TileLaunches {
    pub fn of(tiles: &[(usize, usize)]) -> Self {
        Self::with_min_rows(tiles, FLASH_MIN_ROWS)
    }
    /// Tiles of at least `min_rows` rows on the flash kernel (1: every tile, each row's statistics).
    pub fn with_min_rows(tiles: &[(usize, usize)], min_rows: usize) -> Self {
        let (flash, single): (Vec<_>, Vec<_>) = tiles.iter().partition(|&&(_, n)| n >= min_rows);
        let single_rows = (!flash.is_empty() && !single.is_empty()).then(|| single.iter().flat_map(|&(first, n)| (first..first + n).map(|r| r as i32)).collect());
        Self { flash, single, single_rows }
    }
}

thread_local! {
    /// The last few partials buffers, by length: every layer of a decode step needs one of the
    /// same length, and a fresh one each time was an allocation task on cubecl's device thread.
    static PARTIALS: std::cell::RefCell<Vec<CubeTensor>> = const { std::cell::RefCell::new(Vec::new()) };
}
const CACHED_PARTIALS: usize = 2;

/// An f32 buffer of `len` values on `like`'s device, reused across calls. Safe to share: the
/// launches that write and read it run in order on this thread's stream, each call's combine
/// reads only the splits its partial kernel wrote, and nothing outside this file holds it.
fn partials_workspace(like: &CubeTensor, len: usize) -> CubeTensor {
    PARTIALS.with(|cached| {
        let mut cached = cached.borrow_mut();
        if let Some(i) = cached.iter().position(|t| t.device == like.device && t.meta.shape().num_elements() == len) {
            let t = cached.remove(i);
            cached.insert(0, t.clone());
            return t;
        }
        let t = empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), [len].into(), DType::F32);
        cached.insert(0, t.clone());
        cached.truncate(CACHED_PARTIALS);
        t
    })
}

/// `t`'s rows at `list` (device indices), contiguous: a copy (burn's select), so the same bits.
fn gather_rows<const D: usize>(t: &CubeTensor, list: &CubeTensor) -> Result<CubeTensor, KernelError> {
    let index = crate::bridge::int_out::<1>(list.clone());
    match t.dtype.is_float() {
        true => crate::bridge::float_in("attention", "rows", crate::bridge::float_out::<D>(t.clone()).select(0, index)),
        false => crate::bridge::int_in("attention", "rows", crate::bridge::int_out::<D>(t.clone()).select(0, index)),
    }
}

/// Runs the kernels for inputs `attention_impl` has checked, with [`tc_attention_available`]
/// true: `q` [rows, q_heads, head_dim] and the caches laid out by `pages`, all contiguous;
/// `tiles` from [`tc_tiles`], cut for [`heads_per_cube`]; `upload` puts a host table on the
/// device in the slots' integer type; `decode` and `prefill` are the kernels
/// [`crate::ops::attention::route`] picks for one-row tiles and for tiles of 2+ rows;
/// `stats` (f32, 2 a (row, query head), `mma` only): every tile on the flash kernel, which also
/// writes each row's softmax statistics for the training backward.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tc_split_kv_attention(
    q: &CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    slots: &CubeTensor,
    positions: CubeTensor,
    pages: &BlockRows,
    (rows, q_heads, kv_heads, max_len, head_dim): (usize, usize, usize, usize, usize),
    scale: f32,
    tiles: &[(usize, usize)],
    (decode, prefill): (Kernel, Kernel),
    upload: impl Fn(Vec<i32>) -> Result<CubeTensor, KernelError>,
    stats: Option<&CubeTensor>,
) -> Result<CubeTensor, KernelError> {
    let splits = max_len.div_ceil(KV_SPLIT);
    let hpc = heads_per_cube(q_heads / kv_heads);
    let parts = q_heads / kv_heads / hpc;
    let vs = 8;
    let dtypes = [storage(q.dtype), storage(slots.dtype)];
    ensure!(stats.is_none() || prefill == Kernel::MmaFlash, "attention", "softmax statistics for the backward come from the mma flash kernel only (this launch's prefill kernel is {prefill:?})");
    let TileLaunches { flash, single, single_rows } = if stats.is_some() { TileLaunches::with_min_rows(tiles, 1) } else { TileLaunches::of(tiles) };
    // the prefill cube's queries: the size `attention_impl` cut the tiles for
    let cube_queries = if prefill == Kernel::MmaFlash { TcKernels::Mma } else { TcKernels::Cmma }.prefill_queries()?;
    ensure!(flash.iter().all(|&(_, n)| n * hpc <= cube_queries), "attention", "a prefill tile holds more than the cube's {cube_queries} queries ({hpc} per row)");
    let flat = |t: &[(usize, usize)]| t.iter().flat_map(|&(first, n)| [first as i32, n as i32]).collect::<Vec<_>>();
    let out = empty_device_contiguous_dtype(q.client.clone(), q.device.clone(), [rows, q_heads, head_dim].into(), q.dtype);
    if !single.is_empty() {
        // beside flash tiles, the one-row tiles' inputs are gathered into rows 0..m: the partial
        // kernels run on them as on a decode step's (the same bits), their f32 partials m rows,
        // not every row of the step (Qwen3-8B, 256 chunks of 64 tokens: 0.14 GB, not 9 GB)
        let listed = single_rows.map(|list| upload(list).map(|t| (t, single.len()))).transpose()?;
        let gather = |list: &CubeTensor| -> Result<_, KernelError> { Ok((gather_rows::<3>(q, list)?, gather_rows::<1>(slots, list)?, gather_rows::<1>(&positions, list)?)) };
        let compact = listed.as_ref().map(|(list, _)| gather(list)).transpose()?;
        let (q, slots, positions) = match &compact {
            Some((q, slots, positions)) => (q, slots, positions.clone()),
            None => (q, slots, positions.clone()),
        };
        ensure!(listed.is_none() || single.iter().all(|&(_, n)| n == 1), "attention", "listed short tiles are single rows");
        let partial_rows = if listed.is_some() { single.len() } else { rows };
        let partials = partials_workspace(q, partial_rows * q_heads * splits * (head_dim + 2));
        let units = single.len() * kv_heads * parts * splits;
        let decode_cubes = cube_count_for(units, 1);
        let single_table = if listed.is_some() || single.iter().enumerate().all(|(r, &(first, n))| first == r && n == 1) { single_row_tiles(single.len(), slots, &upload)? } else { upload(flat(&single))? };
        if let Kernel::MmaPartials(staging) = decode {
            let warps = decode_warps(hpc);
            let launch = DecodeLaunch { splits_per_cube: DecodeLaunch::requested()?.map_or_else(|| DecodeLaunch::auto_splits(units), |l| l.splits_per_cube), staging };
            let chunks = splits.div_ceil(launch.splits_per_cube);
            let cubes = cube_count_for(single.len() * kv_heads * parts * chunks, 1);
            ensure!(launch.staging != Staging::Narrow || hpc <= NARROW_QUERIES, "attention", "LOCKSTEP_DECODE_LAUNCH={}: the narrow kernel holds at most {NARROW_QUERIES} query heads a cube, this model's KV heads have {hpc}", launch.name());
            // the same arguments for both kernels (the narrow one is one warp, one stage)
            macro_rules! launch_partials {
                ($kernel:ident, $warps:expr $(, $staging:expr)*) => {
                    $kernel::launch(
                        &q.client,
                        cubes,
                        CubeDim::new_2d(32, $warps as u32),
                        vs,
                        q.clone().into_tensor_arg(),
                        k.clone().into_tensor_arg(),
                        v.clone().into_tensor_arg(),
                        slots.clone().into_tensor_arg(),
                        positions.clone().into_tensor_arg(),
                        single_table.clone().into_tensor_arg(),
                        pages.table.clone().into_tensor_arg(),
                        partials.clone().into_tensor_arg(),
                        single.len() as u32,
                        q_heads as u32,
                        kv_heads as u32,
                        pages.width as u32,
                        splits as u32,
                        hpc as u32,
                        launch.splits_per_cube as u32,
                        scale,
                        head_dim,
                        vs,
                        q.dtype == DType::F16,
                        $($staging,)*
                        dtypes,
                    )
                };
            }
            match launch.staging {
                Staging::Narrow => launch_partials!(mma_partial_narrow_kernel, 1),
                staging => launch_partials!(mma_partial_kernel, warps, warps, staging == Staging::One),
            }
        } else {
            tc_partial_kernel::launch(
                &q.client,
                decode_cubes,
                CubeDim::new_2d(PLANE_DIM as u32, PLANES as u32),
                vs,
                q.clone().into_tensor_arg(),
                k.clone().into_tensor_arg(),
                v.clone().into_tensor_arg(),
                slots.clone().into_tensor_arg(),
                positions.clone().into_tensor_arg(),
                single_table.clone().into_tensor_arg(),
                pages.table.clone().into_tensor_arg(),
                partials.clone().into_tensor_arg(),
                single.len() as u32,
                q_heads as u32,
                kv_heads as u32,
                pages.width as u32,
                splits as u32,
                hpc as u32,
                scale,
                head_dim,
                vs,
                dtypes,
            );
        }
        combine_rows(&out, partials, positions, listed, (rows, q_heads, splits, head_dim));
    }
    if !flash.is_empty() && prefill == Kernel::MmaFlash {
        let stats_arg = stats.cloned().unwrap_or_else(|| empty_device_contiguous_dtype(q.client.clone(), q.device.clone(), [2].into(), DType::F32)); // unwritten
        mma_flash_kernel::launch(
            &q.client,
            cube_count_for(flash.len() * kv_heads * parts, 1),
            CubeDim::new_2d(32, (cube_queries / 16) as u32),
            vs,
            q.clone().into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            slots.clone().into_tensor_arg(),
            positions.into_tensor_arg(),
            upload(flat(&flash))?.into_tensor_arg(),
            pages.table.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            stats_arg.into_tensor_arg(),
            flash.len() as u32,
            q_heads as u32,
            kv_heads as u32,
            pages.width as u32,
            hpc as u32,
            scale,
            head_dim,
            vs,
            q.dtype == DType::F16,
            cube_queries / 16,
            stats.is_some(),
            dtypes,
        );
    } else if !flash.is_empty() {
        tc_flash_kernel::launch(
            &q.client,
            cube_count_for(flash.len() * kv_heads * parts, 1),
            CubeDim::new_2d(PLANE_DIM as u32, PLANES as u32),
            vs,
            q.clone().into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            slots.clone().into_tensor_arg(),
            positions.into_tensor_arg(),
            upload(flat(&flash))?.into_tensor_arg(),
            pages.table.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            flash.len() as u32,
            q_heads as u32,
            kv_heads as u32,
            pages.width as u32,
            hpc as u32,
            scale,
            head_dim,
            vs,
            dtypes,
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_setting_names_its_values() {
        assert_eq!(TcKernels::parse("mma"), Some(TcKernels::Mma));
        assert_eq!(TcKernels::parse("cmma"), Some(TcKernels::Cmma));
        assert_eq!(TcKernels::parse("wmma"), None);
    }

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
    fn a_mixed_launch_lists_the_rows_the_combine_writes() {
        // a prefill chunk of 3 rows, two decode rows, a chunk of 2
        let l = TileLaunches::of(&[(0, 3), (3, 1), (4, 1), (5, 2)]);
        assert_eq!((l.flash, l.single, l.single_rows), (vec![(0, 3), (5, 2)], vec![(3, 1), (4, 1)], Some(vec![3, 4])));
        // decode only: the combine writes every row, no list
        let l = TileLaunches::of(&[(0, 1), (1, 1)]);
        assert_eq!((l.flash.len(), l.single.len(), l.single_rows), (0, 2, None));
        // prefill only: no partials at all
        let l = TileLaunches::of(&[(0, 16), (16, 4)]);
        assert_eq!((l.flash.len(), l.single.len(), l.single_rows), (2, 0, None));
        // the training forward writing the backward's statistics: every tile on the flash kernel
        let l = TileLaunches::with_min_rows(&[(0, 3), (3, 1), (5, 2)], 1);
        assert_eq!((l.flash, l.single.len(), l.single_rows), (vec![(0, 3), (3, 1), (5, 2)], 0, None));
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
