//! Seeded sampling with temperature, top-k and top-p, batch invariant: the vocabulary in the
//! logprob's fixed chunks (pass 1 per (row, chunk), pass 2 per row), truncation per row.
//!
//! Distribution: `softmax(logits / T)` restricted to the top-k tokens, then to the smallest
//! head of that set holding at least `top_p` of its mass, renormalised. A draw is Gumbel-max
//! over the allowed tokens: `argmax_j z_j - ln(-ln u_j)` with `u_j` a hash of the row's key
//! (itself a hash of seed, request and position, see [`row_rng_key`]) and of the token id `j`.
//! The noise therefore depends only on (seed, request, position, token), never on the batch,
//! and argmax with lowest-index tie-breaking is exact in any reduction order.
//!
//! The kept set is [`crate::ops::logits::truncation`]'s. T = 0 is greedy: argmax of the logits.
//!
//! The returned logprob is the one [`crate::ops::logits::logprob`] defines, so it equals the
//! trainer's bits: by default the full softmax at temperature T, before truncation (vLLM's
//! `raw_logprobs`), computed here with the logprob's own device functions; for a row with
//! `processed`, the truncated distribution renormalised (`processed_logprobs`), computed by the
//! trainer's logprob kernels themselves on the drawn tokens and the same kept sets, so the two
//! sides run one kernel on equal inputs rather than two kernels that must agree.
//!
//! One file past 400 lines: the two passes, their device inputs and the launcher share the
//! chunk layout.

use crate::ops::logits::rows::{chunk_span, chunk_stats, inv_temperature, load_chunk, order_key, row_normaliser, scaled_logit, VOCAB_CHUNK};
use crate::ops::logits::truncation::launch_thresholds;
use crate::ops::reduce::{cube_linear, NEG_BIG};
use crate::ops::{cube_count_for, storage, ROW_BLOCK};
use crate::bridge::{dims, float_in, float_out, int_in, int_out};
use crate::{ensure, KernelError};
use burn::tensor::{DType, Device, Int as BInt, Tensor as BTensor, TensorData};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

/// One row's sampling parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingRow {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = no top-k truncation.
    pub top_k: u32,
    /// In (0, 1]; 1 = no top-p truncation.
    pub top_p: f32,
    /// From [`row_rng_key`].
    pub rng_key: u32,
    /// The returned logprob is taken under the truncated distribution, renormalised (vLLM's
    /// `processed_logprobs`), instead of the full one (`raw_logprobs`); the same when the row
    /// does not truncate.
    pub processed: bool,
}

impl SamplingRow {
    /// Whether the row's logprob is taken under its kept set: processed and truncating. Any
    /// other row is scored on the full distribution, on both sides (the trainer's `Truncation`
    /// is `None` for a row that keeps the whole vocabulary).
    pub fn scored_on_kept_set(&self, vocab: usize) -> bool {
        self.processed && crate::ops::logits::truncation::truncates(self.temperature, self.top_k, self.top_p, vocab)
    }
}

/// Chris Wellons' lowbias32 integer hash (good avalanche, two multiplies).
pub fn lowbias32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// The per-row key of the counter-based RNG: a hash of (seed, request, position) only.
pub fn row_rng_key(seed: u64, request: u64, position: u32) -> u32 {
    let mut h = lowbias32(seed as u32 ^ 0x6a09_e667);
    h = lowbias32(h ^ (seed >> 32) as u32);
    h = lowbias32(h ^ request as u32);
    h = lowbias32(h ^ (request >> 32) as u32);
    lowbias32(h ^ position)
}

/// Host twin of the kernel's uniform draw for token `j`: (h >> 8 + 0.5) / 2^24, in (0, 1).
pub fn token_uniform(row_key: u32, token: u32) -> f32 {
    let h = lowbias32(row_key ^ lowbias32(token ^ 0x9e37_79b9));
    ((h >> 8) as f32 + 0.5) * (1.0 / 16_777_216.0)
}

/// Marks "no allowed token seen" in the argmax trees.
const NO_TOKEN: u32 = 0xffff_ffff;

#[cube]
fn lowbias32_dev(value: u32) -> u32 {
    let mut x = value;
    x ^= x >> 16u32;
    x *= 0x7feb_352du32;
    x ^= x >> 15u32;
    x *= 0x846c_a68bu32;
    x ^ (x >> 16u32)
}

/// Argmax over the cube of (score, token) with the lowest token winning ties; `NO_TOKEN`
/// marks a unit that saw no allowed token. Exact in any order, so the tree shape is free.
/// Every unit gets the winning (score, token).
#[cube]
fn tree_argmax(scores: &mut Shared<[f32]>, tokens: &mut Shared<[u32]>, score: f32, token: u32) -> (f32, u32) {
    let unit = UNIT_POS_X as usize;
    scores[unit] = score;
    tokens[unit] = token;
    sync_cube();
    let mut stride = (CUBE_DIM_X / 2u32) as usize;
    while stride > 0 {
        if unit < stride {
            let other = scores[unit + stride];
            let other_token = tokens[unit + stride];
            let mine_token = tokens[unit];
            let take = other_token != NO_TOKEN
                && (mine_token == NO_TOKEN || other > scores[unit] || (other == scores[unit] && other_token < mine_token));
            if take {
                scores[unit] = other;
                tokens[unit] = other_token;
            }
        }
        sync_cube();
        stride /= 2;
    }
    let best = (scores[0], tokens[0]);
    sync_cube();
    best
}

/// The Gumbel-max score of token `i` (its scaled logit when greedy).
#[cube]
fn draw_score(z: f32, key: u32, i: u32, temperature: f32) -> f32 {
    let mut score = z;
    if temperature > 0.0f32 {
        let h = lowbias32_dev(key ^ lowbias32_dev(i ^ 0x9e37_79b9u32));
        let u = (f32::cast_from(h >> 8u32) + 0.5f32) * (1.0f32 / 16_777_216.0f32);
        score = z - (-u.ln()).ln();
    }
    score
}

/// Pass 1, one cube per (row, chunk): the chunk's softmax statistics (the same calls as the
/// logprob's pass 1, so the same bits) and its best allowed (score, token).
#[cube(launch)]
fn sample_partials_kernel<F: Float, I: Int>(
    logits: &Tensor<F>,
    temperatures: &Tensor<f32>,
    rng_keys: &Tensor<I>,
    thresholds: &Tensor<u32>,
    chunk_max: &mut Tensor<f32>,
    chunk_sum: &mut Tensor<f32>,
    chunk_score: &mut Tensor<f32>,
    chunk_token: &mut Tensor<u32>,
    rows_arg: u32,
    vocab_arg: u32,
    chunks_arg: u32,
    #[comptime] block: usize,
    #[comptime] chunk_len: usize,
    #[comptime] truncated: bool,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let (vocab, chunks) = (vocab_arg as usize, chunks_arg as usize);
    let slot = cube_linear();
    if slot < rows_arg as usize * chunks {
        let row = slot / chunks;
        let chunk = slot % chunks;
        let (base, len) = chunk_span(row, chunk, vocab, chunk_len);
        let temperature = temperatures[row];
        let inv_t = inv_temperature(temperature);
        let mut shared = Shared::new_slice(block);
        let mut vals = Array::<f32>::new(comptime!(chunk_len / block));
        load_chunk(logits, &mut vals, base, len, inv_t, block, comptime!(chunk_len / block));
        let (max, sum, _) = chunk_stats(&vals, len, 0u32, &mut shared, block, comptime!(chunk_len / block), false, false);
        let mut threshold = 0u32;
        if truncated {
            threshold = thresholds[row];
        }
        let key = u32::cast_from(rng_keys[row]);
        let first_token = chunk * chunk_len;
        let mut my_best = f32::new(NEG_BIG);
        let mut my_token = u32::new(NO_TOKEN as i64);
        #[unroll]
        for jj in 0..comptime!(chunk_len / block) {
            let j = UNIT_POS_X as usize + jj * block;
            let z = vals[jj];
            if j < len && order_key(z) >= threshold {
                let score = draw_score(z, key, (first_token + j) as u32, temperature);
                if score > my_best || my_token == NO_TOKEN {
                    my_best = score;
                    my_token = (first_token + j) as u32;
                }
            }
        }
        let mut tokens = Shared::<[u32]>::new_slice(block);
        let (best_score, best) = tree_argmax(&mut shared, &mut tokens, my_best, my_token);
        if UNIT_POS_X == 0 {
            chunk_max[slot] = max;
            chunk_sum[slot] = sum;
            chunk_score[slot] = best_score;
            chunk_token[slot] = best;
        }
    }
}

/// Pass 2, one cube per row: the best chunk (lowest token on ties) and the token's logprob from
/// the chunk statistics, folded exactly as [`crate::ops::logits::logprob::token_logprobs`] folds them.
#[cube(launch)]
fn sample_combine_kernel<F: Float, I: Int>(
    logits: &Tensor<F>,
    temperatures: &Tensor<f32>,
    chunk_max: &Tensor<f32>,
    chunk_sum: &Tensor<f32>,
    chunk_score: &Tensor<f32>,
    chunk_token: &Tensor<u32>,
    tokens: &mut Tensor<I>,
    logprobs: &mut Tensor<f32>,
    rows_arg: u32,
    vocab_arg: u32,
    chunks_arg: u32,
    #[comptime] block: usize,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let (vocab, chunks) = (vocab_arg as usize, chunks_arg as usize);
    let row = cube_linear();
    if row < rows_arg as usize {
        let first = row * chunks;
        let inv_t = inv_temperature(temperatures[row]);
        let mut shared = Shared::new_slice(block);
        let (max, sum) = row_normaliser(chunk_max, chunk_sum, first, chunks, &mut shared, block);
        let mut my_best = f32::new(NEG_BIG);
        let mut my_token = u32::new(NO_TOKEN as i64);
        let mut c = UNIT_POS_X as usize;
        while c < chunks {
            let token = chunk_token[first + c];
            if token != NO_TOKEN {
                let score = chunk_score[first + c];
                if score > my_best || my_token == NO_TOKEN {
                    my_best = score;
                    my_token = token;
                }
            }
            c += block;
        }
        let mut best_tokens = Shared::<[u32]>::new_slice(block);
        let (_, token) = tree_argmax(&mut shared, &mut best_tokens, my_best, my_token);
        if UNIT_POS_X == 0 {
            tokens[row] = I::cast_from(token);
            logprobs[row] = scaled_logit(logits, row * vocab + token as usize, inv_t) - max - sum.ln();
        }
    }
}

/// Draw one token per row of `logits` [rows, vocab]. Returns (tokens [rows], logprobs [rows]).
pub fn sample(logits: BTensor<2>, params: &[SamplingRow]) -> Result<(BTensor<1, BInt>, BTensor<1>), KernelError> {
    let [_, vocab] = logits.dims();
    let inputs = SamplingInputs::upload(params, vocab, &logits.device())?;
    sample_with(logits, &inputs)
}

/// The per-row sampling parameters on the device, for [`sample_with`]. A replayed graph reads
/// them from the buffers it was captured with: [`SamplingInputs::write`] refreshes those in place.
#[derive(Clone)]
pub struct SamplingInputs {
    temperatures: BTensor<1>,
    top_p: BTensor<1>,
    top_k: BTensor<1, BInt>,
    rng_keys: BTensor<1, BInt>,
    /// 1 for a row whose logprob is processed ([`SamplingRow::processed`]), else 0.
    processed: BTensor<1, BInt>,
    /// Whether some row truncates (top-k below the vocabulary or top-p below 1 at T > 0): then
    /// the truncation kernel runs, so a graph captured with it differs from one without.
    pub truncated: bool,
    /// Whether some truncating row's logprob is processed: then the logprob kernels run on the
    /// drawn tokens (a graph captured with them differs from one without).
    pub processed_any: bool,
}

impl SamplingInputs {
    pub fn upload(params: &[SamplingRow], vocab: usize, device: &Device) -> Result<Self, KernelError> {
        Self::check(params)?;
        let rows = params.len();
        let f32s = |v: Vec<f32>| BTensor::<1>::from_data(TensorData::new(v, [rows]), device);
        let ints = |v: Vec<i64>| BTensor::<1, BInt>::from_data(TensorData::new(v, [rows]), device);
        let (t, p, k, r, m) = Self::columns(params, vocab);
        let (truncated, processed_any) = (Self::truncates(params, vocab), Self::processes(params, vocab));
        Ok(SamplingInputs { temperatures: f32s(t), top_p: f32s(p), top_k: ints(k), rng_keys: ints(r), processed: ints(m), truncated, processed_any })
    }

    /// New parameters for the same rows, written into the same device buffers. Refused when
    /// the row count, whether any row truncates or whether any truncating row's logprob is
    /// processed changes (a graph's launches depend on all three).
    pub fn write(&self, params: &[SamplingRow], vocab: usize) -> Result<(), KernelError> {
        Self::check(params)?;
        let rows = self.temperatures.dims()[0];
        ensure!(params.len() == rows, "sample", "{} parameter rows written into inputs of {rows}", params.len());
        ensure!(Self::truncates(params, vocab) == self.truncated, "sample", "the parameters' truncation ({}) differs from the inputs' ({})", !self.truncated, self.truncated);
        ensure!(Self::processes(params, vocab) == self.processed_any, "sample", "the parameters' processed logprobs ({}) differ from the inputs' ({})", !self.processed_any, self.processed_any);
        let (t, p, k, r, m) = Self::columns(params, vocab);
        crate::ops::in_place::write_floats("sample", "temperatures", &self.temperatures, &t)?;
        crate::ops::in_place::write_floats("sample", "top_p", &self.top_p, &p)?;
        crate::ops::in_place::write_ints("sample", "top_k", &self.top_k, &k)?;
        crate::ops::in_place::write_ints("sample", "processed", &self.processed, &m)?;
        crate::ops::in_place::write_ints("sample", "rng_key", &self.rng_keys, &r)
    }

    fn check(params: &[SamplingRow]) -> Result<(), KernelError> {
        const OP: &str = "sample";
        ensure!(!params.is_empty(), OP, "no parameter rows");
        for (r, p) in params.iter().enumerate() {
            ensure!(p.temperature.is_finite() && p.temperature >= 0.0, OP, "row {r}: temperature must be >= 0, got {}", p.temperature);
            // the logits are scaled by 1 / t: an infinite scale turns every logprob into NaN
            ensure!(p.temperature == 0.0 || (1.0 / p.temperature).is_finite(), OP, "row {r}: temperature {:e} is too small: its reciprocal overflows f32", p.temperature);
            ensure!(p.top_p > 0.0 && p.top_p <= 1.0, OP, "row {r}: top_p must be in (0, 1], got {}", p.top_p);
        }
        Ok(())
    }

    /// The device columns; `processed` marks the rows [`SamplingRow::scored_on_kept_set`].
    #[allow(clippy::type_complexity)]
    fn columns(params: &[SamplingRow], vocab: usize) -> (Vec<f32>, Vec<f32>, Vec<i64>, Vec<i64>, Vec<i64>) {
        (
            params.iter().map(|p| p.temperature).collect(),
            params.iter().map(|p| p.top_p).collect(),
            params.iter().map(|p| p.top_k as i64).collect(),
            params.iter().map(|p| p.rng_key as i32 as i64).collect(),
            params.iter().map(|p| p.scored_on_kept_set(vocab) as i64).collect(),
        )
    }

    fn row_truncates(p: &SamplingRow, vocab: usize) -> bool {
        crate::ops::logits::truncation::truncates(p.temperature, p.top_k, p.top_p, vocab)
    }

    pub fn truncates(params: &[SamplingRow], vocab: usize) -> bool {
        params.iter().any(|p| Self::row_truncates(p, vocab))
    }

    /// Whether some row truncates and has its logprob processed.
    pub fn processes(params: &[SamplingRow], vocab: usize) -> bool {
        params.iter().any(|p| p.scored_on_kept_set(vocab))
    }
}

/// [`sample`] with the parameters already on the device.
pub fn sample_with(logits: BTensor<2>, inputs: &SamplingInputs) -> Result<(BTensor<1, BInt>, BTensor<1>), KernelError> {
    const OP: &str = "sample";
    let logits = float_in(OP, "logits", logits)?;
    let ld = dims(&logits);
    let (rows, vocab) = (ld[0], ld[1]);
    ensure!(rows > 0 && vocab > 0, OP, "empty logits {ld:?}");
    ensure!(rows * vocab < u32::MAX as usize, OP, "logits [{rows}, {vocab}] exceed the u32 index range");
    let given = inputs.temperatures.dims()[0];
    ensure!(given == rows, OP, "logits have {rows} rows but {given} parameter rows were given");
    let temps = float_in(OP, "temperatures", inputs.temperatures.clone())?;
    let top_ps = float_in(OP, "top_p", inputs.top_p.clone())?;
    let top_ks = int_in(OP, "top_k", inputs.top_k.clone())?;
    let keys = int_in(OP, "rng_key", inputs.rng_keys.clone())?;
    ensure!(top_ks.dtype.size() >= 4, OP, "the device's int dtype {:?} cannot hold 32-bit keys", top_ks.dtype);
    let truncated = inputs.truncated;
    let client = logits.client.clone();
    let alloc = |n: usize, dtype| empty_device_contiguous_dtype(client.clone(), logits.device.clone(), [n].into(), dtype);
    // rows that do not truncate never read it; a one-element stand-in keeps the binding valid
    let thresholds = if truncated { launch_thresholds(&logits, &temps, &top_ks, &top_ps) } else { alloc(1, DType::U32) };
    let chunks = vocab.div_ceil(VOCAB_CHUNK);
    let (chunk_max, chunk_sum, chunk_score) = (alloc(rows * chunks, DType::F32), alloc(rows * chunks, DType::F32), alloc(rows * chunks, DType::F32));
    let chunk_token = alloc(rows * chunks, DType::U32);
    sample_partials_kernel::launch(
        &client,
        cube_count_for(rows * chunks, 1),
        CubeDim::new_1d(ROW_BLOCK as u32),
        logits.clone().into_tensor_arg(),
        temps.clone().into_tensor_arg(),
        keys.into_tensor_arg(),
        thresholds.clone().into_tensor_arg(),
        chunk_max.clone().into_tensor_arg(),
        chunk_sum.clone().into_tensor_arg(),
        chunk_score.clone().into_tensor_arg(),
        chunk_token.clone().into_tensor_arg(),
        rows as u32,
        vocab as u32,
        chunks as u32,
        ROW_BLOCK,
        VOCAB_CHUNK,
        truncated,
        [storage(logits.dtype), storage(top_ks.dtype)],
    );
    let tokens = alloc(rows, top_ks.dtype);
    let lps = alloc(rows, DType::F32);
    sample_combine_kernel::launch(
        &client,
        cube_count_for(rows, 1),
        CubeDim::new_1d(ROW_BLOCK as u32),
        logits.clone().into_tensor_arg(),
        temps.clone().into_tensor_arg(),
        chunk_max.into_tensor_arg(),
        chunk_sum.into_tensor_arg(),
        chunk_score.into_tensor_arg(),
        chunk_token.into_tensor_arg(),
        tokens.clone().into_tensor_arg(),
        lps.clone().into_tensor_arg(),
        rows as u32,
        vocab as u32,
        chunks as u32,
        ROW_BLOCK,
        [storage(logits.dtype), storage(top_ks.dtype)],
    );
    if !inputs.processed_any {
        return Ok((int_out(tokens), float_out(lps)));
    }
    // processed rows: the trainer's logprob kernels on the drawn tokens and the kept sets the
    // tokens were drawn from (row invariant, so the other rows of the launch change no bit)
    let kept = crate::ops::logits::logprob::kept_set_logprobs(&logits, &tokens, &temps, thresholds);
    let processed = inputs.processed.clone().equal_elem(1);
    Ok((int_out(tokens), float_out(lps).mask_where(processed, float_out(kept))))
}
