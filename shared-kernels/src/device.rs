//! Which cubecl device tests, the battery and the CLI run on.
//!
//! Built with `wgpu` (the CI default) the device is the first wgpu adapter, which on the CPU
//! machine is Mesa's lavapipe; built with `cuda` it is CUDA device 0.

use burn::tensor::Device;
use burn_cubecl::cubecl::client::Client;

/// `device`'s cubecl client, reached through a one-element probe tensor (burn exposes no
/// other way); `None` on a non-cubecl backend.
pub(crate) fn client(device: &Device) -> Option<Client> {
    burn::tensor::Tensor::<1>::zeros([1], device).try_into_primitive::<burn_cubecl::Cube>().ok().map(|p| p.client)
}

/// The runtime this binary was built for, as a short name for tables and logs.
pub fn runtime_name() -> &'static str {
    if cfg!(feature = "cuda") { "cuda" } else { "wgpu" }
}

#[cfg(feature = "cuda")]
pub fn default_device() -> Device {
    burn::tensor::Device::from(burn_cubecl::cubecl::cuda::CudaDevice::new(0))
}

#[cfg(all(feature = "wgpu", not(feature = "cuda")))]
pub fn default_device() -> Device {
    burn::tensor::Device::from(burn_cubecl::cubecl::wgpu::WgpuDevice::default())
}

/// The device's dynamic memory pools in one line: each pool's page size and pages held, in the
/// order cubecl routes allocations through them (the pools a growth left behind come last).
///
/// Why it is worth printing: cubecl walks every page of every left-behind pool on each
/// reservation until that pool drains, so long-lived tensors stranded there (weights, the KV
/// cache) make every allocation of the run slower.
pub fn memory_pools_line(device: &Device) -> String {
    match device.memory_pool_report() {
        None => "memory pools: not reported by this runtime".into(),
        Some(pools) => {
            let pages: u64 = pools.iter().map(|p| p.pages).sum();
            let each: Vec<String> = pools.iter().map(|p| format!("{}x{:.1}MiB", p.pages, p.page_size as f64 / (1u64 << 20) as f64)).collect();
            format!("memory pools: {} pools, {pages} pages [{}]", pools.len(), each.join(", "))
        }
    }
}

/// Whether kernels on `device` can hold `dtype` (lavapipe's Vulkan has no bf16 or f16: a bf16
/// model there failed inside cubecl's shader compiler).
pub fn supports_dtype(device: &Device, dtype: burn::tensor::DType) -> bool {
    client(device).is_some_and(|c| c.properties().features.supports_type(storage(dtype)))
}

/// The cubecl element type that holds `dtype` (kernels allocate and launch with it).
pub(crate) fn storage(dtype: burn::tensor::DType) -> burn_cubecl::cubecl::ir::ElemType {
    burn_backend::cubecl::dtype_to_storage_type(dtype)
}

/// The device's streaming multiprocessors (compute units), where the runtime says; else 132
/// (an H100/H200), the figure tile schedules are sized for.
pub fn multiprocessors(device: &Device) -> usize {
    client(device).map_or(132, |c| client_multiprocessors(&c))
}

/// [`multiprocessors`] of a client at hand.
pub(crate) fn client_multiprocessors(client: &Client) -> usize {
    client.properties().hardware.num_streaming_multiprocessors.unwrap_or(132) as usize
}

/// Bytes `device` can hold, where it is known: cubecl's figure for the runtime (Vulkan's
/// largest device-local heap), else on CUDA the driver's total (`cuMemGetInfo`). `None` when
/// neither says; the memory plan then checks nothing against the device.
pub fn memory_capacity(device: &Device) -> Option<u64> {
    if let Some((_, total)) = fake_memory() {
        return Some(total);
    }
    let client = client(device)?;
    client.properties().memory.max_memory().or_else(|| cuda_memory_info().map(|(_, total)| total))
}

/// The largest tensor one kernel can bind on `device`, where the runtime has such a limit:
/// wgpu's storage-buffer binding size (128 MiB on lavapipe; a larger tensor fails inside wgpu's
/// validation on cubecl's device thread). `None` on CUDA, whose limit is the memory itself.
pub fn max_tensor_bytes(device: &Device) -> Option<u64> {
    if cfg!(feature = "cuda") {
        return None;
    }
    let client = client(device)?;
    Some(client.properties().memory.max_page_size)
}

/// Bytes free on `device` now (CUDA: the driver's `cuMemGetInfo`); `None` where the runtime
/// does not say (wgpu). `LOCKSTEP_FAKE_DEVICE_MEMORY` stands in for both figures in tests.
pub fn memory_free(device: &Device) -> Option<u64> {
    if let Some((free, _)) = fake_memory() {
        return Some(free);
    }
    client(device)?;
    cuda_memory_info().map(|(free, _)| free)
}

/// `LOCKSTEP_FAKE_DEVICE_MEMORY` as (free, total): `FREE` or `FREE/TOTAL` bytes.
fn fake_memory() -> Option<(u64, u64)> {
    let v = crate::knobs::var("LOCKSTEP_FAKE_DEVICE_MEMORY")?;
    let (free, total) = v.split_once('/').unwrap_or((&v, &v));
    Some((free.trim().parse().ok()?, total.trim().parse().ok()?))
}

/// The driver's (free, total) bytes of device 0 (`cuMemGetInfo` in the primary context, the
/// one cubecl's CudaDevice::new(0) runs on); `None` without CUDA.
#[cfg(feature = "cuda")]
fn cuda_memory_info() -> Option<(u64, u64)> {
    let context = cudarc::driver::CudaContext::new(0).ok()?;
    context.mem_get_info().ok().map(|(free, total)| (free as u64, total as u64))
}

#[cfg(not(feature = "cuda"))]
fn cuda_memory_info() -> Option<(u64, u64)> {
    None
}
