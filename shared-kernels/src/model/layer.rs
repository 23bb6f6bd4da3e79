//! One decoder layer: its weights and its forward.
//!
//!   rmsnorm -> q,k,v proj (+ bias: Qwen2) -> (Qwen3: per-head q/k rmsnorm) -> rope
//!   -> causal GQA attention -> o proj -> + residual -> rmsnorm -> silu(gate) * up -> down
//!   -> + residual
//!
//! A layer runs unfused (training, prefill without fused weights, the ablation's kernels) or on
//! the decode path's fused launches ([`FusedProjections`], `attention_inputs`, `add_rmsnorm`,
//! `swiglu_halves`): 9 launches instead of 19, the same bits, which the model contract checks.

use super::cache::take;
use super::pass::{Pass, Stream};
use super::lora::{add_adapter, LayerAdapters, Projection};
use super::moe::{self, Expert, MoeBlock};
use super::names::LayerTensor;
use super::{ModelConfig, ModelError};
use crate::ops::attention::attention_for_rows;
use crate::ops::attention::decode::inputs::attention_inputs;
use crate::ops::kv_cache::write_kv_cache_paged;
use crate::{add, add_rmsnorm, bias_add, causal_attention, rope, swiglu, swiglu_halves, QkNorm, WeightLayout::OutIn};
use burn::tensor::Tensor;

/// One decoder layer's weights, in HF layout (`[out, in]` projections).
#[derive(Clone, Debug)]
pub struct Layer {
    pub input_norm: Tensor<1>,
    pub q_proj: Tensor<2>,
    pub k_proj: Tensor<2>,
    pub v_proj: Tensor<2>,
    pub o_proj: Tensor<2>,
    /// Projection biases where the architecture has them (`ModelConfig::qkv_bias`, `o_bias`).
    pub q_bias: Option<Tensor<1>>,
    pub k_bias: Option<Tensor<1>>,
    pub v_bias: Option<Tensor<1>>,
    pub o_bias: Option<Tensor<1>>,
    pub q_norm: Option<Tensor<1>>,
    pub k_norm: Option<Tensor<1>>,
    pub post_norm: Tensor<1>,
    /// The dense MLP (`None` in a sparse MoE layer, which has `moe` instead).
    pub gate_proj: Option<Tensor<2>>,
    pub up_proj: Option<Tensor<2>>,
    pub down_proj: Option<Tensor<2>>,
    /// A Qwen3-MoE sparse layer's router and experts (`moe.rs`).
    pub moe: Option<MoeBlock>,
    /// LoRA adapters on some of the projections (`lora.rs`); a layer with them runs unfused.
    pub adapters: Option<LayerAdapters>,
}

/// One layer's q/k/v and gate/up weights as one matrix each (`[q; k; v]` and `[gate; up]` by
/// output row): a row's dot product with a weight row does not depend on which other weight
/// rows share the launch, so the fused projections give the separate ones' bits in fewer
/// launches. The layer's own `q_proj` ... `up_proj` become views into these (no second copy).
#[derive(Clone, Debug)]
pub struct FusedProjections {
    pub qkv: Tensor<2>,
    /// `[q; k; v]` biases, where the layer has them.
    pub qkv_bias: Option<Tensor<1>>,
    /// `[gate; up]` of a dense MLP (`None` in a sparse layer).
    pub gate_up: Option<Tensor<2>>,
}

/// One weight of a layer, borrowed for the weight walk.
pub(crate) enum Slot<'a> {
    Vector(&'a mut Tensor<1>),
    Matrix(&'a mut Tensor<2>),
}

impl Layer {
    /// Layer `i` of a model of shape `c`, every weight from `source` by HF name (a matrix;
    /// vectors as one row).
    pub(crate) fn load(i: usize, c: &ModelConfig, source: &dyn Fn(&str) -> Result<Tensor<2>, ModelError>) -> Result<Self, ModelError> {
        let matrix = |t: LayerTensor| source(&t.name(i));
        let vector = |t: LayerTensor| -> Result<Tensor<1>, ModelError> {
            let m = source(&t.name(i))?;
            let n = m.dims()[1];
            Ok(m.reshape([n]))
        };
        Ok(Layer {
            input_norm: vector(LayerTensor::InputNorm)?,
            q_proj: matrix(LayerTensor::QProj)?,
            k_proj: matrix(LayerTensor::KProj)?,
            v_proj: matrix(LayerTensor::VProj)?,
            o_proj: matrix(LayerTensor::OProj)?,
            q_bias: c.qkv_bias.then(|| vector(LayerTensor::QBias)).transpose()?,
            k_bias: c.qkv_bias.then(|| vector(LayerTensor::KBias)).transpose()?,
            v_bias: c.qkv_bias.then(|| vector(LayerTensor::VBias)).transpose()?,
            o_bias: c.o_bias.then(|| vector(LayerTensor::OBias)).transpose()?,
            q_norm: c.qk_norm.then(|| vector(LayerTensor::QNorm)).transpose()?,
            k_norm: c.qk_norm.then(|| vector(LayerTensor::KNorm)).transpose()?,
            post_norm: vector(LayerTensor::PostNorm)?,
            gate_proj: LayerTensor::GateProj.present_in(c, i).then(|| matrix(LayerTensor::GateProj)).transpose()?,
            up_proj: LayerTensor::UpProj.present_in(c, i).then(|| matrix(LayerTensor::UpProj)).transpose()?,
            down_proj: LayerTensor::DownProj.present_in(c, i).then(|| matrix(LayerTensor::DownProj)).transpose()?,
            moe: match c.moe.as_ref().filter(|m| m.is_sparse(i)) {
                None => None,
                Some(m) => Some(MoeBlock {
                    router: source(&moe::router_name(i))?,
                    experts: (0..m.num_experts).map(|e| {
                        let [g, u, d] = moe::expert_names(i, e);
                        Ok(Expert { gate: source(&g)?, up: source(&u)?, down: source(&d)? })
                    }).collect::<Result<_, ModelError>>()?,
                    top_k: m.top_k,
                    norm_topk_prob: m.norm_topk_prob,
                    aux: None,
                }),
            },
            adapters: None,
        })
    }

    /// `x W^T (+ b)` of projection `p` (weight `w`), plus its adapter's term if it has one.
    fn project(&self, p: Projection, x: Tensor<2>, w: &Tensor<2>, bias: &Option<Tensor<1>>, kernels: super::KernelSet) -> Result<Tensor<2>, ModelError> {
        let adapter = self.adapters.as_ref().and_then(|a| a.get(p).map(|adapter| (adapter, a.scale)));
        let y = with_bias(kernels.matmul(x.clone(), w.clone(), OutIn)?, bias)?;
        match adapter {
            Some((adapter, scale)) => add_adapter(y, x, adapter, scale, kernels),
            None => Ok(y),
        }
    }

    /// The weight `t`, if this layer has it.
    pub(crate) fn slot(&mut self, t: LayerTensor) -> Option<Slot<'_>> {
        Some(match t {
            LayerTensor::InputNorm => Slot::Vector(&mut self.input_norm),
            LayerTensor::QProj => Slot::Matrix(&mut self.q_proj),
            LayerTensor::KProj => Slot::Matrix(&mut self.k_proj),
            LayerTensor::VProj => Slot::Matrix(&mut self.v_proj),
            LayerTensor::OProj => Slot::Matrix(&mut self.o_proj),
            LayerTensor::QBias => Slot::Vector(self.q_bias.as_mut()?),
            LayerTensor::KBias => Slot::Vector(self.k_bias.as_mut()?),
            LayerTensor::VBias => Slot::Vector(self.v_bias.as_mut()?),
            LayerTensor::OBias => Slot::Vector(self.o_bias.as_mut()?),
            LayerTensor::QNorm => Slot::Vector(self.q_norm.as_mut()?),
            LayerTensor::KNorm => Slot::Vector(self.k_norm.as_mut()?),
            LayerTensor::PostNorm => Slot::Vector(&mut self.post_norm),
            LayerTensor::GateProj => Slot::Matrix(self.gate_proj.as_mut()?),
            LayerTensor::UpProj => Slot::Matrix(self.up_proj.as_mut()?),
            LayerTensor::DownProj => Slot::Matrix(self.down_proj.as_mut()?),
        })
    }

    /// Concatenates q/k/v and gate/up (see [`FusedProjections`]); the separate weights become
    /// views of the fused ones.
    pub(crate) fn fuse(&mut self) -> FusedProjections {
        let qkv = Tensor::cat(vec![self.q_proj.clone(), self.k_proj.clone(), self.v_proj.clone()], 0);
        let qkv_bias = match (&self.q_bias, &self.k_bias, &self.v_bias) {
            (Some(q), Some(k), Some(v)) => Some(Tensor::cat(vec![q.clone(), k.clone(), v.clone()], 0)),
            _ => None,
        };
        let gate_up = match (&self.gate_proj, &self.up_proj) {
            (Some(g), Some(u)) => Some(Tensor::cat(vec![g.clone(), u.clone()], 0)),
            _ => None,
        };
        let mut at = 0;
        for w in [&mut self.q_proj, &mut self.k_proj, &mut self.v_proj] {
            let [out, inp] = w.dims();
            *w = qkv.clone().slice([at..at + out, 0..inp]);
            at += out;
        }
        if let (Some(gu), Some(g)) = (&gate_up, &self.gate_proj) {
            let [ffn, hidden] = g.dims();
            self.gate_proj = Some(gu.clone().slice([0..ffn, 0..hidden]));
            self.up_proj = Some(gu.clone().slice([ffn..2 * ffn, 0..hidden]));
        }
        FusedProjections { qkv, qkv_bias, gate_up }
    }

    /// Layer `i` on the pass's rows: the residual stream after it. `fused` runs the decode
    /// path's fused launches (the pass has a KV cache); then the stream leaves normed by
    /// `next_norm` (the next layer's input norm, or the final norm), computed in the launch of
    /// the residual add.
    pub(crate) fn forward(&self, i: usize, stream: Stream, fused: Option<&FusedProjections>, next_norm: &Tensor<1>, pass: &mut Pass) -> Result<Stream, ModelError> {
        let (k, eps, n) = (pass.kernels, pass.eps(), pass.rows.len());
        let (hq, d) = (pass.config.num_heads, pass.config.head_dim);
        if fused.is_some() && self.adapters.is_some() {
            return Err(ModelError::Input(format!("layer {i} has LoRA adapters and fused projections: an adapted layer runs unfused")));
        }
        let x = match stream.normed {
            Some(x) => x,
            None => k.rmsnorm(stream.h.clone(), self.input_norm.clone(), eps)?,
        };
        pass.record(|| format!("layer {i} input_norm"), &x);
        let attn = match fused {
            Some(f) => self.attention_fused(i, x, f, pass)?,
            None => self.attention(i, x, pass)?,
        };
        pass.record(|| format!("layer {i} attention"), &attn.clone().reshape([n, hq * d]));
        let o = self.project(Projection::O, attn.reshape([n, hq * d]), &self.o_proj, &self.o_bias, k)?;
        pass.record(|| format!("layer {i} o_proj"), &o);
        let (h, x) = match residual(stream.h, o, &self.post_norm, fused.is_some(), eps)? {
            Stream { h, normed: Some(x) } => (h, x),
            Stream { h, normed: None } => (h.clone(), k.rmsnorm(h, self.post_norm.clone(), eps)?),
        };
        pass.record(|| format!("layer {i} post_norm"), &x);
        let down = match (&self.moe, fused.and_then(|f| f.gate_up.as_ref())) {
            (Some(moe), _) => {
                // the training layout's sequences (each starts at position 0 or a new slot);
                // sampling needs none
                let rows = pass.rows;
                let starts: Option<Vec<usize>> = x.is_autodiff().then(|| (0..rows.len()).filter(|&r| r == 0 || rows.positions[r] == 0 || rows.slots[r] != rows.slots[r - 1]).collect());
                let (out, routing) = moe.forward(x, k, starts.as_deref(), &rows.padding, self.adapters.as_ref())?;
                if let Some(log) = pass.routing.as_deref_mut() {
                    log.layers.push((i, routing));
                }
                out
            }
            (None, gate_up) => {
                let missing = || ModelError::Input(format!("layer {i} has neither a dense MLP nor experts"));
                let (gate, up, down_w) = (self.gate_proj.as_ref().ok_or_else(missing)?, self.up_proj.as_ref().ok_or_else(missing)?, self.down_proj.as_ref().ok_or_else(missing)?);
                let act = match gate_up {
                    Some(gu) => swiglu_halves(k.matmul(x, gu.clone(), OutIn)?)?,
                    None => swiglu(self.project(Projection::Gate, x.clone(), gate, &None, k)?, self.project(Projection::Up, x, up, &None, k)?)?,
                };
                pass.record(|| format!("layer {i} gate/up+swiglu"), &act);
                self.project(Projection::Down, act, down_w, &None, k)?
            }
        };
        pass.record(|| format!("layer {i} down_proj"), &down);
        residual(h, down, next_norm, fused.is_some(), eps)
    }

    /// Attention on separate launches: q/k/v projections, q/k norms, RoPE, then the rows' keys
    /// and values written into the KV cache and attention over it, or without a cache causal
    /// attention within each sequence of the rows (the training path).
    fn attention(&self, i: usize, x: Tensor<2>, pass: &mut Pass) -> Result<Tensor<3>, ModelError> {
        let (k, eps, n) = (pass.kernels, pass.eps(), pass.rows.len());
        let (hq, hkv, d) = (pass.config.num_heads, pass.config.num_kv_heads, pass.config.head_dim);
        let mut q = self.project(Projection::Q, x.clone(), &self.q_proj, &self.q_bias, k)?.reshape([n, hq, d]);
        let mut kk = self.project(Projection::K, x.clone(), &self.k_proj, &self.k_bias, k)?.reshape([n, hkv, d]);
        let v = self.project(Projection::V, x, &self.v_proj, &self.v_bias, k)?.reshape([n, hkv, d]);
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = k.rmsnorm(q, qn.clone(), eps)?;
            kk = k.rmsnorm(kk, kn.clone(), eps)?;
        }
        let q = rope(q, pass.positions.clone(), pass.rope)?;
        let kk = rope(kk, pass.positions.clone(), pass.rope)?;
        pass.record(|| format!("layer {i} q (normed, rope)"), &q.clone().reshape([n, hq * d]));
        pass.record(|| format!("layer {i} k (normed, rope)"), &kk.clone().reshape([n, hkv * d]));
        pass.record(|| format!("layer {i} v"), &v.clone().reshape([n, hkv * d]));
        let (slots, positions, scale) = (pass.slots.clone(), pass.positions.clone(), pass.scale());
        Ok(match pass.cache.as_deref_mut() {
            Some(cache) => {
                let pages = cache.pages()?;
                let (kc, vc) = &mut cache.layers[i];
                // moved out so the write happens in place (a shared handle would be copied)
                *kc = write_kv_cache_paged(take(kc), kk, slots.clone(), positions.clone(), Some(&pages))?;
                *vc = write_kv_cache_paged(take(vc), v, slots.clone(), positions.clone(), Some(&pages))?;
                attention_for_rows(q, kc.clone(), vc.clone(), slots, positions, &pass.rows.slots, scale, Some(&pages))?
            }
            None => causal_attention(q, kk, v, &pass.rows.slots, &pass.rows.positions, scale)?,
        })
    }

    /// Attention on the decode path's fused launches: one q/k/v projection, then q/k norms,
    /// RoPE and the cache write in one kernel ([`attention_inputs`]), then attention over the
    /// cache.
    fn attention_fused(&self, i: usize, x: Tensor<2>, f: &FusedProjections, pass: &mut Pass) -> Result<Tensor<3>, ModelError> {
        let (eps, n, scale) = (pass.eps(), pass.rows.len(), pass.scale());
        let (hq, d) = (pass.config.num_heads, pass.config.head_dim);
        let qkv = with_bias(pass.kernels.matmul(x, f.qkv.clone(), OutIn)?, &f.qkv_bias)?;
        let qk_norm = match (&self.q_norm, &self.k_norm) {
            (Some(q), Some(k)) => Some(QkNorm { q: q.clone(), k: k.clone(), eps }),
            _ => None,
        };
        let (slots, positions) = (pass.slots.clone(), pass.positions.clone());
        let cache = pass.cache.as_deref_mut().ok_or_else(|| ModelError::Input("the fused decode path needs a KV cache".into()))?;
        let pages = cache.pages()?;
        let (kc, vc) = &mut cache.layers[i];
        let (q, k_new, v_new) = attention_inputs(qkv, hq, qk_norm.as_ref(), slots.clone(), positions.clone(), pass.rope, take(kc), take(vc), Some(&pages))?;
        (*kc, *vc) = (k_new, v_new);
        let (kc, vc) = (kc.clone(), vc.clone());
        pass.record(|| format!("layer {i} q (normed, rope)"), &q.clone().reshape([n, hq * d]));
        if pass.traced() {
            let cache = pass.cache.as_deref().expect("checked above");
            let (k_rows, v_rows) = (cache.rows_of(&kc, pass.rows), cache.rows_of(&vc, pass.rows));
            pass.record(|| format!("layer {i} k (normed, rope)"), &k_rows);
            pass.record(|| format!("layer {i} v"), &v_rows);
        }
        Ok(attention_for_rows(q, kc, vc, slots, positions, &pass.rows.slots, scale, Some(&pages))?)
    }
}

/// A projection's output plus its bias, if it has one (elementwise: the fused q/k/v projection
/// adding the concatenated biases gives each element the bits of its own projection's add).
fn with_bias(y: Tensor<2>, bias: &Option<Tensor<1>>) -> Result<Tensor<2>, ModelError> {
    Ok(match bias {
        Some(b) => bias_add(y, b.clone())?,
        None => y,
    })
}

/// `h + delta`; on the fused path with its RMSNorm by `norm` from the same launch.
fn residual(h: Tensor<2>, delta: Tensor<2>, norm: &Tensor<1>, fused: bool, eps: f32) -> Result<Stream, ModelError> {
    Ok(if fused {
        let (h, normed) = add_rmsnorm(h, delta, norm.clone(), eps)?;
        Stream { h, normed: Some(normed) }
    } else {
        Stream { h: add(h, delta)?, normed: None }
    })
}
