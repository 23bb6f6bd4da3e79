//! bf16/f16 tensor-core matmul on cubek-matmul's double-buffered kernel (the kernel family burn's
//! autotuner picks from on the H200), launched with frozen blueprints instead of its selector.
//!
//! Why this is batch invariant (read from cubek-matmul 0.3.1's source, checked on the H200 by the
//! battery): every cube walks the full K of its 128x128 output tile in order, in stages of 32
//! (no split-K, no stream-K anywhere in the multi-level kernels); each 16x16 f32 accumulator
//! fragment takes its 16x16x16 products k = 0, 16, 32, ... in order, whichever fragment slot the
//! row lands in; rows past M are loaded as zeros and never written. What cubek would otherwise
//! choose by M (instruction shape, the "tiny" tiling, the M-bounds check) is fixed here. Only
//! the output-tile size follows M (16 rows per cube up to M = 64, 128 above), and both tiles
//! share the algorithm, the instruction and the k-tiles per stage, so every output element sees
//! the same sequence of instructions over the same k order. Errors are returned, never retried
//! on another kernel (a silent fallback would change the bits).

use crate::ops::matmul::layout::WeightLayout;
use crate::ops::storage;
use crate::KernelError;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems, MatmulProblem};
use cubek::matmul::multi_level::components::{stage::PartitionBuffering, tile::TileMatmulKind};
use cubek::matmul::multi_level::definition::{BatchMatmulBlueprint, TilingScheme};
use cubek::matmul::multi_level::routines::batch::double_buffering::{AsyncCyclicDoubleBufferingAlgorithm, CyclicDoubleBufferingAlgorithm, TmaDoubleBufferingAlgorithm};
use cubek::matmul::multi_level::routines::batch::launch::{launch_ref, launch_ref_tma};
use cubek::matmul::multi_level::{PartitionSize, StageSize, TileSize};
use cubek::matmul::routine::BlueprintStrategy;
use cubek::std::cube_count::{GlobalOrder, HypercubeBlueprint};
use cubek::std::{InputBinding, MatrixLayout};

/// One kernel configuration: the cubek algorithm (how stages are loaded), the tile instruction,
/// tiles per plane and planes per cube. Written `algo/kind/TMxTNxTK/PMxPNxPK/SMxSNx1`, e.g. the
/// default `double/cmma/16x16x16/2x8x2/4x1x1`: 16x16x16 wmma, each plane 2x8 fragments with two
/// k-tiles per stage, 4 planes along M: a 128x128 output tile per cube, K consumed 32 at a time,
/// two stages in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipelinedConfig {
    pub algo: Algo,
    pub kind: TileMatmulKind,
    pub tile: (u32, u32, u32),
    pub partition: (u32, u32, u32),
    pub stage: (u32, u32),
}

/// How a cube stages its operands in shared memory; all walk K in order, two stages in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    /// Synchronous cyclic loads (no alignment requirement).
    Double,
    /// cp.async loads (K and N multiples of 8 in bf16).
    Async,
    /// Hopper TMA loads (same alignment as Async).
    Tma,
}

/// The large-M configuration (prefill, training): TMA loads, 128x128 output tile.
pub const LARGE: PipelinedConfig = PipelinedConfig { algo: Algo::Tma, kind: TileMatmulKind::Cmma, tile: (16, 16, 16), partition: (2, 8, 2), stage: (4, 1) };
/// The small-M configuration (decode): cp.async loads, 16 rows per cube instead of 128, so a
/// one-token decode computes 16 padded rows, not 128. Same instruction and k-tiles per stage as
/// [`LARGE`] and the same two-stage pipeline (only how operands reach shared memory differs), so
/// every output element sees the same instruction sequence over the same k order: the row bits
/// do not depend on which configuration ran (the battery checks rows computed with M = 1..64
/// against the same rows in an M = 257 launch).
pub const SMALL: PipelinedConfig = PipelinedConfig { algo: Algo::Async, kind: TileMatmulKind::Cmma, tile: (16, 16, 16), partition: (1, 4, 2), stage: (1, 2) };
/// For K or N not a multiple of 8 (TMA and cp.async need 16-byte-aligned rows): the same tiles
/// with synchronous loads. Chosen by N and K, never by M.
pub const LARGE_UNALIGNED: PipelinedConfig = PipelinedConfig { algo: Algo::Double, ..LARGE };
pub const SMALL_UNALIGNED: PipelinedConfig = PipelinedConfig { algo: Algo::Double, ..SMALL };
/// Launches with M up to this use the small configuration (measured crossover on the H200
/// between M = 16 and 64 at Qwen3-0.6B's shapes: docs/perf.md).
pub const SMALL_MAX_M: usize = 32;

impl PipelinedConfig {
    pub fn parse(text: &str) -> Result<Self, String> {
        let parts: Vec<&str> = text.trim().split('/').collect();
        let [algo, kind, tile, partition, stage] = parts[..] else {
            return Err(format!("`{text}`: expected algo/kind/TMxTNxTK/PMxPNxPK/SMxSNx1"));
        };
        let triple = |what: &str, t: &str| -> Result<(u32, u32, u32), String> {
            let v: Vec<u32> = t.split('x').map(|n| n.parse::<u32>()).collect::<Result<_, _>>().map_err(|e| format!("`{text}`: {what} `{t}`: {e}"))?;
            match v[..] {
                [a, b, c] if a > 0 && b > 0 && c > 0 => Ok((a, b, c)),
                _ => Err(format!("`{text}`: {what} `{t}` must be three positive numbers AxBxC")),
            }
        };
        let algo = match algo {
            "double" => Algo::Double,
            "async" => Algo::Async,
            "tma" => Algo::Tma,
            other => return Err(format!("`{text}`: algo `{other}` is not double, async or tma")),
        };
        let kind = match kind {
            "cmma" => TileMatmulKind::Cmma,
            "mma" => TileMatmulKind::Mma,
            other => return Err(format!("`{text}`: kind `{other}` is not cmma or mma")),
        };
        let (sm, sn, sk) = triple("stage", stage)?;
        if sk != 1 {
            return Err(format!("`{text}`: stage k must be 1"));
        }
        Ok(PipelinedConfig { algo, kind, tile: triple("tile", tile)?, partition: triple("partition", partition)?, stage: (sm, sn) })
    }

    /// Two configurations give every output element the same arithmetic when they share the
    /// instruction and the k-tiles per stage: all three algorithms run the same two-stage
    /// pipeline over K and differ only in how operands reach shared memory, and the tile sizes
    /// only decide how many rows and columns a plane and a cube cover.
    pub fn same_arithmetic(&self, other: &Self) -> bool {
        self.kind == other.kind && self.tile == other.tile && self.partition.2 == other.partition.2
    }
}

/// The (small, large) configurations for a K x N weight: the constants above, or
/// `LOCKSTEP_PIPELINED_LARGE` / `LOCKSTEP_PIPELINED_SMALL` (for benchmark sweeps; used as given,
/// alignment included). Overrides that would change the arithmetic between the two are refused.
pub fn configs_for(k: usize, n: usize, has_tma: bool) -> Result<(PipelinedConfig, PipelinedConfig), KernelError> {
    if let Some(pair) = overrides().clone().map_err(|e| KernelError::new("matmul", e))? {
        return Ok(pair);
    }
    if k % 8 != 0 || n % 8 != 0 {
        return Ok((SMALL_UNALIGNED, LARGE_UNALIGNED));
    }
    // without TMA (pre-Hopper GPUs) the large tile loads with cp.async: same tiles, same
    // arithmetic, only the copy engine differs
    Ok((SMALL, if has_tma { LARGE } else { PipelinedConfig { algo: Algo::Async, ..LARGE } }))
}

/// The environment's (small, large) pair, `None` when neither variable is set; read once per
/// process (this sits on every matmul call).
fn overrides() -> &'static Result<Option<(PipelinedConfig, PipelinedConfig)>, String> {
    static OVERRIDES: std::sync::OnceLock<Result<Option<(PipelinedConfig, PipelinedConfig)>, String>> = std::sync::OnceLock::new();
    OVERRIDES.get_or_init(|| {
        let read = |var: &str| crate::knobs::var(var).map(|text| PipelinedConfig::parse(&text).map_err(|e| format!("{var}: {e}"))).transpose();
        let (large, small) = (read("LOCKSTEP_PIPELINED_LARGE")?, read("LOCKSTEP_PIPELINED_SMALL")?);
        let (small, large) = match (small, large) {
            (None, None) => return Ok(None),
            (small, large) => {
                let large = large.unwrap_or(LARGE);
                (small.unwrap_or(large), large)
            }
        };
        if !small.same_arithmetic(&large) {
            return Err(format!("LOCKSTEP_PIPELINED_SMALL {small:?} and _LARGE {large:?} must share kind, tile and partition k (else row bits would depend on M)"));
        }
        Ok(Some((small, large)))
    })
}

fn blueprint(config: PipelinedConfig, n: usize, k: usize, rhs_layout: MatrixLayout, globals: MatmulGlobalElems) -> Result<BatchMatmulBlueprint, KernelError> {
    let (t, p, st) = (config.tile, config.partition, config.stage);
    let tiling = TilingScheme::builder()
        .with_tile_size(TileSize::new(t.0, t.1, t.2))
        .with_partition_size(PartitionSize::new(p.0, p.1, p.2))
        .with_stage_size(StageSize::new(st.0, st.1, 1))
        .build()
        .map_err(|e| KernelError::new("matmul", format!("pipelined tiling {config:?}: {e}")))?;
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
    let mut bp = BatchMatmulBlueprint::builder(config.kind, tiling, PLANE_DIM, &problem)
        .partition_buffering(if p.1 >= 2 { PartitionBuffering::Double } else { PartitionBuffering::Single })
        .stage_buffering(2)
        // which cube computes which tile (L2 reuse), not what a tile computes
        .hypercube_blueprint(HypercubeBlueprint::builder().global_order(GlobalOrder::SwizzleRow(4)).build())
        .build();
    bp.check_m_bounds = true;
    Ok(bp)
}

const PLANE_DIM: u32 = 32;

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
    let has_tma = client.properties().features.tma.contains(burn_cubecl::cubecl::features::Tma::Base);
    let (small, large) = configs_for(k, n, has_tma)?;
    let config = if m <= SMALL_MAX_M { small } else { large };
    let bp = blueprint(config, n, k, rhs_layout, globals.clone())?;
    let mut dtypes = MatmulElems::from_globals(&globals);
    let out = y.clone().binding();
    match config.algo {
        Algo::Double => launch_ref::<CyclicDoubleBufferingAlgorithm>(&client, lhs, rhs, out, &BlueprintStrategy::Forced(bp), &mut dtypes),
        Algo::Async => launch_ref::<AsyncCyclicDoubleBufferingAlgorithm>(&client, lhs, rhs, out, &BlueprintStrategy::Forced(bp), &mut dtypes),
        Algo::Tma => launch_ref_tma::<TmaDoubleBufferingAlgorithm>(&client, lhs, rhs, out, &BlueprintStrategy::Forced(bp), &mut dtypes),
    }
    .map_err(|e| KernelError::new(OP, format!("pipelined tensor-core kernel {config:?} failed to launch for M={m} K={k} N={n}: {e:?}")))?;
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_parse_and_refuse_what_would_change_the_arithmetic() {
        let large = PipelinedConfig::parse("tma/cmma/16x16x16/2x8x2/4x1x1").unwrap();
        assert_eq!(large, LARGE);
        assert_eq!(PipelinedConfig::parse("async/cmma/16x16x16/1x4x2/1x2x1").unwrap(), SMALL);
        for (small, large) in [(SMALL, LARGE), (SMALL_UNALIGNED, LARGE_UNALIGNED), (SMALL_UNALIGNED, LARGE)] {
            assert!(small.same_arithmetic(&large), "shipped configurations must share the arithmetic: {small:?} {large:?}");
        }
        let mma = PipelinedConfig::parse("tma/mma/16x8x16/2x8x2/4x1x1").unwrap();
        assert_eq!((mma.algo, mma.kind, mma.tile), (Algo::Tma, TileMatmulKind::Mma, (16, 8, 16)));
        assert!(!mma.same_arithmetic(&LARGE));
        let deeper_k = PipelinedConfig::parse("double/cmma/16x16x16/1x4x4/1x2x1").unwrap();
        assert!(!deeper_k.same_arithmetic(&LARGE), "k-tiles per stage are part of the arithmetic");
        // the shipped selection by shape and device (only meaningful without overrides)
        if crate::knobs::is_set("LOCKSTEP_PIPELINED_LARGE") || crate::knobs::is_set("LOCKSTEP_PIPELINED_SMALL") {
            return;
        }
        assert_eq!(configs_for(1024, 3072, true).unwrap(), (SMALL, LARGE));
        assert_eq!(configs_for(1024, 3072, false).unwrap().1.algo, Algo::Async);
        assert_eq!(configs_for(1000, 37, true).unwrap(), (SMALL_UNALIGNED, LARGE_UNALIGNED));
        for (small, large) in [configs_for(1024, 3072, false).unwrap(), configs_for(100, 64, true).unwrap()] {
            assert!(small.same_arithmetic(&large));
        }
        for (bad, names) in [
            ("double/cmma/16x16x16/2x8x2", "expected algo/kind"),
            ("split/cmma/16x16x16/2x8x2/4x1x1", "algo `split`"),
            ("double/wmma/16x16x16/2x8x2/4x1x1", "kind `wmma`"),
            ("double/cmma/16x16/2x8x2/4x1x1", "tile `16x16`"),
            ("double/cmma/16x16x16/2x0x2/4x1x1", "partition `2x0x2`"),
            ("double/cmma/16x16x16/2x8x2/4x1x2", "stage k must be 1"),
        ] {
            let e = PipelinedConfig::parse(bad).unwrap_err();
            assert!(e.contains(names), "{bad}: {e}");
        }
    }
}
