//! The kept set of a truncated distribution (top-k, then top-p), per row: the smallest order
//! key ([`order_key`]) of the tokens `softmax(logits / T)` keeps, so a token is kept iff its
//! scaled logit's key is at least the row's threshold (0: every token). The sampler draws from
//! that set; with processed logprobs (vLLM's `processed_logprobs`) the sampler's logprob and the
//! trainer's are taken under it, renormalised, and both find it with this one kernel on logits
//! that are equal as bits, so the sets are the same.
//!
//! Thresholds are defined by bisection over the order-preserving u32 image of the scaled
//! logits, each step counting (top-k) or summing (top-p) with the fixed tree
//! ([`super::truncation_definition`]). The kernel here takes the same steps from the same sums
//! in 8 + 8 passes over the row instead of 64 (the definition's pass per step made Qwen3's
//! top-p 0.95 / top-k 20 sampling 6.5x slower than full-vocabulary sampling at 64 requests).
//! Tokens tied at the top-k boundary are all kept. T = 0 (greedy, scored at T = 1) keeps every
//! token.

use crate::ops::logits::rows::{inv_temperature, order_key, row_max, scaled_logit};
use crate::ops::reduce::{cube_linear, tree_sum};
use crate::ops::{cube_count_for, storage, ROW_BLOCK};
use crate::autodiff::untracked;
use crate::bridge::{dims, float_in, int_in, int_out, same_device};
use crate::ops::logits::truncation_definition::definition_kernel;
use crate::{ensure, KernelError};
use burn::tensor::{DType, Int as BInt, Tensor as BTensor};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

/// Top-p's bisection steps taken per pass over the row: each pass sums the mass above every
/// midpoint the next `LEVELS` steps could visit ([`CANDIDATES`] of them, in heap order), each in
/// the definition's per-unit order and tree, then takes the steps from those sums.
const LEVELS: usize = 4;
const CANDIDATES: usize = 15;
/// Top-k's radix: 4 bits of the threshold per pass, from per-unit counts by digit (exact).
const DIGIT_BITS: u32 = 4;
const DIGITS: usize = 16;
/// Top-k survivors held in shared memory for top-p's steps; past it, top-p passes over the row.
const SURVIVORS: usize = 1024;
/// Logits each unit loads before it uses them: loads in flight, so a pass is not one memory
/// latency per element (a unit still uses its elements in ascending order).
const LOADS: usize = 4;

/// Words of the kernel's shared scratch at `block` units.
fn work_words(block: usize) -> usize {
    ((DIGITS + 1) * block).max(CANDIDATES * block).max(2 * SURVIVORS)
}

/// Rows that truncate (top-k or top-p): the smallest order key of the row's kept set, one cube
/// per row; rows that do not truncate get 0 (all tokens kept). Launched only when some row of
/// the batch truncates. The thresholds are, as bits, those of
/// [`truncation_definition::definition_kernel`](super::truncation_definition) (tests and the
/// battery check it): top-k's 32 steps from 8 radix passes of exact counts; top-p's steps from
/// the survivors in shared memory when top-k left at most [`SURVIVORS`], else [`LEVELS`] steps
/// a pass.
#[cube(launch)]
fn truncation_kernel<F: Float, I: Int>(
    logits: &Tensor<F>,
    temperatures: &Tensor<f32>,
    top_ks: &Tensor<I>,
    top_ps: &Tensor<f32>,
    thresholds: &mut Tensor<u32>,
    rows_arg: u32,
    vocab_arg: u32,
    #[comptime] block: usize,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let rows = rows_arg as usize;
    let vocab = vocab_arg as usize;
    let row = cube_linear();
    if row < rows {
        let base = row * vocab;
        let temperature = temperatures[row];
        let inv_t = inv_temperature(temperature);
        let mut shared = Shared::new_slice(block);
        // one scratch for each phase's use (top-k's counts, top-p's sums as bits or its
        // survivors' keys and masses), within the 16 KB of shared memory WebGPU guarantees
        let mut work = Shared::<[u32]>::new_slice(comptime!(work_words(block)));
        let mut threshold = 0u32;
        // uniform over the cube (one row), so the syncs below are reached by every unit
        if temperature > 0.0f32 {
            let k = u32::cast_from(top_ks[row]);
            let top_k = k > 0u32 && (k as usize) < vocab;
            if top_k {
                threshold = top_k_threshold(logits, base, vocab, inv_t, k, &mut work, block);
            }
            let p = top_ps[row];
            if p < 1.0f32 {
                let max = row_max(logits, base, vocab, inv_t, &mut shared, block);
                threshold = top_p_threshold(logits, base, vocab, inv_t, max, p, threshold, &mut shared, &mut work, block);
            }
        }
        if UNIT_POS_X == 0 {
            thresholds[row] = threshold;
        }
    }
}

/// The largest key t with count(key >= t) >= k, 4 bits a pass: each unit counts its keys that
/// share the bits found so far by their next digit (and those above them), the cube adds the
/// counts, and the largest digit whose tail still holds k keys is the next 4 bits. Counts are
/// exact, so this is the definition's 32-step bisection's answer.
#[cube]
fn top_k_threshold<F: Float>(logits: &Tensor<F>, base: usize, vocab: usize, inv_t: f32, k: u32, columns: &mut Shared<[u32]>, #[comptime] block: usize) -> u32 {
    let unit = UNIT_POS_X as usize;
    let mut prefix = 0u32;
    for pass in 0..8u32 {
        let shift = 28u32 - pass * DIGIT_BITS;
        // the bits already found: none in the first pass (a shift by 32 is not defined)
        let mut high = 0u32;
        if pass > 0u32 {
            high = 0xffff_ffffu32 << (shift + DIGIT_BITS);
        }
        #[unroll]
        for d in 0..DIGITS + 1 {
            columns[d * block + unit] = 0u32;
        }
        let mut i = unit;
        while i + comptime!((LOADS - 1) * block) < vocab {
            let mut z = Array::<f32>::new(LOADS);
            #[unroll]
            for j in 0..LOADS {
                z[j] = scaled_logit(logits, base + i + j * block, inv_t);
            }
            #[unroll]
            for j in 0..LOADS {
                count_digit(columns, order_key(z[j]), high, prefix, shift, unit, block);
            }
            i += comptime!(LOADS * block);
        }
        while i < vocab {
            count_digit(columns, order_key(scaled_logit(logits, base + i, inv_t)), high, prefix, shift, unit, block);
            i += block;
        }
        sync_cube();
        // the cube's count per digit (column DIGITS: keys above the prefix), in column d * block
        let mut stride = (CUBE_DIM_X / 2u32) as usize; // == block / 2: a runtime value, as the trees use
        while stride > 0 {
            if unit < stride {
                #[unroll]
                for d in 0..DIGITS + 1 {
                    let sum = columns[d * block + unit] + columns[d * block + unit + stride];
                    columns[d * block + unit] = sum;
                }
            }
            sync_cube();
            stride /= 2;
        }
        // count(key >= prefix | d << shift) for d = 15 down to 0; it reaches k at the latest at
        // d = 0, whose count is count(key >= prefix) >= k
        let mut tail = columns[DIGITS * block];
        let mut digit = 0u32;
        let mut found = false;
        #[unroll]
        for e in 0..DIGITS {
            let d = DIGITS - 1 - e;
            tail += columns[d * block];
            if !found && tail >= k {
                digit = d as u32;
                found = true;
            }
        }
        prefix |= digit << shift;
        sync_cube(); // every unit has read the counts before the next pass clears them
    }
    prefix
}

/// One key into its unit's column of counts: by its digit at `shift` when its higher bits are
/// `prefix`'s, in the last column when they are above.
#[cube]
fn count_digit(columns: &mut Shared<[u32]>, key: u32, high: u32, prefix: u32, shift: u32, unit: usize, #[comptime] block: usize) {
    let top = key & high;
    if top == prefix {
        let at = ((key >> shift) & comptime!(DIGITS as u32 - 1)) as usize * block + unit;
        columns[at] = columns[at] + 1u32;
    } else if top > prefix {
        let at = DIGITS * block + unit;
        columns[at] = columns[at] + 1u32;
    }
}

/// The largest key t >= `start` whose head (keys >= t) holds at least `p` of the mass of the
/// keys >= `start`: the definition's 32 bisection steps, each mass added in its order. The
/// survivors of top-k (keys >= `start`) go to shared memory when they fit, each unit's in its
/// order, and the steps read them there; otherwise each pass over the row takes `LEVELS` steps.
#[cube]
#[allow(clippy::too_many_arguments)]
fn top_p_threshold<F: Float>(
    logits: &Tensor<F>,
    base: usize,
    vocab: usize,
    inv_t: f32,
    max: f32,
    p: f32,
    start: u32,
    shared: &mut Shared<[f32]>,
    work: &mut Shared<[u32]>,
    #[comptime] block: usize,
) -> u32 {
    let unit = UNIT_POS_X as usize;
    // the survivors' mass, and how many each unit holds
    let mut local_all = 0.0f32;
    let mut held = 0u32;
    let mut i = unit;
    while i < vocab {
        let z = scaled_logit(logits, base + i, inv_t);
        if order_key(z) >= start {
            local_all += (z - max).exp();
            held += 1u32;
        }
        i += block;
    }
    let target = tree_sum(shared, local_all, block) * p;
    work[unit] = held;
    sync_cube();
    let mut offset = 0u32;
    let mut total = 0u32;
    for u in 0..block {
        let n = work[u];
        if u < unit {
            offset += n;
        }
        total += n;
    }
    sync_cube();
    let mut lo = start;
    let mut hi = 0xffff_ffffu32;
    if (total as usize) <= SURVIVORS {
        let mut slot = offset as usize;
        let mut i = unit;
        while i < vocab {
            let z = scaled_logit(logits, base + i, inv_t);
            let key = order_key(z);
            if key >= start {
                work[slot] = key;
                work[SURVIVORS + slot] = u32::reinterpret((z - max).exp());
                slot += 1;
            }
            i += block;
        }
        sync_cube();
        let first = offset as usize;
        let end = first + held as usize;
        for _ in 0..32u32 {
            let mid = lo + (hi - lo) / 2u32 + (hi - lo) % 2u32;
            let mut local = 0.0f32;
            for s in first..end {
                if work[s] >= mid {
                    local += f32::reinterpret(work[SURVIVORS + s]);
                }
            }
            let mass = tree_sum(shared, local, block);
            if lo < hi {
                if mass >= target {
                    lo = mid;
                } else {
                    hi = mid - 1u32;
                }
            }
        }
    } else {
        for _ in 0..comptime!(32 / LEVELS) {
            // the midpoints of the next LEVELS steps from (lo, hi), in heap order: node n's
            // children are 2n + 1 (mass below the target: hi = mid - 1) and 2n + 2 (lo = mid)
            let mut mids = Array::<u32>::new(CANDIDATES);
            let mut los = Array::<u32>::new(CANDIDATES);
            let mut his = Array::<u32>::new(CANDIDATES);
            los[0] = lo;
            his[0] = hi;
            #[unroll]
            for n in 0..CANDIDATES {
                let (l, h) = (los[n], his[n]);
                let m = l + (h - l) / 2u32 + (h - l) % 2u32;
                mids[n] = m;
                if comptime!(n < CANDIDATES / 2) {
                    // a settled range (l == h) takes no step: both children keep it
                    let mut left_hi = h;
                    let mut right_lo = l;
                    if l < h {
                        left_hi = m - 1u32;
                        right_lo = m;
                    }
                    los[comptime!(2 * n + 1)] = l;
                    his[comptime!(2 * n + 1)] = left_hi;
                    los[comptime!(2 * n + 2)] = right_lo;
                    his[comptime!(2 * n + 2)] = h;
                }
            }
            let mut local = Array::<f32>::new(CANDIDATES);
            #[unroll]
            for c in 0..CANDIDATES {
                local[c] = 0.0f32;
            }
            let mut i = unit;
            while i + comptime!((LOADS - 1) * block) < vocab {
                let mut z = Array::<f32>::new(LOADS);
                #[unroll]
                for j in 0..LOADS {
                    z[j] = scaled_logit(logits, base + i + j * block, inv_t);
                }
                #[unroll]
                for j in 0..LOADS {
                    add_above(&mut local, &mids, z[j], max);
                }
                i += comptime!(LOADS * block);
            }
            while i < vocab {
                add_above(&mut local, &mids, scaled_logit(logits, base + i, inv_t), max);
                i += block;
            }
            // each candidate's tree: tree_sum's pairs, all candidates at once
            #[unroll]
            for c in 0..CANDIDATES {
                work[c * block + unit] = u32::reinterpret(local[c]);
            }
            sync_cube();
            let mut stride = (CUBE_DIM_X / 2u32) as usize; // == block / 2: a runtime value, as the trees use
            while stride > 0 {
                if unit < stride {
                    #[unroll]
                    for c in 0..CANDIDATES {
                        let sum = f32::reinterpret(work[c * block + unit]) + f32::reinterpret(work[c * block + unit + stride]);
                        work[c * block + unit] = u32::reinterpret(sum);
                    }
                }
                sync_cube();
                stride /= 2;
            }
            let mut node = 0usize;
            #[unroll]
            for _ in 0..LEVELS {
                let mid = lo + (hi - lo) / 2u32 + (hi - lo) % 2u32;
                let mass = f32::reinterpret(work[node * block]);
                if lo < hi {
                    if mass >= target {
                        lo = mid;
                        node = 2 * node + 2;
                    } else {
                        hi = mid - 1u32;
                        node = 2 * node + 1;
                    }
                } else {
                    node = 2 * node + 1;
                }
            }
            sync_cube(); // every unit has read the sums before the next pass writes them
        }
    }
    lo
}

/// One logit's mass, added to the sum of every candidate midpoint its key reaches.
#[cube]
fn add_above(local: &mut Array<f32>, mids: &Array<u32>, z: f32, max: f32) {
    let key = order_key(z);
    let e = (z - max).exp();
    #[unroll]
    for c in 0..CANDIDATES {
        if key >= mids[c] {
            local[c] += e;
        }
    }
}

/// Which kernel finds the thresholds: the fast one every caller uses, or the definition
/// ([`super::truncation_definition`]) it is checked against as bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThresholdKernel {
    Fast,
    Definition,
}

/// The per-row thresholds of `logits` [rows, vocab] (checked, contiguous device tensors of one
/// device; `temps`, `top_ks`, `top_ps` one per row), as a u32 tensor [rows].
pub(crate) fn launch_thresholds(logits: &CubeTensor, temps: &CubeTensor, top_ks: &CubeTensor, top_ps: &CubeTensor) -> CubeTensor {
    launch_thresholds_by(logits, temps, top_ks, top_ps, ThresholdKernel::Fast)
}

fn launch_thresholds_by(logits: &CubeTensor, temps: &CubeTensor, top_ks: &CubeTensor, top_ps: &CubeTensor, kernel: ThresholdKernel) -> CubeTensor {
    let (rows, vocab) = (logits.meta.shape()[0], logits.meta.shape()[1]);
    let client = logits.client.clone();
    let thresholds = empty_device_contiguous_dtype(client.clone(), logits.device.clone(), [rows].into(), DType::U32);
    let (count, dim) = (cube_count_for(rows, 1), CubeDim::new_1d(ROW_BLOCK as u32));
    let args = (logits.clone().into_tensor_arg(), temps.clone().into_tensor_arg(), top_ks.clone().into_tensor_arg(), top_ps.clone().into_tensor_arg(), thresholds.clone().into_tensor_arg());
    let dtypes = [storage(logits.dtype), storage(top_ks.dtype)];
    match kernel {
        ThresholdKernel::Fast => truncation_kernel::launch(&client, count, dim, args.0, args.1, args.2, args.3, args.4, rows as u32, vocab as u32, ROW_BLOCK, dtypes),
        ThresholdKernel::Definition => definition_kernel::launch(&client, count, dim, args.0, args.1, args.2, args.3, args.4, rows as u32, vocab as u32, ROW_BLOCK, dtypes),
    }
    thresholds
}

/// Each row's threshold (the smallest order key of its kept set; 0: every token kept) for
/// `logits` [rows, vocab] at `temperatures` [rows] under `truncation`, by `kernel`, read back:
/// for the tests and the battery that hold the fast kernel to the definition.
pub fn row_thresholds(logits: BTensor<2>, temperatures: BTensor<1>, truncation: &Truncation, kernel: ThresholdKernel) -> Result<Vec<u32>, KernelError> {
    const OP: &str = "row_thresholds";
    let logits = float_in(OP, "logits", logits)?;
    let temps = float_in(OP, "temperatures", temperatures)?;
    same_device(OP, &logits, &temps, "temperatures")?;
    let rows = logits.meta.shape()[0];
    ensure!(dims(&temps) == [rows], OP, "logits have {rows} rows but temperatures are {:?}", dims(&temps));
    let thresholds = truncation.thresholds_by(OP, &logits, &temps, kernel)?;
    let data = int_out::<1>(thresholds).into_data();
    data.convert::<u32>().try_to_vec::<u32>().map_err(|e| KernelError::new(OP, format!("reading the thresholds back: {e:?}")))
}

/// Top-k and top-p per row, for logprobs taken under the truncated distribution (the trainer's
/// side of processed logprobs). `top_k` 0 and `top_p` 1 keep every token.
#[derive(Clone, Debug)]
pub struct Truncation {
    pub top_k: BTensor<1, BInt>,
    pub top_p: BTensor<1>,
}

/// Whether top-k / top-p at `temperature` drop any token of a `vocab`-token vocabulary: the
/// one definition the sampler (whether the truncation kernel runs) and the trainer (whether
/// its logprobs are masked) share. Greedy (T = 0) keeps every token: it is scored at T = 1.
pub fn truncates(temperature: f32, top_k: u32, top_p: f32, vocab: usize) -> bool {
    temperature > 0.0 && ((top_k > 0 && (top_k as usize) < vocab) || top_p < 1.0)
}

impl Truncation {
    /// One setting for all `rows` rows; `None` when it keeps every token ([`truncates`]), so
    /// nothing needs masking.
    pub fn uniform(temperature: f32, top_k: u32, top_p: f32, rows: usize, vocab: usize, device: &burn::tensor::Device) -> Option<Truncation> {
        truncates(temperature, top_k, top_p, vocab).then(|| Truncation {
            top_k: BTensor::from_data(burn::tensor::TensorData::new(vec![top_k as i64; rows], [rows]), device),
            top_p: BTensor::from_data(burn::tensor::TensorData::new(vec![top_p; rows], [rows]), device),
        })
    }

    /// Rows `range` of it (a chunk of the LM head's rows).
    pub fn slice(&self, range: std::ops::Range<usize>) -> Truncation {
        Truncation { top_k: self.top_k.clone().slice([range.clone()]), top_p: self.top_p.clone().slice([range]) }
    }

    /// The thresholds of `logits` (checked by the caller) at `temps`, for op `op`.
    pub(crate) fn thresholds(&self, op: &'static str, logits: &CubeTensor, temps: &CubeTensor) -> Result<CubeTensor, KernelError> {
        self.thresholds_by(op, logits, temps, ThresholdKernel::Fast)
    }

    fn thresholds_by(&self, op: &'static str, logits: &CubeTensor, temps: &CubeTensor, kernel: ThresholdKernel) -> Result<CubeTensor, KernelError> {
        // made on an autodiff device where the logits are tracked: plain values, no gradient
        let top_ks = int_in(op, "top_k", untracked(self.top_k.clone()))?;
        let top_ps = float_in(op, "top_p", untracked(self.top_p.clone()))?;
        let rows = logits.meta.shape()[0];
        same_device(op, logits, &top_ks, "top_k")?;
        same_device(op, logits, &top_ps, "top_p")?;
        ensure!(dims(&top_ks) == [rows] && dims(&top_ps) == [rows], op, "logits have {rows} rows but top_k is {:?} and top_p {:?}", dims(&top_ks), dims(&top_ps));
        ensure!(top_ks.dtype.size() >= 4, op, "the device's int dtype {:?} cannot hold top_k", top_ks.dtype);
        ensure!(top_ps.dtype == DType::F32, op, "top_p must be f32, got {:?}", top_ps.dtype);
        Ok(launch_thresholds_by(logits, temps, &top_ks, &top_ps, kernel))
    }
}
