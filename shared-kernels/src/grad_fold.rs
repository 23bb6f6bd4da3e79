//! Weight gradients whose bits do not depend on the micro-batch size.
//!
//! A weight gradient is a sum over tokens. Summed per micro-batch and then added, its bits follow
//! the micro-batching (verl users see updates change with the micro-batch size). Here every
//! token-summing weight gradient (linear layers and their biases, the LM head, RMSNorm weights, the embedding) is
//! instead *folded* into one f32 accumulator per weight and use, continuing from where the last
//! micro-batch left it ([`crate::ops::weight_grad`]). With the training layout padding every
//! sequence to a multiple of [`FOLD_ROWS`] rows ([`crate::model::Rows::whole_padded`]) and
//! micro-batches made of whole sequences, every micro-batch boundary falls on a fold granule, so
//! the accumulators after the last micro-batch hold the bits of one pass over all the tokens,
//! whatever the micro-batch size.
//!
//! Use: a [`GradFold`] per optimizer step; around each micro-batch's `backward()`,
//! [`GradFold::attach`] the tracked weights (name and autodiff node). The ops' backward passes
//! then fold into it and hand burn no gradient for those weights. [`GradFold::into_grads`] gives
//! the flat f32 gradients by name; a weight with two uses (a tied embedding: the embedding lookup
//! and the LM head) gets its uses' accumulators added in [`FoldUse`] order.

pub use crate::ops::weight_grad::FOLD_ROWS;
use burn::tensor::Tensor;
use burn_cubecl::tensor::CubeTensor;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

/// Which op a weight's gradient came through (a tied weight has two).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FoldUse {
    Linear,
    Norm,
    /// A projection's bias (`ops/bias.rs`).
    Bias,
    Head,
    Embedding,
}

type Accumulators = BTreeMap<(String, FoldUse), CubeTensor>;

struct Active {
    names: HashMap<u64, String>,
    acc: Accumulators,
}

thread_local! {
    static ACTIVE: RefCell<Option<Active>> = const { RefCell::new(None) };
}

/// One step's folded weight gradients.
#[derive(Default)]
pub struct GradFold {
    acc: Accumulators,
}

/// While alive, the attached weights' backward passes fold into the [`GradFold`]; on drop the
/// accumulators go back to it.
pub struct Attached<'a> {
    fold: &'a mut GradFold,
}

impl GradFold {
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds the gradients of the weights in `named` (name, autodiff node id of the tracked
    /// leaf) into this fold until the guard drops. One attachment per thread at a time.
    pub fn attach(&mut self, named: Vec<(String, u64)>) -> Attached<'_> {
        let acc = std::mem::take(&mut self.acc);
        ACTIVE.with(|a| {
            let mut a = a.borrow_mut();
            assert!(a.is_none(), "GradFold::attach: another fold is attached on this thread");
            *a = Some(Active { names: named.into_iter().map(|(n, id)| (id, n)).collect(), acc });
        });
        Attached { fold: self }
    }

    /// Names with at least one folded gradient.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.acc.keys().map(|(n, _)| n.clone()).collect();
        names.dedup();
        names
    }

    /// The gradients, flat f32, by name (uses added in [`FoldUse`] order).
    pub fn into_grads(self) -> BTreeMap<String, Tensor<1>> {
        let mut out: BTreeMap<String, Tensor<1>> = BTreeMap::new();
        for ((name, _), acc) in self.acc {
            let shape = crate::bridge::dims(&acc);
            let n: usize = shape.iter().product();
            let flat = if shape.len() == 1 { crate::autodiff::plain::<1>(acc) } else { crate::autodiff::plain::<2>(acc).reshape([n]) };
            let sum = match out.remove(&name) {
                Some(prev) => prev + flat,
                None => flat,
            };
            out.insert(name, sum);
        }
        out
    }
}

impl Drop for Attached<'_> {
    fn drop(&mut self) {
        if let Some(active) = ACTIVE.with(|a| a.borrow_mut().take()) {
            self.fold.acc = active.acc;
        }
    }
}

/// Folds one use of the weight with autodiff node `id` through `f` (given the accumulator so
/// far, returning it updated) when a fold is attached and holds that weight; `false` (and `f`
/// unused) otherwise, so the op hands burn the gradient as usual.
pub(crate) fn fold_into(id: u64, use_: FoldUse, f: impl FnOnce(Option<CubeTensor>) -> CubeTensor) -> bool {
    ACTIVE.with(|a| {
        let mut a = a.borrow_mut();
        let Some(active) = a.as_mut() else { return false };
        let Some(name) = active.names.get(&id).cloned() else { return false };
        let key = (name, use_);
        let prev = active.acc.remove(&key);
        let next = f(prev);
        active.acc.insert(key, next);
        true
    })
}

/// Whether a fold is attached on this thread that holds the weight with node `id`.
pub(crate) fn folds(id: u64) -> bool {
    ACTIVE.with(|a| a.borrow().as_ref().is_some_and(|active| active.names.contains_key(&id)))
}

/// The autodiff node id of a tracked tensor (a weight leaf made with `require_grad`).
pub fn node_id<const D: usize>(t: &Tensor<D>) -> Option<u64> {
    crate::autodiff::as_tracked(t.clone()).ok().map(|a| a.id().value)
}
