//! GRPO over data-parallel ranks ([`crate::distributed`]): the share of a step each rank works
//! on, and the gathers and sums that give every rank the step's whole rollouts, logprobs and
//! gradients. On one rank (no communicator) every function here is the identity.

use super::Trainer;
use crate::distributed::tree::pairwise_sum;
use crate::distributed::{f32_bytes, f32s, f64_bytes, f64s, share, CommError, Communicator};
use crate::error::RunError;
use burn::tensor::{Tensor, TensorData};
use sampler::{Completion, FinishReason};
use std::collections::BTreeMap;
use std::ops::Range;

pub(super) fn comm_error(e: CommError) -> RunError {
    RunError::Other(format!("data parallel: {e}"))
}

/// Length-prefixed fields, in the order they are read back.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn len(&mut self, n: usize) {
        self.0.extend((n as u64).to_le_bytes());
    }
    fn f32s(&mut self, v: &[f32]) {
        self.len(v.len());
        self.0.extend(f32_bytes(v));
    }
    fn u32s(&mut self, v: &[u32]) {
        self.len(v.len());
        self.0.extend(v.iter().flat_map(|x| x.to_le_bytes()));
    }
    fn f64s(&mut self, v: &[f64]) {
        self.len(v.len());
        self.0.extend(f64_bytes(v));
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
    fn len(&mut self) -> usize {
        u64::from_le_bytes(self.take(8).try_into().unwrap()) as usize
    }
    fn f32s(&mut self) -> Vec<f32> {
        let n = self.len();
        f32s(self.take(4 * n))
    }
    fn u32s(&mut self) -> Vec<u32> {
        let n = self.len();
        self.take(4 * n).chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect()
    }
    fn f64s(&mut self) -> Vec<f64> {
        let n = self.len();
        f64s(self.take(8 * n))
    }
}

impl Trainer {
    pub(super) fn comm(&self) -> Option<&dyn Communicator> {
        self.comm.as_deref()
    }

    /// This rank's block of `items` (all of them on one rank).
    pub(super) fn own_share(&self, items: usize) -> Range<usize> {
        match self.comm() {
            Some(c) => share(items, c.world(), c.rank()),
            None => 0..items,
        }
    }

    /// This rank's sequences of `sequences` in groups of `g`: whole groups, never split.
    pub(super) fn own_sequences(&self, sequences: usize, g: usize) -> Range<usize> {
        let groups = self.own_share(sequences / g);
        groups.start * g..groups.end * g
    }

    /// Whether `flag` holds on any rank (every rank gets the same answer): a stop asked of one
    /// rank stops all of them at the same step. One rank: `flag`.
    pub fn any_rank(&self, what: &str, flag: bool) -> Result<bool, RunError> {
        let Some(c) = self.comm() else { return Ok(flag) };
        Ok(c.all_gather(what, vec![u8::from(flag)]).map_err(comm_error)?.iter().any(|b| b == &[1]))
    }

    /// The step's gradient blocks (`train.gradient_blocks`; 0: one per rank).
    pub(super) fn gradient_blocks(&self) -> usize {
        match (self.cfg.train.gradient_blocks, self.comm()) {
            (0, Some(c)) => c.world(),
            (0, None) => 1,
            (b, _) => b,
        }
    }

    /// This rank's gradient blocks of `items` things cut in `unit`s (prompt groups of
    /// sequences; 1 for single sequences): its consecutive blocks of the step's, each a range of
    /// the items, empty where a block gets no unit. Independent of the number of ranks; with one
    /// block per rank, the rank's own share.
    pub(super) fn own_blocks(&self, items: usize, unit: usize) -> Vec<Range<usize>> {
        let (world, rank) = self.comm().map_or((1, 0), |c| (c.world(), c.rank()));
        let blocks = self.gradient_blocks();
        share(blocks, world, rank)
            .map(|k| {
                let units = share(items / unit, blocks, k);
                units.start * unit..units.end * unit
            })
            .collect()
    }

    /// Every rank's completions and raw rewards, in rank order (each rank's own block of the
    /// step's requests): the whole step's, the same on every rank.
    pub(super) fn gather_rollouts(&self, step: usize, own: Vec<Completion>, rewards: Vec<f64>) -> Result<(Vec<Completion>, Vec<f64>), RunError> {
        let Some(c) = self.comm() else { return Ok((own, rewards)) };
        let mut w = Writer::default();
        w.len(own.len());
        for comp in &own {
            w.len(comp.id as usize);
            w.len(comp.prompt_len);
            w.len(matches!(comp.finish, FinishReason::Length) as usize);
            w.u32s(&comp.tokens);
            w.f32s(&comp.logprobs);
        }
        w.f64s(&rewards);
        let all = c.all_gather(&format!("rollouts of step {step}"), w.0).map_err(comm_error)?;
        let (mut completions, mut raw) = (Vec::new(), Vec::new());
        for part in &all {
            let mut r = Reader(part);
            for _ in 0..r.len() {
                let (id, prompt_len) = (r.len() as u64, r.len());
                let finish = if r.len() == 1 { FinishReason::Length } else { FinishReason::Stop };
                let tokens = r.u32s();
                let logprobs = r.f32s();
                completions.push(Completion { id, prompt_len, tokens, logprobs, top_logprobs: Vec::new(), routing: Vec::new(), finish, timings: Default::default() });
            }
            raw.extend(r.f64s());
        }
        Ok((completions, raw))
    }

    /// Rows (a sequence's logprobs, say) every rank computed for its own sequences, gathered in
    /// rank order, i.e. sequence order: the whole step's rows on every rank.
    pub(super) fn gather_rows(&self, what: &str, own: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, RunError> {
        let Some(c) = self.comm() else { return Ok(own) };
        let mut w = Writer::default();
        w.len(own.len());
        for row in &own {
            w.f32s(row);
        }
        let all = c.all_gather(what, w.0).map_err(comm_error)?;
        let mut rows = Vec::new();
        for part in &all {
            let mut r = Reader(part);
            for _ in 0..r.len() {
                rows.push(r.f32s());
            }
        }
        Ok(rows)
    }

    /// Each rank's `values`, in rank order (statistics a step combines).
    pub(super) fn gather_f64s(&self, what: &str, values: Vec<f64>) -> Result<Vec<Vec<f64>>, RunError> {
        let Some(c) = self.comm() else { return Ok(vec![values]) };
        Ok(c.all_gather(what, f64_bytes(&values)).map_err(comm_error)?.iter().map(|b| f64s(b)).collect())
    }

    /// `x` summed over the ranks in the pairwise tree ([`crate::distributed::tree`]); a rank
    /// passing `None` (nothing to add) is skipped.
    pub(super) fn sum_f64(&self, what: &str, x: Option<f64>) -> Result<Option<f64>, RunError> {
        let parts = self.gather_f64s(what, x.into_iter().collect())?;
        Ok(pairwise_sum(parts.into_iter().map(|v| v.first().copied()).collect(), &mut |a, b| a + b))
    }

    /// The ranks' weight gradients summed in f32 in the pairwise tree over the ranks, for
    /// every parameter any rank has a gradient for (zeros where a rank that has gradients lacks
    /// one); a rank with none at all (no sequences) passes `None` and is skipped. The same bits
    /// on every rank.
    pub(super) fn sum_gradients(&self, what: &str, grads: Option<BTreeMap<String, Tensor<1>>>) -> Result<BTreeMap<String, Tensor<1>>, RunError> {
        let Some(c) = self.comm() else { return Ok(grads.unwrap_or_default()) };
        let grads = grads.filter(|g| !g.is_empty());
        // the union of the ranks' parameter names and sizes, in name order
        let mut w = Writer::default();
        let own = grads.clone().unwrap_or_default();
        w.len(own.len());
        for (name, g) in &own {
            w.u32s(&name.bytes().map(u32::from).collect::<Vec<_>>());
            w.len(g.dims()[0]);
        }
        let mut shapes = BTreeMap::new();
        for part in c.all_gather(&format!("{what}: names"), w.0).map_err(comm_error)? {
            let mut r = Reader(&part);
            for _ in 0..r.len() {
                let name: String = r.u32s().into_iter().map(|b| b as u8 as char).collect();
                shapes.insert(name, r.len());
            }
        }
        let device = self.policy.model.named_tensors().first().map(|(_, w)| w.flat().device()).ok_or_else(|| RunError::Other(format!("{what}: the model has no weights")))?;
        // every gradient in name order (zeros where this rank lacks one), read back in one copy
        let mut dtypes = BTreeMap::new();
        let flat = match &grads {
            Some(grads) => {
                let mut parts = Vec::with_capacity(shapes.len());
                for (name, &n) in &shapes {
                    match grads.get(name) {
                        Some(g) => {
                            dtypes.insert(name.clone(), g.dtype());
                            parts.push(g.clone().cast(burn::tensor::DType::F32));
                        }
                        None => parts.push(Tensor::<1>::zeros([n], &device)),
                    }
                }
                Some(Tensor::cat(parts, 0).into_data().convert::<f32>().try_to_vec::<f32>().map_err(|e| RunError::Other(format!("{what}: reading the gradients: {e:?}")))?)
            }
            None => None,
        };
        let Some(flat) = c.all_reduce_sum(what, flat).map_err(comm_error)? else { return Ok(BTreeMap::new()) };
        let mut out = BTreeMap::new();
        let mut at = 0;
        for (name, n) in shapes {
            let t = Tensor::<1>::from_data(TensorData::new(flat[at..at + n].to_vec(), [n]), &device);
            let dtype = dtypes.get(&name).copied().unwrap_or(burn::tensor::DType::F32);
            out.insert(name, t.cast(dtype));
            at += n;
        }
        Ok(out)
    }
}
