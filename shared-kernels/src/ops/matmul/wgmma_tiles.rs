//! The warpgroup matmul's scheduling: the cube tile (the tile ladder by output size, or
//! `LOCKSTEP_WGMMA_TILES`), the schedule (`LOCKSTEP_WGMMA_SCHEDULE`) and the persistent grid;
//! the variables' types and parsers are [`crate::kernel_choice::Tuning`]'s. None of it changes a
//! bit: every output walks k = 0, 16, 32, ... from zero whatever the tile, the schedule or the grid.

use crate::KernelError;
use burn_cubecl::cubecl::client::Client;

pub use crate::kernel_choice::{TilePick, WgmmaSchedule, WgmmaTiles};

/// `LOCKSTEP_WGMMA_TILES` (benchmark sweeps; [`crate::kernel_choice::Tuning`]; `None`: unset).
pub(crate) fn wgmma_tiles() -> Result<Option<WgmmaTiles>, KernelError> {
    Ok(crate::kernel_choice::KernelChoice::current()?.tuning.wgmma_tiles)
}

/// The tiles of an `[M, N]` output: `LOCKSTEP_WGMMA_TILES` if set, else by the output's size
/// under `LOCKSTEP_WGMMA_PICK` ([`tiles_by_waves`] or [`tiles_by_coverage`]); `whole`: only
/// tiles that divide the output (a fold accumulates whole tiles). Scheduling only: every shape
/// gives the same bits.
pub(super) fn wgmma_tiles_for(client: &Client, m: usize, n: usize, whole: bool) -> Result<WgmmaTiles, KernelError> {
    if let Some(t) = wgmma_tiles()? {
        return Ok(t);
    }
    Ok(tiles_picked(wgmma_pick()?, m, n, multiprocessors(client), whole))
}

/// The tiles `pick` gives an `[M, N]` output on `sms` multiprocessors: where no weighed tile
/// divides a fold's output, the coverage rule's (the fold then takes its other kernel).
pub fn tiles_picked(pick: TilePick, m: usize, n: usize, sms: usize, whole: bool) -> WgmmaTiles {
    match pick {
        TilePick::Waves => tiles_by_waves(m, n, sms, whole).unwrap_or_else(|| tiles_by_coverage(m, n, sms)),
        TilePick::WavesComputeRates => tiles_by_waves_at(m, n, sms, whole, false).unwrap_or_else(|| tiles_by_coverage(m, n, sms)),
        TilePick::Coverage => tiles_by_coverage(m, n, sms),
    }
}

/// `LOCKSTEP_WGMMA_PICK` (benchmark comparisons); unset: waves.
pub(crate) fn wgmma_pick() -> Result<TilePick, KernelError> {
    Ok(crate::kernel_choice::KernelChoice::current()?.tuning.wgmma_pick)
}

/// The tiles [`tiles_by_waves`] weighs, each with two throughputs relative to the default's:
/// where every multiprocessor runs many tiles (H200, `lockstep bench --preset qwen3-8b
/// --tile-sweep`, gate/up at 8192 rows: 692, 624, 599, 468, 377 and 311 TFLOP/s),
/// and at [`TWO_ROW_TILES`] rows. Smaller tiles re-read more of the operands per product. All
/// but the last fill one multiprocessor's shared memory (deep pipelines beat two shallow cubes
/// at 256 rows).
const WEIGHED: [(WgmmaTiles, f64, f64); 6] = [
    (WgmmaTiles::DEFAULT, 1.0, 1.0),
    (WgmmaTiles { wg_m: 1, bn: 256, stages: 5 }, 0.90, 0.90),
    // at two row tiles a rank just above 1/256/5's (no other pick at those rows changes: o and
    // down keep 1/128/8, lm_head the default)
    (WgmmaTiles { wg_m: 2, bn: 128, stages: 7 }, 0.87, 0.92),
    (WgmmaTiles { wg_m: 1, bn: 128, stages: 8 }, 0.68, 0.68),
    (WgmmaTiles::MEDIUM, 0.55, 0.55),
    (WgmmaTiles { wg_m: 1, bn: 64, stages: 6 }, 0.45, 0.45),
];

/// The tiles [`tiles_by_waves`] chooses from (the battery checks each).
pub fn weighed_tiles() -> Vec<WgmmaTiles> {
    WEIGHED.iter().map(|(t, _, _)| *t).collect()
}

/// The tile whose busiest multiprocessor finishes first: each multiprocessor runs
/// ceil(tiles / SMs) tiles at the tile's throughput ([`WEIGHED`]); ties go to the larger tile.
/// At 256 rows (a decode step) a 128 x 256 gate/up of Qwen3-8B is 192 tiles, two rounds on 132
/// SMs of which the second is half empty; 64 x 256 (or 128 x 128) tiles make three nearly full
/// rounds (116 -> 99.6 µs on the H200). `whole`: only tiles that divide the output; `None` if none does.
pub fn tiles_by_waves(m: usize, n: usize, sms: usize, whole: bool) -> Option<WgmmaTiles> {
    tiles_by_waves_at(m, n, sms, whole, true)
}

/// [`tiles_by_waves`], with [`WEIGHED`]'s rates for `m` rows or, `by_rows` false, its
/// compute-bound rates at every row count.
fn tiles_by_waves_at(m: usize, n: usize, sms: usize, whole: bool, by_rows: bool) -> Option<WgmmaTiles> {
    let two_row_tiles = by_rows && TWO_ROW_TILES.contains(&m);
    let cost = |(t, many, two): &(WgmmaTiles, f64, f64)| {
        let rate = if two_row_tiles { *two } else { *many };
        (m.div_ceil(t.bm()) * n.div_ceil(t.bn)).div_ceil(sms.max(1)) as f64 * (t.bm() * t.bn) as f64 / rate
    };
    WEIGHED
        .iter()
        .filter(|(t, _, _)| !whole || (m % t.bm() == 0 && n % t.bn == 0))
        // WEIGHED runs from the largest tile down, and min_by keeps the first of equal cost
        .min_by(|a, b| cost(a).total_cmp(&cost(b)))
        .map(|(t, _, _)| *t)
}

/// Rows at which two 128-row tiles cover the output, weighed by [`WEIGHED`]'s second rates. A
/// matmul of 256 rows does 256 FLOP a byte of weight, below an H100's ~295 (memory-bound), so
/// the 128 x 128 tile, which reads each weight tile for 2 row tiles where 64 x 256 reads it for
/// 4, beats the 64 x 256 tile of the same area that the compute-bound rates prefer. ncu at 256 rows
/// (H100, caches kept): Qwen3-8B's q/k/v 28.7 against 32.1 µs, gate/up 93.5
/// against 98.0; on the H200 (a host-timed sweep) a tie: 41.7 against 40.7, 98.5
/// against 99.6.
const TWO_ROW_TILES: std::ops::RangeInclusive<usize> = 129..=256;
pub(crate) use crate::device::client_multiprocessors as multiprocessors;

/// `LOCKSTEP_WGMMA_SCHEDULE` (benchmark sweeps); unset: persistent.
pub(crate) fn wgmma_schedule() -> Result<WgmmaSchedule, KernelError> {
    Ok(crate::kernel_choice::KernelChoice::current()?.tuning.wgmma_schedule)
}

/// The earlier rule: the largest of [`WgmmaTiles::DEFAULT`], [`WgmmaTiles::NARROW`],
/// [`WgmmaTiles::MEDIUM`] whose cubes fill at least 7/8 of the multiprocessors (at 1024 x 1024,
/// 128 128x64 cubes on 132 SMs beat 256 64x64 ones), else [`WgmmaTiles::SMALL`].
pub fn tiles_by_coverage(m: usize, n: usize, sms: usize) -> WgmmaTiles {
    [WgmmaTiles::DEFAULT, WgmmaTiles::NARROW, WgmmaTiles::MEDIUM]
        .into_iter()
        .find(|t| 8 * m.div_ceil(t.bm()) * n.div_ceil(t.bn) >= 7 * sms)
        .unwrap_or(WgmmaTiles::SMALL)
}

/// Cubes of `tiles` one multiprocessor holds at once: by shared memory (228 KiB per H100/H200
/// multiprocessor, 1 KiB of it reserved per cube), at most 3.
pub(super) fn cubes_per_multiprocessor(tiles: WgmmaTiles) -> usize {
    (228 * 1024 / (tiles.shared_bytes() + 2 * 1024)).clamp(1, 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wgmma_tiles_parse_within_shared_memory_or_name_the_variable() {
        assert_eq!(WgmmaTiles::parse("2/256/4").unwrap(), WgmmaTiles::DEFAULT);
        assert_eq!(WgmmaTiles::DEFAULT.shared_bytes(), 192 * 1024);
        assert!(WgmmaTiles::parse("1/64/8").is_ok());
        assert_eq!(WgmmaTiles::NARROW.shared_bytes(), 96 * 1024);
        for bad in ["2/128", "4/256/3", "0/128/4", "3/128/4", "2/120/4", "2/192/4", "2/512/4", "2/128/1", "2/256/5", "4/256/4", "x/128/4", "2/128/4/4"] {
            assert!(WgmmaTiles::parse(bad).unwrap_err().contains("LOCKSTEP_WGMMA_TILES"), "{bad}");
        }
    }

    #[test]
    fn the_schedule_parses_or_names_the_variable() {
        assert_eq!(WgmmaSchedule::parse("persistent"), Ok(WgmmaSchedule::Persistent));
        assert_eq!(WgmmaSchedule::parse("synced"), Ok(WgmmaSchedule::Synced));
        assert!(WgmmaSchedule::parse("fast").unwrap_err().contains("LOCKSTEP_WGMMA_SCHEDULE=\"fast\""));
    }

    #[test]
    fn coverage_picks_the_largest_tiles_that_cover_the_multiprocessors() {
        assert_eq!(tiles_by_coverage(4096, 151936, 132), WgmmaTiles::DEFAULT);
        // 128 128x256 cubes fill 7/8 of 132 SMs
        assert_eq!(tiles_by_coverage(4096, 1024, 132), WgmmaTiles::DEFAULT);
        assert_eq!(tiles_by_coverage(1024, 3072, 132), WgmmaTiles::NARROW);
        assert_eq!(tiles_by_coverage(1024, 1024, 132), WgmmaTiles::MEDIUM);
        assert_eq!(tiles_by_coverage(256, 3072, 132), WgmmaTiles::SMALL);
        for t in [WgmmaTiles::DEFAULT, WgmmaTiles::NARROW, WgmmaTiles::MEDIUM, WgmmaTiles::SMALL] {
            let text = format!("{}/{}/{}", t.wg_m, t.bn, t.stages);
            assert_eq!(WgmmaTiles::parse(&text), Ok(t), "{text}");
        }
    }

    #[test]
    fn waves_pick_the_tiles_that_finish_first() {
        let t = |text: &str| WgmmaTiles::parse(text).unwrap();
        // every weighed tile is one the kernel takes
        for (w, _, _) in WEIGHED {
            assert_eq!(t(&format!("{}/{}/{}", w.wg_m, w.bn, w.stages)), w);
        }
        // many tiles a multiprocessor: the default, as before
        assert_eq!(tiles_by_waves(8192, 24576, 132, false), Some(WgmmaTiles::DEFAULT));
        assert_eq!(tiles_by_waves(16384, 151936, 132, false), Some(WgmmaTiles::DEFAULT));
        // Qwen3-8B's decode step at 256 rows, each the fastest of the H100 ncu sweep
        assert_eq!(tiles_by_waves(256, 24576, 132, false), Some(t("2/128/7")));
        assert_eq!(tiles_by_waves(256, 6144, 132, false), Some(t("2/128/7")));
        assert_eq!(tiles_by_waves(256, 4096, 132, false), Some(t("1/128/8")));
        assert_eq!(tiles_by_waves(256, 151936, 132, false), Some(WgmmaTiles::DEFAULT));
        // past two 128-row tiles the compute-bound rates decide, as before
        assert_eq!(tiles_by_waves(1024, 6144, 132, false), Some(t("1/256/5")));
        assert_eq!(tiles_by_waves(128, 6144, 132, false), Some(t("1/128/8")));
        // the rule before: the compute-bound rates at 256 rows too
        assert_eq!(tiles_picked(TilePick::WavesComputeRates, 256, 24576, 132, false), t("1/256/5"));
        assert_eq!(tiles_picked(TilePick::WavesComputeRates, 256, 6144, 132, false), t("1/256/5"));
        // a fold takes only tiles that divide its output
        let whole = tiles_by_waves(1088, 4096, 132, true).unwrap();
        assert!(1088 % whole.bm() == 0 && 4096 % whole.bn == 0, "{whole:?}");
        assert_eq!(tiles_by_waves(1000, 1000, 132, true), None);
        assert!(tiles_by_waves(1000, 1000, 132, false).is_some());
    }

    #[test]
    fn the_persistent_grid_fills_the_multiprocessors_by_shared_memory() {
        assert_eq!(cubes_per_multiprocessor(WgmmaTiles::DEFAULT), 1);
        assert_eq!(cubes_per_multiprocessor(WgmmaTiles::NARROW), 2);
        assert_eq!(cubes_per_multiprocessor(WgmmaTiles::SMALL), 3);
    }
}
