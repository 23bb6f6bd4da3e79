//! What the forward runs on: rows of (token, sequence, position), and the sampler's KV cache.

use crate::ops::attention::KvCacheShape;
use crate::model::ModelConfig;
use crate::KernelError;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};

/// Stand-in rows after a sequence of `len` rows up to a multiple of `granule`.
pub fn padding_rows(len: usize, granule: usize) -> usize {
    (granule - len % granule) % granule
}

fn post_inc(x: &mut u32) -> u32 {
    *x += 1;
    *x - 1
}

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
    /// [`Rows::whole`] with each sequence followed by [`padding_rows`] stand-in rows (token 0),
    /// so every sequence starts on a multiple of `granule` rows. They sit at the positions
    /// after the sequence (attention is causal: its rows never see them), or, where that would
    /// pass `max_positions`, as a sequence of their own in an extra slot (numbered from
    /// `sequences.len()`).
    pub fn whole_padded(sequences: &[Vec<u32>], granule: usize, max_positions: usize) -> Self {
        let mut rows = Rows::default();
        let mut extra = sequences.len() as u32;
        for (s, seq) in sequences.iter().enumerate() {
            for (p, &t) in seq.iter().enumerate() {
                rows.push(t, s as u32, p as u32);
            }
            let pad = padding_rows(seq.len(), granule);
            let (slot, first) = if seq.len() + pad <= max_positions { (s as u32, seq.len()) } else { (post_inc(&mut extra), 0) };
            for p in first..first + pad {
                rows.push(0, slot, p as u32);
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
        // In the persistent pool, for the reason given at `Qwen3::into_resident`: the cache
        // lives as long as the engine.
        let layers = device.memory_persistent_allocations((), |_| {
            (0..config.num_layers)
                .map(|_| (Tensor::<4>::zeros(dims, (device, dtype)), Tensor::<4>::zeros(dims, (device, dtype))))
                .collect()
        });
        Self { shape, layers }
    }

    /// Copies positions `0..len` of every layer's K and V from slot `from` to slot `to`: a
    /// plain copy, so `to` then holds exactly the bits `from` computed.
    pub fn copy_prefix(&mut self, from: usize, to: usize, len: usize) -> Result<(), KernelError> {
        self.copy_prefixes(&[(from, to, len)])
    }

    /// [`KvCache::copy_prefix`] for many `(from, to, len)` at once: one launch per layer's K and
    /// V for all of them (a GRPO step copies a prompt into every other slot of its group; one
    /// slice-assign per copy and layer took most of a rollout's time on the H200). No slot may
    /// be both a source and a destination.
    pub fn copy_prefixes(&mut self, copies: &[(usize, usize, usize)]) -> Result<(), KernelError> {
        let s = self.shape;
        let mut from_rows = Vec::new();
        let mut to_rows = Vec::new();
        // a GRPO step hands ~1000 copies at once: look sources up, don't rescan the list
        let sources: std::collections::HashSet<usize> = copies.iter().map(|&(f, _, _)| f).collect();
        for &(from, to, len) in copies {
            crate::ensure!(from < s.slots && to < s.slots && len <= s.max_len, "copy_prefix", "copy of {len} positions from slot {from} to slot {to} is outside the cache {s:?}");
            crate::ensure!(from == to || !sources.contains(&to), "copy_prefix", "slot {to} is both a source and a destination");
            if from != to {
                for p in 0..len {
                    from_rows.push((from * s.max_len + p) as i32);
                    to_rows.push((to * s.max_len + p) as i32);
                }
            }
        }
        if from_rows.is_empty() {
            return Ok(());
        }
        let device = self.layers[0].0.device();
        let n = from_rows.len();
        let from_t = Tensor::<1, Int>::from_data(TensorData::new(from_rows, [n]), &device);
        let to_t = Tensor::<1, Int>::from_data(TensorData::new(to_rows, [n]), &device);
        for (k, v) in self.layers.iter_mut() {
            for t in [k, v] {
                // taken out so the copy may write in place
                *t = crate::ops::attention::copy_cache_rows(take(t), from_t.clone(), to_t.clone())?;
            }
        }
        Ok(())
    }

    /// Bytes held by the cache.
    pub fn bytes(&self, dtype: DType) -> usize {
        let s = self.shape;
        2 * self.layers.len() * s.slots * s.max_len * s.kv_heads * s.head_dim * dtype.size()
    }
}

thread_local! {
    /// One placeholder per device, shared by every [`take`]: a fresh one per call was an
    /// allocation (a task on cubecl's device thread) for each K and V of each layer and step.
    static PLACEHOLDERS: std::cell::RefCell<Vec<Tensor<4>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Moves a cache tensor out (leaving a placeholder) so the kernel that writes it holds the only
/// reference and may write in place.
pub(crate) fn take(t: &mut Tensor<4>) -> Tensor<4> {
    let device = t.device();
    let placeholder = PLACEHOLDERS.with(|p| {
        let mut p = p.borrow_mut();
        match p.iter().find(|x| x.device() == device) {
            Some(x) => x.clone(),
            None => {
                let x = Tensor::<4>::empty([1, 1, 1, 1], &device);
                p.push(x.clone());
                x
            }
        }
    });
    std::mem::replace(t, placeholder)
}

/// The cache rows at each row's (slot, position), `[rows, kv_heads * head_dim]` (for traces).
pub(crate) fn cache_rows(cache: &Tensor<4>, rows: &Rows) -> Tensor<2> {
    let [slots, len, heads, dim] = cache.dims();
    let at: Vec<i32> = rows.slots.iter().zip(&rows.positions).map(|(&s, &p)| (s as usize * len + p as usize) as i32).collect();
    let index = Tensor::<1, Int>::from_data(TensorData::new(at, [rows.len()]), &cache.device());
    cache.clone().reshape([slots * len, heads * dim]).select(0, index)
}
