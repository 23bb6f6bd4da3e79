//! Which kernel of each family this process runs: one typed value, parsed once from the
//! `LOCKSTEP_*` kernel variables that [`crate::knobs`] declares, and read by each family's front
//! door (matmul, attention, its backward, the weight-gradient fold) and by the engine (decode
//! fusion). Every choice here but one gives the same bits (the battery compares them row by
//! row) and changes time only; `LOCKSTEP_BACKWARD_MATH` changes the gradients' bits (never a
//! logprob's), which [`KernelChoice::arithmetic`] names so a run can record it. They are
//! process-wide rather than per call: a row's result must not depend on which caller launched it.
//!
//! The benchmark-only tuning variables (tile and launch shapes, `tuning.rs`) are a field of the
//! choice, parsed with it, so a typo in any of them stops a run at its start with the variable
//! named, on every device, rather than at the first launch that would read it. The choices'
//! values are spelled once, in `values.rs`.

mod tuning;
mod values;

pub use tuning::{parse_flash_warps, DecodeLaunch, SkinnyLaunch, Staging, TileShape, TilePick, Tuning, WgmmaSchedule, WgmmaTiles, TC_ASYNC_SHARED_LIMIT};
pub use values::{AttentionKernel, MatmulKernel, NormPlanes, TcKernels};
use crate::KernelError;

thread_local! {
    /// [`KernelChoice::scoped`]'s choice on this thread.
    static SCOPED: std::cell::Cell<Option<KernelChoice>> = const { std::cell::Cell::new(None) };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelChoice {
    /// `LOCKSTEP_MATMUL`; `None`: the device's default (wgmma on compute capability 9.x, tc on
    /// other tensor-core devices, else scalar).
    pub matmul: Option<MatmulKernel>,
    /// `LOCKSTEP_ATTENTION`; `None` (`auto`): split_kv_tc where the tensor-core attention runs,
    /// else split_kv.
    pub attention: Option<AttentionKernel>,
    /// `LOCKSTEP_ATTENTION_TC`: the register-fragment (`mma`) or shared-memory (`cmma`) kernels of
    /// the tensor-core attention.
    pub attention_tc: TcKernels,
    /// `LOCKSTEP_ATTENTION_BACKWARD`: the tensor-core backward where it applies (`tensor_cores`),
    /// or the per-sequence paths everywhere (`per_sequence`).
    pub attention_backward_on_tensor_cores: bool,
    /// `LOCKSTEP_BACKWARD_STATS`: the tensor-core backward's softmax statistics from the
    /// training forward's flash kernel (`forward`) or from its own pass over the keys
    /// (`recompute`); the same bits.
    pub backward_stats_from_forward: bool,
    /// `LOCKSTEP_BACKWARD_MATH`: the tensor-core backward's probabilities with the accurate
    /// `exp` and a division (`exact`) or `2^x` approximated and a reciprocal (`fast`).
    pub backward_fast_math: bool,
    /// `LOCKSTEP_FOLD_KERNEL`: the weight-gradient fold on the warpgroup kernel (`wgmma`) or the
    /// plain cmma chain (`cmma`).
    pub fold_on_wgmma: bool,
    /// `LOCKSTEP_DECODE_FUSION`: the engine's fused decode projections (`on`) or the unfused layer.
    pub decode_fusion: bool,
    /// `LOCKSTEP_DECODE_GRAPHS`: the engine replays steps whose rows are all sampled as
    /// captured graphs (`on`, the default), or launches every step (`off`).
    pub decode_graphs: bool,
    /// `LOCKSTEP_DECODE_GRAPH_PADDING`: replayed steps padded to 1, 2, 4, then multiples of 8
    /// rows (`on`, the default), or one graph per exact row count (`off`).
    pub decode_graph_padding: bool,
    /// `LOCKSTEP_NORM_PLANES`: rmsnorm and its backward over rows of 128 values (the per-head
    /// q/k norms) one plane a row or one cube a row (`off`, the default until measured).
    pub norm_planes: NormPlanes,
    /// The benchmark-only launch and tile shapes (same bits whatever they are).
    pub tuning: Tuning,
}

impl Default for KernelChoice {
    fn default() -> Self {
        KernelChoice { matmul: None, attention: None, attention_tc: TcKernels::Mma, attention_backward_on_tensor_cores: true, backward_stats_from_forward: true, backward_fast_math: true, fold_on_wgmma: true, decode_fusion: true, decode_graphs: true, decode_graph_padding: true, norm_planes: NormPlanes::On, tuning: Tuning::default() }
    }
}

/// `var`'s value parsed by `parse`, `None` when unset; a bad value's error names the variable,
/// the value and `choices`.
fn read<T>(var: &str, choices: &[&str], parse: impl Fn(&str) -> Option<T>) -> Result<Option<T>, String> {
    match crate::knobs::var(var) {
        None => Ok(None),
        Some(text) => parse(text.trim()).map(Some).ok_or_else(|| format!("{var}={text:?} is not one of {}", choices.join(", "))),
    }
}

/// A two-valued variable: `Some(true)` for `yes`, `Some(false)` for `no`, `None` when unset.
fn either(var: &str, yes: &str, no: &str) -> Result<Option<bool>, String> {
    read(var, &[yes, no], |t| if t == yes { Some(true) } else if t == no { Some(false) } else { None })
}

impl KernelChoice {
    /// The choice the environment makes, parsed now (tests and tools; runs use [`Self::process`]).
    pub fn from_env() -> Result<KernelChoice, String> {
        let default = KernelChoice::default();
        let choice = KernelChoice {
            matmul: read("LOCKSTEP_MATMUL", MatmulKernel::VALUES, MatmulKernel::parse)?,
            attention: read("LOCKSTEP_ATTENTION", &[&["auto"], AttentionKernel::VALUES].concat(), |t| if t == "auto" { Some(None) } else { AttentionKernel::parse(t).map(Some) })?.flatten(),
            attention_tc: read("LOCKSTEP_ATTENTION_TC", TcKernels::VALUES, TcKernels::parse)?.unwrap_or(default.attention_tc),
            attention_backward_on_tensor_cores: either("LOCKSTEP_ATTENTION_BACKWARD", "tensor_cores", "per_sequence")?.unwrap_or(default.attention_backward_on_tensor_cores),
            backward_stats_from_forward: either("LOCKSTEP_BACKWARD_STATS", "forward", "recompute")?.unwrap_or(default.backward_stats_from_forward),
            backward_fast_math: either("LOCKSTEP_BACKWARD_MATH", "fast", "exact")?.unwrap_or(default.backward_fast_math),
            fold_on_wgmma: either("LOCKSTEP_FOLD_KERNEL", "wgmma", "cmma")?.unwrap_or(default.fold_on_wgmma),
            decode_fusion: either("LOCKSTEP_DECODE_FUSION", "on", "off")?.unwrap_or(default.decode_fusion),
            decode_graphs: either("LOCKSTEP_DECODE_GRAPHS", "on", "off")?.unwrap_or(default.decode_graphs),
            decode_graph_padding: either("LOCKSTEP_DECODE_GRAPH_PADDING", "on", "off")?.unwrap_or(default.decode_graph_padding),
            norm_planes: read("LOCKSTEP_NORM_PLANES", NormPlanes::VALUES, NormPlanes::parse)?.unwrap_or(default.norm_planes),
            tuning: Tuning::from_env()?,
        };
        either("LOCKSTEP_NVRTC_PCH", "on", "off")?; // read by kernel_cache::enable
        // a fault the engine tests inject: a misspelt one would silently inject nothing
        if let Some(v) = crate::knobs::var("LOCKSTEP_FAULT_GRAPH_CAPTURE").filter(|v| !["upload", "cross-stream"].contains(&v.as_str())) {
            return Err(format!("LOCKSTEP_FAULT_GRAPH_CAPTURE={v:?} is not one of upload, cross-stream"));
        }
        Ok(choice)
    }

    /// The variables among these whose value changes a bit of a training run, each with the
    /// value this choice stands for (as the variable spells it), where the variable applies:
    /// the backward's math only on CUDA, the one runtime with the tensor-core backward.
    pub fn arithmetic(&self) -> Vec<(&'static str, &'static str)> {
        let mut out = Vec::new();
        if crate::device::runtime_name() == "cuda" {
            out.push(("LOCKSTEP_BACKWARD_MATH", if self.backward_fast_math { "fast" } else { "exact" }));
        }
        out
    }

    /// The choice this thread runs under: [`Self::scoped`]'s inside one, else the process's.
    /// Every family reads its kernel from here.
    pub fn current() -> Result<KernelChoice, KernelError> {
        match SCOPED.with(|c| c.get()) {
            Some(choice) => Ok(choice),
            None => Self::process().copied(),
        }
    }

    /// Runs `f` with this thread's choice changed by `change` (the one scoped override: tests
    /// and benchmarks compare, in one process, kernels or launches whose bits are equal; e.g.
    /// the battery's two tensor-core attention sets, the bench's unfused decode and decode
    /// launches).
    pub fn scoped<R>(change: impl FnOnce(&mut KernelChoice), f: impl FnOnce() -> R) -> Result<R, KernelError> {
        let mut choice = Self::current()?;
        change(&mut choice);
        let before = SCOPED.with(|c| c.replace(Some(choice)));
        let out = f();
        SCOPED.with(|c| c.set(before));
        Ok(out)
    }

    /// This process's choice, parsed on first use and kept; a bad variable is the same error on
    /// every call. `lockstep` asks for it before any work, so a typo stops the run at once.
    pub fn process() -> Result<&'static KernelChoice, KernelError> {
        static CHOICE: std::sync::OnceLock<Result<KernelChoice, String>> = std::sync::OnceLock::new();
        CHOICE.get_or_init(KernelChoice::from_env).as_ref().map_err(|e| KernelError::new("kernel choice", e.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unset_environment_is_the_default_choice() {
        // CI sets none of the kernel variables; a developer's shell may, so compare only then
        let kernel_vars = ["LOCKSTEP_MATMUL", "LOCKSTEP_ATTENTION", "LOCKSTEP_ATTENTION_TC", "LOCKSTEP_ATTENTION_BACKWARD", "LOCKSTEP_BACKWARD_STATS", "LOCKSTEP_BACKWARD_MATH", "LOCKSTEP_FOLD_KERNEL", "LOCKSTEP_DECODE_FUSION", "LOCKSTEP_DECODE_GRAPHS", "LOCKSTEP_DECODE_GRAPH_PADDING", "LOCKSTEP_NORM_PLANES", "LOCKSTEP_SKINNY", "LOCKSTEP_TC_TILES", "LOCKSTEP_WGMMA_TILES", "LOCKSTEP_WGMMA_PICK", "LOCKSTEP_WGMMA_SCHEDULE", "LOCKSTEP_FLASH_WARPS", "LOCKSTEP_DECODE_LAUNCH"];
        if kernel_vars.iter().all(|v| !crate::knobs::is_set(v)) {
            assert_eq!(KernelChoice::from_env().unwrap(), KernelChoice::default());
            assert_eq!(*KernelChoice::process().unwrap(), KernelChoice::default());
        }
    }

    #[test]
    fn the_values_parse_to_their_kernels() {
        // a bad value in the environment, end to end: trainer/tests/cli.rs
        for (text, want) in [("tc", Some(MatmulKernel::TensorCore)), ("wgmma", Some(MatmulKernel::Warpgroup)), ("pipelinedd", None)] {
            assert_eq!(MatmulKernel::parse(text), want, "{text}");
        }
        for (text, want) in [("split_kv", Some(AttentionKernel::SplitKv)), ("split_kv_tc", Some(AttentionKernel::SplitKvTensorCore)), ("auto", None), ("flash", None)] {
            assert_eq!(AttentionKernel::parse(text), want, "{text}");
        }
        for kernel in [MatmulKernel::Scalar, MatmulKernel::Warpgroup, MatmulKernel::Hybrid] {
            assert_eq!(MatmulKernel::parse(kernel.name()), Some(kernel));
        }
        assert_eq!(TcKernels::VALUES, ["mma", "cmma"]);
    }
}
