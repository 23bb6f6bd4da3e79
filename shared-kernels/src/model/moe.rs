//! Mixture-of-experts MLP (transformers' `Qwen3MoeSparseMoeBlock`), on the same kernels for the
//! sampler and the trainer, with every token's arithmetic independent of which other tokens
//! share the launch or an expert:
//!
//! - the router's logits `x R^T` [rows, experts] on the batch-invariant matmul;
//! - per token on the host, in f32: the softmax (max, then the exponentials summed in expert
//!   order), the top-k by probability with ties to the lower expert index, the k weights
//!   renormalised to sum 1 when `norm_topk_prob` (the sum in top-k order), cast to the model's
//!   dtype, as transformers does;
//! - each expert's SwiGLU over the rows routed to it (gathered in row order), on the
//!   batch-invariant matmul, whose rows do not depend on how many rows the expert got, times
//!   each row's weight;
//! - each token's k outputs added in ascending expert order, starting from the first (the order
//!   of transformers' `index_add_` over a zero start, so the same sum).

use super::config::MoeConfig;
use super::{KernelSet, ModelError};
use crate::WeightLayout::OutIn;
use burn::tensor::{DType, Int, Tensor, TensorData};

/// The router's tensor name in layer `layer`.
pub fn router_name(layer: usize) -> String {
    format!("model.layers.{layer}.mlp.gate.weight")
}

/// Expert `e`'s gate, up and down tensor names in layer `layer`.
pub fn expert_names(layer: usize, e: usize) -> [String; 3] {
    let base = format!("model.layers.{layer}.mlp.experts.{e}");
    [format!("{base}.gate_proj.weight"), format!("{base}.up_proj.weight"), format!("{base}.down_proj.weight")]
}

/// A sparse layer's tensors with their shapes (HF layout), in checkpoint order.
pub fn sparse_tensors(c: &super::ModelConfig, m: &MoeConfig, layer: usize) -> Vec<(String, Vec<usize>)> {
    let (h, f) = (c.hidden_size, m.expert_intermediate);
    let mut out = vec![(router_name(layer), vec![m.num_experts, h])];
    for e in 0..m.num_experts {
        let [g, u, d] = expert_names(layer, e);
        out.extend([(g, vec![f, h]), (u, vec![f, h]), (d, vec![h, f])]);
    }
    out
}

/// One expert's SwiGLU weights, HF layout.
#[derive(Clone, Debug)]
pub struct Expert {
    pub gate: Tensor<2>,
    pub up: Tensor<2>,
    pub down: Tensor<2>,
}

/// A sparse MLP's weights: the router `[experts, hidden]` and the experts.
#[derive(Clone, Debug)]
pub struct MoeBlock {
    pub router: Tensor<2>,
    pub experts: Vec<Expert>,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    /// The load-balancing loss's constants while a GRPO step trains with one (its gradient
    /// joins the router's in the training path; sampling and scoring ignore it).
    pub aux: Option<std::sync::Arc<super::moe_train::RouterAux>>,
}

/// Each row's k experts, ascending by index, with their weights (f32 as computed).
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub experts: Vec<u32>,
    pub weights: Vec<f32>,
    /// Each expert's softmax probability summed over the rows, in row order (the
    /// load-balancing loss's `P`).
    pub prob_sums: Vec<f64>,
}

/// Every sparse layer's routing of one forward's rows, in layer order (`Forward::routing`): what
/// the telemetry compares between the sampler and the trainer and counts per expert.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoutingLog {
    pub layers: Vec<(usize, Routing)>,
}

impl RoutingLog {
    /// One number per row naming the experts every sparse layer chose for it (FNV-1a over the
    /// layer and expert indices): equal for rows routed alike; rows routed differently collide
    /// with a chance of about 2^-64. Empty for a dense model.
    pub fn row_digests(&self, rows: usize) -> Vec<u64> {
        if self.layers.is_empty() {
            return Vec::new();
        }
        let mut out = vec![0xcbf2_9ce4_8422_2325u64; rows];
        for (layer, routing) in &self.layers {
            let k = routing.experts.len() / rows.max(1);
            for (r, h) in out.iter_mut().enumerate() {
                for v in std::iter::once(*layer as u32).chain(routing.experts[r * k..(r + 1) * k].iter().copied()) {
                    for b in v.to_le_bytes() {
                        *h = (*h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
                    }
                }
            }
        }
        out
    }

    /// The load-balancing loss's sums over this pass's rows, every sparse layer's together
    /// (transformers concatenates the layers' router logits): (rows routed to each expert,
    /// each expert's summed softmax probability, rows times sparse layers).
    pub fn load_balancing_sums(&self, rows: usize, experts: usize) -> (Vec<u64>, Vec<f64>, usize) {
        let (mut counts, mut probs) = (vec![0u64; experts], vec![0.0f64; experts]);
        for (_, routing) in &self.layers {
            for &e in &routing.experts {
                counts[e as usize] += 1;
            }
            for (p, s) in probs.iter_mut().zip(&routing.prob_sums) {
                *p += s;
            }
        }
        (counts, probs, rows * self.layers.len())
    }

    /// Each sparse layer's tokens per expert over the rows `rows` of a pass of `total` rows.
    pub fn expert_load(&self, rows: std::ops::Range<usize>, total: usize, experts: usize) -> Vec<(usize, Vec<u64>)> {
        self.layers
            .iter()
            .map(|(layer, routing)| {
                let k = routing.experts.len() / total.max(1);
                let mut counts = vec![0u64; experts];
                for &e in &routing.experts[rows.start * k..rows.end * k] {
                    counts[e as usize] += 1;
                }
                (*layer, counts)
            })
            .collect()
    }
}

/// transformers' `load_balancing_loss_func` (unweighted; `top_k` when perfectly balanced) from
/// [`RoutingLog::load_balancing_sums`] over a step: `experts * sum_e (counts_e / N) (P_e / N)`.
pub fn load_balancing_loss(counts: &[u64], prob_sums: &[f64], layer_rows: usize) -> f64 {
    let n = layer_rows.max(1) as f64;
    counts.len() as f64 / (n * n) * counts.iter().zip(prob_sums).map(|(&c, &p)| c as f64 * p).sum::<f64>()
}

/// The routing of `logits` (`rows` x `experts`, row-major f32), per row alone (module docs).
pub fn route(logits: &[f32], experts: usize, top_k: usize, norm_topk_prob: bool) -> Routing {
    let rows = logits.len() / experts.max(1);
    let (mut chosen, mut weights) = (Vec::with_capacity(rows * top_k), Vec::with_capacity(rows * top_k));
    let mut prob_sums = vec![0.0f64; experts];
    for row in logits.chunks_exact(experts) {
        let probs = super::moe_train::softmax_row(row);
        for (t, &p) in prob_sums.iter_mut().zip(&probs) {
            *t += p as f64;
        }
        let mut order: Vec<u32> = (0..experts as u32).collect();
        // highest probability first; ties to the lower index (a stable sort on the index order)
        order.sort_by(|&a, &b| probs[b as usize].total_cmp(&probs[a as usize]));
        let top = &order[..top_k];
        let mut total = 0.0f32;
        for &e in top {
            total += probs[e as usize];
        }
        let mut picked: Vec<(u32, f32)> = top.iter().map(|&e| (e, if norm_topk_prob { probs[e as usize] / total } else { probs[e as usize] })).collect();
        picked.sort_by_key(|&(e, _)| e);
        for (e, w) in picked {
            chosen.push(e);
            weights.push(w);
        }
    }
    Routing { experts: chosen, weights, prob_sums }
}

/// Expert `e`'s SwiGLU over its rows `x`, each projection with the expert's LoRA adapter (if
/// any) added as `lora.rs` adds a dense layer's.
fn expert_swiglu(expert: &Expert, e: usize, x: Tensor<2>, kernels: KernelSet, adapters: Option<&super::lora::LayerAdapters>) -> Result<Tensor<2>, ModelError> {
    let project = |p: super::lora::Projection, x: Tensor<2>, w: &Tensor<2>| -> Result<Tensor<2>, ModelError> {
        let y = kernels.matmul(x.clone(), w.clone(), OutIn)?;
        match adapters.and_then(|a| a.expert(e, p).map(|ad| (ad, a.scale))) {
            Some((ad, scale)) => super::lora::add_adapter(y, x, ad, scale, kernels),
            None => Ok(y),
        }
    };
    use super::lora::Projection::{Down, Gate, Up};
    let act = crate::swiglu(project(Gate, x.clone(), &expert.gate)?, project(Up, x, &expert.up)?)?;
    project(Down, act, &expert.down)
}

/// Each expert's (row, slot) pairs `p` (row `p / k`), ascending, in one pass over the routing.
fn pairs_by_expert(routing: &Routing, experts: usize) -> Vec<Vec<usize>> {
    let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); experts];
    for (p, &e) in routing.experts.iter().enumerate() {
        by_expert[e as usize].push(p);
    }
    by_expert
}

fn int_rows(rows: &[usize], device: &burn::tensor::Device) -> Tensor<1, Int> {
    Tensor::<1, Int>::from_data(TensorData::new(rows.iter().map(|&r| r as i32).collect::<Vec<_>>(), [rows.len()]), device)
}

impl MoeBlock {
    /// The block's output `[rows, hidden]` for the normed rows `x`, and the routing it used.
    /// `sequence_starts` (the training path: the rows where each sequence begins) lays the
    /// experts' rows out for micro-batch-independent weight gradients (`moe_train.rs`);
    /// `padding` (the training rows' stand-ins) get no load-balancing gradient.
    /// `adapters`: the layer's LoRA adapters (each expert's, `LayerAdapters::experts`), added
    /// to each expert's projections as `lora.rs` adds them to a dense layer's.
    pub fn forward(&self, x: Tensor<2>, kernels: KernelSet, sequence_starts: Option<&[usize]>, padding: &[usize], adapters: Option<&super::lora::LayerAdapters>) -> Result<(Tensor<2>, Routing), ModelError> {
        let [n, hidden] = x.dims();
        let (experts, k) = (self.experts.len(), self.top_k);
        let device = x.device();
        let logits = kernels.matmul(x.clone(), self.router.clone(), OutIn)?;
        let training = logits.is_autodiff();
        let plain = if training { logits.clone().inner() } else { logits.clone() };
        let host = plain.cast(DType::F32).into_data().convert::<f32>().try_to_vec::<f32>().map_err(|e| ModelError::Input(format!("reading the router's logits: {e:?}")))?;
        let routing = route(&host, experts, k, self.norm_topk_prob);
        if !training {
            let out = self.experts_for_sampling(x, &routing, kernels, adapters)?;
            return Ok((out, routing));
        }
        // the weights, an op of the logits (the router's gradient); a zero row and weight past
        // the end for the training layout's padding
        let aux = self.aux.as_ref().map(|a| (a.clone(), padding.to_vec()));
        let w = super::moe_train::routing_weights(logits, &host, &routing.experts, &routing.weights, k, self.norm_topk_prob, aux)?;
        let xs = Tensor::cat(vec![x.clone(), Tensor::zeros([1, hidden], (&device, x.dtype()))], 0);
        let ws = Tensor::cat(vec![w, Tensor::zeros([1], (&device, x.dtype()))], 0);
        // each expert's rows, and where each (row, slot) output lands in their concatenation
        let mut at = vec![0usize; n * k];
        let mut outputs = Vec::new();
        let mut offset = 0;
        for (e, (expert, pairs)) in self.experts.iter().zip(&pairs_by_expert(&routing, experts)).enumerate() {
            if pairs.is_empty() {
                continue;
            }
            let laid: Vec<Option<usize>> = match sequence_starts {
                Some(starts) => super::moe_train::padded_pairs(pairs, k, starts),
                None => pairs.iter().map(|&p| Some(p)).collect(),
            };
            let rows: Vec<usize> = laid.iter().map(|p| p.map_or(n, |p| p / k)).collect();
            let slots: Vec<usize> = laid.iter().map(|p| p.unwrap_or(n * k)).collect();
            let xe = xs.clone().select(0, int_rows(&rows, &device));
            let h = expert_swiglu(expert, e, xe, kernels, adapters)?;
            let we = ws.clone().select(0, int_rows(&slots, &device)).reshape([laid.len(), 1]);
            outputs.push(super::moe_train::weighted(h, we)?);
            for (j, p) in laid.iter().enumerate() {
                if let Some(p) = p {
                    at[*p] = offset + j;
                }
            }
            offset += laid.len();
        }
        let all = Tensor::cat(outputs, 0).select(0, int_rows(&at, &device)).reshape([n, k, hidden]);
        let mut out = all.clone().slice([0..n, 0..1, 0..hidden]).reshape([n, hidden]);
        for s in 1..k {
            out = crate::add(out, all.clone().slice([0..n, s..s + 1, 0..hidden]).reshape([n, hidden]))?;
        }
        Ok((out, routing))
    }

    /// The sampling path (no autodiff): the training path's arithmetic element for element
    /// (each expert's SwiGLU on its rows in (row, slot) order, times the row's weight cast to
    /// the model's dtype, the k slots added in order) with fewer launches and uploads: one
    /// gather of every expert's rows, each expert's projections on its slice of it, one weight
    /// multiply, one gather per slot.
    fn experts_for_sampling(&self, x: Tensor<2>, routing: &Routing, kernels: KernelSet, adapters: Option<&super::lora::LayerAdapters>) -> Result<Tensor<2>, ModelError> {
        let [n, hidden] = x.dims();
        let k = self.top_k;
        let device = x.device();
        let by_expert = pairs_by_expert(routing, self.experts.len());
        let order: Vec<usize> = by_expert.concat();
        let gathered = x.clone().select(0, int_rows(&order.iter().map(|&p| p / k).collect::<Vec<_>>(), &device));
        let weights: Vec<f32> = order.iter().map(|&p| routing.weights[p]).collect();
        let mut outputs = Vec::new();
        let mut start = 0;
        for (e, (expert, pairs)) in self.experts.iter().zip(&by_expert).enumerate() {
            if pairs.is_empty() {
                continue;
            }
            let xe = gathered.clone().slice([start..start + pairs.len(), 0..hidden]);
            outputs.push(expert_swiglu(expert, e, xe, kernels, adapters)?);
            start += pairs.len();
        }
        let weights = Tensor::<1>::from_data(TensorData::new(weights, [n * k]), &device).cast(x.dtype()).reshape([n * k, 1]);
        let weighted = Tensor::cat(outputs, 0) * weights;
        let mut at = vec![0usize; n * k];
        for (i, &p) in order.iter().enumerate() {
            at[p] = i;
        }
        let slot = |s: usize| weighted.clone().select(0, int_rows(&(0..n).map(|r| at[r * k + s]).collect::<Vec<_>>(), &device));
        let mut out = slot(0);
        for s in 1..k {
            out = crate::add(out, slot(s))?;
        }
        Ok(out)
    }
}

#[cfg(test)]
#[path = "moe_tests.rs"]
mod tests;
