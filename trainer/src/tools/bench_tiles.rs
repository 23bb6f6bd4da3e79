//! `lockstep bench --tile-sweep`: the warpgroup matmul's every cube tile at the preset's real
//! projection shapes (the decode path's fused q/k/v and gate/up, o_proj, down_proj, lm_head) and
//! the given M, in one run: time per call and TFLOP/s, the tile the process picks marked, and
//! each tile's output checked against the pick's as bits (tiles are scheduling only).

use super::bench_options::BenchOptions;
use super::bench_ops::{rand2, time_op};
use burn::tensor::{Device, Tensor};
use shared_kernels::model::ModelConfig;
use shared_kernels::ops::matmul::matmul_warpgroup;
use shared_kernels::ops::matmul::wgmma::{WgmmaSchedule, WgmmaTiles};
use shared_kernels::WeightLayout;

/// Every tile shape of one or two warpgroups, at the most k-tile slots that fit one cube a
/// multiprocessor and, where smaller, the most that fit two. (Four warpgroups, 544 units,
/// leave ptxas 96 registers a unit: too few for an m64n256 accumulator, H200.)
pub fn candidate_tiles() -> Vec<WgmmaTiles> {
    let mut out = Vec::new();
    for wg_m in [1, 2] {
        for bn in [64, 128, 256] {
            let fits = |stages: usize| WgmmaTiles::parse(&format!("{wg_m}/{bn}/{stages}")).ok();
            let most = (2..=8).rev().find_map(fits);
            // two cubes a multiprocessor: at most ~110 KiB each
            let two = (2..=8).rev().filter_map(fits).find(|t| t.shared_bytes() <= 110 * 1024);
            // and the coverage rule's smallest tile, 1/64/4
            let small = (wg_m == 1 && bn == 64).then_some(WgmmaTiles::SMALL);
            for t in [most, two, small].into_iter().flatten() {
                if !out.contains(&t) {
                    out.push(t);
                }
            }
        }
    }
    out
}

pub fn run(o: &BenchOptions, config: &ModelConfig, device: &Device) -> Result<(), String> {
    let (h, ffn, v) = (config.hidden_size, config.intermediate_size, config.vocab_size);
    let qkv = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim;
    let attn = config.num_heads * config.head_dim;
    let ms: &[usize] = if o.matmul_m.is_empty() { &[256, 4096] } else { &o.matmul_m };
    let sms = shared_kernels::device::multiprocessors(device);
    println!("\n## warpgroup matmul tiles (persistent schedule; median µs per call; `*` = the waves rule's pick, `°` = the coverage rule's; bits vs the process's pick)\n");
    println!("| op | M x N x K | tiles wg_m/bn/stages | cubes | µs | TFLOP/s | vs pick | bits |");
    println!("|---|---|---|---|---|---|---|---|");
    let shapes = [("qkv (fused)", qkv, h), ("o_proj", h, attn), ("gate/up (fused)", 2 * ffn, h), ("down_proj", h, ffn), ("lm_head", v, h)];
    for &(name, n, k) in &shapes {
        let w = rand2([n, k], o.dtype, device).mul_scalar(0.02);
        for &m in ms {
            let x = rand2([m, k], o.dtype, device);
            let run = |t: Option<WgmmaTiles>| matmul_warpgroup(x.clone(), w.clone(), WeightLayout::OutIn, o.dtype, Some(WgmmaSchedule::Persistent), t);
            let pick = run(None).map_err(|e| e.to_string())?; // the process's pick (LOCKSTEP_WGMMA_PICK)
            let pick_bits = bits(pick);
            use shared_kernels::ops::matmul::wgmma_tiles::{tiles_picked, TilePick};
            let picked = tiles_picked(TilePick::Waves, m, n, sms, false);
            let coverage = tiles_picked(TilePick::Coverage, m, n, sms, false);
            let inner = if m * n * k < 1 << 30 { 20 } else { 5 };
            let flops = 2.0 * (m * n * k) as f64;
            let mut results = Vec::new();
            for t in candidate_tiles() {
                let out = match run(Some(t)) {
                    Ok(y) => y,
                    Err(e) => {
                        println!("| {name} | {m}x{n}x{k} | {} | - | refused: {e} | | | |", label(t));
                        continue;
                    }
                };
                let same = bits(out) == pick_bits;
                let s = time_op(device, o.repeats, inner, || drop(run(Some(t)).expect("ran above")));
                results.push((t, s, same));
            }
            let pick_s = results.iter().find(|r| r.0 == picked).map(|r| r.1).unwrap_or(f64::NAN);
            let coverage_s = results.iter().find(|r| r.0 == coverage).map(|r| r.1).unwrap_or(f64::NAN);
            for (t, s, same) in &results {
                let cubes = m.div_ceil(t.bm()) * n.div_ceil(t.bn);
                let mark = match (*t == picked, *t == coverage) {
                    (true, true) => "*°",
                    (true, false) => "*",
                    (false, true) => "°",
                    _ => "",
                };
                println!("| {name} | {m}x{n}x{k} | {}{mark} | {cubes} | {:.1} | {:.0} | {:.2} | {} |", label(*t), s * 1e6, flops / s / 1e12, s / pick_s, if *same { "equal" } else { "DIFFERENT" });
            }
            if let Some((best, s, _)) = results.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
                eprintln!("tile-sweep: {name} {m}x{n}x{k}: best {} {:.1} µs, waves' pick {} {:.1} µs, coverage's pick {} {:.1} µs", label(*best), s * 1e6, label(picked), pick_s * 1e6, label(coverage), coverage_s * 1e6);
            }
            if results.iter().any(|r| !r.2) {
                return Err(format!("tile sweep: {name} {m}x{n}x{k}: a tile's output differs from the pick's as bits"));
            }
        }
    }
    Ok(())
}

fn label(t: WgmmaTiles) -> String {
    format!("{}/{}/{}", t.wg_m, t.bn, t.stages)
}

/// The output's bytes as stored (its dtype's bits).
fn bits(y: Tensor<2>) -> Vec<u8> {
    y.into_data().as_bytes().to_vec()
}
