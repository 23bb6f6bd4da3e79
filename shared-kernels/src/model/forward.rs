//! The one forward: embedding, the layer loop, the final norm, the LM head, for any rows.
//!
//! Work is a list of rows, one per token: (token id, sequence, position). The trainer passes
//! every token of a batch of whole sequences at once; the sampler passes prefill chunks and
//! single decode tokens, with a persistent KV cache. Both go through [`Qwen3::run`], and every
//! kernel under it is batch and chunk invariant, so a token's logits (hence its logprob) have the
//! same bits on both paths.

use super::layer::FusedProjections;
use super::pass::{Pass, Stream, Trace};
use super::{KvCache, ModelError, Qwen3, Rows};
use crate::{embedding, WeightLayout::OutIn};
use burn::tensor::{Int, Tensor, TensorData};

/// Where the rows' token ids come from.
#[derive(Clone, Copy, Default)]
pub enum Tokens<'a> {
    /// `rows.tokens`.
    #[default]
    Host,
    /// The first `index.len()` rows take `sampled[index[r]]`, a device tensor (the tokens the
    /// previous decode step sampled, not yet read back), and ignore their `rows.tokens`; the
    /// other rows take `rows.tokens`. Lets the sampler enqueue a decode step before the previous
    /// one's tokens reach the host.
    Device { sampled: &'a Tensor<1, Int>, index: &'a [i32] },
    /// Every row's token id in this device tensor (`[rows]`), `rows.tokens` ignored: a
    /// replayed graph's input buffer, filled before each replay.
    Ids(&'a Tensor<1, Int>),
}

/// Which rows' logits a forward computes.
#[derive(Clone, Copy, Default)]
pub enum Logits<'a> {
    #[default]
    All,
    /// These rows, in this order (none: no LM head at all, e.g. a step of prompt chunks that
    /// ends no prompt). Rows are independent in every kernel, so the selected rows' logits have
    /// the bits of a full forward.
    At(&'a [usize]),
}

/// One forward's inputs: [`Qwen3::run`] takes it.
#[derive(Default)]
pub struct Forward<'a> {
    pub rows: Option<&'a Rows>,
    pub tokens: Tokens<'a>,
    pub logits: Logits<'a>,
    /// With a cache, each row's K/V is written into its slot first and attention reads the
    /// cache (prefill chunks, decode steps); without, the rows must be whole sequences (the
    /// training path, differentiable on an autodiff device).
    pub cache: Option<&'a mut KvCache>,
    pub trace: Option<&'a mut Trace>,
    /// Each sparse layer's routing of the rows is pushed here (a mixture-of-experts model).
    pub routing: Option<&'a mut super::moe::RoutingLog>,
    /// The rows' slots and positions already on the device (`[rows]` each, equal to
    /// `rows.slots` / `rows.positions`, which host-side checks still read); else uploaded from
    /// `rows`. A captured graph must upload nothing.
    pub device_rows: Option<(&'a Tensor<1, Int>, &'a Tensor<1, Int>)>,
}

impl<'a> Forward<'a> {
    pub fn rows(rows: &'a Rows) -> Self {
        Forward { rows: Some(rows), ..Forward::default() }
    }
    pub fn cache(mut self, cache: &'a mut KvCache) -> Self {
        self.cache = Some(cache);
        self
    }
    pub fn logits_at(mut self, at: &'a [usize]) -> Self {
        self.logits = Logits::At(at);
        self
    }
    pub fn tokens(mut self, tokens: Tokens<'a>) -> Self {
        self.tokens = tokens;
        self
    }
    pub fn device_rows(mut self, slots: &'a Tensor<1, Int>, positions: &'a Tensor<1, Int>) -> Self {
        self.device_rows = Some((slots, positions));
        self
    }
    pub fn traced(mut self, trace: &'a mut Trace) -> Self {
        self.trace = Some(trace);
        self
    }
    pub fn routing(mut self, log: &'a mut super::moe::RoutingLog) -> Self {
        self.routing = Some(log);
        self
    }
}

/// The rows' sequence, position (or token) ids as a device tensor.
pub fn int_tensor(v: &[u32], device: &burn::tensor::Device) -> Tensor<1, Int> {
    Tensor::<1, Int>::from_data(TensorData::new(v.iter().map(|&x| x as i32).collect::<Vec<_>>(), [v.len()]), device)
}

impl Qwen3 {
    /// Logits `[rows, vocab]` for every row (see [`Forward::cache`] for what a cache changes).
    pub fn forward(&self, rows: &Rows, cache: Option<&mut KvCache>) -> Result<Tensor<2>, ModelError> {
        let mut args = Forward::rows(rows);
        args.cache = cache;
        self.run(args)?.ok_or_else(|| ModelError::Input("no logits requested".into()))
    }

    /// The forward as `args` asks: the logits of the rows it names (`None` when it names none).
    pub fn run(&self, args: Forward) -> Result<Option<Tensor<2>>, ModelError> {
        let Forward { rows, tokens, logits, cache, mut trace, routing, device_rows } = args;
        let rows = rows.ok_or_else(|| ModelError::Input("a forward needs rows".into()))?;
        if let Logits::At(at) = logits {
            if let Some(&r) = at.iter().find(|&&r| r >= rows.len()) {
                return Err(ModelError::Input(format!("logits asked for row {r} of {} rows", rows.len())));
            }
        }
        if let Tokens::Device { index, .. } = tokens {
            if index.len() > rows.len() {
                return Err(ModelError::Input(format!("{} fed rows but only {} rows", index.len(), rows.len())));
            }
        }
        // a trace of one row needs that row's logits only (a batch's [rows, vocab] may not fit)
        let only_row = trace.as_deref().and_then(|t| t.only_row).filter(|_| matches!(logits, Logits::All));
        let x = self.final_hidden(rows, tokens, device_rows, cache, trace.as_deref_mut(), routing)?;
        let (at, one_row) = match (only_row, logits) {
            (Some(r), _) => (vec![r], true),
            (None, Logits::At(at)) => (at.to_vec(), false),
            (None, Logits::All) => return Ok(Some(self.lm_head(x, trace.as_deref_mut())?)),
        };
        if at.is_empty() {
            return Ok(None);
        }
        let device = x.device();
        let picked = x.select(0, Tensor::<1, Int>::from_data(TensorData::new(at.iter().map(|&r| r as i32).collect::<Vec<_>>(), [at.len()]), &device));
        let logits = self.kernels.logits(self.kernels.matmul(picked, self.head(), OutIn)?)?;
        match trace {
            // the traced row's logits are all there is: kept whole, not row `only_row` of them
            Some(t) if one_row => t.entries.push(("lm_head".into(), logits.clone())),
            Some(t) => t.record("lm_head".into(), &logits),
            None => {}
        }
        Ok(Some(logits))
    }

    /// The LM head on every final-normed row.
    fn lm_head(&self, x: Tensor<2>, trace: Option<&mut Trace>) -> Result<Tensor<2>, ModelError> {
        let logits = self.kernels.logits(self.kernels.matmul(x, self.head(), OutIn)?)?;
        if let Some(t) = trace {
            t.record("lm_head".into(), &logits);
        }
        Ok(logits)
    }

    /// Every decoder layer and the final norm: the rows' hidden states `[rows, hidden]` that the
    /// LM head reads.
    pub(crate) fn final_hidden(&self, rows: &Rows, tokens: Tokens, device_rows: Option<(&Tensor<1, Int>, &Tensor<1, Int>)>, cache: Option<&mut KvCache>, trace: Option<&mut Trace>, routing: Option<&mut super::moe::RoutingLog>) -> Result<Tensor<2>, ModelError> {
        self.check_rows(rows)?;
        let device = self.embed.device();
        let n = rows.len();
        let ids = match tokens {
            Tokens::Host => int_tensor(&rows.tokens, &device),
            Tokens::Device { sampled, index } => {
                let k = index.len();
                let picked = sampled.clone().select(0, Tensor::<1, Int>::from_data(TensorData::new(index.to_vec(), [k]), &device));
                if k == n { picked } else { Tensor::cat(vec![picked, int_tensor(&rows.tokens[k..], &device)], 0) }
            }
            Tokens::Ids(ids) => {
                if ids.dims() != [n] {
                    return Err(ModelError::Input(format!("{:?} token ids for {n} rows", ids.dims())));
                }
                ids.clone()
            }
        };
        let (slots, positions) = match device_rows {
            Some((s, p)) if s.dims() == [n] && p.dims() == [n] => (s.clone(), p.clone()),
            Some((s, p)) => return Err(ModelError::Input(format!("device slots {:?} and positions {:?} for {n} rows", s.dims(), p.dims()))),
            None => (int_tensor(&rows.slots, &device), int_tensor(&rows.positions, &device)),
        };
        if let Some(cache) = cache.as_deref() {
            self.check_cache(rows, cache)?;
        }
        // the decode path's fused launches: lockstep's kernels, a cache, fused weights
        let fused = (cache.is_some() && self.kernels.lockstep_layers() && self.fused.len() == self.layers.len()).then_some(&self.fused[..]);
        let mut pass = Pass { rows, slots, positions, cache, trace, routing, kernels: self.kernels, config: &self.config, rope: &self.rope };
        let h = embedding(self.embed.clone(), ids)?;
        pass.record(|| "embedding".into(), &h);
        let stream = self.layers_forward(Stream { h, normed: None }, 0..self.layers.len(), fused, &mut pass)?;
        let x = match stream.normed {
            Some(x) => x,
            None => self.kernels.rmsnorm(stream.h, self.norm.clone(), pass.eps())?,
        };
        pass.record(|| "final_norm".into(), &x);
        Ok(x)
    }

    /// A pass over whole-sequence rows without a cache or a trace (the training path's layers
    /// run one at a time, as recomputation does).
    pub(crate) fn training_pass<'a>(&'a self, rows: &'a Rows, slots: Tensor<1, Int>, positions: Tensor<1, Int>) -> Pass<'a> {
        Pass { rows, slots, positions, cache: None, trace: None, routing: None, kernels: self.kernels, config: &self.config, rope: &self.rope }
    }

    /// Layers `range` on the pass's rows, each fused when `fused` has its weights.
    pub(crate) fn layers_forward(&self, mut stream: Stream, range: std::ops::Range<usize>, fused: Option<&[FusedProjections]>, pass: &mut Pass) -> Result<Stream, ModelError> {
        for i in range {
            let next_norm = self.layers.get(i + 1).map_or(&self.norm, |next| &next.input_norm);
            stream = self.layers[i].forward(i, stream, fused.map(|f| &f[i]), next_norm, pass)?;
        }
        Ok(stream)
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

    /// Every row's (slot, position) inside the cache and on a block it holds.
    fn check_cache(&self, rows: &Rows, cache: &KvCache) -> Result<(), ModelError> {
        let s = cache.shape;
        if let Some(r) = (0..rows.len()).find(|&r| rows.slots[r] as usize >= s.slots || rows.positions[r] as usize >= s.max_len) {
            return Err(ModelError::Input(format!("row {r}: slot {} position {} outside the KV cache ({} slots x {} positions)", rows.slots[r], rows.positions[r], s.slots, s.max_len)));
        }
        if let Some(r) = (0..rows.len()).find(|&r| !cache.covers(rows.slots[r] as usize, rows.positions[r] as usize)) {
            return Err(ModelError::Input(format!("row {r}: slot {} holds no cache block for position {} (reserve it first)", rows.slots[r], rows.positions[r])));
        }
        Ok(())
    }
}
