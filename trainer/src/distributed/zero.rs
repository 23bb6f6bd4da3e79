//! ZeRO-1: AdamW's state (first and second moments, and the f32 master weights of a narrower
//! model) split over the ranks by whole parameters. Each rank updates the parameters it owns
//! and then every rank gets every parameter's new value from its owner; since AdamW is
//! elementwise per parameter, the updated weights are the same bits as without sharding, and
//! each rank holds about 1/N of the optimizer's memory.

use std::collections::BTreeMap;

/// Which rank owns each parameter: parameters in name order cut into `world` consecutive runs
/// of about equal element counts (a parameter goes to the rank whose share holds its first
/// element).
#[derive(Clone, Debug)]
pub struct Shards {
    owner: BTreeMap<String, usize>,
    rank: usize,
    world: usize,
}

impl Shards {
    /// `sizes`: every parameter's name and element count.
    pub fn new(sizes: &[(String, usize)], world: usize, rank: usize) -> Self {
        let mut sorted: Vec<&(String, usize)> = sizes.iter().collect();
        sorted.sort();
        let total: u128 = sorted.iter().map(|(_, n)| *n as u128).sum::<u128>().max(1);
        let mut owner = BTreeMap::new();
        let mut at = 0u128;
        for (name, n) in sorted {
            owner.insert(name.clone(), ((at * world as u128 / total) as usize).min(world - 1));
            at += *n as u128;
        }
        Self { owner, rank, world }
    }

    pub fn owner(&self, name: &str) -> Option<usize> {
        self.owner.get(name).copied()
    }

    /// Whether this rank updates `name` (a name outside the model: no one).
    pub fn owns(&self, name: &str) -> bool {
        self.owner(name) == Some(self.rank)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// Every parameter's name in name order.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.owner.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_parameter_has_one_owner_and_the_shares_are_near_equal() {
        let sizes: Vec<(String, usize)> = (0..40).map(|i| (format!("layers.{i:02}.w"), 1000 + 37 * i)).chain([("embed".to_string(), 20_000)]).collect();
        let total: usize = sizes.iter().map(|(_, n)| n).sum();
        for world in 1..6 {
            let mut held = vec![0usize; world];
            for rank in 0..world {
                let s = Shards::new(&sizes, world, rank);
                for (name, n) in &sizes {
                    let owners = (0..world).filter(|&r| Shards::new(&sizes, world, r).owns(name)).count();
                    assert_eq!(owners, 1, "{name} on {world} ranks");
                    if s.owns(name) {
                        held[rank] += n;
                    }
                }
            }
            // no rank holds more than its share plus the largest parameter
            for (rank, &h) in held.iter().enumerate() {
                assert!(h <= total / world + 20_000, "{world} ranks: rank {rank} holds {h} of {total}");
                assert!(h > 0 || world > 3, "{world} ranks: rank {rank} holds nothing");
            }
        }
        assert!(!Shards::new(&sizes, 2, 0).owns("not a parameter"));
    }
}
