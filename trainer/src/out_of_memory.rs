//! Running out of device memory mid-run: recognising cubecl's report of it, and the failpoint
//! that stands in for it in tests.

/// Whether `error` (any text that carries cubecl's or the driver's report) says a device
/// allocation did not fit, with the bytes asked for where it says: cubecl reports it as "out of
/// device memory allocating N bytes" inside "An IO error happened" (a read of a buffer whose
/// allocation failed), or as a launch's "out-of-memory error".
pub fn reported(error: &str) -> Option<Option<u64>> {
    const SIGNS: [&str; 3] = ["out of device memory allocating", "An out-of-memory error happened", "CUDA_ERROR_OUT_OF_MEMORY"];
    if !SIGNS.iter().any(|s| error.contains(s)) {
        return None;
    }
    let asked = error.split("out of device memory allocating ").nth(1).and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok());
    Some(asked)
}

/// "<bytes> asked, <free> free" for an allocation of `asked` bytes (where cubecl said) that did
/// not fit on the default device, as the out-of-memory errors name it.
pub fn sizes(asked: Option<u64>) -> String {
    let gb = |b: u64| format!("{:.2} GB", b as f64 / 1e9);
    let device = shared_kernels::device::default_device();
    let free = shared_kernels::device::memory_free(&device).map_or("free memory unknown".to_string(), |f| format!("{} free", gb(f)));
    let asked = asked.map_or("an allocation".to_string(), |a| format!("{} asked", gb(a)));
    format!("{asked}, {free}")
}

/// `LOCKSTEP_FAULT_OOM=PHASE:STEP`: the error cubecl gives when an allocation of that phase of
/// that GRPO step does not fit (fault injection for the tests), else `Ok`.
pub fn injected(phase: &str, step: usize) -> Result<(), String> {
    let Some(spec) = shared_kernels::knobs::var("LOCKSTEP_FAULT_OOM") else { return Ok(()) };
    if spec.split_once(':').is_some_and(|(p, s)| p == phase && s.trim().parse::<usize>().ok() == Some(step)) {
        return Err(format!("the {phase} pass failed on the device: An IO error happened\nCaused by:\n  out of device memory allocating 4294967296 bytes (fault injection: LOCKSTEP_FAULT_OOM={spec})"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn cubecls_out_of_memory_reports_are_recognised_with_their_size() {
        let read = "the training path's forward over 8 sequences (80 rows) failed on the device while reading its entropy: An IO error happened\nCaused by:\n  out of device memory allocating 21474836480 bytes\n   0: backtrace";
        assert_eq!(super::reported(read), Some(Some(21474836480)));
        assert_eq!(super::reported("An out-of-memory error happened during launch\nCaused by:\n  pool"), Some(None));
        assert_eq!(super::reported("An IO error happened\nCaused by:\n  storage handle not found"), None);
    }
}
