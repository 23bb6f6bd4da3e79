//! What the forward runs on: rows of (token, sequence, position), and the sampler's KV cache.

use crate::ops::attention::KvCacheShape;
use crate::model::ModelConfig;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};

/// The tokens to run: row r is token `tokens[r]` at `positions[r]` of sequence `slots[r]`.
#[derive(Clone, Debug, Default)]
pub struct Rows {
    pub tokens: Vec<u32>,
    pub slots: Vec<u32>,
    pub positions: Vec<u32>,
}

impl Rows {
    /// Every token of each sequence; sequence i uses slot i.
    pub fn whole(sequences: &[Vec<u32>]) -> Self {
        let mut rows = Rows::default();
        for (s, seq) in sequences.iter().enumerate() {
            for (p, &t) in seq.iter().enumerate() {
                rows.push(t, s as u32, p as u32);
            }
        }
        rows
    }
    pub fn push(&mut self, token: u32, slot: u32, position: u32) {
        self.tokens.push(token);
        self.slots.push(slot);
        self.positions.push(position);
    }
    pub fn len(&self) -> usize {
        self.tokens.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// Per-layer K and V caches, `[slots, max_len, kv_heads, head_dim]` each.
pub struct KvCache {
    pub shape: KvCacheShape,
    pub layers: Vec<(Tensor<4>, Tensor<4>)>,
}

impl KvCache {
    pub fn new(config: &ModelConfig, slots: usize, max_len: usize, dtype: DType, device: &Device) -> Self {
        let shape = KvCacheShape { slots, max_len, kv_heads: config.num_kv_heads, head_dim: config.head_dim };
        let dims = [slots, max_len, shape.kv_heads, shape.head_dim];
        let layers = (0..config.num_layers)
            .map(|_| (Tensor::<4>::zeros(dims, device).cast(dtype), Tensor::<4>::zeros(dims, device).cast(dtype)))
            .collect();
        Self { shape, layers }
    }

    /// Copies positions `0..len` of every layer's K and V from slot `from` to slot `to`: a
    /// plain copy, so `to` then holds exactly the bits `from` computed.
    pub fn copy_prefix(&mut self, from: usize, to: usize, len: usize) {
        let s = self.shape;
        if from == to || len == 0 {
            return;
        }
        assert!(from < s.slots && to < s.slots && len <= s.max_len, "copy_prefix({from}, {to}, {len}) outside the cache {s:?}");
        for (k, v) in self.layers.iter_mut() {
            for t in [k, v] {
                let rows = t.clone().slice([from..from + 1, 0..len, 0..s.kv_heads, 0..s.head_dim]);
                // taken out so slice_assign may write in place
                *t = take(t).slice_assign([to..to + 1, 0..len, 0..s.kv_heads, 0..s.head_dim], rows);
            }
        }
    }

    /// Bytes held by the cache.
    pub fn bytes(&self, dtype: DType) -> usize {
        let s = self.shape;
        2 * self.layers.len() * s.slots * s.max_len * s.kv_heads * s.head_dim * dtype.size()
    }
}

/// Moves a cache tensor out (leaving a placeholder) so the kernel that writes it holds the only
/// reference and may write in place.
pub(crate) fn take(t: &mut Tensor<4>) -> Tensor<4> {
    let device = t.device();
    std::mem::replace(t, Tensor::<4>::empty([1, 1, 1, 1], &device))
}

/// The cache rows at each row's (slot, position), `[rows, kv_heads * head_dim]` (for traces).
pub(crate) fn cache_rows(cache: &Tensor<4>, rows: &Rows) -> Tensor<2> {
    let [slots, len, heads, dim] = cache.dims();
    let at: Vec<i32> = rows.slots.iter().zip(&rows.positions).map(|(&s, &p)| (s as usize * len + p as usize) as i32).collect();
    let index = Tensor::<1, Int>::from_data(TensorData::new(at, [rows.len()]), &cache.device());
    cache.clone().reshape([slots * len, heads * dim]).select(0, index)
}
