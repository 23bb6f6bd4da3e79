//! What the forward runs on: rows of (token, sequence, position), and the sampler's KV cache.

use crate::ops::attention::{BlockRows, KvCacheShape, BLOCK};
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
    /// Which rows are [`Rows::whole_padded`]'s stand-ins (ascending; empty for other rows): the
    /// load-balancing loss leaves them out.
    pub padding: Vec<usize>,
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
                rows.padding.push(rows.len());
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

/// Per-layer K and V caches and where each sequence's positions live in them.
///
/// Two layouts, the same kernels and bits: [`KvCache::new`] holds `[slots, max_len, kv_heads,
/// head_dim]` tensors, every slot owning its `max_len` positions for the cache's life (tests,
/// the auditor, the battery); [`KvCache::paged`] holds `[blocks, BLOCK, kv_heads, head_dim]`
/// and hands a sequence [`BLOCK`]-position blocks as it grows ([`KvCache::reserve`]), takes
/// them back when it finishes ([`KvCache::release`]) and lets sequences with one prompt share
/// its whole blocks ([`KvCache::copy_prefixes`]). Either way the kernels read a sequence's
/// keys through its block table ([`BlockRows`]) in the same order, so a row's bits do not
/// depend on where its blocks are.
pub struct KvCache {
    /// Logical shape: `slots` sequences (block-table rows) of up to `max_len` positions.
    pub shape: KvCacheShape,
    pub layers: Vec<(Tensor<4>, Tensor<4>)>,
    blocks: Option<Blocks>,
    /// The device copy of the block table, `None` after a change.
    table: Option<BlockRows>,
    /// The paged table's device buffer: a change is written into it in place, so a graph
    /// captured on it reads the current table when it replays.
    table_buffer: Option<Tensor<1, Int>>,
    /// The device's int dtype (the tables' element type), learnt at the first upload.
    int_dtype: Option<DType>,
}

/// The paged layout's bookkeeping (host side).
struct Blocks {
    /// Blocks no sequence holds.
    free: Vec<u32>,
    /// Sequences holding each block (a shared prompt block is held by its whole group).
    holders: Vec<u32>,
    /// Each slot's blocks, in position order.
    owned: Vec<Vec<u32>>,
}

impl KvCache {
    pub fn new(config: &ModelConfig, slots: usize, max_len: usize, dtype: DType, device: &Device) -> Self {
        let shape = KvCacheShape { slots, max_len, kv_heads: config.num_kv_heads, head_dim: config.head_dim };
        let layers = Self::tensors(config, [slots, max_len, shape.kv_heads, shape.head_dim], dtype, device);
        Self { shape, layers, blocks: None, table: None, table_buffer: None, int_dtype: None }
    }

    /// A paged cache of `blocks` blocks of [`BLOCK`] positions for up to `slots` sequences of up
    /// to `max_len` positions each (rounded up to whole blocks). Sequences hold no block until
    /// [`KvCache::reserve`].
    pub fn paged(config: &ModelConfig, slots: usize, max_len: usize, blocks: usize, dtype: DType, device: &Device) -> Result<Self, KernelError> {
        let width = max_len.div_ceil(BLOCK);
        crate::ensure!(blocks >= width, "kv cache", "{blocks} blocks of {BLOCK} positions cannot hold one sequence of {max_len} positions ({width} blocks)");
        let elements = blocks as u128 * (BLOCK * config.num_kv_heads * config.head_dim) as u128;
        crate::ensure!(elements <= i32::MAX as u128, "kv cache", "{blocks} blocks of {BLOCK} positions are {elements} elements per layer, beyond the kernels' 31-bit block rows ({}); lower the KV budget", i32::MAX);
        let shape = KvCacheShape { slots, max_len: width * BLOCK, kv_heads: config.num_kv_heads, head_dim: config.head_dim };
        let layers = Self::tensors(config, [blocks, BLOCK, shape.kv_heads, shape.head_dim], dtype, device);
        let blocks = Blocks { free: (0..blocks as u32).rev().collect(), holders: vec![0; blocks], owned: vec![Vec::new(); slots] };
        Ok(Self { shape, layers, blocks: Some(blocks), table: None, table_buffer: None, int_dtype: None })
    }

    fn tensors(config: &ModelConfig, dims: [usize; 4], dtype: DType, device: &Device) -> Vec<(Tensor<4>, Tensor<4>)> {
        // In the persistent pool, for the reason given at `Qwen3::into_resident`: the cache
        // lives as long as the engine.
        device.memory_persistent_allocations((), |_| {
            (0..config.num_layers)
                .map(|_| (Tensor::<4>::zeros(dims, (device, dtype)), Tensor::<4>::zeros(dims, (device, dtype))))
                .collect()
        })
    }

    fn width(&self) -> usize {
        self.shape.max_len.div_ceil(BLOCK)
    }

    /// Blocks of a paged cache no sequence holds (`None`: not paged).
    pub fn free_blocks(&self) -> Option<usize> {
        self.blocks.as_ref().map(|b| b.free.len())
    }

    /// Blocks of a paged cache in all (`None`: not paged).
    pub fn total_blocks(&self) -> Option<usize> {
        self.blocks.as_ref().map(|b| b.holders.len())
    }

    /// Blocks `slot` holds (paged; 0 for a contiguous cache, whose slots hold their whole length).
    pub fn blocks_held(&self, slot: usize) -> usize {
        self.blocks.as_ref().map_or(0, |b| b.owned[slot].len())
    }

    /// Blocks `len` positions take.
    pub fn blocks_for(len: usize) -> usize {
        len.div_ceil(BLOCK)
    }

    /// Whether `slot` may hold position `pos`: inside the shape, and (paged) in a block it holds.
    pub fn covers(&self, slot: usize, pos: usize) -> bool {
        slot < self.shape.slots && pos < self.shape.max_len && self.blocks.as_ref().is_none_or(|b| pos / BLOCK < b.owned[slot].len())
    }

    /// Gives `slot` blocks for positions `0..len` (paged; a contiguous slot holds them all
    /// already). `false` when the cache ran out: what it could take it keeps.
    pub fn reserve(&mut self, slot: usize, len: usize) -> bool {
        let need = Self::blocks_for(len);
        let Some(b) = self.blocks.as_mut() else { return true };
        while b.owned[slot].len() < need {
            let Some(block) = b.free.pop() else { return false };
            b.holders[block as usize] = 1;
            b.owned[slot].push(block);
            self.table = None;
        }
        true
    }

    /// Hands back `slot`'s blocks (paged): a block no other sequence holds is free again.
    pub fn release(&mut self, slot: usize) {
        let Some(b) = self.blocks.as_mut() else { return };
        for block in std::mem::take(&mut b.owned[slot]) {
            b.holders[block as usize] -= 1;
            if b.holders[block as usize] == 0 {
                b.free.push(block);
            }
        }
        self.table = None;
    }

    /// The block table on the device (uploaded again after a change).
    pub fn pages(&mut self) -> Result<BlockRows, KernelError> {
        if let Some(t) = &self.table {
            return Ok(t.clone());
        }
        let device = self.layers[0].0.device();
        let int_dtype = match self.int_dtype {
            Some(d) => d,
            None => crate::bridge::int_in("kv cache", "probe", Tensor::<1, Int>::zeros([1], &device))?.dtype,
        };
        self.int_dtype = Some(int_dtype);
        let table = match &self.blocks {
            None => BlockRows::contiguous(&self.shape, int_dtype, &device)?,
            Some(b) => {
                let width = self.width();
                // a position past a sequence's blocks is never read or written (`covers`): 0
                let mut rows = vec![0i32; self.shape.slots * width];
                for (slot, owned) in b.owned.iter().enumerate() {
                    for (i, &block) in owned.iter().enumerate() {
                        rows[slot * width + i] = (block as usize * BLOCK) as i32;
                    }
                }
                let len = self.shape.slots * width;
                let t = match self.table_buffer.take().filter(|t| t.dims()[0] == len) {
                    Some(t) => {
                        crate::ops::in_place::write_ints("kv cache", "block table", &t, &rows.iter().map(|&r| r as i64).collect::<Vec<_>>())?;
                        t
                    }
                    None => Tensor::<1, Int>::from_data(TensorData::new(rows, [len]), &device),
                };
                self.table_buffer = Some(t.clone());
                BlockRows::new("kv cache", t, self.shape.slots, width)?
            }
        };
        self.table = Some(table.clone());
        Ok(table)
    }

    /// The cache row of (slot, position) (host side, for copies and traces).
    fn row(&self, slot: usize, pos: usize) -> usize {
        match &self.blocks {
            None => slot * self.shape.max_len + pos,
            Some(b) => b.owned[slot][pos / BLOCK] as usize * BLOCK + pos % BLOCK,
        }
    }

    /// Copies positions `0..len` of every layer's K and V from slot `from` to slot `to`: a
    /// plain copy, so `to` then holds exactly the bits `from` computed.
    pub fn copy_prefix(&mut self, from: usize, to: usize, len: usize) -> Result<(), KernelError> {
        match self.copy_prefixes(&[(from, to, len)])?[..] {
            [false] => Err(KernelError::new("copy_prefix", format!("no free cache block for slot {to}'s copy of {len} positions"))),
            _ => Ok(()),
        }
    }

    /// [`KvCache::copy_prefix`] for many `(from, to, len)` at once: one launch per layer's K and
    /// V for all of them (a GRPO step copies a prompt into every other slot of its group; one
    /// slice-assign per copy and layer took most of a rollout's time on the H200). No slot may
    /// be both a source and a destination. Paged, a destination that holds no block yet takes
    /// the source's whole blocks of the prefix as its own (held by both; neither writes them:
    /// the prefix is complete) and copies only the rows of the last, partial one into a fresh
    /// block; `false` in the result where no block was free for that (nothing done for it).
    pub fn copy_prefixes(&mut self, copies: &[(usize, usize, usize)]) -> Result<Vec<bool>, KernelError> {
        let s = self.shape;
        let mut from_rows = Vec::new();
        let mut to_rows = Vec::new();
        let mut done = Vec::with_capacity(copies.len());
        // a GRPO step hands ~1000 copies at once: look sources up, don't rescan the list
        let sources: std::collections::HashSet<usize> = copies.iter().map(|&(f, _, _)| f).collect();
        for &(from, to, len) in copies {
            crate::ensure!(from < s.slots && to < s.slots && len <= s.max_len, "copy_prefix", "copy of {len} positions from slot {from} to slot {to} is outside the cache {s:?}");
            crate::ensure!(from == to || !sources.contains(&to), "copy_prefix", "slot {to} is both a source and a destination");
            crate::ensure!(len == 0 || self.covers(from, len - 1), "copy_prefix", "slot {from} holds fewer than the {len} positions to copy");
            let mut first = 0;
            if from != to {
                if let Some(b) = self.blocks.as_mut().filter(|b| b.owned[to].is_empty()) {
                    let whole = len / BLOCK;
                    if len % BLOCK > 0 && b.free.is_empty() {
                        done.push(false);
                        continue;
                    }
                    for i in 0..whole {
                        let block = b.owned[from][i];
                        b.holders[block as usize] += 1;
                        b.owned[to].push(block);
                    }
                    self.table = None;
                    first = whole * BLOCK;
                    // the partial block: the free one checked for above
                    crate::ensure!(self.reserve(to, len), "copy_prefix", "no free block for slot {to}'s last {} prefix positions", len - first);
                }
                crate::ensure!(len == 0 || self.covers(to, len - 1), "copy_prefix", "slot {to} holds fewer than the {len} positions to copy into");
                for p in first..len {
                    from_rows.push(self.row(from, p) as i32);
                    to_rows.push(self.row(to, p) as i32);
                }
            }
            done.push(true);
        }
        if from_rows.is_empty() {
            return Ok(done);
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
        Ok(done)
    }

    /// Bytes held by the cache.
    pub fn bytes(&self, dtype: DType) -> usize {
        let rows = match &self.blocks {
            None => self.shape.slots * self.shape.max_len,
            Some(b) => b.holders.len() * BLOCK,
        };
        2 * self.layers.len() * rows * self.shape.kv_heads * self.shape.head_dim * dtype.size()
    }

    /// The cache rows at each row's (slot, position), `[rows, kv_heads * head_dim]` (for traces).
    pub(crate) fn rows_of(&self, cache: &Tensor<4>, rows: &Rows) -> Tensor<2> {
        let [units, len, heads, dim] = cache.dims();
        let at: Vec<i32> = rows.slots.iter().zip(&rows.positions).map(|(&s, &p)| self.row(s as usize, p as usize) as i32).collect();
        let index = Tensor::<1, Int>::from_data(TensorData::new(at, [rows.len()]), &cache.device());
        cache.clone().reshape([units * len, heads * dim]).select(0, index)
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
