//! The kernel choices' values, each spelled once as its `LOCKSTEP_*` variable spells it: the
//! parser, the name a table prints and the list an error or docs/config.md shows all come from
//! that one list ([`spelled!`]). At the bottom of the crate: the kernel families, the choice
//! ([`super::KernelChoice`]) and the variables' declarations ([`crate::knobs`]) all read them.

/// An enum whose variants each carry the text a variable spells them with: `VALUES` (every
/// text, in order), `name` and `parse` are generated from that one list.
macro_rules! spelled {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, as the variable spells it.
            pub const VALUES: &'static [&'static str] = &[$($text),+];

            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The value `text` spells, if any.
            pub fn parse(text: &str) -> Option<Self> {
                match text {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

spelled! {
/// The matmul kernels, all batch invariant on their own; which one runs is fixed per process by
/// dtype, device and `LOCKSTEP_MATMUL`, never by the call's shape, so the sampler and the
/// trainer always share it.
pub enum MatmulKernel {
    /// One f32 accumulator per output, any dtype, any runtime.
    Scalar = "scalar",
    /// lockstep's own cmma kernels: the decode-shaped one ([`crate::ops::matmul::skinny`]) where
    /// M <= 64 and its shape rules hold, else tiles: 128x128 tiles fed by asynchronous copies
    /// ([`crate::ops::matmul::tc_async`]) for outputs of at least [`crate::ops::matmul::ASYNC_MIN_OUTPUTS`] elements whose
    /// vector width allows them, 128x64 register-prefetch tiles ([`crate::ops::matmul::tc`]) otherwise.
    TensorCore = "tc",
    /// [`crate::ops::matmul::tc`]'s register-prefetch tiles at every M (tc as it was before the
    /// decode kernel and the asynchronous copies), for comparisons; same bits as `tc`.
    TensorCoreTiles = "tc-tiles",
    /// The asynchronous-copy tiles at every M, for comparisons; same bits as `tc`.
    TensorCoreAsync = "tc-async",
    /// The default where the device has it (CUDA compute capability 9.x; elsewhere the default
    /// is `tc`): `tc`'s decode kernel where `tc` runs it (M <= 64), else warpgroup `wgmma`
    /// tiles ([`crate::ops::matmul::wgmma`]) wherever every row stride is a whole 16 bytes (both
    /// weight layouts, xᵀ read in place), `tc`'s tiles otherwise. Same bits as `tc`: the battery
    /// compares them row by row and the f32 accumulators against a plain cmma chain.
    Warpgroup = "wgmma",
    /// cubek's double-buffered cmma kernel with frozen blueprints ([`crate::ops::matmul::pipelined`]).
    Pipelined = "pipelined",
    /// [`MatmulKernel::Pipelined`] for large outputs (M x N >= 3 * 2^20: prefill, training) and
    /// for wide weights at any M (an lm_head's N >= 16384, where its 16-row tiles win), else
    /// [`MatmulKernel::TensorCore`] (decode-sized launches, where its lower host cost per launch
    /// wins; crossovers measured on the H200, docs/perf.md). Both run the same 16x16x16
    /// instruction over k in ascending order from a zero accumulator, so a row's bits do not
    /// depend on which of them ran: the battery checks tc rows against pipelined rows. Decode
    /// shapes (M <= 64) run the skinny kernel, as under `tc`.
    Hybrid = "hybrid",
}
}

spelled! {
/// The attention kernels; all batch and chunk invariant, with different arithmetic, so one is
/// chosen per process (`LOCKSTEP_ATTENTION`) and device, dtype and head size, never per call.
/// (`LOCKSTEP_ATTENTION` also takes `auto`: [`super::KernelChoice::attention`] `None`.)
pub enum AttentionKernel {
    /// Split-KV with the split's products on tensor cores ([`crate::ops::attention::decode::cmma`]; CUDA, bf16/f16).
    SplitKvTensorCore = "split_kv_tc",
    /// One cube per (row, head, split), then a fixed-order combine ([`crate::ops::attention::decode::split_kv`]).
    SplitKv = "split_kv",
    /// One cube per (row, head) walking the splits in order (`ops/attention/mod.rs`'s kernel).
    Sequential = "sequential",
}
}

spelled! {
/// Which kernels run the tensor-core attention: the register-fragment ones (prefill tiles:
/// [`crate::ops::attention::prefill::mma_flash`], decode rows: [`crate::ops::attention::decode::mma_decode`]) or the `cmma`
/// ones ([`crate::ops::attention::prefill::cmma_flash`], [`crate::ops::attention::decode::cmma`]'s partial kernel). All give the
/// same bits, so the choice changes time only.
pub enum TcKernels {
    /// `mma.sync` fragments in registers (CUDA only); 64 queries per prefill cube.
    Mma = "mma",
    /// `cmma` fragments through shared memory; 32 queries per prefill cube.
    Cmma = "cmma",
}
}

spelled! {
/// Where the rmsnorm plane kernels run (`ops/rmsnorm_planes.rs`).
pub enum NormPlanes {
    /// On devices whose planes have one size and that advertise plane operations (CUDA).
    On = "on",
    /// One cube a row everywhere.
    Off = "off",
    /// Also where planes of one size shuffle but no plane operations are advertised (CI's
    /// lavapipe): the end-to-end tests' way to train on the plane kernels.
    Force = "force",
}
}
