//! Between burn's user-facing tensors and burn-cubecl's `CubeTensor`, which kernels launch on.
//!
//! burn 0.22 routes every tensor through its dispatch layer; with fusion off the cubecl
//! primitive underneath is a plain `CubeTensor`, so unwrapping is free (no copy, no host trip).
//!
//! Every kernel indexes rows as `row * width + col`, so inputs are made strictly contiguous
//! (`into_contiguous` copies strided or pitched tensors: CUDA's default allocator pads rows) and
//! outputs are allocated with `empty_device_contiguous_dtype`, never the pitched allocator.

use crate::KernelError;
use burn::tensor::{DType, Int, Tensor};
use burn_cubecl::{kernel::into_contiguous, tensor::CubeTensor, Cube};

pub(crate) fn float_in<const D: usize>(
    op: &'static str,
    name: &str,
    tensor: Tensor<D>,
) -> Result<CubeTensor, KernelError> {
    if debug_sync() {
        let _ = tensor.device().sync();
    }
    let cube = tensor.try_into_primitive::<Cube>().map_err(|e| {
        KernelError::new(op, format!("`{name}` is not a tensor on a cubecl device ({e:?})"))
    })?;
    match cube.dtype {
        DType::F32 | DType::BF16 | DType::F16 => Ok(into_contiguous(cube)),
        other => Err(KernelError::new(op, format!("`{name}` has dtype {other:?}; expected f32, bf16 or f16"))),
    }
}

pub(crate) fn int_in<const D: usize>(
    op: &'static str,
    name: &str,
    tensor: Tensor<D, Int>,
) -> Result<CubeTensor, KernelError> {
    let cube = tensor.try_into_primitive::<Cube>().map_err(|e| {
        KernelError::new(op, format!("`{name}` is not a tensor on a cubecl device ({e:?})"))
    })?;
    match cube.dtype {
        DType::I32 | DType::U32 | DType::I64 | DType::U64 => Ok(into_contiguous(cube)),
        other => Err(KernelError::new(op, format!("`{name}` has dtype {other:?}; expected an integer dtype"))),
    }
}

/// `x` in a compact row-major buffer (a copy only where `x` is strided or pitched: CUDA pads
/// rows whose byte width is not a multiple of min(512, its next power of two), e.g. a 151936-token
/// bf16 vocabulary). Every lockstep op makes this copy itself when needed; benchmarks call it
/// once so that the copy is not timed as part of the op.
pub fn contiguous<const D: usize>(x: Tensor<D>) -> Result<Tensor<D>, KernelError> {
    Ok(float_out(float_in("contiguous", "x", x)?))
}

/// `x` copied into a buffer of its own, allocated where the device's allocator puts new
/// tensors at the time of the call (inside a persistent-allocation window: the persistent pool).
/// The copy is exact (a load and a store per element).
pub fn own_buffer<const D: usize>(x: Tensor<D>) -> Result<Tensor<D>, KernelError> {
    Ok(float_out(float_in("own_buffer", "x", x)?.copy()))
}

pub(crate) fn float_out<const D: usize>(tensor: CubeTensor) -> Tensor<D> {
    Tensor::from_primitive::<Cube>(tensor)
}

pub(crate) fn int_out<const D: usize>(tensor: CubeTensor) -> Tensor<D, Int> {
    Tensor::<D, Int>::from_primitive::<Cube>(tensor)
}

pub(crate) fn dims(t: &CubeTensor) -> Vec<usize> {
    t.meta.shape().to_vec()
}

pub(crate) fn same_device(op: &'static str, a: &CubeTensor, b: &CubeTensor, name_b: &str) -> Result<(), KernelError> {
    if a.device != b.device {
        return Err(KernelError::new(op, format!("`{name_b}` is on {:?}, the input on {:?}", b.device, a.device)));
    }
    Ok(())
}

/// `LOCKSTEP_DEBUG_SYNC=1`: synchronise the device before every launch (diagnostics only).
pub(crate) fn debug_sync() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("LOCKSTEP_DEBUG_SYNC").is_some())
}
