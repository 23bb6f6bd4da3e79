//! Compiled kernels reused across processes: cubecl's compilation cache (the PTX NVRTC made,
//! on disk) turned on for CUDA, in `LOCKSTEP_KERNEL_CACHE` (default `~/.cache/lockstep/kernels`,
//! `off` to compile everything afresh). A cache hit cannot change a bit: cubecl keys an entry by
//! the kernel's identity (its type, every compile-time setting, the cube shape), the build id of
//! the running binary, the GPU architecture and the compiler backend, so a hit is exactly the PTX
//! this binary would compile for this device, and the driver turns it into the same machine code.
//! Off CUDA (the CI runtime) there is nothing to cache and this does nothing. It also sets the
//! cubecl-cuda patch's precompiled headers (`LOCKSTEP_NVRTC_PCH`), which shorten the compiles a
//! cold cache costs without changing the PTX but for line numbers.

use std::path::PathBuf;

/// Where the cache lives, or `None` when `LOCKSTEP_KERNEL_CACHE=off`.
pub fn directory() -> Option<PathBuf> {
    match crate::knobs::var("LOCKSTEP_KERNEL_CACHE").as_deref() {
        Some("off") => None,
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => {
            let base = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
            Some(base.unwrap_or_else(std::env::temp_dir).join("lockstep").join("kernels"))
        }
    }
}

/// Turns the cache on. Call first in `main`, before any device exists (cubecl reads its
/// configuration once); a `cubecl.toml` the user keeps is read and only its cache settings
/// replaced. Returns the directory in use (`None`: off, or not the CUDA runtime).
pub fn enable() -> Option<PathBuf> {
    #[cfg(feature = "cuda")]
    {
        use cubecl::config::{cache::CacheConfig, CubeClRuntimeConfig, RuntimeConfig};
        // NVRTC's precompiled headers (the cubecl-cuda patch); a bad value is refused with
        // the kernel choice (`KernelChoice::from_env`)
        let pch = crate::knobs::var("LOCKSTEP_NVRTC_PCH").is_none_or(|v| v.trim() != "off");
        cubecl::cuda::header_precompilation::set_enabled(pch);
        let dir = directory()?;
        // an unwritable directory costs a recompile, never the run: cubecl degrades to no cache
        let _ = std::fs::create_dir_all(&dir);
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        config.compilation.cache = true;
        config.environment.path = CacheConfig::Directory(dir.clone());
        CubeClRuntimeConfig::try_set(config).then_some(dir)
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}

// The cubecl-cuda patch's source transform, tested here so CI (no CUDA build) runs its tests.
#[cfg(test)]
#[path = "../patches/cubecl-cuda/src/includes_first.rs"]
mod includes_first;
