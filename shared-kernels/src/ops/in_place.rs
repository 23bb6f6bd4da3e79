//! Inputs written into existing device buffers (the same memory, not a new tensor). A replayed
//! graph runs its recorded launches on the buffers it was captured with, so the inputs of each
//! replay are written into those: host values with [`write_ints`] / [`write_floats`], the
//! previous step's sampled tokens with [`gather_tokens_into`]. Writes and launches go on the
//! client's stream, in order with the replays.

use crate::bridge::{dims, int_in};
use crate::ops::reduce::cube_linear;
use crate::ops::{cube_count_for, storage, ROW_BLOCK};
use crate::{ensure, KernelError};
use burn::tensor::{DType, Int as BInt, Tensor as BTensor, TensorData};
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::{tensor::CubeTensor, Cube};

/// The buffer under `t`, which must be a whole contiguous tensor of `len` elements (a view
/// would be written at the wrong place).
fn whole(op: &'static str, name: &str, t: CubeTensor, len: usize) -> Result<CubeTensor, KernelError> {
    ensure!(t.is_contiguous() && dims(&t).iter().product::<usize>() == len, op, "`{name}` {:?} is not a whole contiguous buffer of {len} elements", dims(&t));
    // a buffer may be padded past its elements (pool alignment); a view starts at an offset
    let at = t.handle.offset_start.unwrap_or(0);
    ensure!(at == 0 && t.handle.size() as usize >= len * t.dtype.size(), op, "`{name}` is a view (offset {at}, {} bytes of {}); only a whole buffer can be written in place", len * t.dtype.size(), t.handle.size());
    Ok(t)
}

/// The whole buffer of `len` elements under a tensor's cubecl primitive (see [`whole`]);
/// `None`: the tensor is on no cubecl device.
fn buffer(op: &'static str, name: &str, cube: Option<CubeTensor>, len: usize) -> Result<CubeTensor, KernelError> {
    whole(op, name, cube.ok_or_else(|| KernelError::new(op, format!("`{name}` is not on a cubecl device")))?, len)
}

/// Writes `values` into `t`'s buffer in place, in `t`'s integer dtype.
pub fn write_ints(op: &'static str, name: &str, t: &BTensor<1, BInt>, values: &[i64]) -> Result<(), KernelError> {
    let cube = buffer(op, name, t.clone().try_into_primitive::<Cube>().ok(), values.len())?;
    let bytes: Vec<u8> = match cube.dtype {
        DType::I32 => values.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect(),
        DType::U32 => values.iter().flat_map(|&v| (v as u32).to_le_bytes()).collect(),
        DType::I64 => values.iter().flat_map(|&v| v.to_le_bytes()).collect(),
        DType::U64 => values.iter().flat_map(|&v| (v as u64).to_le_bytes()).collect(),
        other => return Err(KernelError::new(op, format!("`{name}` has dtype {other:?}; expected an integer dtype"))),
    };
    cube.client.write(&cube.handle, burn::tensor::Bytes::from_bytes_vec(bytes));
    Ok(())
}

/// Writes `values` into `t`'s buffer in place; `t` must be f32.
pub fn write_floats(op: &'static str, name: &str, t: &BTensor<1>, values: &[f32]) -> Result<(), KernelError> {
    let cube = buffer(op, name, t.clone().try_into_primitive::<Cube>().ok(), values.len())?;
    ensure!(cube.dtype == DType::F32, op, "`{name}` has dtype {:?}; expected f32", cube.dtype);
    cube.client.write(&cube.handle, burn::tensor::Bytes::from_bytes_vec(values.iter().flat_map(|v| v.to_le_bytes()).collect()));
    Ok(())
}

#[cube(launch)]
fn gather_tokens_kernel<I: Int>(dst: &mut Tensor<I>, src: &Tensor<I>, spec: &Tensor<I>, fed_arg: u32, rows_arg: u32, #[define(I)] _d: ElemType) {
    let r = cube_linear() * comptime!(ROW_BLOCK) + UNIT_POS_X as usize;
    if r < rows_arg as usize {
        if r < fed_arg as usize {
            dst[r] = src[u32::cast_from(spec[r]) as usize];
        } else {
            dst[r] = spec[r];
        }
    }
}

/// `dst[r] = src[spec[r]]` for the first `fed` rows (tokens sampled on the device, not read
/// back yet) and `dst[r] = spec[r]` for the rest (ids the host has), in place in `dst`.
pub fn gather_tokens_into(dst: &BTensor<1, BInt>, src: &BTensor<1, BInt>, spec: &[i32], fed: usize) -> Result<(), KernelError> {
    const OP: &str = "gather_tokens_into";
    let rows = spec.len();
    ensure!(rows > 0 && fed <= rows, OP, "{fed} fed rows of {rows}");
    let d = buffer(OP, "dst", dst.clone().try_into_primitive::<Cube>().ok(), rows)?;
    let s = int_in(OP, "src", src.clone())?;
    let len = dims(&s)[0];
    if let Some(&bad) = spec[..fed].iter().find(|&&i| i < 0 || i as usize >= len) {
        return Err(KernelError::new(OP, format!("fed index {bad} outside the {len} sampled tokens")));
    }
    let device = dst.device();
    let spec = int_in(OP, "spec", BTensor::<1, BInt>::from_data(TensorData::new(spec.to_vec(), [rows]), &device))?;
    ensure!(d.dtype == s.dtype && s.dtype == spec.dtype, OP, "dtypes differ: dst {:?}, src {:?}, spec {:?}", d.dtype, s.dtype, spec.dtype);
    gather_tokens_kernel::launch(
        &d.client,
        cube_count_for(rows, ROW_BLOCK),
        CubeDim::new_1d(ROW_BLOCK as u32),
        d.clone().into_tensor_arg(),
        s.into_tensor_arg(),
        spec.into_tensor_arg(),
        fed as u32,
        rows as u32,
        storage(d.dtype),
    );
    Ok(())
}
