//! Compiled kernels reused across processes: cubecl's compilation cache (the PTX NVRTC made,
//! on disk) turned on for CUDA, in `LOCKSTEP_KERNEL_CACHE` (default `~/.cache/lockstep/kernels`,
//! `off` to compile everything afresh). A cache hit cannot change a bit: cubecl keys an entry by
//! the kernel's identity (its type, every compile-time setting, the cube shape), the build id of
//! the running binary, the GPU architecture and the compiler backend, so a hit is exactly the PTX
//! this binary would compile for this device, and the driver turns it into the same machine code.
//! Off CUDA (the CI runtime) there is nothing to cache and this does nothing. It also sets the
//! cubecl-cuda patch's precompiled headers (`LOCKSTEP_NVRTC_PCH`), which shorten the compiles a
//! cold cache costs without changing the PTX but for line numbers.

use std::path::{Path, PathBuf};

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
        if pch {
            remove_pch_of_dead_processes(&std::env::temp_dir());
        }
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

/// NVRTC keeps a process's precompiled headers in `$TMPDIR/__nvrtc_auto_pch_<pid>_<n>` (~150 MB
/// once the TMA kernels' headers are in) and removes them when the process exits; a process that
/// was killed leaves them. Removes those whose process is gone (Linux: no `/proc/<pid>`), leaving
/// every other entry alone. Returns how many went.
pub fn remove_pch_of_dead_processes(temp: &Path) -> usize {
    if !Path::new("/proc/self").exists() {
        return 0; // no way to tell a live process from a dead one
    }
    let Ok(entries) = std::fs::read_dir(temp) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("__nvrtc_auto_pch_")) else { continue };
        let Some(pid) = rest.split('_').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !Path::new(&format!("/proc/{pid}")).exists() && std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_dead_process_s_precompiled_headers_are_removed() {
        let temp = std::env::temp_dir().join(format!("lockstep-pch-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&temp);
        // above any pid Linux hands out (pid_max is at most 2^22)
        let dead = temp.join("__nvrtc_auto_pch_4294967295_0");
        let alive = temp.join(format!("__nvrtc_auto_pch_{}_0", std::process::id()));
        let other = temp.join("__nvrtc_auto_pch_notapid_0");
        let unrelated = temp.join("4294967295");
        for dir in [&dead, &alive, &other, &unrelated] {
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(dir.join("default_program_0.pch"), b"x").unwrap();
        }
        let removed = super::remove_pch_of_dead_processes(&temp);
        if std::path::Path::new("/proc/self").exists() {
            assert_eq!(removed, 1);
            assert!(!dead.exists(), "a dead process's headers stay");
        } else {
            assert_eq!(removed, 0);
        }
        assert!(alive.exists() && other.exists() && unrelated.exists(), "something else was removed");
        std::fs::remove_dir_all(&temp).unwrap();
    }
}

// The cubecl-cuda patch's source transform, tested here so CI (no CUDA build) runs its tests.
#[cfg(test)]
#[path = "../patches/cubecl-cuda/src/includes_first.rs"]
mod includes_first;
