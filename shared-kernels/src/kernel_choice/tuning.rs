//! The benchmark-only tuning variables as one typed value ([`Tuning`], a field of
//! [`super::KernelChoice`]): tile and launch shapes that change how a kernel is launched, never
//! a result's bits (every output still walks k, and every key split, in the same order from
//! zero). Parsed with the kernel choice, so a typo in any of them stops a run at its start with
//! the variable named; the families read them from the choice and fill in their own defaults,
//! and tests and benchmarks change them with [`super::KernelChoice::scoped`].

use crate::ops::matmul::tc_fragments::{BK as TC_BK, FRAGS_M, FRAGS_N, FRAG_ELEMS, INSTR, PAD, STAGES, WARPS_M, WARPS_N};
use crate::ops::matmul::wgmma_fragments::{BK as WGMMA_BK, WG_ROWS};

/// Every tuning variable; `None` where the family's default applies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tuning {
    /// `LOCKSTEP_SKINNY`: the decode-shaped matmul's launch.
    pub skinny: Option<SkinnyLaunch>,
    /// `LOCKSTEP_TC_TILES`: the tc matmul's tile, for both of its pipelines.
    pub tc_tiles: Option<TileShape>,
    /// `LOCKSTEP_WGMMA_TILES`: the warpgroup matmul's tile at every output size.
    pub wgmma_tiles: Option<WgmmaTiles>,
    /// `LOCKSTEP_WGMMA_PICK`: how the warpgroup tile is picked by output size.
    pub wgmma_pick: TilePick,
    /// `LOCKSTEP_WGMMA_SCHEDULE`: how the warpgroup kernel walks its tiles.
    pub wgmma_schedule: WgmmaSchedule,
    /// `LOCKSTEP_FLASH_WARPS`: warps per prefill attention cube (4 or 8).
    pub flash_warps: Option<usize>,
    /// `LOCKSTEP_DECODE_LAUNCH`: the `mma` decode partials' launch (`auto`: `None`).
    pub decode_launch: Option<DecodeLaunch>,
}

impl Tuning {
    /// The variables' values, each parsed by its type's `parse` (whose error names the variable).
    pub fn from_env() -> Result<Tuning, String> {
        fn read<T>(var: &str, parse: fn(&str) -> Result<T, String>) -> Result<Option<T>, String> {
            crate::knobs::var(var).map(|text| parse(&text)).transpose()
        }
        Ok(Tuning {
            skinny: read("LOCKSTEP_SKINNY", SkinnyLaunch::parse)?,
            tc_tiles: read("LOCKSTEP_TC_TILES", TileShape::parse)?,
            wgmma_tiles: read("LOCKSTEP_WGMMA_TILES", WgmmaTiles::parse)?,
            wgmma_pick: read("LOCKSTEP_WGMMA_PICK", TilePick::parse)?.unwrap_or_default(),
            wgmma_schedule: read("LOCKSTEP_WGMMA_SCHEDULE", WgmmaSchedule::parse)?.unwrap_or_default(),
            flash_warps: read("LOCKSTEP_FLASH_WARPS", parse_flash_warps)?,
            decode_launch: read("LOCKSTEP_DECODE_LAUNCH", DecodeLaunch::parse)?.flatten(),
        })
    }
}

/// How the decode-shaped matmul ([`crate::ops::matmul::skinny`]) is launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkinnyLaunch {
    /// k-steps whose weight is requested before the first of them multiplies.
    pub group: usize,
    /// Planes per cube for wide weights (N >= 8192) and for the rest.
    pub wide: usize,
    pub narrow: usize,
    /// Wide `[N,K]` weights through per-plane shared-memory slabs filled with coalesced loads.
    pub staged: bool,
}

impl SkinnyLaunch {
    /// `group/wide/narrow/staged|direct`, e.g. `8/4/1/staged`.
    pub fn parse(text: &str) -> Result<SkinnyLaunch, String> {
        let bad = || format!("LOCKSTEP_SKINNY={text:?} is not group/wide/narrow/staged|direct (group 1-32, planes 1-8)");
        let parts: Vec<&str> = text.split('/').map(str::trim).collect();
        let [g, w, n, mode] = parts[..] else { return Err(bad()) };
        let num = |p: &str, max: usize| p.parse::<usize>().ok().filter(|v| (1..=max).contains(v)).ok_or_else(bad);
        let staged = match mode {
            "staged" => true,
            "direct" => false,
            _ => return Err(bad()),
        };
        Ok(SkinnyLaunch { group: num(g, 32)?, wide: num(w, 8)?, narrow: num(n, 8)?, staged })
    }
}

/// The tc matmul's cube tile: planes along M and N, 16x16 fragments per plane along M and N.
/// Every fragment walks k = 0, 16, 32, ... from zero whatever the tile (the battery's
/// `tc = pipelined` rows compare two tilings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileShape {
    pub warps_m: usize,
    pub warps_n: usize,
    pub frags_m: usize,
    pub frags_n: usize,
    /// 16-deep `mma` steps per shared-memory stage (the stage's k extent is 16 times this).
    pub k_steps: usize,
    /// Shared-memory slots of the asynchronous-copy pipeline (at least 2).
    pub stages: usize,
}

/// Shared memory one cube of the asynchronous tc kernel may use: within the 227 KiB a Hopper or
/// Ampere (sm80: 163 KiB) block can opt into, so two cubes still fit on an SM.
pub const TC_ASYNC_SHARED_LIMIT: usize = 96 * 1024;

impl TileShape {
    pub const DEFAULT: TileShape = TileShape { warps_m: WARPS_M, warps_n: WARPS_N, frags_m: FRAGS_M, frags_n: FRAGS_N, k_steps: TC_BK / INSTR, stages: STAGES };
    /// The asynchronous kernel's: 128x128 tiles of 4 planes, each 64x64 (4x4 fragments), k 64,
    /// 2 slots. With the loads off the registers, the larger plane tile (fewer shared-memory
    /// fragment loads per `mma`) and the deeper k-tile were the fastest of the 17 shapes swept
    /// at M = 1024 and 4096 (docs/perf.md).
    pub const ASYNC_DEFAULT: TileShape = TileShape { warps_m: 2, warps_n: 2, frags_m: 4, frags_n: 4, k_steps: 4, stages: 2 };
    pub fn bm(self) -> usize {
        self.warps_m * self.frags_m * INSTR
    }
    pub fn bn(self) -> usize {
        self.warps_n * self.frags_n * INSTR
    }
    pub fn planes(self) -> usize {
        self.warps_m * self.warps_n
    }
    /// k extent of one shared-memory stage.
    pub fn bk(self) -> usize {
        self.k_steps * INSTR
    }
    /// Static shared memory of one cube of the register-prefetch kernel, bytes (A and B stages
    /// of 16-bit values, f32 epilogue).
    pub fn shared_bytes(self) -> usize {
        self.slot_bytes() + 4 * self.planes() * FRAG_ELEMS
    }
    /// Shared memory of one cube of the asynchronous-copy kernel: `stages` slots and the epilogue.
    pub fn async_shared_bytes(self) -> usize {
        self.stages * self.slot_bytes() + 4 * self.planes() * FRAG_ELEMS
    }
    /// One A and one B k-tile of 16-bit values, rows padded, in the larger of their two layouts.
    fn slot_bytes(self) -> usize {
        let a_stage = (self.bm() * (self.bk() + PAD)).max(self.bk() * (self.bm() + PAD));
        let b_stage = (self.bn() * (self.bk() + PAD)).max(self.bk() * (self.bn() + PAD));
        2 * (a_stage + b_stage)
    }

    /// `warps_m/warps_n/frags_m/frags_n[/k_steps[/stages]]`, e.g. `2/2/4/4` or `4/2/2/2/4/3`.
    pub fn parse(text: &str) -> Result<TileShape, String> {
        let bad = || format!("LOCKSTEP_TC_TILES={text:?} is not warps_m/warps_n/frags_m/frags_n[/k_steps[/stages]] (1-8 each, stages 2-8, at most 16 planes and 16 fragments per plane, 48 KiB of shared memory for one stage and {} KiB for all stages)", TC_ASYNC_SHARED_LIMIT / 1024);
        let parts: Vec<usize> = text.split('/').map(|p| p.trim().parse::<usize>()).collect::<Result<_, _>>().map_err(|_| bad())?;
        let (warps_m, warps_n, frags_m, frags_n, k_steps, stages) = match parts[..] {
            [a, b, c, d] => (a, b, c, d, TC_BK / INSTR, STAGES),
            [a, b, c, d, e] => (a, b, c, d, e, STAGES),
            [a, b, c, d, e, f] => (a, b, c, d, e, f),
            _ => return Err(bad()),
        };
        let t = TileShape { warps_m, warps_n, frags_m, frags_n, k_steps, stages };
        let ok = parts.iter().all(|v| (1..=8).contains(v)) && stages >= 2 && t.planes() <= 16 && frags_m * frags_n <= 16 && t.shared_bytes() <= 48 * 1024 && t.async_shared_bytes() <= TC_ASYNC_SHARED_LIMIT;
        ok.then_some(t).ok_or_else(bad)
    }
}

/// The warpgroup matmul's cube tile: `wg_m` warpgroups along M (64 rows each), `bn` columns
/// (the instruction's N), `stages` k-tile slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgmmaTiles {
    pub wg_m: usize,
    pub bn: usize,
    pub stages: usize,
}

/// Shared memory one warpgroup cube may use (an H100/H200 block may opt into 227 KiB).
const WGMMA_SHARED_LIMIT: usize = 224 * 1024;

impl WgmmaTiles {
    /// 128 x 256 tiles (two warpgroups of m64n256), 4 slots: 192 KiB, one cube per SM. The
    /// fastest shape swept at M = 1024 and 4096 on the H200 (docs/perf.md).
    pub const DEFAULT: WgmmaTiles = WgmmaTiles { wg_m: 2, bn: 256, stages: 4 };
    /// 128 x 128 tiles, 3 slots (96 KiB: two cubes per SM) for outputs too small to give every
    /// multiprocessor a 128 x 256 cube (at M = 1024 up to 1.5x the default's throughput).
    pub const NARROW: WgmmaTiles = WgmmaTiles { wg_m: 2, bn: 128, stages: 3 };
    /// 128 x 64 tiles, 8 slots (192 KiB) for outputs of about a thousand rows: at 1024 x 1024
    /// 128 cubes, and 1.16-1.4x the 64 x 64 tiles' throughput there (GPU time).
    pub const MEDIUM: WgmmaTiles = WgmmaTiles { wg_m: 2, bn: 64, stages: 8 };
    /// 64 x 64 tiles of one warpgroup (64 KiB) for small outputs (a few hundred rows): more
    /// cubes to spread a long K over.
    pub const SMALL: WgmmaTiles = WgmmaTiles { wg_m: 1, bn: 64, stages: 4 };
    pub fn bm(self) -> usize {
        self.wg_m * WG_ROWS
    }
    /// A and B slots of 16-bit values.
    pub fn shared_bytes(self) -> usize {
        self.stages * 2 * (self.bm() + self.bn) * WGMMA_BK
    }
    /// `wg_m/bn/stages`, e.g. `2/256/4`.
    pub fn parse(text: &str) -> Result<WgmmaTiles, String> {
        let bad = || format!("LOCKSTEP_WGMMA_TILES={text:?} is not wg_m/bn/stages (wg_m 1, 2 or 4, bn 64, 128 or 256, not 4 with 256, stages 2-8, at most {} KiB of shared memory)", WGMMA_SHARED_LIMIT / 1024);
        let parts: Vec<usize> = text.split('/').map(|p| p.trim().parse::<usize>()).collect::<Result<_, _>>().map_err(|_| bad())?;
        let [wg_m, bn, stages] = parts[..] else { return Err(bad()) };
        let t = WgmmaTiles { wg_m, bn, stages };
        // the copy engine's boxes are powers of two of at most 256 rows (a 192-row box was
        // measured to hang the kernel), and an MN-major B takes whole 64-wide boxes;
        // four warpgroups (544 units) leave 96 registers a unit: ptxas cannot hold an m64n256
        // accumulator in them
        let registers = !(wg_m == 4 && bn == 256);
        let ok = [1, 2, 4].contains(&wg_m) && [64, 128, 256].contains(&bn) && (2..=8).contains(&stages) && t.shared_bytes() <= WGMMA_SHARED_LIMIT && registers;
        ok.then_some(t).ok_or_else(bad)
    }
}

/// How warpgroup tiles are picked by output size (`LOCKSTEP_WGMMA_PICK`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TilePick {
    /// [`crate::ops::matmul::wgmma_tiles::tiles_by_waves`] (the default).
    #[default]
    Waves,
    /// `tiles_by_waves` with the compute-bound rates at every row count (the rule before the
    /// two-row-tile rates).
    WavesComputeRates,
    /// [`crate::ops::matmul::wgmma_tiles::tiles_by_coverage`] (the earlier rule, for same-run comparisons).
    Coverage,
}

impl TilePick {
    pub fn parse(text: &str) -> Result<TilePick, String> {
        match text.trim() {
            "waves" => Ok(TilePick::Waves),
            "waves-compute-rates" => Ok(TilePick::WavesComputeRates),
            "coverage" => Ok(TilePick::Coverage),
            other => Err(format!("LOCKSTEP_WGMMA_PICK={other:?} is not one of waves, waves-compute-rates, coverage")),
        }
    }
}

/// How the warpgroup kernel walks its tiles (`LOCKSTEP_WGMMA_SCHEDULE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WgmmaSchedule {
    /// One cube per output tile; each k-tile ends in a cube-wide sync before its slot is refilled.
    Synced,
    /// As many cubes as fit at once, each walking several tiles; a producer warp and per-slot
    /// mbarriers instead of cube syncs ([`crate::ops::matmul::wgmma_persistent`]). The default.
    #[default]
    Persistent,
}

impl WgmmaSchedule {
    pub fn parse(text: &str) -> Result<WgmmaSchedule, String> {
        match text.trim() {
            "synced" => Ok(WgmmaSchedule::Synced),
            "persistent" => Ok(WgmmaSchedule::Persistent),
            other => Err(format!("LOCKSTEP_WGMMA_SCHEDULE={other:?} is not one of persistent, synced")),
        }
    }
}

/// `LOCKSTEP_FLASH_WARPS`: 4 or 8.
pub fn parse_flash_warps(text: &str) -> Result<usize, String> {
    match text.trim() {
        "4" => Ok(4),
        "8" => Ok(8),
        other => Err(format!("LOCKSTEP_FLASH_WARPS={other:?} is not 4 or 8")),
    }
}

/// How the `mma` decode partials stage K and V (`LOCKSTEP_DECODE_LAUNCH`'s K: 2, 1, n).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Staging {
    /// `decode/mma_decode.rs`, a K and a V stage, each refilled as soon as it is read.
    Two,
    /// `decode/mma_decode.rs`, K then V through one stage.
    One,
    /// `decode/mma_decode_narrow.rs`: one stage, the queries on the `mma`'s narrow side (at most
    /// [`crate::ops::attention::route::NARROW_QUERIES`] heads a cube).
    Narrow,
}

/// The `mma` decode partials' launch: key splits per cube and the staging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLaunch {
    pub splits_per_cube: usize,
    pub staging: Staging,
}

impl DecodeLaunch {
    /// A `LOCKSTEP_DECODE_LAUNCH` value: `auto` (`Ok(None)`), or `SxK` with S splits per cube
    /// (1-64) and K stages (1 or 2, or `n`: one stage, the queries on the `mma`'s narrow side),
    /// e.g. `8x1`.
    pub fn parse(text: &str) -> Result<Option<DecodeLaunch>, String> {
        let text = text.trim();
        if text == "auto" {
            return Ok(None);
        }
        let bad = || format!("LOCKSTEP_DECODE_LAUNCH={text:?} is not `auto` or SxK (S splits per cube 1-64, K stages 1 or 2, or n for the narrow kernel, e.g. 8x1)");
        let (s, k) = text.split_once('x').ok_or_else(bad)?;
        let splits: usize = s.parse().map_err(|_| bad())?;
        let staging = match k {
            "1" => Staging::One,
            "2" => Staging::Two,
            "n" => Staging::Narrow,
            _ => return Err(bad()),
        };
        if !(1..=64).contains(&splits) {
            return Err(bad());
        }
        Ok(Some(DecodeLaunch { splits_per_cube: splits, staging }))
    }

    pub fn name(self) -> String {
        let k = match self.staging {
            Staging::Two => "2",
            Staging::One => "1",
            Staging::Narrow => "n",
        };
        format!("{}x{k}", self.splits_per_cube)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tuning_value_parses_or_names_its_variable() {
        assert_eq!(SkinnyLaunch::parse(" 8 / 4 / 1 / staged "), Ok(SkinnyLaunch { group: 8, wide: 4, narrow: 1, staged: true }));
        assert_eq!(SkinnyLaunch::parse("16/2/1/direct"), Ok(SkinnyLaunch { group: 16, wide: 2, narrow: 1, staged: false }));
        for bad in ["8/4/1", "0/4/1/staged", "8/9/1/direct", "8/4/1/sideways", "x/4/1/staged", ""] {
            assert!(SkinnyLaunch::parse(bad).unwrap_err().contains("LOCKSTEP_SKINNY"), "{bad}");
        }
        assert_eq!(TilePick::parse(" coverage "), Ok(TilePick::Coverage));
        assert!(TilePick::parse("wave").unwrap_err().contains("LOCKSTEP_WGMMA_PICK"));
        assert_eq!(WgmmaSchedule::parse("synced"), Ok(WgmmaSchedule::Synced));
        assert!(WgmmaSchedule::parse("sync").unwrap_err().contains("LOCKSTEP_WGMMA_SCHEDULE"));
        assert_eq!((parse_flash_warps("4"), parse_flash_warps(" 8 ")), (Ok(4), Ok(8)));
        for bad in ["2", "16", "", "eight"] {
            assert!(parse_flash_warps(bad).unwrap_err().contains("LOCKSTEP_FLASH_WARPS"), "{bad}");
        }
    }

    #[test]
    fn tc_tile_shapes_parse_within_shared_memory_or_name_the_variable() {
        assert!(TileShape::DEFAULT.shared_bytes() <= 48 * 1024);
        assert!(TileShape::ASYNC_DEFAULT.async_shared_bytes() <= TC_ASYNC_SHARED_LIMIT);
        assert_eq!(TileShape::parse("2/2/4/4").unwrap(), TileShape { warps_m: 2, warps_n: 2, frags_m: 4, frags_n: 4, k_steps: 2, stages: STAGES });
        assert_eq!(TileShape::parse("4/2/2/2/4").unwrap().bk(), 64);
        assert_eq!(TileShape::parse("4/2/2/2/2/4").unwrap().stages, 4);
        // 128x64 tiles, k 32: 15 KiB a slot and 8 KiB of epilogue, so 5 slots fit in 96 KiB, 6 do not
        assert!(TileShape::parse("4/2/2/2/2/5").is_ok());
        for bad in ["4/2/2", "0/2/2/2", "4/4/4/4", "8/8/1/1", "2/2/8/8", "a/2/2/2", "4/2/2/2/0", "4/4/4/2/8", "4/2/2/2/4/1", "4/2/2/2/2/6", "4/2/2/2/2/2/2"] {
            assert!(TileShape::parse(bad).unwrap_err().contains("LOCKSTEP_TC_TILES"), "{bad}");
        }
    }

    #[test]
    fn the_decode_launch_parses_and_names_the_variable_when_bad() {
        assert_eq!(DecodeLaunch::parse(" auto "), Ok(None));
        assert_eq!(DecodeLaunch::parse("8x1"), Ok(Some(DecodeLaunch { splits_per_cube: 8, staging: Staging::One })));
        assert_eq!(DecodeLaunch::parse("1x2"), Ok(Some(DecodeLaunch { splits_per_cube: 1, staging: Staging::Two })));
        assert_eq!(DecodeLaunch::parse("4xn"), Ok(Some(DecodeLaunch { splits_per_cube: 4, staging: Staging::Narrow })));
        for bad in ["", "8", "0x1", "65x2", "8x3", "x1", "eightx1", "8xN", "8xnn"] {
            let e = DecodeLaunch::parse(bad).unwrap_err();
            assert!(e.contains("LOCKSTEP_DECODE_LAUNCH"), "{bad}: {e}");
        }
        assert_eq!(DecodeLaunch::parse("4x2").unwrap().unwrap().name(), "4x2");
        assert_eq!(DecodeLaunch::parse("16xn").unwrap().unwrap().name(), "16xn");
    }
}
