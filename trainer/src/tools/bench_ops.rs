//! `lockstep bench`, second half: each lockstep kernel against burn's default op at the preset's
//! shapes, then the trainer's step time and model FLOP utilisation. Timings are medians of
//! `repeats` samples, each sample the mean of several back-to-back calls between two device
//! syncs (so launch latency is amortised as in a real forward). `--json` writes the rows for
//! experiments/bench/torch_bench.py, which adds torch's time for the same shapes in the same visit.

use super::bench_options::{median, sync, BenchOptions};
use burn::tensor::{activation, DType, Device, Distribution, Int, Tensor, TensorData};
use serde_json::json;
use shared_kernels::model::{KernelSet, ModelConfig, Qwen3, Weight};
use shared_kernels::ops::matmul::{matmul_with, MatmulKernel};
use shared_kernels::WeightLayout;
use std::time::Instant;

/// Dense bf16 tensor-core peak of one H200 (SXM), FLOP/s: the MFU denominator on CUDA.
const H200_BF16_PEAK: f64 = 989.4e12;

/// `--single-call`: every op runs once (a kernel profiler then sees one launch per kernel and
/// shape); the times printed are of that one cold call.
static SINGLE_CALL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(crate) fn time_op(device: &Device, repeats: usize, inner: usize, mut f: impl FnMut()) -> f64 {
    if SINGLE_CALL.load(std::sync::atomic::Ordering::Relaxed) {
        let t = Instant::now();
        f();
        sync(device);
        return t.elapsed().as_secs_f64();
    }
    f();
    sync(device);
    let samples = (0..repeats.max(1))
        .map(|_| {
            let t = Instant::now();
            for _ in 0..inner {
                f();
            }
            sync(device);
            t.elapsed().as_secs_f64() / inner as f64
        })
        .collect();
    median(samples)
}

pub(crate) fn rand2(shape: [usize; 2], dtype: DType, device: &Device) -> Tensor<2> {
    Tensor::<2>::random(shape, Distribution::Normal(0.0, 1.0), device).cast(dtype)
}

pub fn run(o: &BenchOptions, config: &ModelConfig, device: &Device) -> Result<(), String> {
    SINGLE_CALL.store(o.single_call, std::sync::atomic::Ordering::Relaxed);
    if o.trainer_only {
        return trainer_step(o, config, device);
    }
    let (h, ffn, v) = (config.hidden_size, config.intermediate_size, config.vocab_size);
    let ms: &[usize] = if o.matmul_m.is_empty() { &[1, 16, 64, 256, 1024, 4096] } else { &o.matmul_m };
    let mut rows = Vec::new();
    println!("\n## kernels (median ms per call; ratio = lockstep / burn default)\n");
    println!("| op | M x N x K | lockstep ms | burn ms | lockstep / burn | lockstep TFLOP/s | lockstep GB/s |");
    println!("|---|---|---|---|---|---|---|");
    let bytes_per = o.dtype.size() as f64;
    // The JSON is rewritten after every row, so a visit's time limit keeps what was measured.
    let mut emit = |op: &str, shape: [usize; 3], a: f64, b: f64, flops: f64, bytes: f64| {
        println!("| {op} | {}x{}x{} | {:.4} | {:.4} | {:.2} | {:.2} | {:.0} |", shape[0], shape[1], shape[2], a * 1e3, b * 1e3, a / b, flops / a / 1e12, bytes / a / 1e9);
        rows.push(json!({"op": op, "m": shape[0], "n": shape[1], "k": shape[2], "lockstep_ms": a * 1e3, "burn_ms": if b.is_nan() { serde_json::Value::Null } else { json!(b * 1e3) }, "flops": flops, "bytes": bytes}));
        if let Some(path) = &o.json {
            let doc = json!({"runtime": shared_kernels::device::runtime_name(), "preset": o.preset, "dtype": format!("{:?}", o.dtype), "q_heads": config.num_heads, "kv_heads": config.num_kv_heads, "kernels": rows});
            if let Err(e) = shared_kernels::model::save::write_atomic(path, serde_json::to_string_pretty(&doc).expect("json").as_bytes()) {
                eprintln!("bench: {}: {e}", path.display());
            }
        }
    };
    if o.attention_only {
        return attention_rows(o, config, device, &mut emit);
    }
    if o.memory_only {
        return memory_rows(o, config, device, &mut emit);
    }
    // every batch-invariant matmul kernel this device runs for the dtype, the default first
    let default_kernel = shared_kernels::ops::matmul::matmul_kernel_on(device, o.dtype).map_err(|e| e.to_string())?;
    let kernels: Vec<MatmulKernel> = match default_kernel {
        k if o.matmul_only => vec![k],
        MatmulKernel::Scalar => vec![MatmulKernel::Scalar],
        k => {
            let wgmma = shared_kernels::ops::matmul::wgmma_on(device).map_err(|e| e.to_string())?;
            let others = [MatmulKernel::Warpgroup, MatmulKernel::Hybrid, MatmulKernel::Pipelined, MatmulKernel::TensorCore, MatmulKernel::TensorCoreTiles, MatmulKernel::TensorCoreAsync];
            std::iter::once(k).chain(others.into_iter().filter(|&o| o != k && (wgmma || o != MatmulKernel::Warpgroup))).collect()
        }
    };
    for &(name, n, k) in &[("matmul hidden->hidden", h, h), ("matmul hidden->ffn", ffn, h), ("matmul ffn->hidden", h, ffn), ("matmul lm_head", v, h)] {
        let w = rand2([n, k], o.dtype, device).mul_scalar(0.02);
        for &m in ms {
            let x = rand2([m, k], o.dtype, device);
            let inner = if m * n * k < 1 << 28 { 20 } else { 10 };
            let b = if o.no_burn { f64::NAN } else { time_op(device, o.repeats, inner, || drop(x.clone().matmul(w.clone().transpose()))) };
            let bytes = (m * k + n * k + m * n) as f64 * bytes_per;
            for (i, &kernel) in kernels.iter().enumerate() {
                // a kernel that cannot run this shape is an error here, not a panic in the timing loop
                matmul_with(Some(kernel), x.clone(), w.clone(), WeightLayout::OutIn).map_err(|e| e.to_string())?;
                let a = time_op(device, o.repeats, inner, || drop(matmul_with(Some(kernel), x.clone(), w.clone(), WeightLayout::OutIn).unwrap()));
                let label = if i == 0 { name.to_string() } else { format!("{name} [{}]", kernel.name()) };
                emit(&label, [m, n, k], a, b, 2.0 * (m * n * k) as f64, bytes);
            }
        }
    }
    // the tensor-core instruction's own ceiling beside the matmul rows (where the device has it):
    // 8 cubes of 4 planes per H200 SM, each plane 4 independent mma chains
    let (cubes, iters) = (1056, 4096);
    if let Ok((_, flops)) = shared_kernels::ops::probes::mma_peak::mma_peak(device, o.dtype, cubes, iters) {
        let a = time_op(device, o.repeats, 3, || drop(shared_kernels::ops::probes::mma_peak::mma_peak(device, o.dtype, cubes, iters).unwrap().0));
        emit("mma peak (cmma 16x16x16, operands in registers)", [cubes, iters, 16], a, f64::NAN, flops, 0.0);
    }
    if o.matmul_only {
        return Ok(());
    }
    memory_rows(o, config, device, &mut emit)?;
    attention_rows(o, config, device, &mut emit)?;
    trainer_step(o, config, device)
}

/// The memory-bound kernels, with the streaming-read ceiling first: every row's GB/s is its
/// bytes read + written over its time, comparable with the `hbm read` row of the same run. The
/// pointwise and norm rows run at a bandwidth-sized token count (16384 on CUDA: 32-96 MB per
/// tensor), where launch latency no longer hides the memory system; rmsnorm also at the matmul
/// rows' M (the decode and prefill sizes), logprob up to 1024 rows of the full vocabulary.
fn memory_rows(o: &BenchOptions, config: &ModelConfig, device: &Device, emit: &mut impl FnMut(&str, [usize; 3], f64, f64, f64, f64)) -> Result<(), String> {
    let (h, ffn, v) = (config.hidden_size, config.intermediate_size, config.vocab_size);
    let bytes_per = o.dtype.size() as f64;
    let cuda = shared_kernels::device::runtime_name() == "cuda";
    let big = if cuda { 16384 } else { 4096 };
    let burn_time = |f: &mut dyn FnMut()| if o.no_burn { f64::NAN } else { time_op(device, o.repeats, 10, f) };
    {
        let w = rand2([v, h], o.dtype, device);
        let cubes = 132 * 8;
        if let Ok((_, bytes)) = shared_kernels::ops::probes::hbm_read::hbm_read(&w, cubes) {
            let a = time_op(device, o.repeats, 5, || drop(shared_kernels::ops::probes::hbm_read::hbm_read(&w, cubes).unwrap().0));
            emit("hbm read (16-byte loads, the lm_head weight)", [1, v, h], a, f64::NAN, 0.0, bytes);
        }
    }
    let ms: &[usize] = if o.matmul_m.is_empty() { &[1, 16, 64, 256, 1024, 4096] } else { &o.matmul_m };
    let norm_w = Tensor::<1>::random([h], Distribution::Uniform(0.5, 1.5), device).cast(o.dtype);
    let mut norm_rows: Vec<usize> = ms.to_vec();
    if !norm_rows.contains(&big) {
        norm_rows.push(big);
    }
    for &m in &norm_rows {
        let x = rand2([m, h], o.dtype, device);
        let a = time_op(device, o.repeats, 20, || drop(shared_kernels::rmsnorm(x.clone(), norm_w.clone(), 1e-6).unwrap()));
        let b = burn_time(&mut || {
            let x32 = x.clone().cast(DType::F32);
            let y = (x32.clone() * x32.clone()).mean_dim(1).add_scalar(1e-6).sqrt().recip() * x32 * norm_w.clone().cast(DType::F32).unsqueeze::<2>();
            drop(y.cast(o.dtype));
        });
        emit("rmsnorm", [m, h, 1], a, b, 0.0, 2.0 * (m * h) as f64 * bytes_per);
    }
    {
        let (x, r) = (rand2([big, h], o.dtype, device), rand2([big, h], o.dtype, device));
        let a = time_op(device, o.repeats, 20, || drop(shared_kernels::add_rmsnorm(x.clone(), r.clone(), norm_w.clone(), 1e-6).unwrap()));
        // reads a and b, writes the sum and the normalised sum
        emit("add_rmsnorm", [big, h, 1], a, f64::NAN, 0.0, 4.0 * (big * h) as f64 * bytes_per);
        let a = time_op(device, o.repeats, 20, || drop(shared_kernels::add(x.clone(), r.clone()).unwrap()));
        let b = burn_time(&mut || drop(x.clone() + r.clone()));
        emit("add", [big, h, 1], a, b, 0.0, 3.0 * (big * h) as f64 * bytes_per);
    }
    {
        let (g, u) = (rand2([big, ffn], o.dtype, device), rand2([big, ffn], o.dtype, device));
        let a = time_op(device, o.repeats, 20, || drop(shared_kernels::swiglu(g.clone(), u.clone()).unwrap()));
        let b = burn_time(&mut || drop(activation::silu(g.clone()) * u.clone()));
        emit("swiglu", [big, ffn, 1], a, b, 0.0, 3.0 * (big * ffn) as f64 * bytes_per);
    }
    {
        let (heads, hd) = (config.num_heads, config.head_dim);
        let tables = shared_kernels::ops::rope::RopeTables::from_frequencies(hd, config.max_position_embeddings, &config.rope.inv_freq(hd), config.rope.attention_factor(), device).map_err(|e| e.to_string())?;
        let x = Tensor::<3>::random([big, heads, hd], Distribution::Normal(0.0, 1.0), device).cast(o.dtype);
        let positions = Tensor::<1, Int>::from_data(TensorData::new((0..big).map(|r| (r % config.max_position_embeddings) as i32).collect::<Vec<_>>(), [big]), device);
        let a = time_op(device, o.repeats, 20, || drop(shared_kernels::ops::rope::rope(x.clone(), positions.clone(), &tables).unwrap()));
        emit("rope", [big, heads, hd], a, f64::NAN, 0.0, 2.0 * (big * heads * hd) as f64 * bytes_per);
    }
    for &m in ms.iter().filter(|&&m| m <= 1024) {
        // compact once: CUDA pads a 151936-wide bf16 row, and the op would copy it on every call
        let logits = shared_kernels::contiguous(rand2([m, v], o.dtype, device)).map_err(|e| e.to_string())?;
        let targets = Tensor::<1, Int>::from_data(TensorData::new((0..m as i32).collect::<Vec<_>>(), [m]), device);
        let temps = Tensor::<1>::ones([m], device);
        let a = time_op(device, o.repeats, 10, || drop(shared_kernels::token_logprobs(logits.clone(), targets.clone(), temps.clone()).unwrap()));
        let b = burn_time(&mut || drop(activation::log_softmax(logits.clone().cast(DType::F32), 1).gather(1, targets.clone().reshape([m, 1]))));
        emit("logprob", [m, v, 1], a, b, 0.0, (m * v) as f64 * bytes_per);
    }
    Ok(())
}

/// Decode attention (one query row per sequence, the whole cache as its prefix) at long
/// contexts: the sequential kernel against split_kv, both batch invariant, in one run.
fn attention_rows(o: &BenchOptions, config: &ModelConfig, device: &Device, emit: &mut impl FnMut(&str, [usize; 3], f64, f64, f64, f64)) -> Result<(), String> {
    use shared_kernels::ops::attention::{attention_with, AttentionKernel};
    let (qh, kvh, hd) = (config.num_heads, config.num_kv_heads, config.head_dim);
    let cuda = shared_kernels::device::runtime_name() == "cuda";
    // 128 keys: the seed benchmark's decode (32 + 100 positions), where 256 rows are a step
    let contexts: &[usize] = if cuda { &[128, 1024, 4096] } else { &[256] };
    for &ctx in contexts {
        let row_counts: &[usize] = if ctx <= 128 { &[16, 64, 256] } else { &[1, 16, 64, 128, 256] };
        for &rows in row_counts {
            let (q, kc, vc, slots, positions) = decode_inputs(o, device, rows, ctx, (qh, kvh, hd));
            let scale = 1.0 / (hd as f32).sqrt();
            let call = |kernel| attention_with(Some(kernel), q.clone(), kc.clone(), vc.clone(), slots.clone(), positions.clone(), scale);
            let bytes = (2 * rows * ctx * kvh * hd + 2 * rows * qh * hd) as f64 * o.dtype.size() as f64;
            let flops = 4.0 * (rows * qh * ctx * hd) as f64;
            for (kernel, name) in [(AttentionKernel::Sequential, "sequential"), (AttentionKernel::SplitKv, "split_kv"), (AttentionKernel::SplitKvTensorCore, "split_kv_tc")] {
                // the tensor-core kernel only where the device and dtype have it
                match call(kernel) {
                    Err(_) if kernel == AttentionKernel::SplitKvTensorCore => continue,
                    r => drop(r.map_err(|e| e.to_string())?),
                }
                let a = time_op(device, o.repeats, 5, || drop(call(kernel).unwrap()));
                emit(&format!("attention decode [{name}]"), [rows, ctx, hd], a, f64::NAN, flops, bytes);
            }
            if cuda {
                decode_launch_rows(o, device, &call, [rows, ctx, hd], flops, bytes, emit)?;
                if ctx >= 1024 && kvh > 1 {
                    head_major_row(o, device, [rows, ctx, hd], (qh, kvh), flops, bytes, emit)?;
                }
            }
        }
    }
    attention_prefill_rows(o, config, device, emit)
}

/// Random decode inputs: `rows` queries of `q_heads` heads, each the last position of its own
/// `ctx`-position cache of `kv_heads` heads (q, k cache, v cache, slots, positions).
fn decode_inputs(o: &BenchOptions, device: &Device, rows: usize, ctx: usize, (q_heads, kv_heads, hd): (usize, usize, usize)) -> (Tensor<3>, Tensor<4>, Tensor<4>, Tensor<1, Int>, Tensor<1, Int>) {
    let cache = || Tensor::<4>::random([rows, ctx, kv_heads, hd], Distribution::Normal(0.0, 1.0), device).cast(o.dtype);
    let (kc, vc) = (cache(), cache());
    let q = Tensor::<3>::random([rows, q_heads, hd], Distribution::Normal(0.0, 1.0), device).cast(o.dtype);
    let slots = Tensor::<1, Int>::from_data(TensorData::new((0..rows as i32).collect::<Vec<_>>(), [rows]), device);
    let positions = Tensor::<1, Int>::from_data(TensorData::new(vec![ctx as i32 - 1; rows], [rows]), device);
    (q, kc, vc, slots, positions)
}

/// The same decode attention (bytes and arithmetic) with each KV head's keys contiguous: the
/// cache as `rows x kv_heads` sequences of one KV head each, so a cube's 64-key split is one
/// 16 KB block instead of 64 rows of 256 bytes 2 KB apart (the sampler's cache interleaves a
/// position's heads). It measures what the cache layout costs the decode read.
fn head_major_row(o: &BenchOptions, device: &Device, [rows, ctx, hd]: [usize; 3], (qh, kvh): (usize, usize), flops: f64, bytes: f64, emit: &mut impl FnMut(&str, [usize; 3], f64, f64, f64, f64)) -> Result<(), String> {
    use shared_kernels::ops::attention::{attention_with, AttentionKernel::SplitKvTensorCore};
    let (q, kc, vc, slots, positions) = decode_inputs(o, device, rows * kvh, ctx, (qh / kvh, 1, hd));
    let scale = 1.0 / (hd as f32).sqrt();
    let call = || attention_with(Some(SplitKvTensorCore), q.clone(), kc.clone(), vc.clone(), slots.clone(), positions.clone(), scale);
    drop(call().map_err(|e| e.to_string())?);
    let a = time_op(device, o.repeats, 5, || drop(call().unwrap()));
    emit("attention decode [split_kv_tc, each KV head's keys contiguous]", [rows, ctx, hd], a, f64::NAN, flops, bytes);
    Ok(())
}

/// The tensor-core decode partials under each launch (`LOCKSTEP_DECODE_LAUNCH`'s values): the
/// time of each, and its output's bits against the one-split, two-stage launch's (a launch
/// must never change a bit; the row's name says `bits DIFFER` if one did).
fn decode_launch_rows(
    o: &BenchOptions,
    device: &Device,
    call: &dyn Fn(shared_kernels::ops::attention::AttentionKernel) -> Result<Tensor<3>, shared_kernels::KernelError>,
    shape: [usize; 3],
    flops: f64,
    bytes: f64,
    emit: &mut impl FnMut(&str, [usize; 3], f64, f64, f64, f64),
) -> Result<(), String> {
    use shared_kernels::ops::attention::decode::mma_decode::{with_decode_launch, DecodeLaunch, Staging};
    use shared_kernels::ops::attention::AttentionKernel::SplitKvTensorCore;
    let bits = |t: Tensor<3>| t.into_data().as_bytes().to_vec();
    let reference = DecodeLaunch { splits_per_cube: 1, staging: Staging::Two };
    let Ok(Ok(expected)) = with_decode_launch(reference, || call(SplitKvTensorCore)) else { return Ok(()) };
    let expected = bits(expected);
    use Staging::{Narrow, One, Two};
    let launches = [(1, Two), (1, One), (4, One), (8, One), (1, Narrow), (4, Narrow), (8, Narrow)];
    for (splits_per_cube, staging) in launches {
        let launch = DecodeLaunch { splits_per_cube, staging };
        let out = with_decode_launch(launch, || call(SplitKvTensorCore)).and_then(|r| r).map_err(|e| e.to_string())?;
        let same = if bits(out) == expected { "bits equal" } else { "bits DIFFER" };
        let a = time_op(device, o.repeats, 5, || with_decode_launch(launch, || drop(call(SplitKvTensorCore).unwrap())).unwrap());
        emit(&format!("attention decode [split_kv_tc {}, {same}]", launch.name()), shape, a, f64::NAN, flops, bytes);
    }
    Ok(())
}

/// Prefill attention (every position of `seqs` whole sequences of `ctx` tokens, causal): the
/// sequential kernel, split-KV one row per cube, and split-KV's prefill tiles, all the same
/// arithmetic per row as decode (the last two the same bits). Shape column: sequences x ctx x
/// head_dim.
fn attention_prefill_rows(o: &BenchOptions, config: &ModelConfig, device: &Device, emit: &mut impl FnMut(&str, [usize; 3], f64, f64, f64, f64)) -> Result<(), String> {
    use shared_kernels::ops::attention::{attention_rows, attention_with, AttentionKernel};
    let (qh, kvh, hd) = (config.num_heads, config.num_kv_heads, config.head_dim);
    let cuda = shared_kernels::device::runtime_name() == "cuda";
    let ctx = if cuda { 1024 } else { 128 };
    let seq_counts: &[usize] = if cuda { &[1, 4, 16] } else { &[1, 4] };
    for &seqs in seq_counts {
        let rows = seqs * ctx;
        let cache = || Tensor::<4>::random([seqs, ctx, kvh, hd], Distribution::Normal(0.0, 1.0), device).cast(o.dtype);
        let (kc, vc) = (cache(), cache());
        let q = Tensor::<3>::random([rows, qh, hd], Distribution::Normal(0.0, 1.0), device).cast(o.dtype);
        let host_slots: Vec<u32> = (0..rows).map(|r| (r / ctx) as u32).collect();
        let slots = Tensor::<1, Int>::from_data(TensorData::new(host_slots.iter().map(|&s| s as i32).collect::<Vec<_>>(), [rows]), device);
        let positions = Tensor::<1, Int>::from_data(TensorData::new((0..rows).map(|r| (r % ctx) as i32).collect::<Vec<_>>(), [rows]), device);
        let scale = 1.0 / (hd as f32).sqrt();
        let bytes = (2 * rows * qh * hd + 2 * seqs * ctx * kvh * hd) as f64 * o.dtype.size() as f64;
        let flops = 4.0 * (seqs * qh * hd) as f64 * (ctx * (ctx + 1) / 2) as f64;
        let run = |kernel, tiles: bool| {
            if tiles {
                attention_rows(Some(kernel), q.clone(), kc.clone(), vc.clone(), slots.clone(), positions.clone(), &host_slots, scale)
            } else {
                attention_with(Some(kernel), q.clone(), kc.clone(), vc.clone(), slots.clone(), positions.clone(), scale)
            }
        };
        let kernels = [
            (AttentionKernel::Sequential, false, "sequential"),
            (AttentionKernel::SplitKv, false, "split_kv per row"),
            (AttentionKernel::SplitKv, true, "split_kv tiles"),
            (AttentionKernel::SplitKvTensorCore, true, "split_kv_tc tiles"),
        ];
        for (kernel, tiles, name) in kernels {
            match run(kernel, tiles) {
                Err(_) if kernel == AttentionKernel::SplitKvTensorCore => continue,
                r => drop(r.map_err(|e| e.to_string())?),
            }
            let a = time_op(device, o.repeats, 2, || drop(run(kernel, tiles).unwrap()));
            emit(&format!("attention prefill [{name}]"), [seqs, ctx, hd], a, f64::NAN, flops, bytes);
        }
    }
    Ok(())
}

/// FLOPs of causal attention's QKᵀ and PV products, forward and backward (3x the forward), over `batch`
/// sequences of `len` tokens: 3 x 2 x 2 x heads x head_dim x len (len + 1) / 2 a sequence and layer,
/// the causal count of the 12 L H Q T a token torchtitan and PaLM add for full attention.
pub fn causal_attention_flops(config: &ModelConfig, batch: usize, len: usize) -> f64 {
    6.0 * (config.num_layers * config.num_heads * config.head_dim * batch) as f64 * (len * (len + 1)) as f64
}

/// Forward + backward of the training path on `batch` sequences of `len` tokens.
fn trainer_step(o: &BenchOptions, config: &ModelConfig, device: &Device) -> Result<(), String> {
    let model = Qwen3::from_checkpoint(&shared_kernels::model::Checkpoint::random(config.clone(), 0.05, 7), o.dtype, device).map_err(|e| e.to_string())?;
    let matmul_params: usize = model
        .named_tensors()
        .iter()
        .filter(|(name, _)| config.tie_word_embeddings || name != shared_kernels::model::names::EMBED)
        .filter_map(|(_, w)| match w {
            Weight::Matrix(m) => Some(m.shape().num_elements()),
            Weight::Vector(_) => None,
        })
        .sum();
    println!("\n## trainer step (training path forward + backward, lockstep kernels)\n");
    // "held after the forward": the device bytes in live allocations when the forward is done
    // and the backward not begun, the model's weights included (what recomputation shrinks)
    // MFU: 6 x matmul parameters a scored token (a lower bound); with attention: plus causal_attention_flops
    println!("| sequences x tokens | recompute_layers | step ms | tokens/s | model TFLOP/s | MFU | MFU with attention | held after the forward |");
    println!("|---|---|---|---|---|---|---|---|");
    let len = o.trainer_len;
    let batches: &[usize] = if o.trainer_batches.is_empty() { &[8, 32] } else { &o.trainer_batches };
    let arms: &[bool] = if o.trainer_recompute { &[true, false] } else { &[false] };
    for &batch in batches {
        let seqs: Vec<Vec<u32>> = (0..batch).map(|b| (0..len).map(|t| ((b * 131 + t * 17) % config.vocab_size) as u32).collect()).collect();
        let mut m = model.clone();
        m.kernels = KernelSet::Matched;
        for &recompute in arms {
            // the GRPO update's own path: every scored token weighted, weight gradients folded
            let held = std::cell::Cell::new(None);
            let step = || {
                let tracked = trainer::backward::tracked_copy(&m);
                let (_, logprobs) = tracked.training_logprobs(&seqs, 1.0, recompute).expect("training path");
                let _ = device.sync();
                held.set(device.memory_pool_usage().map(|u| u.bytes_in_use));
                let weights = vec![1.0f32; logprobs.flat.dims()[0]];
                let mut fold = shared_kernels::grad_fold::GradFold::new();
                let (_, grads) = trainer::backward::weighted_backward(&tracked, logprobs, &weights, &mut fold, "bench", "train.lr").expect("bench update");
                drop(trainer::backward::with_folded(grads, fold));
            };
            let secs = time_op(device, o.repeats.min(5), 1, step);
            let tokens = batch * (len - 1);
            let (flops, attention_flops) = (6.0 * matmul_params as f64 * tokens as f64, causal_attention_flops(config, batch, len));
            let on_h200 = shared_kernels::device::runtime_name() == "cuda" && o.dtype == DType::BF16;
            let mfu = |f: f64| if on_h200 { format!("{:.1}% of 989 TFLOP/s", 100.0 * f / secs / H200_BF16_PEAK) } else { "-".into() };
            let held = held.get().map_or_else(|| "-".to_string(), |b| format!("{:.1} MB", b as f64 / 1e6));
            println!("| {batch} x {len} | {recompute} | {:.1} | {:.0} | {:.2} | {} | {} | {held} |", secs * 1e3, tokens as f64 / secs, flops / secs / 1e12, mfu(flops), mfu(flops + attention_flops));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_attention_flops_are_half_of_the_full_attention_term_per_token() {
        // Qwen3-1.7B, 4 x 4,096: per token 6 L H Q (T + 1), i.e. half of torchtitan's 12 L H Q T
        let config = crate::tools::bench::preset("qwen3-1.7b").unwrap();
        let flops = causal_attention_flops(&config, 4, 4096);
        assert_eq!(flops, 6.0 * 28.0 * 16.0 * 128.0 * 4.0 * 4096.0 * 4097.0);
        let full_per_token = 12.0 * 28.0 * 16.0 * 128.0 * 4096.0;
        let ratio = flops / (4.0 * 4096.0) / full_per_token;
        assert!((ratio - 0.5).abs() < 1e-3, "{ratio}");
        // one token attends to itself: 3 x 2 products x 2 FLOP x H x Q, every layer
        assert_eq!(causal_attention_flops(&config, 1, 1), 12.0 * 28.0 * 16.0 * 128.0);
    }
}
