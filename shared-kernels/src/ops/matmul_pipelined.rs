//! bf16/f16 tensor-core matmul on cubek-matmul's double-buffered kernel (the kernel family burn's
//! autotuner picks from on the H200), launched with ONE frozen blueprint instead of its selector.
//!
//! Why this is batch invariant (read from cubek-matmul 0.3.1's source, checked on the H200 by the
//! battery): every cube walks the full K of its 128x128 output tile in order, in stages of 32
//! (no split-K, no stream-K anywhere in the multi-level kernels); each 16x16 f32 accumulator
//! fragment takes its 16x16x16 products k = 0, 16, 32, ... in order; a row always lands in the
//! same fragment slot whatever M is; rows past M are loaded as zeros and never written. What
//! cubek would otherwise choose by M (instruction shape, rows per plane, planes per cube, the
//! "tiny" tiling, the M-bounds check) is fixed here: the blueprint depends on N, K and the weight
//! layout only. Errors are returned, never retried on another kernel (a silent fallback would
//! change the bits).

use super::matmul::WeightLayout;
use super::storage;
use crate::KernelError;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems, MatmulProblem};
use cubek::matmul::multi_level::components::{stage::PartitionBuffering, tile::TileMatmulKind};
use cubek::matmul::multi_level::definition::{BatchMatmulBlueprint, TilingScheme};
use cubek::matmul::multi_level::routines::batch::{double_buffering::CyclicDoubleBufferingAlgorithm, launch::launch_ref};
use cubek::matmul::multi_level::{PartitionSize, StageSize, TileSize};
use cubek::matmul::routine::BlueprintStrategy;
use cubek::std::cube_count::{GlobalOrder, HypercubeBlueprint};
use cubek::std::{InputBinding, MatrixLayout};

/// The instruction (16x16x16), tiles per plane (2 x 8, two k-tiles per stage) and planes per
/// cube (4 along M): a 128x128 output tile per cube, K consumed 32 at a time, two stages in
/// flight. Part of the numerics: never chosen per call.
const TILE: (u32, u32, u32) = (16, 16, 16);
const PARTITION: (u32, u32, u32) = (2, 8, 2);
const STAGE: (u32, u32, u32) = (4, 1, 1);
const STAGES_IN_FLIGHT: u32 = 2;
const PLANE_DIM: u32 = 32;

fn blueprint(n: usize, k: usize, rhs_layout: MatrixLayout, globals: MatmulGlobalElems) -> Result<BatchMatmulBlueprint, KernelError> {
    let tiling = TilingScheme::builder()
        .with_tile_size(TileSize::new(TILE.0, TILE.1, TILE.2))
        .with_partition_size(PartitionSize::new(PARTITION.0, PARTITION.1, PARTITION.2))
        .with_stage_size(StageSize::new(STAGE.0, STAGE.1, STAGE.2))
        .build()
        .map_err(|e| KernelError::new("matmul", format!("pipelined tiling: {e}")))?;
    // the builder reads m only to set check_m_bounds, which is forced on below: one compiled
    // kernel for every M
    let problem = MatmulProblem::from_parameters(
        1,
        n,
        k,
        [0usize; 0].into(),
        [0usize; 0].into(),
        MatrixLayout::RowMajor,
        rhs_layout,
        MatrixLayout::RowMajor,
        None,
        None,
        globals,
        Default::default(),
    );
    let mut bp = BatchMatmulBlueprint::builder(TileMatmulKind::Cmma, tiling, PLANE_DIM, &problem)
        .partition_buffering(PartitionBuffering::Double)
        .stage_buffering(STAGES_IN_FLIGHT)
        // which cube computes which tile (L2 reuse), not what a tile computes
        .hypercube_blueprint(HypercubeBlueprint::builder().global_order(GlobalOrder::SwizzleRow(4)).build())
        .build();
    bp.check_m_bounds = true;
    Ok(bp)
}

/// `x[M,K] @ W` with `w` laid out as `layout` says; bf16 or f16, f32 accumulation, output in x's
/// dtype, packed `[M,N]`. Operands already checked by `matmul::checked_dims`.
pub(crate) fn matmul_pipelined(x: CubeTensor, w: CubeTensor, layout: WeightLayout, (m, k, n): (usize, usize, usize)) -> Result<CubeTensor, KernelError> {
    const OP: &str = "matmul";
    let elem = storage(x.dtype);
    let globals = MatmulGlobalElems { lhs: elem, rhs: elem, out: elem };
    let y = empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), [m, n].into(), x.dtype);
    let client = x.client.clone();
    let lhs = InputBinding::new(x.binding(), elem);
    let mut rhs = InputBinding::new(w.binding(), elem);
    let rhs_layout = match layout {
        // [N,K] row-major viewed as [K,N] with strides [1,K]: column-major
        WeightLayout::OutIn => {
            rhs.swap_dims(0, 1);
            MatrixLayout::ColMajor
        }
        WeightLayout::InOut => MatrixLayout::RowMajor,
    };
    let bp = blueprint(n, k, rhs_layout, globals.clone())?;
    let mut dtypes = MatmulElems::from_globals(&globals);
    launch_ref::<CyclicDoubleBufferingAlgorithm>(&client, lhs, rhs, y.clone().binding(), &BlueprintStrategy::Forced(bp), &mut dtypes)
        .map_err(|e| KernelError::new(OP, format!("pipelined tensor-core kernel failed to launch for M={m} K={k} N={n}: {e:?}")))?;
    Ok(y)
}
