//! Inline-PTX device helpers any kernel family may use (cubecl 0.11.3 has no API for them, or
//! one NVRTC rejects): a shared slice's 32-bit address (for matrix descriptors and `ldmatrix`),
//! the asynchronous-copy group commit and wait, and Hopper's bulk copy. They move data or name
//! addresses; no arithmetic.

use burn_cubecl::cubecl::prelude::barrier::Barrier;
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

/// One Hopper bulk copy (`cp.async.bulk`, sm_90) of `bytes` from the global slice `src` to the
/// shared address `dst`, completing as transaction bytes on `bar` (both addresses 16-byte
/// aligned, `bytes` a multiple of 16). Why PTX: cubecl 0.11.3's `memcpy_async_tx` passes a plain
/// byte count where CCCL's `cuda::device::memcpy_async_tx` takes a `cuda::aligned_size_t`, and
/// NVRTC rejects the call (H200, session 33).
#[cube]
pub(crate) fn bulk_copy_to_shared<E: CubePrimitive>(dst: u32, src: &[E], bytes: u32, bar: &Shared<Barrier>) {
    let p = unsafe { src.as_ptr_unchecked() };
    gpu_asm!(
        "{{ .reg .u64 g, t; .reg .u32 b; cvta.to.global.u64 g, {p}; cvta.to.shared.u64 t, {bar}; cvt.u32.u64 b, t; cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{dst}], [g], {bytes}, [b]; }}",
        p = in(_) p,
        bar = in(_) bar,
        dst = in(_) dst,
        bytes = in(_) bytes
    );
}
