//! The policy model: a Qwen3 (or Llama) decoder written once, on lockstep's kernels.
//!
//!   embed -> N x [ rmsnorm -> q,k,v proj -> (Qwen3: per-head q/k rmsnorm) -> rope
//!                  -> causal GQA attention -> o proj -> + residual
//!                  -> rmsnorm -> silu(gate) * up -> down -> + residual ]
//!         -> rmsnorm -> lm head (tied to the embedding or not)
//!
//! Work is a list of rows, one per token: (token id, sequence, position). The trainer passes
//! every token of a batch of whole sequences at once; the sampler passes prefill chunks and
//! single decode tokens, with a persistent KV cache. Both go through [`Qwen3::forward`], and
//! every kernel under it is batch and chunk invariant, so a token's logits (hence its logprob)
//! have the same bits on both paths.

use super::cache::take;
use super::{Checkpoint, KvCache, ModelConfig, ModelError, Rows};
use crate::ops::attention::attention_for_rows;
use crate::ops::attention::inputs::attention_inputs;
use crate::ops::kv_cache::write_kv_cache_paged;
use crate::{add, add_rmsnorm, causal_attention, embedding, rope, swiglu, swiglu_halves, QkNorm};
use crate::{KernelError, RopeTables, WeightLayout::OutIn};
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use std::path::Path;

/// A weight of either rank, for code that walks all of them.
#[derive(Clone, Debug)]
pub enum Weight {
    Vector(Tensor<1>),
    Matrix(Tensor<2>),
}

impl Weight {
    /// Flat view.
    pub fn flat(&self) -> Tensor<1> {
        match self {
            Weight::Vector(v) => v.clone(),
            Weight::Matrix(m) => {
                let n = m.shape().num_elements();
                m.clone().reshape([n])
            }
        }
    }
    /// Same rank and shape as `self`, values from a flat tensor.
    pub fn with_flat(&self, flat: Tensor<1>) -> Weight {
        match self {
            Weight::Vector(_) => Weight::Vector(flat),
            Weight::Matrix(m) => Weight::Matrix(flat.reshape(m.dims())),
        }
    }
    pub fn to_host(&self) -> Vec<f32> {
        self.flat().cast(DType::F32).into_data().convert::<f32>().try_to_vec::<f32>().expect("f32 weights")
    }
    pub fn map(self, f1: impl FnOnce(Tensor<1>) -> Tensor<1>, f2: impl FnOnce(Tensor<2>) -> Tensor<2>) -> Weight {
        match self {
            Weight::Vector(v) => Weight::Vector(f1(v)),
            Weight::Matrix(m) => Weight::Matrix(f2(m)),
        }
    }
}

/// One decoder layer's weights, in HF layout (`[out, in]` projections).
#[derive(Clone, Debug)]
pub struct Layer {
    pub input_norm: Tensor<1>,
    pub q_proj: Tensor<2>,
    pub k_proj: Tensor<2>,
    pub v_proj: Tensor<2>,
    pub o_proj: Tensor<2>,
    pub q_norm: Option<Tensor<1>>,
    pub k_norm: Option<Tensor<1>>,
    pub post_norm: Tensor<1>,
    pub gate_proj: Tensor<2>,
    pub up_proj: Tensor<2>,
    pub down_proj: Tensor<2>,
}

#[derive(Clone, Debug)]
pub struct Qwen3 {
    pub config: ModelConfig,
    pub dtype: DType,
    pub embed: Tensor<2>,
    pub layers: Vec<Layer>,
    pub norm: Tensor<1>,
    /// `None` when tied to `embed`.
    pub lm_head: Option<Tensor<2>>,
    pub rope: RopeTables,
    /// Which kernels the projections and norms run on (see [`KernelSet`]).
    pub kernels: KernelSet,
    /// Mean token entropy of the last [`Qwen3::sequence_logprobs`] call (a metric).
    pub last_entropy: std::cell::Cell<Option<f64>>,
    /// Per layer, the projections concatenated for the decode path (empty unless
    /// [`Qwen3::fuse_projections`] ran since the weights last changed).
    pub fused: Vec<FusedProjections>,
}

/// One layer's q/k/v and gate/up weights as one matrix each (`[q; k; v]` and `[gate; up]` by
/// output row): a row's dot product with a weight row does not depend on which other weight
/// rows share the launch, so the fused projections give the separate ones' bits in fewer
/// launches. The layer's own `q_proj` ... `up_proj` become views into these (no second copy).
#[derive(Clone, Debug)]
pub struct FusedProjections {
    pub qkv: Tensor<2>,
    pub gate_up: Tensor<2>,
}

/// The kernel set a forward runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelSet {
    /// lockstep's batch-invariant kernels: the product.
    #[default]
    Matched,
    /// The same kernels without the decode path's fused launches (see [`FusedProjections`]):
    /// the same bits, for benchmarks of what fusion saves.
    MatchedUnfused,
    /// burn's default matmul and an rmsnorm built from burn ops (autotuned, split reductions,
    /// not batch invariant): the ablation's "fast" sampler. Attention and logprobs stay lockstep's.
    Fast,
    /// lockstep's kernels except the matmul, which splits K by batch size
    /// ([`crate::ops::ablation::matmul_split_k`]): the ablation's deterministic, non-invariant sampler.
    SplitK,
}

impl Qwen3 {
    /// The HF checkpoint in `dir`, its shards memory-mapped and each weight sent to the device
    /// in its stored dtype where that is `dtype` (no f32 host copy of the model); the same bits
    /// as [`Self::from_checkpoint`] of [`load_checkpoint`] (a 16-bit value widened to f32 and
    /// cast back is itself).
    pub fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Self, ModelError> {
        let config = super::ModelConfig::from_file(&dir.join("config.json"))?;
        let mapped = super::weights::MappedWeights::open(dir)?;
        let shapes: std::collections::HashMap<String, Vec<usize>> = config.expected_tensors().into_iter().collect();
        // every tensor checked (presence, shape, finite values) before any goes to the device
        mapped.check_all(dir, &config.expected_tensors())?;
        let source = |name: &str| -> Result<Tensor<2>, ModelError> {
            let shape = &shapes[name];
            let rows = if shape.len() == 2 { shape[0] } else { 1 };
            let data = mapped.data(name, vec![rows, shape.iter().product::<usize>() / rows], dtype)?;
            Ok(Tensor::<2>::from_data(data, device).cast(dtype))
        };
        let model = Self::from_source(&config, dtype, device, &source)?;
        // the runtime may still be reading the mapped bytes: it is done before the mapping can
        // go (a file truncated in place while mapped would fault here, not later)
        device.sync().map_err(|e| ModelError::Input(format!("{}: copying the weights to the device: {e:?}", dir.display())))?;
        Ok(model)
    }

    pub fn from_checkpoint(ck: &Checkpoint, dtype: DType, device: &Device) -> Result<Self, ModelError> {
        let source = |name: &str| -> Result<Tensor<2>, ModelError> {
            let (shape, values) = &ck.tensors[name];
            let rows = if shape.len() == 2 { shape[0] } else { 1 };
            Ok(Tensor::<2>::from_data(TensorData::new(values.clone(), [rows, values.len() / rows]), device).cast(dtype))
        };
        Self::from_source(&ck.config, dtype, device, &source)
    }

    /// The model from `source` (every weight by HF name, as a matrix: vectors as one row).
    fn from_source(c: &super::ModelConfig, dtype: DType, device: &Device, source: &dyn Fn(&str) -> Result<Tensor<2>, ModelError>) -> Result<Self, ModelError> {
        let t1 = |name: String| -> Result<Tensor<1>, ModelError> {
            let t = source(&name)?;
            let n = t.dims()[1];
            Ok(t.reshape([n]))
        };
        let t2 = |name: String| source(&name);
        // The largest tensors first: cubecl sizes its pages to the largest allocation so far,
        // so weights loaded before a larger one would sit on left-behind pages (see
        // `into_resident`).
        let embed = t2("model.embed_tokens.weight".into())?;
        let lm_head = (!c.tie_word_embeddings).then(|| t2("lm_head.weight".into())).transpose()?;
        let layers = (0..c.num_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                Ok(Layer {
                    input_norm: t1(format!("{p}.input_layernorm.weight"))?,
                    q_proj: t2(format!("{p}.self_attn.q_proj.weight"))?,
                    k_proj: t2(format!("{p}.self_attn.k_proj.weight"))?,
                    v_proj: t2(format!("{p}.self_attn.v_proj.weight"))?,
                    o_proj: t2(format!("{p}.self_attn.o_proj.weight"))?,
                    q_norm: c.qk_norm.then(|| t1(format!("{p}.self_attn.q_norm.weight"))).transpose()?,
                    k_norm: c.qk_norm.then(|| t1(format!("{p}.self_attn.k_norm.weight"))).transpose()?,
                    post_norm: t1(format!("{p}.post_attention_layernorm.weight"))?,
                    gate_proj: t2(format!("{p}.mlp.gate_proj.weight"))?,
                    up_proj: t2(format!("{p}.mlp.up_proj.weight"))?,
                    down_proj: t2(format!("{p}.mlp.down_proj.weight"))?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self {
            config: c.clone(),
            dtype,
            embed,
            layers,
            norm: t1("model.norm.weight".into())?,
            lm_head,
            rope: RopeTables::new(c.head_dim, c.max_position_embeddings, c.rope_theta, device)?,
            kernels: KernelSet::Matched,
            last_entropy: std::cell::Cell::new(None),
            fused: Vec::new(),
        })
    }

    /// This model with every weight cast to `dtype` on the device (the same rounding as
    /// loading in `dtype`); weights already in `dtype` are shared, not copied.
    pub fn cast(&self, dtype: DType) -> Self {
        let mut out = self.map_weights(&mut |_, w| w.map(|v| v.cast(dtype), |m| m.cast(dtype)));
        out.dtype = dtype;
        out
    }

    /// Host copy of every weight, by HF name (for saving and hashing).
    pub fn to_checkpoint(&self) -> Checkpoint {
        let shapes: std::collections::HashMap<String, Vec<usize>> = self.config.expected_tensors().into_iter().collect();
        let mut tensors = std::collections::BTreeMap::new();
        for (name, t) in self.named_tensors() {
            let shape = shapes[&name].clone();
            let values = t.to_host();
            tensors.insert(name, (shape, values));
        }
        Checkpoint { config: self.config.clone(), tensors }
    }

    /// Every weight by HF name.
    pub fn named_tensors(&self) -> Vec<(String, Weight)> {
        let mut out = Vec::new();
        self.visit(&mut |name, w| out.push((name.to_string(), w.clone())));
        out
    }

    fn visit(&self, f: &mut dyn FnMut(&str, &Weight)) {
        let mut clone = self.clone();
        clone.visit_mut(&mut |name, w| f(name, w));
    }

    /// Every weight by HF name, mutably (in checkpoint order).
    pub fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Weight)) {
        self.fused.clear(); // the weights may change: fused copies would go stale
        let one = |name: String, t: &mut Tensor<1>, f: &mut dyn FnMut(&str, &mut Weight)| {
            let mut w = Weight::Vector(t.clone());
            f(&name, &mut w);
            if let Weight::Vector(v) = w { *t = v } else { panic!("{name}: rank changed") }
        };
        let two = |name: String, t: &mut Tensor<2>, f: &mut dyn FnMut(&str, &mut Weight)| {
            let mut w = Weight::Matrix(t.clone());
            f(&name, &mut w);
            if let Weight::Matrix(m) = w { *t = m } else { panic!("{name}: rank changed") }
        };
        two("model.embed_tokens.weight".into(), &mut self.embed, f);
        for (i, l) in self.layers.iter_mut().enumerate() {
            let p = format!("model.layers.{i}");
            one(format!("{p}.input_layernorm.weight"), &mut l.input_norm, f);
            two(format!("{p}.self_attn.q_proj.weight"), &mut l.q_proj, f);
            two(format!("{p}.self_attn.k_proj.weight"), &mut l.k_proj, f);
            two(format!("{p}.self_attn.v_proj.weight"), &mut l.v_proj, f);
            two(format!("{p}.self_attn.o_proj.weight"), &mut l.o_proj, f);
            if let Some(q) = l.q_norm.as_mut() {
                one(format!("{p}.self_attn.q_norm.weight"), q, f);
            }
            if let Some(k) = l.k_norm.as_mut() {
                one(format!("{p}.self_attn.k_norm.weight"), k, f);
            }
            one(format!("{p}.post_attention_layernorm.weight"), &mut l.post_norm, f);
            two(format!("{p}.mlp.gate_proj.weight"), &mut l.gate_proj, f);
            two(format!("{p}.mlp.up_proj.weight"), &mut l.up_proj, f);
            two(format!("{p}.mlp.down_proj.weight"), &mut l.down_proj, f);
        }
        one("model.norm.weight".into(), &mut self.norm, f);
        if let Some(h) = self.lm_head.as_mut() {
            two("lm_head.weight".into(), h, f);
        }
    }

    /// A copy with every weight passed through `f` (cast, move to a device, track gradients).
    pub fn map_weights(&self, f: &mut dyn FnMut(&str, Weight) -> Weight) -> Self {
        let mut out = self.clone();
        out.visit_mut(&mut |name, w| *w = f(name, w.clone()));
        out
    }

    /// The weights and RoPE tables copied into cubecl's persistent memory pool, each layer's
    /// projections fused first when `fuse` (see [`Qwen3::fuse_projections`]); the sampler keeps
    /// its model this way.
    ///
    /// Why: cubecl carves every other allocation from pages sized to the largest allocation
    /// seen so far, and when a larger one arrives the old pages are left behind and walked on
    /// every later reservation until nothing lives on them. Weights loaded early sit on such
    /// pages for the engine's life, so each of the decode loop's hundreds of allocations per
    /// step walked them; in the persistent pool they are out of that walk. Same bits: a copy.
    pub fn into_resident(self, fuse: bool) -> Result<Self, KernelError> {
        let device = self.embed.device();
        device.memory_persistent_allocations(self, move |mut m| -> Result<Self, KernelError> {
            fn own<const D: usize>(t: &mut Tensor<D>) -> Result<(), KernelError> {
                *t = crate::bridge::own_buffer(t.clone())?;
                Ok(())
            }
            if fuse {
                m.fuse_projections(); // new buffers already: q/k/v and gate/up become views of them
            }
            own(&mut m.embed)?;
            own(&mut m.norm)?;
            if let Some(h) = m.lm_head.as_mut() {
                own(h)?;
            }
            own(&mut m.rope.cos)?;
            own(&mut m.rope.sin)?;
            for l in m.layers.iter_mut() {
                for t in [&mut l.input_norm, &mut l.post_norm] {
                    own(t)?;
                }
                for t in [l.q_norm.as_mut(), l.k_norm.as_mut()].into_iter().flatten() {
                    own(t)?;
                }
                own(&mut l.o_proj)?;
                own(&mut l.down_proj)?;
                if !fuse {
                    for t in [&mut l.q_proj, &mut l.k_proj, &mut l.v_proj, &mut l.gate_proj, &mut l.up_proj] {
                        own(t)?;
                    }
                }
            }
            Ok(m)
        })
    }

    /// Concatenates each layer's q/k/v and gate/up projections for the decode path (the
    /// sampler calls this whenever it receives weights); the separate weights become views of
    /// the fused ones. Any later [`Qwen3::visit_mut`] drops the fused copies again.
    pub fn fuse_projections(&mut self) {
        let mut fused = Vec::with_capacity(self.layers.len());
        for l in self.layers.iter_mut() {
            let qkv = Tensor::cat(vec![l.q_proj.clone(), l.k_proj.clone(), l.v_proj.clone()], 0);
            let gate_up = Tensor::cat(vec![l.gate_proj.clone(), l.up_proj.clone()], 0);
            let mut at = 0;
            for w in [&mut l.q_proj, &mut l.k_proj, &mut l.v_proj] {
                let [out, inp] = w.dims();
                *w = qkv.clone().slice([at..at + out, 0..inp]);
                at += out;
            }
            let [ffn, hidden] = l.gate_proj.dims();
            l.gate_proj = gate_up.clone().slice([0..ffn, 0..hidden]);
            l.up_proj = gate_up.clone().slice([ffn..2 * ffn, 0..hidden]);
            fused.push(FusedProjections { qkv, gate_up });
        }
        self.fused = fused;
    }

    /// Token ids must be below the vocabulary; positions below the RoPE table.
    pub fn check_rows(&self, rows: &Rows) -> Result<(), ModelError> {
        if rows.is_empty() {
            return Err(ModelError::Input("no rows to run".into()));
        }
        if rows.slots.len() != rows.len() || rows.positions.len() != rows.len() {
            return Err(ModelError::Input(format!("rows: {} tokens, {} slots, {} positions", rows.len(), rows.slots.len(), rows.positions.len())));
        }
        for r in 0..rows.len() {
            if rows.tokens[r] as usize >= self.config.vocab_size {
                return Err(ModelError::TokenOutOfRange { id: rows.tokens[r], sequence: rows.slots[r] as usize, position: rows.positions[r] as usize, vocab: self.config.vocab_size });
            }
            if rows.positions[r] as usize >= self.config.max_position_embeddings {
                return Err(ModelError::Input(format!(
                    "sequence {} position {} is beyond max_position_embeddings {}",
                    rows.slots[r], rows.positions[r], self.config.max_position_embeddings
                )));
            }
        }
        Ok(())
    }

    /// Logits `[rows, vocab]` for `rows`. With `cache`, each row's K/V is written into its slot
    /// first (prefill chunks, decode steps); without, the rows must be whole sequences (the
    /// training path, differentiable on an autodiff device).
    pub fn forward(&self, rows: &Rows, cache: Option<&mut KvCache>) -> Result<Tensor<2>, ModelError> {
        self.forward_traced(rows, cache, None)
    }

    /// [`Qwen3::forward`], recording every op's output `[rows, features]` under a name like
    /// "layer 3 q_proj" (for the auditor that finds where two paths first differ). With
    /// `trace.only_row`, each op's row of that token only, and the logits of that row only.
    pub fn forward_traced(&self, rows: &Rows, cache: Option<&mut KvCache>, trace: Option<&mut Trace>) -> Result<Tensor<2>, ModelError> {
        self.forward_inner(rows, cache, trace, None, None)?.ok_or_else(|| ModelError::Input("no logits requested".into()))
    }

    /// [`Qwen3::forward`] with logits for the rows in `at` only (in that order; `None` when `at`
    /// is empty, e.g. a step of prompt chunks that ends none): the sampler needs a prompt's last
    /// row only, and the LM head is a quarter of a small model's prefill work. Rows are
    /// independent in every kernel, so the selected rows' logits have the bits of a full forward.
    pub fn forward_at(&self, rows: &Rows, cache: Option<&mut KvCache>, at: &[usize]) -> Result<Option<Tensor<2>>, ModelError> {
        if let Some(&r) = at.iter().find(|&&r| r >= rows.len()) {
            return Err(ModelError::Input(format!("logits asked for row {r} of {} rows", rows.len())));
        }
        self.forward_inner(rows, cache, None, Some(at), None)
    }

    /// [`Qwen3::forward_at`] where the first `fed.1.len()` rows take their token ids from a
    /// device tensor (`fed.0[fed.1[r]]`, e.g. the tokens the previous step sampled, not yet read
    /// back) instead of `rows.tokens`, whose entries for those rows are ignored. Lets the
    /// sampler enqueue a decode step before the previous one's tokens reach the host.
    pub fn forward_at_fed(&self, rows: &Rows, cache: Option<&mut KvCache>, at: &[usize], fed: (&Tensor<1, Int>, &[i32])) -> Result<Option<Tensor<2>>, ModelError> {
        if let Some(&r) = at.iter().find(|&&r| r >= rows.len()) {
            return Err(ModelError::Input(format!("logits asked for row {r} of {} rows", rows.len())));
        }
        if fed.1.len() > rows.len() {
            return Err(ModelError::Input(format!("{} fed rows but only {} rows", fed.1.len(), rows.len())));
        }
        self.forward_inner(rows, cache, None, Some(at), Some(fed))
    }

    fn forward_inner(&self, rows: &Rows, cache: Option<&mut KvCache>, mut trace: Option<&mut Trace>, at: Option<&[usize]>, fed: Option<(&Tensor<1, Int>, &[i32])>) -> Result<Option<Tensor<2>>, ModelError> {
        // a trace of one row needs that row's logits only (a batch's [rows, vocab] may not fit)
        let only_row = trace.as_deref().and_then(|t| t.only_row).filter(|_| at.is_none());
        let x = self.final_hidden(rows, cache, trace.as_deref_mut(), fed)?;
        match only_row {
            Some(r) => {
                let logits = self.lm_head_at(x, Some(std::slice::from_ref(&r)), &mut None)?;
                if let (Some(t), Some(l)) = (trace.as_deref_mut(), &logits) {
                    t.entries.push(("lm_head".into(), l.clone()));
                }
                Ok(logits)
            }
            None => self.lm_head_at(x, at, &mut trace),
        }
    }

    /// Every decoder layer and the final norm: the rows' hidden states `[rows, hidden]` that the
    /// LM head reads.
    fn final_hidden(&self, rows: &Rows, mut cache: Option<&mut KvCache>, mut trace: Option<&mut Trace>, fed: Option<(&Tensor<1, Int>, &[i32])>) -> Result<Tensor<2>, ModelError> {
        self.check_rows(rows)?;
        let c = &self.config;
        let device = self.embed.device();
        let n = rows.len();
        let ints = |v: &[u32]| Tensor::<1, Int>::from_data(TensorData::new(v.iter().map(|&x| x as i32).collect::<Vec<_>>(), [v.len()]), &device);
        let (slots, positions) = (ints(&rows.slots), ints(&rows.positions));
        let tokens = match fed {
            None => ints(&rows.tokens),
            Some((sampled, index)) => {
                let k = index.len();
                let picked = sampled.clone().select(0, Tensor::<1, Int>::from_data(TensorData::new(index.to_vec(), [k]), &device));
                if k == n { picked } else { Tensor::cat(vec![picked, ints(&rows.tokens[k..])], 0) }
            }
        };
        if let Some(cache) = cache.as_deref() {
            let s = cache.shape;
            if let Some(r) = (0..n).find(|&r| rows.slots[r] as usize >= s.slots || rows.positions[r] as usize >= s.max_len) {
                return Err(ModelError::Input(format!("row {r}: slot {} position {} outside the KV cache ({} slots x {} positions)", rows.slots[r], rows.positions[r], s.slots, s.max_len)));
            }
            if let Some(r) = (0..n).find(|&r| !cache.covers(rows.slots[r] as usize, rows.positions[r] as usize)) {
                return Err(ModelError::Input(format!("row {r}: slot {} holds no cache block for position {} (reserve it first)", rows.slots[r], rows.positions[r])));
            }
        }
        let eps = c.rms_norm_eps as f32;
        let mut h = embedding(self.embed.clone(), tokens)?;
        record(&mut trace, || "embedding".into(), &h);
        if let Some(cache) = cache.as_deref_mut() {
            if self.kernels == KernelSet::Matched && self.fused.len() == self.layers.len() {
                return self.forward_fused(rows, h, cache, (&slots, &positions), trace);
            }
        }
        for i in 0..self.layers.len() {
            h = self.layer(i, h, rows, (&slots, &positions), cache.as_deref_mut(), trace.as_deref_mut())?;
        }
        let x = self.norm_rows(h, self.norm.clone(), eps)?;
        record(&mut trace, || "final_norm".into(), &x);
        Ok(x)
    }

    /// Decoder layer `i` on the rows: the residual stream `h` after it. With a cache the rows'
    /// keys and values are written into it and attention reads it; without, attention is causal
    /// within each sequence of the rows (the training path).
    pub(crate) fn layer(&self, i: usize, mut h: Tensor<2>, rows: &Rows, (slots, positions): (&Tensor<1, Int>, &Tensor<1, Int>), cache: Option<&mut KvCache>, mut trace: Option<&mut Trace>) -> Result<Tensor<2>, ModelError> {
        let c = &self.config;
        let l = &self.layers[i];
        let n = rows.len();
        let eps = c.rms_norm_eps as f32;
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        let (hq, hkv, d) = (c.num_heads, c.num_kv_heads, c.head_dim);
        let x = self.norm_rows(h.clone(), l.input_norm.clone(), eps)?;
        record(&mut trace, || format!("layer {i} input_norm"), &x);
        let mut q = self.mm(x.clone(), l.q_proj.clone(), OutIn)?.reshape([n, hq, d]);
        let mut k = self.mm(x.clone(), l.k_proj.clone(), OutIn)?.reshape([n, hkv, d]);
        let v = self.mm(x, l.v_proj.clone(), OutIn)?.reshape([n, hkv, d]);
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            q = self.norm_rows(q, qn.clone(), eps)?;
            k = self.norm_rows(k, kn.clone(), eps)?;
        }
        let q = rope(q, positions.clone(), &self.rope)?;
        let k = rope(k, positions.clone(), &self.rope)?;
        record(&mut trace, || format!("layer {i} q (normed, rope)"), &q.clone().reshape([n, hq * d]));
        record(&mut trace, || format!("layer {i} k (normed, rope)"), &k.clone().reshape([n, hkv * d]));
        record(&mut trace, || format!("layer {i} v"), &v.clone().reshape([n, hkv * d]));
        let attn = match cache {
            Some(cache) => {
                let pages = cache.pages()?;
                let (kc, vc) = &mut cache.layers[i];
                // moved out so the write happens in place (a shared handle would be copied)
                *kc = write_kv_cache_paged(take(kc), k, slots.clone(), positions.clone(), Some(&pages))?;
                *vc = write_kv_cache_paged(take(vc), v, slots.clone(), positions.clone(), Some(&pages))?;
                attention_for_rows(q, kc.clone(), vc.clone(), slots.clone(), positions.clone(), &rows.slots, scale, Some(&pages))?
            }
            None => causal_attention(q, k, v, &rows.slots, &rows.positions, scale)?,
        };
        record(&mut trace, || format!("layer {i} attention"), &attn.clone().reshape([n, hq * d]));
        let o = self.mm(attn.reshape([n, hq * d]), l.o_proj.clone(), OutIn)?;
        record(&mut trace, || format!("layer {i} o_proj"), &o);
        h = add(h, o)?;
        let x = self.norm_rows(h.clone(), l.post_norm.clone(), eps)?;
        record(&mut trace, || format!("layer {i} post_norm"), &x);
        let gate = self.mm(x.clone(), l.gate_proj.clone(), OutIn)?;
        let up = self.mm(x, l.up_proj.clone(), OutIn)?;
        let act = swiglu(gate, up)?;
        record(&mut trace, || format!("layer {i} gate/up+swiglu"), &act);
        let down = self.mm(act, l.down_proj.clone(), OutIn)?;
        record(&mut trace, || format!("layer {i} down_proj"), &down);
        h = add(h, down)?;
        Ok(h)
    }

    /// The LM head on the final-normed rows `x`, all of them or those in `at`.
    fn lm_head_at(&self, x: Tensor<2>, at: Option<&[usize]>, trace: &mut Option<&mut Trace>) -> Result<Option<Tensor<2>>, ModelError> {
        let x = match at {
            None => x,
            Some([]) => return Ok(None),
            Some(at) => {
                let index: Vec<i32> = at.iter().map(|&r| r as i32).collect();
                let device = x.device();
                x.select(0, Tensor::<1, Int>::from_data(TensorData::new(index, [at.len()]), &device))
            }
        };
        let logits = self.mm(x, self.head(), OutIn)?;
        record(trace, || "lm_head".into(), &logits);
        Ok(Some(logits))
    }


    /// The decode path on fused launches (see [`FusedProjections`], [`attention_inputs`],
    /// [`add_rmsnorm`], [`swiglu_halves`]): 9 launches per layer instead of 19, the same bits
    /// as the unfused path, which the model contract checks. Records the same trace points.
    fn forward_fused(&self, rows: &Rows, mut h: Tensor<2>, cache: &mut KvCache, (slots, positions): (&Tensor<1, Int>, &Tensor<1, Int>), mut trace: Option<&mut Trace>) -> Result<Tensor<2>, ModelError> {
        let c = &self.config;
        let n = rows.len();
        let eps = c.rms_norm_eps as f32;
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        let (hq, d) = (c.num_heads, c.head_dim);
        let mut x = crate::rmsnorm(h.clone(), self.layers[0].input_norm.clone(), eps)?;
        for (i, (l, f)) in self.layers.iter().zip(&self.fused).enumerate() {
            record(&mut trace, || format!("layer {i} input_norm"), &x);
            let qkv = crate::matmul(x, f.qkv.clone(), OutIn)?;
            let qk_norm = match (&l.q_norm, &l.k_norm) {
                (Some(q), Some(k)) => Some(QkNorm { q: q.clone(), k: k.clone(), eps }),
                _ => None,
            };
            let pages = cache.pages()?;
            let (kc, vc) = &mut cache.layers[i];
            let (q, k_new, v_new) = attention_inputs(qkv, hq, qk_norm.as_ref(), slots.clone(), positions.clone(), &self.rope, take(kc), take(vc), Some(&pages))?;
            (*kc, *vc) = (k_new, v_new);
            record(&mut trace, || format!("layer {i} q (normed, rope)"), &q.clone().reshape([n, hq * d]));
            if trace.is_some() {
                let (kc, vc) = &cache.layers[i];
                record(&mut trace, || format!("layer {i} k (normed, rope)"), &cache.rows_of(kc, rows));
                record(&mut trace, || format!("layer {i} v"), &cache.rows_of(vc, rows));
            }
            let (kc, vc) = &cache.layers[i];
            let attn = attention_for_rows(q, kc.clone(), vc.clone(), slots.clone(), positions.clone(), &rows.slots, scale, Some(&pages))?;
            record(&mut trace, || format!("layer {i} attention"), &attn.clone().reshape([n, hq * d]));
            let o = crate::matmul(attn.reshape([n, hq * d]), l.o_proj.clone(), OutIn)?;
            record(&mut trace, || format!("layer {i} o_proj"), &o);
            let normed;
            (h, normed) = add_rmsnorm(h, o, l.post_norm.clone(), eps)?;
            record(&mut trace, || format!("layer {i} post_norm"), &normed);
            let act = swiglu_halves(crate::matmul(normed, f.gate_up.clone(), OutIn)?)?;
            record(&mut trace, || format!("layer {i} gate/up+swiglu"), &act);
            let down = crate::matmul(act, l.down_proj.clone(), OutIn)?;
            record(&mut trace, || format!("layer {i} down_proj"), &down);
            let next_norm = self.layers.get(i + 1).map_or(&self.norm, |next| &next.input_norm);
            (h, x) = add_rmsnorm(h, down, next_norm.clone(), eps)?;
        }
        record(&mut trace, || "final_norm".into(), &x);
        Ok(x)
    }

    /// The LM head's weight `[vocab, hidden]`: its own, or the tied embedding.
    fn head(&self) -> Tensor<2> {
        self.lm_head.clone().unwrap_or_else(|| self.embed.clone())
    }

    fn mm(&self, x: Tensor<2>, w: Tensor<2>, layout: crate::WeightLayout) -> Result<Tensor<2>, crate::KernelError> {
        match self.kernels {
            KernelSet::Matched | KernelSet::MatchedUnfused => crate::matmul(x, w, layout),
            KernelSet::SplitK => crate::ops::ablation::matmul_split_k::matmul_split_k(x, w, layout),
            KernelSet::Fast => Ok(match layout {
                OutIn => x.matmul(w.transpose()),
                crate::WeightLayout::InOut => x.matmul(w),
            }),
        }
    }

    pub(crate) fn norm_rows<const D: usize>(&self, x: Tensor<D>, w: Tensor<1>, eps: f32) -> Result<Tensor<D>, crate::KernelError> {
        match self.kernels {
            KernelSet::Matched | KernelSet::MatchedUnfused | KernelSet::SplitK => crate::rmsnorm(x, w, eps),
            KernelSet::Fast => {
                let dtype = x.dtype();
                let x32 = x.cast(DType::F32);
                let inv = (x32.clone() * x32.clone()).mean_dim(D - 1).add_scalar(eps as f64).sqrt().recip();
                let shape: [usize; D] = std::array::from_fn(|i| if i + 1 == D { w.dims()[0] } else { 1 });
                Ok((x32 * inv).cast(dtype) * w.reshape(shape))
            }
        }
    }

    /// The training path: logprob (at `temperature`) of every token after the first of each
    /// sequence, given its prefix, as one flat vector per sequence (length len - 1).
    /// Returns (per-sequence logprobs, flat tensor of all of them in the same order). The LM
    /// head runs fused with the logprob in chunks of rows ([`crate::head_logprobs`]): the
    /// `[rows, vocab]` logits never exist at once.
    pub fn sequence_logprobs(&self, sequences: &[Vec<u32>], temperature: f32) -> Result<(Vec<Vec<f32>>, Tensor<1>), ModelError> {
        let rows = self.training_rows(sequences)?;
        let x = self.final_hidden(&rows, None, None, None)?;
        self.score_rows(x, &rows, sequences, temperature)
    }

    /// The training path's rows for `sequences`: every sequence whole, padded to whole fold
    /// granules (a micro-batch of whole sequences then starts on a granule, so the folded
    /// weight gradients' bits do not see the micro-batching).
    pub(crate) fn training_rows(&self, sequences: &[Vec<u32>]) -> Result<Rows, ModelError> {
        if let Some(i) = sequences.iter().position(|s| s.len() < 2) {
            return Err(ModelError::Input(format!("sequence {i} has fewer than 2 tokens: nothing to score")));
        }
        Ok(Rows::whole_padded(sequences, crate::grad_fold::FOLD_ROWS, self.config.max_position_embeddings))
    }

    /// The LM head and logprobs on the final-normed training rows `x` of `sequences`: (per-sequence
    /// logprobs, flat tensor of all of them in the same order), and the entropy metric.
    pub(crate) fn score_rows(&self, x: Tensor<2>, rows: &Rows, sequences: &[Vec<u32>], temperature: f32) -> Result<(Vec<Vec<f32>>, Tensor<1>), ModelError> {
        let granule = crate::grad_fold::FOLD_ROWS;
        let device = x.device();
        // every row runs through the head (a sequence's last row and the padding with a
        // stand-in target 0, then dropped), so the head's weight gradient walks every row
        let mut targets = Vec::with_capacity(rows.len());
        let mut keep = Vec::with_capacity(rows.len());
        for seq in sequences {
            for p in 0..seq.len() {
                if p + 1 < seq.len() {
                    keep.push(targets.len() as i32);
                    targets.push(seq[p + 1] as i32);
                } else {
                    targets.push(0);
                }
            }
            targets.extend(std::iter::repeat_n(0, super::cache::padding_rows(seq.len(), granule)));
        }
        debug_assert_eq!(targets.len(), rows.len());
        let (n, m) = (targets.len(), keep.len());
        let tg = Tensor::<1, Int>::from_data(TensorData::new(targets, [n]), &device);
        let temps = Tensor::<1>::from_data(TensorData::new(vec![temperature; n], [n]), &device);
        let scored = match self.kernels {
            KernelSet::Matched | KernelSet::MatchedUnfused => crate::head_logprobs(x, self.head(), tg, temps)?,
            // the ablation's kernels: their own matmul for the head, then the logprob
            _ => crate::token_logprobs(self.mm(x, self.head(), OutIn)?, tg, temps)?,
        };
        let index = |on: &burn::tensor::Device| Tensor::<1, Int>::from_data(TensorData::new(keep.clone(), [m]), on);
        // the entropy is a metric, on the plain device even when the logprobs are tracked
        let entropy = scored.entropy.clone().select(0, index(&scored.entropy.device()));
        let lp = scored.logprobs.select(0, index(&device));
        // a device failure (out of memory, most often) is an error naming the pass, not a panic
        let read = |t: Tensor<1>, what: &str| -> Result<Vec<f32>, ModelError> {
            let data = t.try_into_data().map_err(|e| ModelError::Input(format!("the training path's forward over {} sequences ({n} rows) failed on the device while reading its {what}: {e}", sequences.len())))?;
            data.convert::<f32>().try_to_vec::<f32>().map_err(|e| ModelError::Input(format!("{what} read-back: {e:?}")))
        };
        let host_entropy = read(entropy, "entropy")?;
        self.last_entropy.set(Some(host_entropy.iter().map(|&v| v as f64).sum::<f64>() / m.max(1) as f64));
        let host = read(lp.clone(), "logprob")?;
        let mut out = Vec::with_capacity(sequences.len());
        let mut at = 0;
        for seq in sequences {
            out.push(host[at..at + seq.len() - 1].to_vec());
            at += seq.len() - 1;
        }
        Ok((out, lp))
    }
}

/// Every op's output of a traced forward, `[rows, features]` under a name like "layer 3 q_proj"
/// (for the auditor that finds where two paths first differ), or only row `only_row` of each
/// (copied out, so a trace of a large batch keeps one row per op alive, not the whole batch).
#[derive(Default)]
pub struct Trace {
    pub only_row: Option<usize>,
    pub entries: Vec<(String, Tensor<2>)>,
}

fn record(trace: &mut Option<&mut Trace>, name: impl FnOnce() -> String, t: &Tensor<2>) {
    if let Some(trace) = trace.as_deref_mut() {
        let kept = match trace.only_row {
            None => t.clone(),
            Some(r) => t.clone().select(0, Tensor::<1, Int>::from_data(TensorData::new(vec![r as i32], [1]), &t.device())),
        };
        trace.entries.push((name(), kept));
    }
}
