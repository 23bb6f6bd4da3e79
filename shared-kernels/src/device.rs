//! Which cubecl device tests, the battery and the CLI run on.
//!
//! Built with `wgpu` (the CI default) the device is the first wgpu adapter, which on the CPU
//! machine is Mesa's lavapipe; built with `cuda` it is CUDA device 0.

use burn::tensor::Device;

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
