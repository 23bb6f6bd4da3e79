//! Which attention kernel runs, in one function: [`route`] maps what a launch computes (a
//! decode row, a prefill tile, the training backward), where (runtime, dtype, head size, query
//! heads per KV head, cache length) and the process's choices (`LOCKSTEP_ATTENTION`,
//! `LOCKSTEP_ATTENTION_TC`, `LOCKSTEP_DECODE_LAUNCH`, `LOCKSTEP_ATTENTION_BACKWARD`) to the
//! kernel, named by its file (under `ops/attention/`: `decode/`, `prefill/`, `backward/`, with
//! what they share in `common/`). The dispatch (`mod.rs`, `tensor_cores.rs`, `backward/mod.rs`) asks it
//! and launches what it answers. Every answer is batch and chunk invariant; answers with other
//! arithmetic (the families) are fixed per process, never per call.

use crate::kernel_choice::{AttentionKernel, TcKernels};
use crate::ops::attention::common::splits::KV_SPLIT;
use burn::tensor::DType;

/// Query heads the narrow decode kernel holds in a cube (the `mma`'s 8 columns).
pub const NARROW_QUERIES: usize = 8;

/// What a launch computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Rows attended one at a time (a decode step's rows; any row outside a prefill tile).
    Decode,
    /// A tile of 2+ consecutive rows of one sequence (prefill, the training forward).
    Prefill,
    /// The training backward.
    Backward,
}

/// Where a launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    pub cuda: bool,
    pub dtype: DType,
    /// Whether the device runs 16x16x16 tensor-core products in `dtype`.
    pub tensor_cores: bool,
    pub head_dim: usize,
    /// Query heads per KV head.
    pub group: usize,
    /// The cache positions a sequence may have.
    pub max_len: usize,
}

/// The process's choices (and a test's or benchmark's scoped override of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choices {
    /// `LOCKSTEP_ATTENTION`; `None`: auto.
    pub attention: Option<AttentionKernel>,
    /// `LOCKSTEP_ATTENTION_TC`.
    pub set: TcKernels,
    /// `LOCKSTEP_DECODE_LAUNCH`'s staging; `None`: auto.
    pub decode_staging: Option<Staging>,
    /// `LOCKSTEP_ATTENTION_BACKWARD = tensor_cores`.
    pub backward_on_tensor_cores: bool,
}

pub use crate::kernel_choice::Staging;

/// The kernel, by file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `mod.rs`'s kernel: one cube per (row, head) walking the 64-key splits in order.
    Sequential,
    /// `decode/split_kv.rs`: one cube per (row, head, split) on CUDA cores, then the fixed-order combine.
    SplitKv,
    /// `decode/cmma.rs`: decode partials on `cmma` through shared memory, then the combine.
    CmmaPartials,
    /// `prefill/cmma_flash.rs`: a prefill tile walking its splits in one cube on `cmma`.
    CmmaFlash,
    /// `decode/mma_decode.rs` (`Two`, `One`) or `decode/mma_decode_narrow.rs` (`Narrow`): decode partials on
    /// `mma.sync` fragments in registers, then the combine.
    MmaPartials(Staging),
    /// `prefill/mma_flash.rs`: a prefill tile on `mma.sync` fragments.
    MmaFlash,
    /// `backward/mma_backward.rs`: every sequence's backward in one launch set on `mma.sync` tiles.
    MmaBackward,
    /// `backward/mod.rs`: the backward a sequence at a time (dense burn ops, or CUDA-core kernels
    /// past 2^29 scores).
    PerSequenceBackward,
}

impl Kernel {
    /// Whether it runs on tensor cores (the `split_kv_tc` family).
    pub fn on_tensor_cores(self) -> bool {
        matches!(self, Kernel::CmmaPartials | Kernel::CmmaFlash | Kernel::MmaPartials(_) | Kernel::MmaFlash)
    }
}

/// Query heads per cube for a group of `group` query heads per KV head: the largest divisor of
/// the group that fits a tensor-core cube's 32 queries. A property of the model, never of the
/// batch.
pub fn heads_per_cube(group: usize) -> usize {
    (1..=group.min(32)).rev().find(|h| group % h == 0).unwrap_or(1)
}

/// The `mma` decode partials' staging when `LOCKSTEP_DECODE_LAUNCH` leaves it to the launch: the
/// narrow kernel wherever a cube's heads fit its 8 columns (3-8% faster than one stage at 16-256
/// rows x 1,024-4,096 keys), else one stage.
pub fn auto_decode_staging(heads_per_cube: usize) -> Staging {
    if heads_per_cube <= NARROW_QUERIES { Staging::Narrow } else { Staging::One }
}

/// Whether the tensor-core family can run the call: 16-bit tensor cores and a head size of 32,
/// 64, 96 or 128 (the shared stages hold a 64-key split of whole head rows).
pub fn tensor_core_family_runs(call: &Call) -> bool {
    call.tensor_cores && call.head_dim % 32 == 0 && (32..=128).contains(&call.head_dim)
}

/// The family a forward call runs: the one chosen, else (`auto`) `split_kv_tc` where it runs,
/// `split_kv` elsewhere; a function of device, dtype and head size only.
pub fn family(call: &Call, choices: &Choices) -> AttentionKernel {
    choices.attention.unwrap_or(if tensor_core_family_runs(call) { AttentionKernel::SplitKvTensorCore } else { AttentionKernel::SplitKv })
}

/// The kernel `phase` runs for `call` under `choices`. (The family's availability is checked by
/// the caller, which names the variable: asking for `split_kv_tc` where it cannot run is an
/// error, not another kernel.)
pub fn route(phase: Phase, call: &Call, choices: &Choices) -> Kernel {
    // the register-fragment set is inline PTX: CUDA only
    let set = if call.cuda { choices.set } else { TcKernels::Cmma };
    if phase == Phase::Backward {
        let sixteen_bit = matches!(call.dtype, DType::BF16 | DType::F16);
        let on_mma = choices.backward_on_tensor_cores && call.cuda && sixteen_bit && (call.head_dim == 64 || call.head_dim == 128) && set == TcKernels::Mma;
        return if on_mma { Kernel::MmaBackward } else { Kernel::PerSequenceBackward };
    }
    match family(call, choices) {
        AttentionKernel::Sequential => Kernel::Sequential,
        // every prefix of a cache this short fits one split, where the two give the same bits:
        // the one-launch kernel does split_kv's work (a rule of the cache shape, never the rows)
        AttentionKernel::SplitKv if call.max_len <= KV_SPLIT => Kernel::Sequential,
        AttentionKernel::SplitKv => Kernel::SplitKv,
        AttentionKernel::SplitKvTensorCore => match (phase, set) {
            (Phase::Prefill, TcKernels::Mma) => Kernel::MmaFlash,
            (Phase::Prefill, TcKernels::Cmma) => Kernel::CmmaFlash,
            (_, TcKernels::Cmma) => Kernel::CmmaPartials,
            (_, TcKernels::Mma) => Kernel::MmaPartials(choices.decode_staging.unwrap_or(auto_decode_staging(heads_per_cube(call.group)))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_table() {
        let default = Choices { attention: None, set: TcKernels::Mma, decode_staging: None, backward_on_tensor_cores: true };
        let h100 = |dtype, head_dim, group| Call { cuda: true, dtype, tensor_cores: dtype != DType::F32, head_dim, group, max_len: 4096 };
        let lavapipe = |dtype| Call { cuda: false, dtype, tensor_cores: false, head_dim: 128, group: 2, max_len: 4096 };
        use Kernel::*;
        use Phase::*;
        let with = |f: fn(&mut Choices)| {
            let mut c = default;
            f(&mut c);
            c
        };
        let rows: Vec<(Phase, Call, Choices, Kernel)> = vec![
            // Qwen3 (16 query / 8 KV heads) and Llama 3.1 8B (32 / 8) on an H100 in bf16
            (Decode, h100(DType::BF16, 128, 2), default, MmaPartials(Staging::Narrow)),
            (Decode, h100(DType::BF16, 128, 4), default, MmaPartials(Staging::Narrow)),
            (Prefill, h100(DType::BF16, 128, 2), default, MmaFlash),
            (Backward, h100(DType::BF16, 128, 2), default, MmaBackward),
            // a group past the narrow kernel's 8 columns
            (Decode, h100(DType::BF16, 128, 16), default, MmaPartials(Staging::One)),
            (Decode, h100(DType::BF16, 128, 2), with(|c| c.decode_staging = Some(Staging::Two)), MmaPartials(Staging::Two)),
            // the cmma set
            (Decode, h100(DType::BF16, 128, 2), with(|c| c.set = TcKernels::Cmma), CmmaPartials),
            (Prefill, h100(DType::BF16, 128, 2), with(|c| c.set = TcKernels::Cmma), CmmaFlash),
            (Backward, h100(DType::BF16, 128, 2), with(|c| c.set = TcKernels::Cmma), PerSequenceBackward),
            // head sizes: 96 has the tensor-core forward but not its backward; 256 neither
            (Decode, h100(DType::BF16, 96, 2), default, MmaPartials(Staging::Narrow)),
            (Backward, h100(DType::BF16, 96, 2), default, PerSequenceBackward),
            (Decode, h100(DType::BF16, 256, 2), default, SplitKv),
            // f32 on CUDA: CUDA cores
            (Decode, h100(DType::F32, 128, 2), default, SplitKv),
            (Prefill, h100(DType::F32, 128, 2), default, SplitKv),
            (Backward, h100(DType::F32, 128, 2), default, PerSequenceBackward),
            // choices
            (Decode, h100(DType::BF16, 128, 2), with(|c| c.attention = Some(AttentionKernel::Sequential)), Sequential),
            (Decode, h100(DType::BF16, 128, 2), with(|c| c.attention = Some(AttentionKernel::SplitKv)), SplitKv),
            (Decode, Call { max_len: 64, ..h100(DType::BF16, 128, 2) }, with(|c| c.attention = Some(AttentionKernel::SplitKv)), Sequential),
            (Backward, h100(DType::BF16, 128, 2), with(|c| c.backward_on_tensor_cores = false), PerSequenceBackward),
            // CI's lavapipe: no tensor cores, no PTX
            (Decode, lavapipe(DType::F32), default, SplitKv),
            (Prefill, lavapipe(DType::F32), default, SplitKv),
            (Backward, lavapipe(DType::F32), default, PerSequenceBackward),
            (Decode, Call { max_len: 48, ..lavapipe(DType::F32) }, default, Sequential),
            // a requested tensor-core family off CUDA takes the cmma set (the caller checks it runs)
            (Decode, lavapipe(DType::BF16), with(|c| c.attention = Some(AttentionKernel::SplitKvTensorCore)), CmmaPartials),
        ];
        for (phase, call, choices, want) in rows {
            assert_eq!(route(phase, &call, &choices), want, "{phase:?} {call:?} {choices:?}");
        }
    }
}
