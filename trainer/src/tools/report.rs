//! `lockstep report`: read the scalars of several runs back from their TensorBoard event files
//! and write a markdown table (one row per run) and PNG curves of reward and KL.

use plotters::prelude::*;
use protobuf::Message;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tensorboard_proto::event::{Event, Event_oneof_what};
use tensorboard_proto::summary::Summary_Value_oneof_value;

pub use super::scalars::Scalars;
use super::scalars::font;

/// Every scalar in the event files of `tb_dir` (TFRecord framing: u64 length, u32 crc,
/// payload, u32 crc; payloads are `Event` protobufs).
pub fn read_scalars(tb_dir: &Path) -> Result<Scalars, String> {
    let mut out: Scalars = BTreeMap::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(tb_dir).map_err(|e| format!("{}: {e}", tb_dir.display()))?.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.contains("tfevents"))).collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("{}: no TensorBoard event files", tb_dir.display()));
    }
    for file in files {
        let bytes = std::fs::read(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let mut at = 0usize;
        while at + 12 <= bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
            let start = at + 12;
            // a length past the file is a record cut by a kill (the last one: skipped) or garbage
            let end = usize::try_from(len).ok().and_then(|l| start.checked_add(l));
            let Some(payload) = end.and_then(|end| bytes.get(start..end)) else {
                if at == 0 {
                    return Err(format!("{}: not a TensorBoard event file (its first record claims {len} bytes; the file has {})", file.display(), bytes.len()));
                }
                break;
            };
            at = start + payload.len() + 4;
            let event = Event::parse_from_bytes(payload).map_err(|e| format!("{}: bad event record: {e}", file.display()))?;
            if let Some(Event_oneof_what::summary(summary)) = event.what {
                for v in summary.get_value() {
                    if let Some(Summary_Value_oneof_value::simple_value(x)) = v.value {
                        out.entry(v.get_tag().to_string()).or_default().push((event.step, x));
                    }
                }
            }
        }
    }
    for series in out.values_mut() {
        series.sort_by_key(|p| p.0);
    }
    Ok(out)
}

fn mean(xs: &[(i64, f32)]) -> f64 {
    xs.iter().map(|p| p.1 as f64).sum::<f64>() / xs.len().max(1) as f64
}

/// Markdown table: one row per run; with a mixture-of-experts run among them, a column of each
/// run's lowest `moe/routing_agreement` too.
pub fn table(runs: &[(String, Scalars)], target_reward: f64) -> String {
    let moe = runs.iter().any(|(_, sc)| sc.contains_key("moe/routing_agreement"));
    let (moe_head, moe_rule) = if moe { (" routing agreement (min) |", "---|") } else { ("", "") };
    let mut s = format!("| run | steps | final reward (mean of last 3) | first step with reward ≥ {target_reward} | mean KL k1 | max abs KL k1 | max abs Δlogprob | bit-equal frac (min) | IS ratio range | truncated/masked frac (mean) | mean step s |{moe_head}\n|---|---|---|---|---|---|---|---|---|---|---|{moe_rule}\n");
    for (name, sc) in runs {
        let get = |t: &str| sc.get(t).cloned().unwrap_or_default();
        let reward = get("rollout/reward_mean");
        if reward.is_empty() {
            s += &format!("| {name} | 0 | no GRPO step logged (the run failed or was cut before its first step; see its log) | | | | | | | | |{}\n", if moe { " |" } else { "" });
            continue;
        }
        let tail = &reward[reward.len().saturating_sub(3)..];
        let reached = reward.iter().find(|p| p.1 as f64 >= target_reward).map_or("never".to_string(), |p| p.0.to_string());
        let kl = get("rollout/kl_k1");
        let kl_max = kl.iter().map(|p| p.1.abs()).fold(0.0f32, f32::max);
        let diff_max = get("rollout/logprob_abs_diff_max").iter().map(|p| p.1).fold(0.0f32, f32::max);
        let bit_min = get("rollout/bit_equal_frac").iter().map(|p| p.1).fold(1.0f32, f32::min);
        let rmin = get("train/is_ratio_min").iter().map(|p| p.1).fold(f32::INFINITY, f32::min);
        let rmax = get("train/is_ratio_max").iter().map(|p| p.1).fold(0.0f32, f32::max);
        let cut = mean(&get("train/truncated_frac")) + mean(&get("train/masked_frac"));
        s += &format!(
            "| {name} | {} | {:.3} | {reached} | {:.3e} | {:.3e} | {:.3e} | {:.4} | {:.7}–{:.7} | {:.4} | {:.2} |\n",
            reward.len(), mean(tail), mean(&kl), kl_max, diff_max, bit_min, rmin, rmax, cut, mean(&get("perf/step_s"))
        );
        if moe {
            let routing = get("moe/routing_agreement");
            let cell = if routing.is_empty() { "dense".to_string() } else { format!("{:.4}", routing.iter().map(|p| p.1).fold(1.0f32, f32::min)) };
            s.insert_str(s.len() - 1, &format!(" {cell} |"));
        }
    }
    s
}

/// One PNG per tag, a line per run.
pub fn plot(runs: &[(String, Scalars)], tag: &str, file: &Path) -> Result<(), String> {
    let labels = font();
    let series: Vec<(&String, Vec<(i64, f32)>)> = runs.iter().map(|(n, s)| (n, s.get(tag).cloned().unwrap_or_default())).collect();
    let max_step = series.iter().flat_map(|s| s.1.iter().map(|p| p.0)).max().unwrap_or(1).max(1);
    let (mut lo, mut hi) = series.iter().flat_map(|s| s.1.iter().map(|p| p.1)).fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    if !lo.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    if hi - lo < 1e-9 {
        hi = lo + 1e-3;
        lo -= 1e-3;
    }
    super::scalars::png_atomically(file, |tmp| {
        let root = BitMapBackend::new(tmp, (900, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let mut builder = ChartBuilder::on(&root);
        builder.margin(12).x_label_area_size(if labels { 36 } else { 0 }).y_label_area_size(if labels { 70 } else { 0 });
        if labels {
            builder.caption(tag, ("sans-serif", 22));
        }
        let mut chart = builder.build_cartesian_2d(0i64..max_step, lo..hi).map_err(|e| e.to_string())?;
        if labels {
            chart.configure_mesh().x_desc("step").draw().map_err(|e| e.to_string())?;
        }
        for (i, (name, pts)) in series.iter().enumerate() {
            let color = Palette99::pick(i).stroke_width(2);
            let drawn = chart.draw_series(LineSeries::new(pts.iter().cloned(), color)).map_err(|e| e.to_string())?;
            if labels {
                drawn.label(name.as_str()).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], Palette99::pick(i).stroke_width(2)));
            }
        }
        if labels {
            chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).position(SeriesLabelPosition::LowerRight).draw().map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| format!("{}: {e}", file.display()))
    })
}

/// The same scalars from a run's `metrics.jsonl` (one JSON object per step), for runs whose
/// TensorBoard folder did not travel (e.g. only metrics.jsonl was copied back from a GPU).
pub fn read_metrics_jsonl(path: &Path) -> Result<Scalars, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out: Scalars = BTreeMap::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let m: trainer::telemetry::StepMetrics = serde_json::from_str(line).map_err(|e| format!("{} line {}: {e}", path.display(), i + 1))?;
        for (tag, value) in m.scalars() {
            out.entry(tag.to_string()).or_default().push((m.step as i64, value as f32));
        }
    }
    Ok(out)
}

/// Reads `run_dirs` (each with a `tb` folder, or else a `metrics.jsonl`), writes
/// `out/table.md`, `out/reward.png`, `out/kl.png`, `out/logprob_abs_diff_max.png`, and by arm
/// (`report_arms.rs`) `out/arms.md` and `out/arms_{reward,kl,grad_norm,entropy}.png`.
pub fn report(run_dirs: &[PathBuf], out: &Path, target_reward: f64) -> Result<String, String> {
    if run_dirs.is_empty() {
        return Err("name at least one run folder (runs/<log.run_name>)".into());
    }
    if !target_reward.is_finite() {
        return Err(format!("--target-reward must be a number, got {target_reward}"));
    }
    // every input read before the output folder is made
    let mut runs = Vec::new();
    for dir in run_dirs {
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("run").to_string();
        let (tb, jsonl) = (dir.join("tb"), dir.join("metrics.jsonl"));
        if !tb.is_dir() && !jsonl.is_file() {
            return Err(format!("{} is not a run folder: it holds neither tb/ nor metrics.jsonl", dir.display()));
        }
        // TensorBoard's files when they are there, else metrics.jsonl (the same tags)
        let scalars = match (tb.is_dir(), jsonl.is_file()) {
            (true, true) => read_scalars(&tb).or_else(|_| read_metrics_jsonl(&jsonl))?,
            (true, false) => read_scalars(&tb)?,
            (false, _) => read_metrics_jsonl(&jsonl)?,
        };
        runs.push((name, scalars));
    }
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let md = table(&runs, target_reward);
    shared_kernels::model::save::write_atomic(&out.join("table.md"), md.as_bytes()).map_err(|e| e.to_string())?;
    plot(&runs, "rollout/reward_mean", &out.join("reward.png"))?;
    plot(&runs, "rollout/kl_k1", &out.join("kl.png"))?;
    plot(&runs, "rollout/logprob_abs_diff_max", &out.join("logprob_abs_diff_max.png"))?;
    // by arm (runs named <arm>-s<seed>): panels and the seed spread of the final rewards
    let by_arm = super::report_arms::arm_table(&runs);
    shared_kernels::model::save::write_atomic(&out.join("arms.md"), by_arm.as_bytes()).map_err(|e| e.to_string())?;
    for (tag, name) in [("rollout/reward_mean", "arms_reward.png"), ("rollout/kl_k1", "arms_kl.png"), ("train/grad_norm", "arms_grad_norm.png"), ("train/entropy", "arms_entropy.png")] {
        super::report_arms::plot_arms(&runs, tag, &out.join(name))?;
    }
    Ok(format!("{md}\n{by_arm}"))
}

#[cfg(test)]
mod tests {
    use super::{table, Scalars};

    #[test]
    fn a_run_without_steps_is_marked_not_filled_with_fake_numbers() {
        let mut ok = Scalars::new();
        ok.insert("rollout/reward_mean".into(), vec![(0, 0.25), (1, 0.75)]);
        ok.insert("train/is_ratio_min".into(), vec![(0, 1.0), (1, 1.0)]);
        ok.insert("train/is_ratio_max".into(), vec![(0, 1.0), (1, 1.0)]);
        let md = table(&[("good".into(), ok), ("crashed".into(), Scalars::new())], 0.5);
        let good = md.lines().find(|l| l.starts_with("| good")).unwrap();
        assert!(good.starts_with("| good | 2 | 0.500 | 1 |"), "{good}");
        let crashed = md.lines().find(|l| l.starts_with("| crashed")).unwrap();
        assert!(crashed.contains("no GRPO step logged") && !crashed.contains("inf"), "{crashed}");
    }

    #[test]
    fn a_mixture_of_experts_run_adds_its_lowest_routing_agreement() {
        let run = |routing: Option<&[f32]>| -> Scalars {
            let mut sc = Scalars::new();
            sc.insert("rollout/reward_mean".into(), vec![(0, 0.5), (1, 0.5)]);
            if let Some(r) = routing {
                sc.insert("moe/routing_agreement".into(), r.iter().enumerate().map(|(i, &v)| (i as i64, v)).collect());
            }
            sc
        };
        let md = super::table(&[("dense".into(), run(None)), ("moe-fast".into(), run(Some(&[0.9375, 0.8125])))], 0.5);
        let header = md.lines().next().unwrap();
        assert!(header.ends_with("| routing agreement (min) |"), "{header}");
        let row = |name: &str| md.lines().find(|l| l.starts_with(&format!("| {name} |"))).unwrap().to_string();
        assert!(row("moe-fast").ends_with("| 0.8125 |") && row("dense").ends_with("| dense |"), "{md}");
        assert!(md.lines().all(|l| l.matches('|').count() == header.matches('|').count()), "{md}");
        assert!(!super::table(&[("dense".into(), run(None))], 0.5).contains("routing"));
    }

    #[test]
    fn metrics_jsonl_gives_the_same_tags_as_tensorboard() {
        let mut m = trainer::telemetry::StepMetrics { step: 3, reward_mean: 0.625, ..Default::default() };
        m.agreement.bit_equal_frac = 1.0;
        let dir = shared_kernels::testing::Scratch::new("report");
        let path = dir.join("metrics.jsonl");
        std::fs::write(&path, format!("{}\n", serde_json::to_string(&m).unwrap())).unwrap();
        let scalars = super::read_metrics_jsonl(&path).unwrap();
        assert_eq!(scalars["rollout/reward_mean"], vec![(3, 0.625)]);
        assert_eq!(scalars["rollout/bit_equal_frac"], vec![(3, 1.0)]);
        std::fs::write(&path, "{\"step\": oops}\n").unwrap();
        let err = super::read_metrics_jsonl(&path).unwrap_err();
        assert!(err.contains("metrics.jsonl line 1"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn inputs_that_are_not_runs_are_errors_before_any_output() {
        let dir = shared_kernels::testing::Scratch::new("report-inputs");
        let (run, not_run, out) = (dir.join("run"), dir.join("not-a-run"), dir.join("out"));
        std::fs::create_dir_all(run.join("tb")).unwrap();
        std::fs::write(run.join("metrics.jsonl"), "").unwrap();
        std::fs::create_dir_all(&not_run).unwrap();
        for (runs, target, needle) in [(vec![], 0.5, "at least one run"), (vec![run.clone(), not_run.clone()], 0.5, "not-a-run is not a run folder"), (vec![run.clone()], f64::NAN, "--target-reward")] {
            let e = super::report(&runs, &out, target).unwrap_err();
            assert!(e.contains(needle), "{e}");
            assert!(!out.exists(), "no output folder for a refused report");
        }
        // a run without steps yet gives a table that says so
        let md = super::report(&[run], &out, 0.5).unwrap();
        assert!(md.starts_with(&std::fs::read_to_string(out.join("table.md")).unwrap()) && md.ends_with(&std::fs::read_to_string(out.join("arms.md")).unwrap()), "{md}");
        // every file renamed into place: the plots and the table, no temp file beside them
        let mut names: Vec<String> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(names, ["arms.md", "arms_entropy.png", "arms_grad_norm.png", "arms_kl.png", "arms_reward.png", "kl.png", "logprob_abs_diff_max.png", "reward.png", "table.md"]);
    }

    #[test]
    fn garbage_event_files_are_errors_not_panics() {
        let dir = shared_kernels::testing::Scratch::new("report-garbage");
        for (i, bytes) in [vec![0xffu8; 64], b"not an event file at all".to_vec(), vec![0u8; 5]].into_iter().enumerate() {
            let file = dir.join(format!("events.out.tfevents.{i}"));
            std::fs::write(&file, bytes).unwrap();
            let got = super::read_scalars(&dir);
            assert!(got.is_err() || got.as_ref().unwrap().is_empty(), "{got:?}");
            std::fs::remove_file(file).unwrap();
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
