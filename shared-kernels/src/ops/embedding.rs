//! Token embedding gather: `y[r, :] = table[ids[r], :]`. Pure copies, invariant as written.
//!
//! Ids come from the device; ids at or beyond the vocabulary write a zero row instead of
//! reading out of bounds. Callers that hold ids on the host (the model, the sampler) validate
//! them first and report the offending id by value.

use crate::ops::reduce::cube_linear;
use crate::ops::{cube_count_for, storage};
use crate::bridge::{dims, float_in, float_out, int_in, same_device};
use crate::autodiff::{cube, from_tracked, inner, plain, tracked, tracked_in, untracked};
use crate::{ensure, KernelError};
use burn::tensor::{Int as BInt, Tensor as BTensor};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;

const BLOCK: usize = 256;

#[cube(launch)]
fn embedding_kernel<F: Float, I: Int>(
    table: &Tensor<F>,
    ids: &Tensor<I>,
    y: &mut Tensor<F>,
    rows_arg: u32,
    vocab_arg: u32,
    hidden_arg: u32,
    #[define(F, I)] _d: [ElemType; 2],
) {
    let rows = rows_arg as usize;
    let vocab = vocab_arg as usize;
    let hidden = hidden_arg as usize;
    let i = cube_linear() * comptime!(BLOCK) + UNIT_POS_X as usize;
    if i < rows * hidden {
        let row = i / hidden;
        let col = i % hidden;
        let id = u32::cast_from(ids[row]) as usize;
        if id < vocab {
            y[i] = table[id * hidden + col];
        } else {
            y[i] = F::new(0.0);
        }
    }
}

/// Rows of `table` ([vocab, hidden]) picked by `ids` ([rows]); output [rows, hidden].
pub fn embedding(table: BTensor<2>, ids: BTensor<1, BInt>) -> Result<BTensor<2>, KernelError> {
    if !table.is_autodiff() {
        return embedding_plain(table, ids);
    }
    let ta = tracked_in("embedding", "table", table)?;
    let tp = plain::<2>(inner(&ta));
    let ids = untracked(ids);
    let y = embedding_plain(tp.clone(), ids.clone())?;
    let t_id = ta.id().value;
    Ok(from_tracked(tracked([&ta], cube(y), move |dy| {
        let dy = plain::<2>(dy);
        if crate::grad_fold::folds(t_id) {
            let vocab = tp.dims()[0];
            crate::grad_fold::fold_into(t_id, crate::grad_fold::FoldUse::Embedding, |acc| {
                crate::ops::weight_grad::fold_embedding(acc, dy, ids, vocab).expect("embedding backward: ids checked in forward")
            });
            return [None];
        }
        let grad = tp.zeros_like().select_assign(0, ids, dy, burn::tensor::IndexingUpdateOp::Add);
        [Some(cube(grad))]
    })))
}

fn embedding_plain(table: BTensor<2>, ids: BTensor<1, BInt>) -> Result<BTensor<2>, KernelError> {
    const OP: &str = "embedding";
    let table = float_in(OP, "table", table)?;
    let ids = int_in(OP, "ids", ids)?;
    same_device(OP, &table, &ids, "ids")?;
    let (td, id) = (dims(&table), dims(&ids));
    let (vocab, hidden) = (td[0], td[1]);
    let rows = id[0];
    ensure!(vocab > 0 && hidden > 0, OP, "empty table {td:?}");
    ensure!(rows > 0, OP, "no ids");
    let y = empty_device_contiguous_dtype(table.client.clone(), table.device.clone(), [rows, hidden].into(), table.dtype);
    embedding_kernel::launch(
        &table.client,
        cube_count_for(rows * hidden, BLOCK),
        CubeDim::new_1d(BLOCK as u32),
        table.clone().into_tensor_arg(),
        ids.clone().into_tensor_arg(),
        y.clone().into_tensor_arg(),
        rows as u32,
        vocab as u32,
        hidden as u32,
        [storage(table.dtype), storage(ids.dtype)],
    );
    Ok(float_out(y))
}
