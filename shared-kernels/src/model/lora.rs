//! Low-rank adapters (LoRA, as PEFT defines them) on a layer's projections, computed unmerged
//! on the batch-invariant kernels in one fixed order on both sides of the contract:
//!
//!   y = (x W^T + b) + s * ((x A^T) B^T),   A = `lora_A` [r, in], B = `lora_B` [out, r],
//!   s = alpha / r (or alpha / sqrt(r) with rsLoRA)
//!
//! so the sampler's and the trainer's logprobs stay equal as bits with an adapter. The base
//! weights are left as loaded (frozen in training); only A and B are trained.

use super::ModelError;
use super::KernelSet;
use crate::WeightLayout::OutIn;
use burn::tensor::{DType, Device, Tensor, TensorData};

/// A projection an adapter can sit on, by PEFT's `target_modules` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Projection {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Projection {
    pub const ALL: [Projection; 7] = [Projection::Q, Projection::K, Projection::V, Projection::O, Projection::Gate, Projection::Up, Projection::Down];

    /// PEFT's module name (`target_modules`).
    pub fn module(self) -> &'static str {
        match self {
            Projection::Q => "q_proj",
            Projection::K => "k_proj",
            Projection::V => "v_proj",
            Projection::O => "o_proj",
            Projection::Gate => "gate_proj",
            Projection::Up => "up_proj",
            Projection::Down => "down_proj",
        }
    }

    /// The module's path inside `model.layers.{i}.`.
    pub fn path(self) -> &'static str {
        match self {
            Projection::Q => "self_attn.q_proj",
            Projection::K => "self_attn.k_proj",
            Projection::V => "self_attn.v_proj",
            Projection::O => "self_attn.o_proj",
            Projection::Gate => "mlp.gate_proj",
            Projection::Up => "mlp.up_proj",
            Projection::Down => "mlp.down_proj",
        }
    }

    pub fn from_module(name: &str) -> Option<Projection> {
        Projection::ALL.into_iter().find(|p| p.module() == name)
    }

    /// `[out, in]` of the projection in a model of shape `c`.
    pub fn dims(self, c: &super::ModelConfig) -> (usize, usize) {
        let (h, f, q, kv) = (c.hidden_size, c.intermediate_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        match self {
            Projection::Q => (q, h),
            Projection::K | Projection::V => (kv, h),
            Projection::O => (h, q),
            Projection::Gate | Projection::Up => (f, h),
            Projection::Down => (h, f),
        }
    }

    /// The adapter's two tensor names in layer `layer` (lockstep's and PEFT's, without PEFT's
    /// `base_model.model.` prefix).
    pub fn tensor_names(self, layer: usize) -> [String; 2] {
        let base = format!("model.layers.{layer}.{}", self.path());
        [format!("{base}.lora_A.weight"), format!("{base}.lora_B.weight")]
    }

    /// The adapter's two tensor names on expert `expert` of sparse layer `layer` (PEFT's
    /// per-expert layout).
    pub fn expert_tensor_names(self, layer: usize, expert: usize) -> [String; 2] {
        let base = format!("model.layers.{layer}.mlp.experts.{expert}.{}", self.module());
        [format!("{base}.lora_A.weight"), format!("{base}.lora_B.weight")]
    }

    /// An MLP projection (on a mixture-of-experts layer, each expert's).
    pub fn is_mlp(self) -> bool {
        matches!(self, Projection::Gate | Projection::Up | Projection::Down)
    }
}

/// One adapter's place: a projection of a layer, or of one expert of a sparse layer (PEFT's
/// per-expert layout, `model.layers.{i}.mlp.experts.{e}.gate_proj.lora_A.weight`, as PEFT
/// saves adapters on transformers 4's Qwen3-MoE modules).
#[derive(Clone, Debug, PartialEq)]
pub struct Site {
    pub projection: Projection,
    pub expert: Option<usize>,
    /// `lora_A`'s and `lora_B`'s names.
    pub names: [String; 2],
    /// `[out, in]` of the adapted projection.
    pub dims: (usize, usize),
}

/// Every adapter site of layer `layer` of a model of shape `c` under `spec`: the targets in
/// order; an MLP target of a sparse layer once per expert, experts in order.
pub fn sites(c: &super::ModelConfig, spec: &LoraSpec, layer: usize) -> Vec<Site> {
    let mut out = Vec::new();
    for &p in &spec.targets {
        match c.moe.as_ref().filter(|m| p.is_mlp() && m.is_sparse(layer)) {
            Some(m) => {
                let (h, f) = (c.hidden_size, m.expert_intermediate);
                let dims = if p == Projection::Down { (h, f) } else { (f, h) };
                for e in 0..m.num_experts {
                    out.push(Site { projection: p, expert: Some(e), names: p.expert_tensor_names(layer, e), dims });
                }
            }
            None => out.push(Site { projection: p, expert: None, names: p.tensor_names(layer), dims: p.dims(c) }),
        }
    }
    out
}

/// How the adapters are shaped and scaled (PEFT's `LoraConfig`).
#[derive(Clone, Debug, PartialEq)]
pub struct LoraSpec {
    pub rank: usize,
    pub alpha: f64,
    /// rsLoRA: scale by alpha / sqrt(rank) instead of alpha / rank.
    pub rslora: bool,
    pub targets: Vec<Projection>,
}

impl LoraSpec {
    /// s, rounded once to f32 (both sides multiply by the same value).
    pub fn scale(&self) -> f32 {
        let r = self.rank as f64;
        (if self.rslora { self.alpha / r.sqrt() } else { self.alpha / r }) as f32
    }
}

/// How A starts (B starts at zero, so an untrained adapter changes no output): PEFT's default
/// (`init_lora_weights=True`: Kaiming-uniform with a = sqrt(5), U(-1/sqrt(in), 1/sqrt(in))) or
/// `"gaussian"` (N(0, 1/r)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoraInit {
    KaimingUniform,
    Gaussian,
}

/// One projection's adapter.
#[derive(Clone, Debug)]
pub struct Adapter {
    /// `lora_A` [r, in].
    pub a: Tensor<2>,
    /// `lora_B` [out, r].
    pub b: Tensor<2>,
}

/// A layer's adapters, by projection, and their common scale; on a sparse (mixture-of-experts)
/// layer the MLP's sit on each expert's projections instead (`experts[e]`, empty otherwise).
#[derive(Clone, Debug)]
pub struct LayerAdapters {
    pub scale: f32,
    pub by_projection: Vec<(Projection, Adapter)>,
    pub experts: Vec<Vec<(Projection, Adapter)>>,
}

impl LayerAdapters {
    pub fn get(&self, p: Projection) -> Option<&Adapter> {
        self.by_projection.iter().find(|(q, _)| *q == p).map(|(_, a)| a)
    }

    /// Expert `e`'s adapter on `p`.
    pub fn expert(&self, e: usize, p: Projection) -> Option<&Adapter> {
        self.experts.get(e)?.iter().find(|(q, _)| *q == p).map(|(_, a)| a)
    }

    /// Adapters in `sites` order (`sites(c, spec, layer)`), from their values.
    pub fn from_sites(scale: f32, sites: &[Site], mut adapter: impl FnMut(&Site) -> Result<Adapter, ModelError>) -> Result<Self, ModelError> {
        let mut out = LayerAdapters { scale, by_projection: Vec::new(), experts: Vec::new() };
        for site in sites {
            let a = adapter(site)?;
            match site.expert {
                None => out.by_projection.push((site.projection, a)),
                Some(e) => {
                    if out.experts.len() <= e {
                        out.experts.resize_with(e + 1, Vec::new);
                    }
                    out.experts[e].push((site.projection, a));
                }
            }
        }
        Ok(out)
    }

    /// Every adapter with its tensor names, in `sites` order for layer `layer`.
    pub fn named_mut(&mut self, layer: usize) -> Vec<([String; 2], &mut Adapter)> {
        let mut out: Vec<([String; 2], &mut Adapter)> = self.by_projection.iter_mut().map(|(p, a)| (p.tensor_names(layer), a)).collect();
        for (e, adapters) in self.experts.iter_mut().enumerate() {
            for (p, a) in adapters.iter_mut() {
                out.push((p.expert_tensor_names(layer, e), a));
            }
        }
        out
    }
}

/// `y + s * ((x A^T) B^T)`: the adapter's term, added after the base projection (and its bias).
pub fn add_adapter(y: Tensor<2>, x: Tensor<2>, adapter: &Adapter, scale: f32, kernels: KernelSet) -> Result<Tensor<2>, ModelError> {
    let down = kernels.matmul(x, adapter.a.clone(), OutIn)?;
    let up = kernels.matmul(down, adapter.b.clone(), OutIn)?;
    Ok(crate::add(y, up.mul_scalar(scale))?)
}

/// Fresh adapters for every layer of a model of shape `c` (`init` for A, zeros for B), in
/// `dtype`, reproducible from `seed`: the same values on every runtime (drawn on the host).
pub fn fresh_adapters(c: &super::ModelConfig, spec: &LoraSpec, init: LoraInit, seed: u64, dtype: DType, device: &Device) -> Vec<LayerAdapters> {
    let mut state = seed ^ 0x1f0a_7e3c_55aa_9d21;
    let mut uniform = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64 // (0, 1)
    };
    (0..c.num_layers)
        .map(|layer| {
            let made = LayerAdapters::from_sites(spec.scale(), &sites(c, spec, layer), |site| {
                let (out, inp) = site.dims;
                let a: Vec<f32> = match init {
                    LoraInit::KaimingUniform => {
                        let bound = 1.0 / (inp as f64).sqrt();
                        (0..spec.rank * inp).map(|_| ((uniform() * 2.0 - 1.0) * bound) as f32).collect()
                    }
                    LoraInit::Gaussian => {
                        let std = 1.0 / spec.rank as f64;
                        // Box-Muller, one normal per pair of uniforms
                        (0..spec.rank * inp).map(|_| ((-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos() * std) as f32).collect()
                    }
                };
                let a = Tensor::<2>::from_data(TensorData::new(a, [spec.rank, inp]), device).cast(dtype);
                let b = Tensor::<2>::zeros([out, spec.rank], (device, dtype));
                Ok(Adapter { a, b })
            });
            made.expect("fresh adapters: nothing to fail")
        })
        .collect()
}
