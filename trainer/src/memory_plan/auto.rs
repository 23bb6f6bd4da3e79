//! `"auto"` memory sizes: `train.micro_batch_tokens` and `sampler.kv_budget_mib` chosen before
//! step 0 from the device's free memory, the fixed state and the activation estimate.
//!
//! Why it is safe to choose them per device: neither changes a bit of the run. The update folds
//! every weight gradient over the tokens in one order whatever the micro-batches
//! (`shared_kernels::grad_fold`), and a smaller KV cache only preempts requests, which rerun
//! with the same bits. So a run sized for an 80 GB card and one sized for a 141 GB card are the
//! same run, and a resume may size itself anew.
//!
//! The rule, when both are auto: if a full KV cache (`max_batch` requests of `context`
//! positions) and a whole-step pass fit, take both; else the trainer's passes keep room for
//! [`PASS_TARGET_TOKENS`] (at least one full sequence), the KV cache takes the rest up to full,
//! and the pass whatever the cache leaves. Generation is most of a step, and it speeds up with
//! every request in flight, while the update barely depends on the pass size past a few
//! thousand tokens (docs/scale.md, the H100 section). One auto key takes what the set one
//! leaves. An auto `train.recompute_layers` is decided by planning both ways ([`choose`]).
//! A config that cannot fit is refused naming the keys with values that would.

use super::fixed::{check_pass_size, MemoryPlan};
use super::shape::{size, Part, Purpose, Shape};
use crate::config::Config;
use crate::error::invalid;
use crate::config::Sizing;
use crate::error::RunError;
use shared_kernels::model::ModelConfig;

/// Kept free beside the plan: the CUDA context and its modules and graphs, the pools' slack
/// between page sizes, the sampler's per-step buffers. On the H100, hand-sized 0.6B rungs
/// peaked up to 6.1 GB above their plan (docs/scale.md's calibration table): 7.1 GB there.
const RESERVE_BYTES: f64 = 2.0e9;
const RESERVE_FRACTION: f64 = 0.06;
/// The activation estimate times this is what a pass is planned with.
const ACTIVATION_MARGIN: f64 = 1.15;
/// When a full KV cache and a whole-step pass do not both fit: the pass size kept for the
/// trainer before the KV cache takes the rest. On the H100 at 0.6B 512 x 2048 the update took
/// 21.9-23.6 s with passes of 4,224 to 14,400 tokens, while 218 requests in flight instead of
/// 166 cut generation from 77.2 to 63.8 s.
const PASS_TARGET_TOKENS: f64 = 4096.0;
/// An auto `train.recompute_layers` is on from this many times the requests in flight it gives
/// the KV cache. It adds a forward to the update (at 1.7B 256 x 4096 on an H100: update 61.4 s
/// against 50.0 s) while generation gains less than the ratio (72 requests in flight instead of
/// 51, 1.41x, made it 1.32x faster: 153.4 s against 202.5 s; the step 215.6 s against 253.2 s;
/// docs/scale.md). With those shares the break-even is about 1.1x; 1.2 leaves a margin.
const RECOMPUTE_GAIN: f64 = 1.2;

/// The device's memory as the plan sees it.
#[derive(Clone, Copy, Debug)]
pub struct DeviceMemory {
    pub total: u64,
    pub free: u64,
    /// The largest tensor a kernel can bind (wgpu), `None` where memory is the limit.
    pub tensor_limit: Option<u64>,
}

impl DeviceMemory {
    /// `device`'s figures (`None` when the runtime gives no size); `sharing` processes or
    /// threads that plan the same device each get their share.
    pub fn of(device: &burn::tensor::Device, sharing: usize) -> Option<Self> {
        let total = shared_kernels::device::memory_capacity(device)?;
        let free = shared_kernels::device::memory_free(device).unwrap_or(total).min(total);
        let share = sharing.max(1) as u64;
        Some(Self { total: total / share, free: free / share, tensor_limit: shared_kernels::device::max_tensor_bytes(device) })
    }

    fn reserve(&self) -> f64 {
        RESERVE_BYTES.min(0.25 * self.total as f64) + RESERVE_FRACTION * self.total as f64
    }

    /// What the run may plan with: the free memory less the reserve.
    fn usable(&self) -> f64 {
        (self.free as f64 - self.reserve()).max(0.0)
    }

    fn describe(&self) -> String {
        format!("{} free of {} ({} kept in reserve)", size(self.free), size(self.total), size(self.reserve() as u64))
    }
}

/// The sizes the planner may pick within, from the model, the config and the device's limits.
struct Room<'a> {
    c: &'a Config,
    shape: Shape,
    purpose: Purpose,
    /// Bytes for the KV cache and one pass together, after the fixed part and the reserve.
    left: f64,
    kv_full: f64,
    kv_min: f64,
    pass_min: f64,
    pass_max: f64,
}

impl Room<'_> {
    fn pass_bytes(&self, tokens: f64) -> f64 {
        if self.purpose == Purpose::Sample {
            return sampler_step_bytes(self.c, &self.shape);
        }
        // a rollout step's buffers live when no trainer pass does: the larger of the two counts
        (self.shape.activation_bytes(self.c, tokens) * ACTIVATION_MARGIN).max(sampler_step_bytes(self.c, &self.shape))
    }

    /// The most tokens a pass may hold within `bytes`, a multiple of 64 unless that is below one
    /// sequence (`None`: not even one sequence fits).
    fn largest_pass(&self, bytes: f64) -> Option<usize> {
        if self.pass_bytes(self.pass_min) > bytes {
            return None;
        }
        if self.pass_bytes(self.pass_max) <= bytes {
            return Some(self.pass_max as usize);
        }
        let (mut lo, mut hi) = (self.pass_min as usize, self.pass_max as usize);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.pass_bytes(mid as f64) <= bytes { lo = mid } else { hi = mid }
        }
        Some((lo / 64 * 64).max(self.pass_min as usize))
    }

    /// The KV budget's bytes for what `left_for_kv` holds (at most a full cache), `None` below
    /// one request.
    fn kv_within(&self, left_for_kv: f64) -> Option<f64> {
        let kv = self.shape.kv_bytes(left_for_kv.min(self.kv_full));
        (kv >= self.kv_min).then_some(kv)
    }
}

/// The bytes of one rollout step's transient buffers beside the KV cache: a prefill chunk per
/// running request through one layer (the layer's values twice over), three f32 rows of the
/// vocabulary per request for the logits, and the split attention's f32 partials (a max, a sum
/// and `head_dim` values per row, head and `KV_SPLIT` keys of the context) for the step's
/// one-row tiles: at most one a request (a decode row, or a chunk's last tile), except where
/// the tensor-core prefill tiles hold one row (`rows_per_tile` below 2), where every row of
/// the step is one.
pub(crate) fn sampler_step_bytes(c: &Config, shape: &Shape) -> f64 {
    let tokens = (c.sampler.max_batch * c.sampler.chunk_size.max(1)) as f64;
    let layer_token = shape.layer_values() * shape.dtype;
    let splits = (c.sampler.context as f64 / shared_kernels::ops::attention::KV_SPLIT as f64).ceil();
    let partial_rows = if shared_kernels::ops::attention::tensor_cores::short_tiles_are_single_rows(shape.group) { c.sampler.max_batch as f64 } else { tokens };
    let partials = partial_rows * shape.heads * splits * (shape.head_dim + 2.0) * 4.0;
    tokens * 2.0 * layer_token + c.sampler.max_batch as f64 * shape.vocab as f64 * 12.0 + partials
}

/// `c` with its `"auto"` sizes chosen for `mem` with `train.recompute_layers` as it is (auto
/// counts as off), and what was chosen and why, a phrase a size. Refuses (a config error naming
/// the key, exit 2) a config that cannot fit.
fn choose_sizes(c: &Config, m: &ModelConfig, dtype_bytes: u64, purpose: Purpose, ranks: usize, mem: &DeviceMemory) -> Result<(Config, Vec<String>), RunError> {
    let shape = Shape::of(c, m, dtype_bytes);
    let fixed: Vec<Part> = shape.fixed_parts(c, purpose, ranks);
    let fixed_bytes: f64 = fixed.iter().map(|p| p.bytes as f64).sum();
    let usable = mem.usable();
    // the kernels' index range and a runtime's binding limit cap one layer's cache and a pass
    let layers2 = 2.0 * shape.layers.max(1.0);
    let mut kv_cap = u32::MAX as f64 * layers2 * shape.dtype;
    let widest = Shape::widest(m) as f64;
    let mut pass_cap = u32::MAX as f64 / widest.max(1.0);
    if let Some(limit) = mem.tensor_limit {
        kv_cap = kv_cap.min(limit as f64 * layers2);
        pass_cap = pass_cap.min(limit as f64 / (widest.max(1.0) * 4.0));
    }
    let pass_min = c.sampler.context as f64;
    let room = Room {
        c,
        purpose,
        left: usable - fixed_bytes,
        kv_full: shape.kv_full_bytes(c).min(kv_cap),
        kv_min: shape.per_block * Shape::request_blocks(c),
        pass_min,
        pass_max: Shape::step_tokens(c).min(pass_cap.floor()).max(pass_min),
        shape,
    };
    let mut out = c.clone();
    let set_kv = c.sampler.kv_budget_mib.set().map(|mib| if mib > 0.0 { room.shape.kv_bytes(mib * 1048576.0) } else { room.shape.kv_full_bytes(c) });
    let set_pass = c.train.micro_batch_tokens.set().map(|t| room.shape.clamp_pass(c, t));
    let training = purpose == Purpose::Train;
    let (kv, pass) = match (set_kv, set_pass.filter(|_| training)) {
        (Some(kv), Some(pass)) => (kv, pass),
        (None, Some(pass)) => (room.kv_within(room.left - room.pass_bytes(pass)).ok_or_else(|| refusal(c, &room, mem, fixed_bytes, room.kv_min, pass, "sampler.kv_budget_mib"))?, pass),
        (Some(kv), None) if training => (kv, room.largest_pass(room.left - kv).ok_or_else(|| refusal(c, &room, mem, fixed_bytes, kv, room.pass_min, "train.micro_batch_tokens"))? as f64),
        (Some(kv), None) => (kv, 0.0),
        (None, None) => {
            let whole = room.pass_bytes(room.pass_max);
            if room.kv_full + whole <= room.left {
                (room.shape.kv_bytes(room.kv_full), room.pass_max)
            } else {
                // whole sequences: a pass just short of two holds one
                let target = ((PASS_TARGET_TOKENS / room.pass_min).ceil() * room.pass_min).clamp(room.pass_min, room.pass_max);
                // the target pass while one request's cache fits beside it, else down to one sequence
                let for_pass = room.pass_bytes(target).max(room.left - room.kv_full).min(room.left - room.kv_min).max(room.pass_bytes(room.pass_min));
                let kv = room.kv_within(room.left - for_pass).ok_or_else(|| refusal(c, &room, mem, fixed_bytes, room.kv_min, room.pass_min, model_key(c)))?;
                let pass = if training { room.largest_pass(room.left - kv).ok_or_else(|| refusal(c, &room, mem, fixed_bytes, kv, room.pass_min, model_key(c)))? as f64 } else { 0.0 };
                (kv, pass)
            }
        }
    };
    // a set pair that passes the device is refused here, with the sizes that would fit
    let needed = fixed_bytes + kv + if training { room.shape.activation_bytes(c, pass) } else { room.pass_bytes(pass) };
    if needed > usable {
        let key = if c.train.micro_batch_tokens.set().is_some() && training { "train.micro_batch_tokens" } else { "sampler.kv_budget_mib" };
        return Err(refusal(c, &room, mem, fixed_bytes, kv, pass, key));
    }
    let mut why = Vec::new();
    if c.sampler.kv_budget_mib.is_auto() {
        let mib = (kv / 1048576.0).floor();
        out.sampler.kv_budget_mib = Sizing::Set(mib);
        let requests = (kv / (room.kv_min.max(1.0))).floor();
        let full = if kv >= room.kv_full - room.shape.per_block { "all of sampler.max_batch" } else { "what the device leaves beside a pass" };
        why.push(format!("sampler.kv_budget_mib = {mib} ({} requests of {} positions at once: {full})", requests, c.sampler.context));
    }
    if training && c.train.micro_batch_tokens.is_auto() {
        out.train.micro_batch_tokens = Sizing::Set(pass as usize);
        let whole = if pass >= room.pass_max { "the whole step" } else { "what the device leaves beside the KV cache" };
        why.push(format!("train.micro_batch_tokens = {} (~{} of activations a pass: {whole})", pass as usize, size((room.pass_bytes(pass)) as u64)));
    }
    Ok((out, why))
}

/// Requests of `sampler.context` positions the resolved KV budget of `c` holds at once.
fn requests_in_flight(c: &Config, m: &ModelConfig, dtype_bytes: u64) -> f64 {
    let shape = Shape::of(c, m, dtype_bytes);
    let kv = shape.kv_bytes(c.sampler.kv_budget_mib.set().unwrap_or(0.0) * 1048576.0);
    (kv / (shape.per_block * Shape::request_blocks(c)).max(1.0)).floor()
}

/// `c` with its `"auto"` sizes chosen for `mem`, and one line saying what was chosen and why.
/// Refuses (a config error naming the key, exit 2) a config that cannot fit. An auto
/// `train.recompute_layers` is on when the run fits only with it, or when the memory it frees
/// lets the KV cache hold [`RECOMPUTE_GAIN`] times the requests.
pub fn choose(c: &Config, m: &ModelConfig, dtype_bytes: u64, purpose: Purpose, ranks: usize, mem: &DeviceMemory) -> Result<(Config, String), RunError> {
    let line = |why: Vec<String>| if why.is_empty() { String::new() } else { format!("auto sizes for {}: {}", mem.describe(), why.join("; ")) };
    let sized = |on: Option<bool>| {
        let mut x = c.clone();
        if let Some(on) = on {
            x.train.recompute_layers = Sizing::Set(on);
        }
        choose_sizes(&x, m, dtype_bytes, purpose, ranks, mem)
    };
    if purpose != Purpose::Train {
        let (mut out, why) = sized(None)?;
        out.train.recompute_layers = Sizing::Set(c.train.recompute_layers.on());
        return Ok((out, line(why)));
    }
    if c.train.recompute_layers.on() {
        let (out, why) = sized(None)?;
        return Ok((out, line(why)));
    }
    // off (set, or auto) against on: the requests each lets run at once
    let (off, on) = (sized(Some(false)), sized(Some(true)));
    let gain = match (&off, &on) {
        (Ok((off, _)), Ok((on, _))) => Some((requests_in_flight(off, m, dtype_bytes), requests_in_flight(on, m, dtype_bytes))).filter(|&(without, with)| with >= RECOMPUTE_GAIN * without),
        _ => None,
    };
    if c.train.recompute_layers == Sizing::Set(false) {
        let (out, mut why) = off?;
        // set off by the user: say what on would give where that is much (not chosen)
        if let (Some((without, with)), true) = (gain, c.sampler.kv_budget_mib.is_auto()) {
            why.push(format!("with train.recompute_layers = true (one more forward in the update, the same bits) the KV cache would hold {with} requests instead of {without}"));
        }
        return Ok((out, line(why)));
    }
    match (off, on) {
        (Ok((off, why_off)), Ok((on, mut why_on))) => match gain {
            Some((without, with)) => {
                why_on.push(format!("train.recompute_layers = true ({with} requests in flight instead of {without} without it; one more forward in the update, the same bits)"));
                Ok((on, line(why_on)))
            }
            None => Ok((off, line(why_off))),
        },
        (Err(_), Ok((on, mut why))) => {
            why.push("train.recompute_layers = true (the run does not fit without it; one more forward in the update, the same bits)".into());
            Ok((on, line(why)))
        }
        (Ok((off, why)), Err(_)) => Ok((off, line(why))),
        (Err(_), Err(e)) => Err(e),
    }
}

/// The key that sizes the model: the checkpoint, or the embedded model's width.
fn model_key(c: &Config) -> &'static str {
    if c.model.path.is_empty() { "model.hidden_size" } else { "model.path" }
}

/// The refusal of a config that does not fit, naming `key` and the sizes that would fit (or,
/// where none would, the levers beyond them).
fn refusal(c: &Config, room: &Room, mem: &DeviceMemory, fixed: f64, kv: f64, pass: f64, key: &str) -> RunError {
    let training = room.purpose == Purpose::Train;
    let act = if training { room.pass_bytes(pass) } else { room.pass_bytes(0.0) };
    let what = if training { format!(" + ~{} of activations for a {}-token pass (estimate x {ACTIVATION_MARGIN})", size(act as u64), pass as usize) } else { format!(" + ~{} of sampling buffers", size(act as u64)) };
    let mut fix = Vec::new();
    // the sizes that would fit with the other levers as they are
    let kv_fit = room.kv_within(room.left - room.pass_bytes(room.pass_min));
    if let Some(kv_fit) = kv_fit {
        let pass_fit = room.largest_pass(room.left - room.kv_min.max(kv_fit.min(kv)));
        if training {
            if let Some(p) = pass_fit {
                fix.push(format!("train.micro_batch_tokens = {p}"));
            }
        }
        fix.push(format!("sampler.kv_budget_mib = {} (or \"auto\")", (kv_fit.min(kv.max(room.kv_min)) / 1048576.0).floor()));
    }
    if training && !c.train.recompute_layers.on() {
        fix.push("train.recompute_layers = true (each layer's activations recomputed in the backward: far less memory a token, same bits)".into());
    }
    fix.push("fewer requests in flight (sampler.max_batch) or a shorter sampler.context".into());
    if training {
        fix.push("a second GPU with --gpus N (train.shard_optimizer splits the optimizer state)".into());
    }
    invalid(key, format!("the run does not fit the device: {} fixed + {} KV cache{what} = {} needed, but {}; change: {}", size(fixed as u64), size(kv as u64), size((fixed + kv + act) as u64), mem.describe(), fix.join(", ")))
}

/// `c` with its `"auto"` sizes resolved for `device` (`ranks` data-parallel ranks, `sharing`
/// of them on this one device), after the plan's checks; prints the plan's line and the sizes
/// chosen. Without the device's size the autos mean what 0 means (the whole step, a full KV
/// cache), as before sizing existed.
pub fn resolve(c: &Config, device: &burn::tensor::Device, purpose: Purpose, ranks: usize, sharing: usize) -> Result<Config, RunError> {
    let shape = crate::policy::model_shape(c)?;
    if purpose == Purpose::Train {
        match (shape.moe.as_ref(), c.train.router_aux_loss_coef) {
            (None, coef) if coef > 0.0 => return Err(invalid("train.router_aux_loss_coef", format!("is {coef}, but {} is a dense model (no mixture-of-experts router to balance); set it to 0", c.model.path))),
            (Some(m), coef) if m.router_aux_loss_coef > 0.0 && coef == 0.0 => {
                eprintln!("note: {} sets router_aux_loss_coef = {}; lockstep adds the load-balancing loss only with train.router_aux_loss_coef set (as transformers adds it only with output_router_logits; docs/moe.md)", c.model.path, m.router_aux_loss_coef)
            }
            _ => {}
        }
    }
    // the kernels' index range first: it holds on every runtime, the binding limit below on some
    crate::policy::check_sizes(c, &shape)?;
    let dtype_bytes = crate::policy::dtype(c).size() as u64;
    let mem = DeviceMemory::of(device, sharing);
    let (resolved, line) = match &mem {
        Some(mem) => choose(c, &shape, dtype_bytes, purpose, ranks, mem)?,
        None => {
            let mut out = c.clone();
            if out.sampler.kv_budget_mib.is_auto() {
                out.sampler.kv_budget_mib = Sizing::Set(0.0);
            }
            if out.train.micro_batch_tokens.is_auto() {
                out.train.micro_batch_tokens = Sizing::Set(0);
            }
            out.train.recompute_layers = Sizing::Set(out.train.recompute_layers.on());
            (out, "auto sizes: the device's memory is unknown, so the whole step in one pass and a full KV cache".to_string())
        }
    };
    crate::policy::check_sizes(&resolved, &shape)?;
    if purpose == Purpose::Train {
        check_pass_size(&resolved, &shape)?;
    }
    let plan = MemoryPlan::of_rank(&resolved, &shape, dtype_bytes, purpose, ranks);
    let total = mem.map(|m| m.total);
    eprintln!("{}", plan.summary(total));
    if !line.is_empty() {
        eprintln!("{line}");
    }
    // the binding limit holds whether or not the runtime says how much memory it has
    plan.check_tensor_limit(shared_kernels::device::max_tensor_bytes(device))?;
    if let Some(warning) = plan.check(total)? {
        eprintln!("warning: {warning}");
    }
    Ok(resolved)
}

#[cfg(test)]
#[path = "auto_tests.rs"]
mod tests;
