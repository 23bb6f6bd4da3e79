//! Weight gradients folded into f32 accumulators: `acc += (sum over tokens)` where the sum walks
//! the tokens in order and starts from the accumulator's current value, so a gradient built
//! over several calls (micro-batches, head chunks) has the bits of one call over all the tokens,
//! provided every call boundary falls on a multiple of [`FOLD_ROWS`] tokens
//! ([`crate::grad_fold`] says how the trainer guarantees it). No atomics, no split over tokens.
//!
//! - [`fold_matmul`]: `acc[N,K] += dyᵀ[N,T] x[T,K]`. On CUDA in bf16/f16 a chain of 16-deep
//!   tensor-core steps over t = 0, 16, ... starting from the accumulator's values (the tokens past
//!   the last whole 16 by the scalar kernel): on the H200 the persistent warpgroup matmul with
//!   its accumulators loaded from `acc` ([`crate::ops::matmul::wgmma::fold_wgmma`]; `dy` and `x` read
//!   in place as its MN-major operands), else (or with `LOCKSTEP_FOLD_KERNEL=cmma`) one plane
//!   per 16 x 16 block on cmma; elsewhere one f32 accumulator per element walking t in order.
//! - [`fold_column_sums`]: `acc[cols] += sum_r x[r, cols]`: partial sums over chunks of
//!   `chunk_rows` rows (one unit per chunk and column, rows in order), then one unit per column
//!   adds the chunks in order.
//! - [`fold_embedding`]: `acc[id] += dy[t]` for every token t with that id, in token order: one
//!   cube per distinct id (the host sorts the ids, stably), units over the hidden dims.

use crate::ops::reduce::cube_linear;
use crate::ops::{cube_count_for, storage};
use crate::bridge::{dims, float_in, int_in};
use crate::{ensure, KernelError};
use burn::tensor::{DType, Int as BInt, Tensor as BTensor, TensorData};
use burn_cubecl::cubecl::cmma::{self, MatrixIdent, MatrixLayout};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, zeros_client};
use burn_cubecl::tensor::CubeTensor;

/// Tokens per fold granule: call boundaries on multiples of it keep the bits (the cmma step).
pub const FOLD_ROWS: usize = 16;
/// Units per cube of the scalar kernels.
const BLOCK: usize = 128;

#[cube(launch)]
fn fold_matmul_scalar_kernel<F: Float>(dy: &Tensor<F>, x: &Tensor<F>, acc: &mut Tensor<f32>, t_first: u32, t_end: u32, n_arg: u32, k_arg: u32, #[define(F)] _d: ElemType) {
    let n = n_arg as usize;
    let k = k_arg as usize;
    let i = cube_linear() * comptime!(BLOCK) + UNIT_POS_X as usize;
    if i < n * k {
        let row = i / k;
        let col = i % k;
        let mut a = acc[i];
        for t in t_first as usize..t_end as usize {
            a += f32::cast_from(dy[t * n + row]) * f32::cast_from(x[t * k + col]);
        }
        acc[i] = a;
    }
}

#[cube(launch)]
fn fold_matmul_cmma_kernel<F: Float>(dy: &Tensor<F>, x: &Tensor<F>, acc: &mut Tensor<f32>, steps: u32, n_arg: u32, k_arg: u32, #[define(F)] _d: ElemType) {
    let n = n_arg as usize;
    let k = k_arg as usize;
    let n0 = CUBE_POS_Y as usize * 16;
    let k0 = CUBE_POS_X as usize * 16;
    let mut c = unsafe { cmma::Matrix::<f32>::uninitialized(MatrixIdent::Accumulator, 16usize, 16usize, 16usize, MatrixLayout::Undefined) };
    cmma::load_with_layout(&mut c, acc.slice(n0 * k + k0, acc.len()), k as u32, MatrixLayout::RowMajor);
    for s in 0..steps as usize {
        let t0 = s * 16;
        // dyᵀ[n0.., t0..]: element (i, j) is dy[(t0 + j) * n + n0 + i], column-major, stride n
        let mut a = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::A, 16usize, 16usize, 16usize, MatrixLayout::ColMajor) };
        let mut b = unsafe { cmma::Matrix::<F>::uninitialized(MatrixIdent::B, 16usize, 16usize, 16usize, MatrixLayout::RowMajor) };
        cmma::load(&mut a, dy.slice(t0 * n + n0, dy.len()), n as u32);
        cmma::load(&mut b, x.slice(t0 * k + k0, x.len()), k as u32);
        cmma::execute(&a, &b, &c, &c);
    }
    cmma::store(acc.slice_mut(n0 * k + k0, acc.len()), &c, k as u32, MatrixLayout::RowMajor);
}

#[cube(launch)]
fn fold_columns_partial_kernel(x: &Tensor<f32>, partials: &mut Tensor<f32>, rows_arg: u32, cols_arg: u32, chunk_rows_arg: u32) {
    let rows = rows_arg as usize;
    let cols = cols_arg as usize;
    let chunk_rows = chunk_rows_arg as usize;
    let chunks = rows.div_ceil(chunk_rows);
    let i = cube_linear() * comptime!(BLOCK) + UNIT_POS_X as usize;
    if i < chunks * cols {
        let chunk = i / cols;
        let col = i % cols;
        let first = chunk * chunk_rows;
        let mut end = first + chunk_rows;
        if end > rows {
            end = rows;
        }
        let mut a = 0.0f32;
        for r in first..end {
            a += x[r * cols + col];
        }
        partials[i] = a;
    }
}

#[cube(launch)]
fn fold_columns_kernel(partials: &Tensor<f32>, acc: &mut Tensor<f32>, chunks_arg: u32, cols_arg: u32) {
    let chunks = chunks_arg as usize;
    let cols = cols_arg as usize;
    let col = cube_linear() * comptime!(BLOCK) + UNIT_POS_X as usize;
    if col < cols {
        let mut a = acc[col];
        // eight loads in flight, then their additions in chunk order (one dependent load at a
        // time left a norm's 1,024 chunks ~100 µs of L2 latency)
        let mut j = 0usize;
        while j + 8 <= chunks {
            let mut v = Array::<f32>::new(8usize);
            #[unroll]
            for t in 0..8usize {
                v[t] = partials[(j + t) * cols + col];
            }
            #[unroll]
            for t in 0..8usize {
                a += v[t];
            }
            j += 8;
        }
        while j < chunks {
            a += partials[j * cols + col];
            j += 1;
        }
        acc[col] = a;
    }
}

#[cube(launch)]
fn fold_embedding_kernel<F: Float, I: Int>(dy: &Tensor<F>, order: &Tensor<I>, runs: &Tensor<I>, acc: &mut Tensor<f32>, n_runs: u32, hidden_arg: u32, #[define(F, I)] _d: [ElemType; 2]) {
    let hidden = hidden_arg as usize;
    let run = cube_linear();
    if run < n_runs as usize {
        let id = u32::cast_from(runs[run * 3]) as usize;
        let first = u32::cast_from(runs[run * 3 + 1]) as usize;
        let end = u32::cast_from(runs[run * 3 + 2]) as usize;
        let mut c = UNIT_POS_X as usize;
        while c < hidden {
            let mut a = acc[id * hidden + c];
            for j in first..end {
                let t = u32::cast_from(order[j]) as usize;
                a += f32::cast_from(dy[t * hidden + c]);
            }
            acc[id * hidden + c] = a;
            c += comptime!(BLOCK);
        }
    }
}

/// A fresh f32 accumulator of `shape`, zeroed, on `like`'s device.
pub fn zeroed_accumulator(like: &CubeTensor, shape: Vec<usize>) -> CubeTensor {
    zeros_client(like.client.clone(), like.device.clone(), shape.into(), DType::F32)
}

/// Whether the bf16/f16 fold may take the warpgroup kernel: the process's `LOCKSTEP_FOLD_KERNEL`
/// ([`crate::kernel_choice::KernelChoice`]) = "wgmma"
/// (the default: the persistent kernel with its accumulators loaded from `acc`, where its tiles
/// divide the output) or "cmma" (always the plain chain, for comparisons). Both give the same
/// bits (H200 battery: pieces = one pass; a 0.6B GRPO step in one pass = in 4,096-token
/// micro-batches = on the cmma chain); the warpgroup fold ran a 1.7B 8 x 2,048 update in 832 ms
/// against 2,878 ms (docs/journal/scale-history.md).
fn fold_on_wgmma() -> Result<bool, KernelError> {
    Ok(crate::kernel_choice::KernelChoice::current()?.fold_on_wgmma)
}

/// Whether `fold_matmul` runs cmma steps for these operands (the rest is the scalar kernel).
fn cmma_route(dy: &CubeTensor, n: usize, k: usize) -> bool {
    crate::device::runtime_name() == "cuda" && matches!(dy.dtype, DType::BF16 | DType::F16) && n % 16 == 0 && k % 16 == 0
}

/// `acc[N,K] += dyᵀ x` for `dy` [T, N] and `x` [T, K] (same dtype); `acc` is f32 and updated in
/// place (a fresh zeroed one when `None`). Returns the accumulator.
pub fn fold_matmul(acc: Option<CubeTensor>, dy: BTensor<2>, x: BTensor<2>) -> Result<CubeTensor, KernelError> {
    const OP: &str = "fold_matmul";
    let dy = float_in(OP, "dy", dy)?;
    let x = float_in(OP, "x", x)?;
    let (dd, xd) = (dims(&dy), dims(&x));
    ensure!(dd[0] == xd[0], OP, "dy is {dd:?} but x is {xd:?}: token counts differ");
    ensure!(dy.dtype == x.dtype, OP, "dy is {:?} but x is {:?}", dy.dtype, x.dtype);
    let (t, n, k) = (dd[0], dd[1], xd[1]);
    crate::bridge::check_index_range(OP, "acc", &[n, k], n * k)?;
    let acc = match acc {
        Some(a) => {
            ensure!(dims(&a) == [n, k] && a.dtype == DType::F32, OP, "the accumulator is {:?} {:?}, expected f32 [{n}, {k}]", a.dtype, dims(&a));
            a
        }
        None => zeroed_accumulator(&dy, vec![n, k]),
    };
    let mut done = 0;
    let whole = t / 16 * 16;
    let wgmma = cmma_route(&dy, n, k) && whole > 0 && fold_on_wgmma()? && crate::ops::matmul::wgmma::fold_wgmma_fits(&dy.client, crate::ops::matmul::layout::WeightLayout::InOut, true, (n, whole, k))?;
    if wgmma {
        // y[n, k] += dyᵀ[n, t] x[t, k]: dy [t, n] is the transposed-x operand, x [t, k] the
        // input-major weight; only whole 16-token steps (the rest by the scalar kernel below)
        let rows = |c: &CubeTensor| if whole == t { c.clone() } else { crate::bridge::float_in(OP, "rows", crate::bridge::float_out::<2>(c.clone()).slice([0..whole])).expect("a row prefix of a checked tensor") };
        crate::ops::matmul::wgmma::fold_wgmma(acc.clone(), rows(&dy), rows(&x), crate::ops::matmul::layout::WeightLayout::InOut, true, (n, whole, k))?;
        done = whole;
    } else if cmma_route(&dy, n, k) && t >= 16 {
        let steps = t / 16;
        fold_matmul_cmma_kernel::launch(
            &dy.client,
            CubeCount::Static((k / 16) as u32, (n / 16) as u32, 1),
            CubeDim::new_1d(32),
            dy.clone().into_tensor_arg(),
            x.clone().into_tensor_arg(),
            acc.clone().into_tensor_arg(),
            steps as u32,
            n as u32,
            k as u32,
            storage(dy.dtype),
        );
        done = steps * 16;
    }
    if done < t {
        fold_matmul_scalar_kernel::launch(
            &dy.client,
            cube_count_for(n * k, BLOCK),
            CubeDim::new_1d(BLOCK as u32),
            dy.clone().into_tensor_arg(),
            x.into_tensor_arg(),
            acc.clone().into_tensor_arg(),
            done as u32,
            t as u32,
            n as u32,
            k as u32,
            storage(dy.dtype),
        );
    }
    Ok(acc)
}

/// `acc[cols] += sum over rows of x[rows, cols]` (f32), chunks of `chunk_rows` rows first.
pub fn fold_column_sums(acc: Option<CubeTensor>, x: BTensor<2>, chunk_rows: usize) -> Result<CubeTensor, KernelError> {
    const OP: &str = "fold_column_sums";
    let x = float_in(OP, "x", x.cast(DType::F32))?;
    let [rows, cols] = [dims(&x)[0], dims(&x)[1]];
    ensure!(chunk_rows > 0 && rows > 0 && cols > 0, OP, "x is [{rows}, {cols}], chunk_rows {chunk_rows}");
    let acc = match acc {
        Some(a) => {
            ensure!(dims(&a) == [cols] && a.dtype == DType::F32, OP, "the accumulator is {:?} {:?}, expected f32 [{cols}]", a.dtype, dims(&a));
            a
        }
        None => zeroed_accumulator(&x, vec![cols]),
    };
    let chunks = rows.div_ceil(chunk_rows);
    let partials = empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), [chunks, cols].into(), DType::F32);
    fold_columns_partial_kernel::launch(
        &x.client,
        cube_count_for(chunks * cols, BLOCK),
        CubeDim::new_1d(BLOCK as u32),
        x.clone().into_tensor_arg(),
        partials.clone().into_tensor_arg(),
        rows as u32,
        cols as u32,
        chunk_rows as u32,
    );
    fold_columns_kernel::launch(
        &x.client,
        cube_count_for(cols, BLOCK),
        CubeDim::new_1d(BLOCK as u32),
        partials.into_tensor_arg(),
        acc.clone().into_tensor_arg(),
        chunks as u32,
        cols as u32,
    );
    Ok(acc)
}

/// `acc[vocab, hidden] += dy[t]` at row `ids[t]` for every token, in token order per id.
pub fn fold_embedding(acc: Option<CubeTensor>, dy: BTensor<2>, ids: BTensor<1, BInt>, vocab: usize) -> Result<CubeTensor, KernelError> {
    const OP: &str = "fold_embedding";
    let device = ids.device();
    let host: Vec<i64> = ids.clone().into_data().convert::<i64>().try_to_vec::<i64>().map_err(|e| KernelError::new(OP, format!("reading the ids back: {e:?}")))?;
    let dy = float_in(OP, "dy", dy)?;
    let [rows, hidden] = [dims(&dy)[0], dims(&dy)[1]];
    ensure!(host.len() == rows, OP, "dy has {rows} rows but there are {} ids", host.len());
    if let Some(bad) = host.iter().find(|&&id| id < 0 || id as usize >= vocab) {
        return Err(KernelError::new(OP, format!("token id {bad} is outside the vocabulary of {vocab}")));
    }
    let acc = match acc {
        Some(a) => {
            ensure!(dims(&a) == [vocab, hidden] && a.dtype == DType::F32, OP, "the accumulator is {:?} {:?}, expected f32 [{vocab}, {hidden}]", a.dtype, dims(&a));
            a
        }
        None => zeroed_accumulator(&dy, vec![vocab, hidden]),
    };
    let mut order: Vec<i32> = (0..rows as i32).collect();
    order.sort_by_key(|&t| host[t as usize]); // stable: token order within an id
    let mut runs = Vec::new();
    let mut first = 0;
    while first < rows {
        let id = host[order[first] as usize];
        let mut end = first + 1;
        while end < rows && host[order[end] as usize] == id {
            end += 1;
        }
        runs.extend_from_slice(&[id as i32, first as i32, end as i32]);
        first = end;
    }
    let n_runs = runs.len() / 3;
    let order = int_in(OP, "order", BTensor::<1, BInt>::from_data(TensorData::new(order, [rows]), &device))?;
    let runs = int_in(OP, "runs", BTensor::<1, BInt>::from_data(TensorData::new(runs, [n_runs * 3]), &device))?;
    let idt = storage(order.dtype);
    fold_embedding_kernel::launch(
        &dy.client,
        cube_count_for(n_runs, 1),
        CubeDim::new_1d(BLOCK as u32),
        dy.clone().into_tensor_arg(),
        order.into_tensor_arg(),
        runs.into_tensor_arg(),
        acc.clone().into_tensor_arg(),
        n_runs as u32,
        hidden as u32,
        [storage(dy.dtype), idt],
    );
    Ok(acc)
}
