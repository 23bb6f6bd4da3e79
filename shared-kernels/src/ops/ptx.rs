//! Inline-PTX device helpers any kernel family may use (cubecl 0.11.3 has no API for them):
//! a shared slice's 32-bit address (for matrix descriptors and `ldmatrix`), and the
//! asynchronous-copy group commit and wait. They move data or name addresses; no arithmetic.

use burn_cubecl::cubecl::prelude::*;

/// The 32-bit shared-state-space address of a shared slice's first element.
#[cube]
pub(crate) fn shared_address<E: CubePrimitive>(s: &[E]) -> u32 {
    let p = unsafe { s.as_ptr_unchecked() };
    let out: u32;
    gpu_asm!("{{ .reg .u64 t; cvta.to.shared.u64 t, {p}; cvt.u32.u64 {out}, t; }}", p = in(_) p, out = out(_) out, options(nomem));
    out
}

/// Closes this unit's copies issued since the last commit into one group.
#[cube]
pub(crate) fn commit_copies() {
    gpu_asm!("cp.async.commit_group;");
}

/// Waits until at most `pending` of this unit's committed groups are still in flight.
#[cube]
pub(crate) fn wait_copies(#[comptime] pending: usize) {
    gpu_asm!("cp.async.wait_group {n};", n = const pending);
}
