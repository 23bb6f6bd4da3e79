//! Data parallel over ranks (issue 26): the collectives a GRPO step needs, behind one trait,
//! and how a step's work is shared among the ranks.
//!
//! The scheme keeps a data-parallel step equal to a one-rank step wherever the arithmetic
//! allows: every rank derives the step's problems and request ids as one rank would, samples
//! only its own block of prompt groups (groups are never split), and the completions and rewards
//! are gathered so that every rank holds the step's whole rollouts: the sampler is batch
//! invariant and its randomness keyed by request id, so these are a one-rank run's, and so are
//! the advantages, loss weights and metrics computed from them. Each rank then trains on its own
//! gradient blocks of the step's sequences, and the weight gradients are summed over the ranks in
//! a fixed pairwise tree ([`Communicator::all_reduce_sum`], [`tree`]), identical as bits on every
//! rank; clipping and AdamW then run alike everywhere, so the ranks' weights stay equal (checked
//! every step by fingerprint).
//!
//! Against one rank: by default a rank's blocks are its share, so an N-rank update is not a
//! one-rank update's bits (one rank folds every token in one chain); with
//! `train.gradient_blocks` set, the blocks and their tree do not depend on the number of ranks,
//! and the update is the same bits on any power-of-two number of ranks dividing it.

pub mod launch;
pub mod local;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod rendezvous;
pub mod threads;
pub mod tree;
pub mod zero;

pub use rendezvous::Rendezvous;

use std::ops::Range;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("rank {rank} of {world}: {message}")]
pub struct CommError {
    pub rank: usize,
    pub world: usize,
    pub message: String,
}

/// The collectives, each called by every rank in the same order with the same `what` (a name
/// for error messages; a rank that reaches another collective is an error, never a hang).
pub trait Communicator: Send + Sync {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;
    /// Every rank's `mine`, in rank order; every rank gets the same list.
    fn all_gather(&self, what: &str, mine: Vec<u8>) -> Result<Vec<Vec<u8>>, CommError>;

    /// Every rank's `mine` summed elementwise in f32 in the fixed pairwise tree over the ranks
    /// ((r0 + r1) + (r2 + r3) ..., [`tree::pairwise_sum`]): the same bits on every rank and in
    /// every run. A rank with nothing to add (an idle rank) passes `None` and is skipped; the
    /// result is `None` only when every rank passed `None`.
    fn all_reduce_sum(&self, what: &str, mine: Option<Vec<f32>>) -> Result<Option<Vec<f32>>, CommError> {
        let len = mine.as_ref().map(Vec::len);
        let all = self.all_gather(what, mine.map(|v| f32_bytes(&v)).unwrap_or_default())?;
        let mut parts = Vec::with_capacity(all.len());
        for (r, bytes) in all.iter().enumerate() {
            parts.push(if bytes.is_empty() { None } else { Some(f32s(bytes)) });
            if let (Some(n), false) = (len, bytes.is_empty()) {
                if bytes.len() != n * 4 {
                    return Err(self.error(format!("{what}: rank {r} gave {} values, this rank {n}", bytes.len() / 4)));
                }
            }
        }
        let lengths: std::collections::BTreeSet<usize> = parts.iter().flatten().map(Vec::len).collect();
        if lengths.len() > 1 {
            return Err(self.error(format!("{what}: the ranks gave different numbers of values: {lengths:?}")));
        }
        Ok(tree::pairwise_sum(parts, &mut |mut a: Vec<f32>, b: Vec<f32>| {
            for (x, y) in a.iter_mut().zip(b) {
                *x += y;
            }
            a
        }))
    }

    /// A CommError from this rank.
    fn error(&self, message: String) -> CommError {
        CommError { rank: self.rank(), world: self.world(), message }
    }
}

/// The contiguous block of `items` (prompt groups, sequences) rank `rank` of `world` owns:
/// sizes differ by at most one, lower ranks first.
pub fn share(items: usize, world: usize, rank: usize) -> Range<usize> {
    items * rank / world..items * (rank + 1) / world
}

pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

pub fn f64_bytes(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect()
}

/// Every rank's string (a config hash, a fingerprint) must equal rank 0's; otherwise an error
/// naming `what`, each differing rank and its value.
pub fn check_equal(comm: &dyn Communicator, what: &str, mine: &str) -> Result<(), CommError> {
    let all = comm.all_gather(what, mine.as_bytes().to_vec())?;
    let all: Vec<String> = all.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect();
    let differing: Vec<String> = all.iter().enumerate().skip(1).filter(|(_, v)| **v != all[0]).map(|(r, v)| format!("rank {r} has {v}")).collect();
    if differing.is_empty() {
        Ok(())
    } else {
        Err(comm.error(format!("{what} differs between ranks: rank 0 has {}, {}", all[0], differing.join(", "))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_the_items_once_in_rank_order() {
        for items in 0..40 {
            for world in 1..9 {
                let mut next = 0;
                for rank in 0..world {
                    let r = share(items, world, rank);
                    assert_eq!(r.start, next);
                    assert!(r.len() == items / world || r.len() == items / world + 1, "{items} {world} {rank}: {r:?}");
                    next = r.end;
                }
                assert_eq!(next, items);
            }
        }
    }

    #[test]
    fn bytes_round_trip_every_bit() {
        let v = [0.0f32, -0.0, 1.5, f32::MIN_POSITIVE / 3.0, f32::NAN, f32::INFINITY];
        assert!(f32s(&f32_bytes(&v)).iter().zip(&v).all(|(a, b)| a.to_bits() == b.to_bits()));
        let d = [1e-300f64, -2.5, f64::MAX];
        assert_eq!(f64s(&f64_bytes(&d)), d);
    }
}
