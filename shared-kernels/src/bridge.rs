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
    name: &'static str,
    tensor: Tensor<D>,
) -> Result<CubeTensor, KernelError> {
    if debug_sync() {
        let _ = tensor.device().sync();
    }
    let cube = tensor.try_into_primitive::<Cube>().map_err(|e| {
        KernelError::new(op, format!("`{name}` is not a tensor on a cubecl device ({e:?})"))
    })?;
    crate::error::note_input(op, name, cube.meta.shape(), cube.dtype);
    crate::error::device_thread_fault(op, &cube.device);
    within_index_range(op, name, &cube)?;
    match cube.dtype {
        DType::F32 | DType::BF16 | DType::F16 => Ok(into_contiguous(cube)),
        other => Err(KernelError::new(op, format!("`{name}` has dtype {other:?}; expected f32, bf16 or f16"))),
    }
}

pub(crate) fn int_in<const D: usize>(
    op: &'static str,
    name: &'static str,
    tensor: Tensor<D, Int>,
) -> Result<CubeTensor, KernelError> {
    let cube = tensor.try_into_primitive::<Cube>().map_err(|e| {
        KernelError::new(op, format!("`{name}` is not a tensor on a cubecl device ({e:?})"))
    })?;
    crate::error::note_input(op, name, cube.meta.shape(), cube.dtype);
    within_index_range(op, name, &cube)?;
    match cube.dtype {
        DType::I32 | DType::U32 | DType::I64 | DType::U64 => Ok(into_contiguous(cube)),
        other => Err(KernelError::new(op, format!("`{name}` has dtype {other:?}; expected an integer dtype"))),
    }
}

/// lockstep's kernels address elements with 32-bit indices: a tensor of more than u32::MAX
/// elements is an error naming the op, the input and its shape, before anything launches.
pub(crate) fn within_index_range(op: &'static str, name: &str, t: &CubeTensor) -> Result<(), KernelError> {
    let shape = t.meta.shape();
    let elements = shape.iter().product::<usize>();
    check_index_range(op, name, shape, elements)
}

/// [`within_index_range`] for a tensor about to be made (an output), by its shape.
pub(crate) fn check_index_range(op: &'static str, name: &str, shape: &[usize], elements: usize) -> Result<(), KernelError> {
    if elements > u32::MAX as usize {
        return Err(KernelError::new(op, format!("`{name}` {shape:?} has {elements} elements, beyond the 32-bit index range of lockstep's kernels ({}); use smaller batches or chunks", u32::MAX)));
    }
    Ok(())
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
    *ON.get_or_init(|| crate::knobs::is_set("LOCKSTEP_DEBUG_SYNC"))
}

type PendingBytes = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<burn::tensor::Bytes>, cubecl::server::ServerError>> + Send>>;

/// Device-to-host copies of whole tensors, issued now (in stream order right after the work
/// enqueued so far) and waited for later (on CUDA; elsewhere `start` waits). burn's own reads copy at first access, after
/// everything enqueued by then; this one is not held up by work enqueued after `start`, which
/// lets the sampler launch its next step before it waits for this step's tokens.
pub struct ReadBack {
    pending: PendingBytes,
    layouts: Vec<(Vec<usize>, DType)>,
}

impl ReadBack {
    /// Starts copying `floats` and `ints` (any shape; made contiguous first).
    pub fn start<const D: usize>(floats: Vec<Tensor<D>>, ints: Vec<Tensor<D, Int>>) -> Result<Self, KernelError> {
        let mut cubes = Vec::new();
        for t in floats {
            cubes.push(float_in("read_back", "float tensor", t)?);
        }
        for t in ints {
            cubes.push(int_in("read_back", "int tensor", t)?);
        }
        let Some(first) = cubes.first() else {
            return Err(KernelError::new("read_back", "nothing to read"));
        };
        let client = static_client(first);
        let layouts = cubes.iter().map(|t| (dims(t), t.dtype)).collect();
        let descriptors = cubes
            .iter()
            .map(|t| cubecl::server::CopyDescriptor::new(t.handle.clone().binding(), t.meta.shape().clone(), t.meta.strides().clone(), t.elem_size()))
            .collect();
        let pending: PendingBytes = Box::pin(client.read_tensor_async(descriptors));
        if crate::device::runtime_name() == "cuda" {
            return Ok(Self { pending, layouts });
        }
        // wgpu maps a staging buffer for the read, and a submit while it is still mapped is a
        // validation error: there the copy completes before anything else is enqueued
        let done = cubecl::future::block_on(pending);
        Ok(Self { pending: Box::pin(std::future::ready(done)), layouts })
    }

    /// Waits for the copies: one `TensorData` per tensor, floats first, in the order given.
    pub fn wait(self) -> Result<Vec<burn::tensor::TensorData>, String> {
        let bytes = cubecl::future::block_on(self.pending).map_err(|e| format!("{e:?}"))?;
        Ok(bytes.into_iter().zip(self.layouts).map(|(b, (shape, dtype))| burn::tensor::TensorData::from_bytes(b, shape, dtype)).collect())
    }
}

/// One client per device kept for the whole process, so a read's future (which borrows the
/// client it was issued on) can outlive the call that issued it.
fn static_client(like: &CubeTensor) -> &'static cubecl::client::Client {
    type Clients = std::sync::Mutex<Vec<(burn_cubecl::CubeDevice, &'static cubecl::client::Client)>>;
    static CLIENTS: std::sync::OnceLock<Clients> = std::sync::OnceLock::new();
    let mut clients = CLIENTS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, c)) = clients.iter().find(|(d, _)| *d == like.device) {
        return c;
    }
    let client: &'static cubecl::client::Client = Box::leak(Box::new(like.client.clone()));
    clients.push((like.device.clone(), client));
    client
}
