//! What one forward carries through its layers: the pass's shared state ([`Pass`]: rows, cache,
//! trace, kernels, config), the residual stream between layers ([`Stream`]) and the optional
//! per-op [`Trace`]. Below both the layer and the layer loop (`forward.rs`), which use it.

use super::{KernelSet, KvCache, ModelConfig, Rows};
use crate::RopeTables;
use burn::tensor::{Int, Tensor, TensorData};

/// Every op's output of a traced forward, `[rows, features]` under a name like "layer 3 q_proj"
/// (for the auditor that finds where two paths first differ), or only row `only_row` of each
/// (copied out, so a trace of a large batch keeps one row per op alive, not the whole batch;
/// then the LM head runs on that row only).
#[derive(Default)]
pub struct Trace {
    pub only_row: Option<usize>,
    pub entries: Vec<(String, Tensor<2>)>,
}

impl Trace {
    pub(super) fn record(&mut self, name: String, t: &Tensor<2>) {
        let kept = match self.only_row {
            None => t.clone(),
            Some(r) => t.clone().select(0, Tensor::<1, Int>::from_data(TensorData::new(vec![r as i32], [1]), &t.device())),
        };
        self.entries.push((name, kept));
    }
}

/// What every layer of one forward shares.
pub(crate) struct Pass<'a> {
    pub rows: &'a Rows,
    pub slots: Tensor<1, Int>,
    pub positions: Tensor<1, Int>,
    pub cache: Option<&'a mut KvCache>,
    pub trace: Option<&'a mut Trace>,
    /// Where the sparse layers leave their routing, when asked (`Forward::routing`).
    pub routing: Option<&'a mut super::moe::RoutingLog>,
    pub kernels: KernelSet,
    pub config: &'a ModelConfig,
    pub rope: &'a RopeTables,
}

impl Pass<'_> {
    pub fn eps(&self) -> f32 {
        self.config.rms_norm_eps as f32
    }
    pub fn scale(&self) -> f32 {
        1.0 / (self.config.head_dim as f32).sqrt()
    }
    pub fn traced(&self) -> bool {
        self.trace.is_some()
    }
    /// Hands `t` to the trace, if any (`name` is built only then).
    pub fn record(&mut self, name: impl FnOnce() -> String, t: &Tensor<2>) {
        if let Some(trace) = self.trace.as_deref_mut() {
            trace.record(name(), t);
        }
    }
}

/// The residual stream between layers: `h`, and on the fused decode path its RMSNorm by the
/// next layer's input norm (or the final norm), computed in the launch of the residual add.
pub(crate) struct Stream {
    pub h: Tensor<2>,
    pub normed: Option<Tensor<2>>,
}
