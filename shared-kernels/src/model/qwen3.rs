//! The policy model: a Qwen3 (or Llama) decoder written once, on lockstep's kernels.
//!
//!   embed -> N x decoder layer (`layer.rs`) -> rmsnorm -> lm head (tied to the embedding or not)
//!
//! This file holds the model's weights: loading, the weight walk (by HF name, `names.rs`),
//! casting, and the sampler's resident and fused copies. The forward is in `forward.rs`, the
//! training path's scoring in `scoring.rs`, recomputation in `recompute.rs`.

use super::layer::{FusedProjections, Layer, Slot};
use super::lora::{LayerAdapters, LoraSpec};
use super::names::{LayerTensor, EMBED, FINAL_NORM, LM_HEAD};
use super::{Checkpoint, KernelSet, ModelConfig, ModelError};
use crate::{KernelError, RopeTables};
use burn::tensor::{DType, Device, Tensor, TensorData};

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
    /// Per layer, the projections concatenated for the decode path (empty unless
    /// [`Qwen3::fuse_projections`] ran since the weights last changed).
    pub fused: Vec<FusedProjections>,
    /// The LoRA adapters' shape, when the layers carry adapters (`lora.rs`).
    pub lora: Option<LoraSpec>,
}

impl Qwen3 {
    pub fn from_checkpoint(ck: &Checkpoint, dtype: DType, device: &Device) -> Result<Self, ModelError> {
        let source = |name: &str| -> Result<Tensor<2>, ModelError> {
            let (shape, values) = &ck.tensors[name];
            let rows = if shape.len() == 2 { shape[0] } else { 1 };
            Ok(Tensor::<2>::from_data(TensorData::new(values.clone(), [rows, values.len() / rows]), device).cast(dtype))
        };
        Self::from_source(&ck.config, dtype, device, &source)
    }

    /// The model from `source` (every weight by HF name, as a matrix: vectors as one row).
    pub(super) fn from_source(c: &super::ModelConfig, dtype: DType, device: &Device, source: &dyn Fn(&str) -> Result<Tensor<2>, ModelError>) -> Result<Self, ModelError> {
        let t1 = |name: String| -> Result<Tensor<1>, ModelError> {
            let t = source(&name)?;
            let n = t.dims()[1];
            Ok(t.reshape([n]))
        };
        // The largest tensors first: cubecl sizes its pages to the largest allocation so far,
        // so weights loaded before a larger one would sit on left-behind pages (see
        // `into_resident`).
        let embed = source(EMBED)?;
        let lm_head = (!c.tie_word_embeddings).then(|| source(LM_HEAD)).transpose()?;
        let layers = (0..c.num_layers).map(|i| Layer::load(i, c, source)).collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self {
            config: c.clone(),
            dtype,
            embed,
            layers,
            norm: t1(FINAL_NORM.into())?,
            lm_head,
            rope: RopeTables::from_frequencies(c.head_dim, c.max_position_embeddings, &c.rope.inv_freq(c.head_dim), c.rope.attention_factor(), device)?,
            kernels: KernelSet::Matched,
            fused: Vec::new(),
            lora: None,
        })
    }

    /// This model with `adapters` (one per layer, shaped by `spec`) on its projections.
    pub fn with_adapters(mut self, spec: LoraSpec, adapters: Vec<LayerAdapters>) -> Result<Self, ModelError> {
        if adapters.len() != self.layers.len() {
            return Err(ModelError::Input(format!("{} layers of adapters for a model of {} layers", adapters.len(), self.layers.len())));
        }
        self.fused.clear(); // an adapted layer runs unfused
        for (layer, a) in self.layers.iter_mut().zip(adapters) {
            layer.adapters = Some(a);
        }
        self.lora = Some(spec);
        Ok(self)
    }

    /// Trains the sparse layers' routers with the load-balancing loss of `aux` from now on
    /// (`None`: without); sampling and scoring passes do not see it.
    pub fn set_router_aux(&mut self, aux: Option<super::moe_train::RouterAux>) {
        let aux = aux.map(std::sync::Arc::new);
        for moe in self.layers.iter_mut().filter_map(|l| l.moe.as_mut()) {
            moe.aux = aux.clone();
        }
    }

    /// Whether `name` is an adapter's tensor (`...lora_A.weight` or `...lora_B.weight`).
    pub fn is_adapter(name: &str) -> bool {
        name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight")
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
        // the base weights: adapters are saved apart, in PEFT's layout (`lora_files.rs`)
        for (name, t) in self.named_tensors().into_iter().filter(|(n, _)| !Self::is_adapter(n)) {
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
        let one = |name: &str, t: &mut Tensor<1>, f: &mut dyn FnMut(&str, &mut Weight)| {
            let mut w = Weight::Vector(t.clone());
            f(name, &mut w);
            if let Weight::Vector(v) = w { *t = v } else { panic!("{name}: rank changed") }
        };
        let two = |name: &str, t: &mut Tensor<2>, f: &mut dyn FnMut(&str, &mut Weight)| {
            let mut w = Weight::Matrix(t.clone());
            f(name, &mut w);
            if let Weight::Matrix(m) = w { *t = m } else { panic!("{name}: rank changed") }
        };
        two(EMBED, &mut self.embed, f);
        for (i, l) in self.layers.iter_mut().enumerate() {
            for t in LayerTensor::ALL {
                match l.slot(t) {
                    Some(Slot::Vector(v)) => one(&t.name(i), v, f),
                    Some(Slot::Matrix(m)) => two(&t.name(i), m, f),
                    None => {}
                }
            }
            if let Some(moe) = l.moe.as_mut() {
                two(&super::moe::router_name(i), &mut moe.router, f);
                for (e, x) in moe.experts.iter_mut().enumerate() {
                    let [g, u, d] = super::moe::expert_names(i, e);
                    two(&g, &mut x.gate, f);
                    two(&u, &mut x.up, f);
                    two(&d, &mut x.down, f);
                }
            }
            for ([a_name, b_name], a) in l.adapters.iter_mut().flat_map(|a| a.named_mut(i)) {
                two(&a_name, &mut a.a, f);
                two(&b_name, &mut a.b, f);
            }
        }
        one(FINAL_NORM, &mut self.norm, f);
        if let Some(h) = self.lm_head.as_mut() {
            two(LM_HEAD, h, f);
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
        let fuse = fuse && self.lora.is_none(); // an adapted layer runs unfused
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
                for t in [l.q_norm.as_mut(), l.k_norm.as_mut(), l.q_bias.as_mut(), l.k_bias.as_mut(), l.v_bias.as_mut(), l.o_bias.as_mut()].into_iter().flatten() {
                    own(t)?;
                }
                own(&mut l.o_proj)?;
                if let Some(d) = l.down_proj.as_mut() {
                    own(d)?;
                }
                if let Some(moe) = l.moe.as_mut() {
                    own(&mut moe.router)?;
                    for x in moe.experts.iter_mut() {
                        own(&mut x.gate)?;
                        own(&mut x.up)?;
                        own(&mut x.down)?;
                    }
                }
                for (_, a) in l.adapters.iter_mut().flat_map(|a| a.named_mut(0)) {
                    own(&mut a.a)?;
                    own(&mut a.b)?;
                }
                if !fuse {
                    for t in [&mut l.q_proj, &mut l.k_proj, &mut l.v_proj] {
                        own(t)?;
                    }
                }
                // a sparse layer's gate/up are not fused: they are its experts'
                if !fuse || l.moe.is_some() {
                    for t in [l.gate_proj.as_mut(), l.up_proj.as_mut()].into_iter().flatten() {
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
        if self.lora.is_some() {
            return; // an adapted layer runs unfused
        }
        self.fused = self.layers.iter_mut().map(Layer::fuse).collect();
    }

    /// The LM head's weight `[vocab, hidden]`: its own, or the tied embedding.
    pub(crate) fn head(&self) -> Tensor<2> {
        self.lm_head.clone().unwrap_or_else(|| self.embed.clone())
    }
}
