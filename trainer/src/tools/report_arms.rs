//! The ablation's figures by arm (Thinking Machines' layout): runs named `<arm>-s<seed>` are
//! grouped into arms; one panel per arm with its seeds as thin lines and their mean bold, and the
//! matched arm's mean (`matched-none`, else the first `matched` arm) in grey in every other panel
//! for reference; and the table of each arm's final reward with its seed spread.

use super::scalars::{font, Scalars};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// A run's arm: its name without a trailing `-s<digits>` (the seed).
pub fn arm_of(run: &str) -> &str {
    match run.rsplit_once("-s") {
        Some((arm, seed)) if !seed.is_empty() && seed.chars().all(|c| c.is_ascii_digit()) => arm,
        _ => run,
    }
}

/// The runs by arm, in the order the arms first appear.
pub fn arms(runs: &[(String, Scalars)]) -> Vec<(String, Vec<&(String, Scalars)>)> {
    let mut out: Vec<(String, Vec<&(String, Scalars)>)> = Vec::new();
    for run in runs {
        let arm = arm_of(&run.0);
        match out.iter_mut().find(|(a, _)| a == arm) {
            Some((_, list)) => list.push(run),
            None => out.push((arm.to_string(), vec![run])),
        }
    }
    out
}

/// The mean over the seeds that logged each step.
pub fn seed_mean(seeds: &[&(String, Scalars)], tag: &str) -> Vec<(i64, f32)> {
    let mut at: BTreeMap<i64, (f64, usize)> = BTreeMap::new();
    for (_, s) in seeds {
        for &(step, v) in s.get(tag).map(Vec::as_slice).unwrap_or(&[]) {
            let e = at.entry(step).or_default();
            e.0 += v as f64;
            e.1 += 1;
        }
    }
    at.into_iter().map(|(step, (sum, n))| (step, (sum / n as f64) as f32)).collect()
}

/// Markdown: per arm, the seeds' final rewards (each the mean of its last 3 steps): their mean,
/// standard deviation and range, and the steps logged.
pub fn arm_table(runs: &[(String, Scalars)]) -> String {
    let mut s = "| arm | seeds | steps (min) | final reward, mean ± std | range |\n|---|---|---|---|---|\n".to_string();
    for (arm, seeds) in arms(runs) {
        let finals: Vec<f64> = seeds
            .iter()
            .filter_map(|(_, sc)| {
                let r = sc.get("rollout/reward_mean").filter(|r| !r.is_empty())?;
                let tail = &r[r.len().saturating_sub(3)..];
                Some(tail.iter().map(|p| p.1 as f64).sum::<f64>() / tail.len() as f64)
            })
            .collect();
        let steps = seeds.iter().map(|(_, sc)| sc.get("rollout/reward_mean").map_or(0, Vec::len)).min().unwrap_or(0);
        if finals.is_empty() {
            s += &format!("| {arm} | {} | 0 | no GRPO step logged | |\n", seeds.len());
            continue;
        }
        let n = finals.len() as f64;
        let mean = finals.iter().sum::<f64>() / n;
        let std = (finals.iter().map(|f| (f - mean).powi(2)).sum::<f64>() / n).sqrt();
        let (lo, hi) = finals.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &f| (a.min(f), b.max(f)));
        s += &format!("| {arm} | {} | {steps} | {mean:.3} ± {std:.3} | {lo:.3}–{hi:.3} |\n", seeds.len());
    }
    s
}

/// One PNG of `tag`: a panel per arm (seeds thin, their mean bold, the matched arm's mean grey).
pub fn plot_arms(runs: &[(String, Scalars)], tag: &str, file: &Path) -> Result<(), String> {
    let arms = arms(runs);
    let reference = arms.iter().find(|(a, _)| a == "matched-none").or_else(|| arms.iter().find(|(a, _)| a.starts_with("matched"))).map(|(a, seeds)| (a.clone(), seed_mean(seeds, tag)));
    let points = || runs.iter().flat_map(|(_, s)| s.get(tag).into_iter().flatten());
    let max_step = points().map(|p| p.0).max().unwrap_or(1).max(1);
    let (mut lo, mut hi) = points().map(|p| p.1).filter(|v| v.is_finite()).fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    if !lo.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    if hi - lo < 1e-9 {
        (lo, hi) = (lo - 1e-3, hi + 1e-3);
    }
    let cols = arms.len().clamp(1, 4);
    let rows = arms.len().div_ceil(cols).max(1);
    let labels = font();
    super::scalars::png_atomically(file, |tmp| {
        let root = BitMapBackend::new(tmp, (360 * cols as u32, 280 * rows as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        for (panel, (arm, seeds)) in root.split_evenly((rows, cols)).iter().zip(&arms) {
            let mut builder = ChartBuilder::on(panel);
            builder.margin(8).x_label_area_size(if labels { 28 } else { 0 }).y_label_area_size(if labels { 56 } else { 0 });
            if labels {
                builder.caption(format!("{arm}: {tag}"), ("sans-serif", 15));
            }
            let mut chart = builder.build_cartesian_2d(0i64..max_step, lo..hi).map_err(|e| e.to_string())?;
            if labels {
                chart.configure_mesh().x_desc("step").draw().map_err(|e| e.to_string())?;
            }
            if let Some((name, mean)) = reference.as_ref().filter(|(name, _)| name != arm) {
                let _ = name;
                chart.draw_series(LineSeries::new(mean.iter().cloned(), BLACK.mix(0.35).stroke_width(3))).map_err(|e| e.to_string())?;
            }
            let color = Palette99::pick(arms.iter().position(|(a, _)| a == arm).unwrap_or(0));
            for (_, s) in seeds {
                chart.draw_series(LineSeries::new(s.get(tag).into_iter().flatten().cloned(), color.mix(0.45).stroke_width(1))).map_err(|e| e.to_string())?;
            }
            chart.draw_series(LineSeries::new(seed_mean(seeds, tag), color.stroke_width(3))).map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| format!("{}: {e}", file.display()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str, rewards: &[f32]) -> (String, Scalars) {
        let mut s = Scalars::new();
        s.insert("rollout/reward_mean".into(), rewards.iter().enumerate().map(|(i, &r)| (i as i64, r)).collect());
        (name.to_string(), s)
    }

    #[test]
    fn seeds_group_into_arms_with_their_mean_and_spread() {
        assert_eq!((arm_of("fast-tis-s12"), arm_of("matched-none"), arm_of("x-seed")), ("fast-tis", "matched-none", "x-seed"));
        let runs = vec![run("matched-none-s0", &[0.0, 0.5, 0.5, 0.5]), run("fast-none-s0", &[0.0, 0.2]), run("matched-none-s1", &[0.0, 0.7, 0.7, 0.7]), run("fast-none-s1", &[])];
        let grouped = arms(&runs);
        assert_eq!(grouped.iter().map(|(a, s)| (a.as_str(), s.len())).collect::<Vec<_>>(), vec![("matched-none", 2), ("fast-none", 2)]);
        assert_eq!(seed_mean(&grouped[0].1, "rollout/reward_mean"), vec![(0, 0.0), (1, 0.6), (2, 0.6), (3, 0.6)]);
        let md = arm_table(&runs);
        assert!(md.contains("| matched-none | 2 | 4 | 0.600 ± 0.100 | 0.500–0.700 |"), "{md}");
        // the seed without steps is not counted as a final reward of 0
        assert!(md.contains("| fast-none | 2 | 0 | 0.100 ± 0.000 | 0.100–0.100 |"), "{md}");
        let dir = shared_kernels::testing::Scratch::new("report-arms");
        plot_arms(&runs, "rollout/reward_mean", &dir.join("arms.png")).unwrap();
        assert!(std::fs::metadata(dir.join("arms.png")).unwrap().len() > 1000);
    }
}
