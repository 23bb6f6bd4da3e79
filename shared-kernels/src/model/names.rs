//! The Hugging Face tensor names, spelled once. Loading, saving, the expected-tensor list, the
//! weight walk (hence the weight fingerprint and the optimizer's state) all read this table, in
//! this order: the embedding, each layer's tensors in [`LayerTensor::ALL`] order, the final
//! norm, the untied LM head.

use super::ModelConfig;

pub const EMBED: &str = "model.embed_tokens.weight";
pub const FINAL_NORM: &str = "model.norm.weight";
/// Present only when the head is not tied to [`EMBED`].
pub const LM_HEAD: &str = "lm_head.weight";

/// One tensor of a decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerTensor {
    InputNorm,
    QProj,
    /// q/k/v biases: Qwen2, or `attention_bias` (which also gives o_proj one).
    QBias,
    KProj,
    KBias,
    VProj,
    VBias,
    OProj,
    OBias,
    /// Qwen3 only (per-head RMSNorm of q and k before RoPE).
    QNorm,
    KNorm,
    PostNorm,
    GateProj,
    UpProj,
    DownProj,
}

impl LayerTensor {
    /// Checkpoint order.
    pub const ALL: [LayerTensor; 15] = [
        LayerTensor::InputNorm,
        LayerTensor::QProj,
        LayerTensor::QBias,
        LayerTensor::KProj,
        LayerTensor::KBias,
        LayerTensor::VProj,
        LayerTensor::VBias,
        LayerTensor::OProj,
        LayerTensor::OBias,
        LayerTensor::QNorm,
        LayerTensor::KNorm,
        LayerTensor::PostNorm,
        LayerTensor::GateProj,
        LayerTensor::UpProj,
        LayerTensor::DownProj,
    ];

    /// The name's part after `model.layers.{i}.`.
    pub fn suffix(self) -> &'static str {
        match self {
            LayerTensor::InputNorm => "input_layernorm.weight",
            LayerTensor::QProj => "self_attn.q_proj.weight",
            LayerTensor::KProj => "self_attn.k_proj.weight",
            LayerTensor::VProj => "self_attn.v_proj.weight",
            LayerTensor::OProj => "self_attn.o_proj.weight",
            LayerTensor::QBias => "self_attn.q_proj.bias",
            LayerTensor::KBias => "self_attn.k_proj.bias",
            LayerTensor::VBias => "self_attn.v_proj.bias",
            LayerTensor::OBias => "self_attn.o_proj.bias",
            LayerTensor::QNorm => "self_attn.q_norm.weight",
            LayerTensor::KNorm => "self_attn.k_norm.weight",
            LayerTensor::PostNorm => "post_attention_layernorm.weight",
            LayerTensor::GateProj => "mlp.gate_proj.weight",
            LayerTensor::UpProj => "mlp.up_proj.weight",
            LayerTensor::DownProj => "mlp.down_proj.weight",
        }
    }

    /// The full name in layer `layer`.
    pub fn name(self, layer: usize) -> String {
        format!("model.layers.{layer}.{}", self.suffix())
    }

    /// Whether a model of shape `c` has this tensor.
    pub fn present(self, c: &ModelConfig) -> bool {
        match self {
            LayerTensor::QNorm | LayerTensor::KNorm => c.qk_norm,
            LayerTensor::QBias | LayerTensor::KBias | LayerTensor::VBias => c.qkv_bias,
            LayerTensor::OBias => c.o_bias,
            _ => true,
        }
    }

    /// Its shape in HF layout (`[out, in]` for projections).
    pub fn shape(self, c: &ModelConfig) -> Vec<usize> {
        let (h, f, d) = (c.hidden_size, c.intermediate_size, c.head_dim);
        let (q, kv) = (c.num_heads * d, c.num_kv_heads * d);
        match self {
            LayerTensor::InputNorm | LayerTensor::PostNorm => vec![h],
            LayerTensor::QProj => vec![q, h],
            LayerTensor::KProj | LayerTensor::VProj => vec![kv, h],
            LayerTensor::OProj => vec![h, q],
            LayerTensor::QNorm | LayerTensor::KNorm => vec![d],
            LayerTensor::QBias => vec![q],
            LayerTensor::KBias | LayerTensor::VBias => vec![kv],
            LayerTensor::OBias => vec![h],
            LayerTensor::GateProj | LayerTensor::UpProj => vec![f, h],
            LayerTensor::DownProj => vec![h, f],
        }
    }
}

/// Every tensor a checkpoint of shape `c` holds, with its shape, in checkpoint order.
pub fn expected_tensors(c: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let mut out = vec![(EMBED.to_string(), vec![c.vocab_size, c.hidden_size])];
    for i in 0..c.num_layers {
        out.extend(LayerTensor::ALL.iter().filter(|t| t.present(c)).map(|t| (t.name(i), t.shape(c))));
    }
    out.push((FINAL_NORM.to_string(), vec![c.hidden_size]));
    if !c.tie_word_embeddings {
        out.push((LM_HEAD.to_string(), vec![c.vocab_size, c.hidden_size]));
    }
    out
}
