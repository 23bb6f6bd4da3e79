//! The fixed pairwise tree that adds a step's gradient blocks (`train.gradient_blocks`), on one
//! rank and across ranks alike.
//!
//! Floating-point addition is not associative, so an update's bits depend on how the partial
//! gradients are added. Here they are always added in one balanced binary tree over the blocks
//! in order: ((b0 + b1) + (b2 + b3)) + ... A rank adds its own consecutive blocks as they finish
//! ([`PairwiseSum`], holding at most log2(blocks) partial sums), and the ranks' partials are then
//! added by the same tree's upper levels ([`pairwise_sum`]). With a power-of-two number of blocks
//! split evenly over a power-of-two number of ranks, every rank's blocks are one subtree, so the
//! sum is the same bits on 1, 2, 4, ... ranks. An absent leaf (a block with no sequences, an
//! idle rank) is skipped: `None + x = x`, so it does not change the tree's other additions.

/// Leaves added as they arrive, in the balanced tree's order (a binary counter of subtrees).
pub struct PairwiseSum<T> {
    /// (height of the subtree, its sum), heights strictly decreasing from the bottom
    stack: Vec<(u32, Option<T>)>,
}

impl<T> Default for PairwiseSum<T> {
    fn default() -> Self {
        Self { stack: Vec::new() }
    }
}

impl<T> PairwiseSum<T> {
    pub fn push(&mut self, leaf: Option<T>, add: &mut impl FnMut(T, T) -> T) {
        let mut node = (0, leaf);
        while let Some(&(height, _)) = self.stack.last() {
            if height != node.0 {
                break;
            }
            let (_, left) = self.stack.pop().expect("checked above");
            node = (height + 1, join(left, node.1, add));
        }
        self.stack.push(node);
    }

    /// The sum of every leaf pushed. For a power-of-two count this is the balanced tree; for
    /// other counts the remaining subtrees are added from the right (the larger, earlier ones
    /// last).
    pub fn finish(mut self, add: &mut impl FnMut(T, T) -> T) -> Option<T> {
        let mut acc = self.stack.pop().and_then(|(_, x)| x);
        while let Some((_, left)) = self.stack.pop() {
            acc = join(left, acc, add);
        }
        acc
    }
}

/// `leaves` added in the balanced tree by halving (`[0, n/2)` + `[n/2, n)`): for a
/// power-of-two count the same additions as [`PairwiseSum`].
pub fn pairwise_sum<T>(mut leaves: Vec<Option<T>>, add: &mut impl FnMut(T, T) -> T) -> Option<T> {
    match leaves.len() {
        0 => None,
        1 => leaves.pop().expect("one leaf"),
        n => {
            let right = leaves.split_off(n / 2);
            let left = pairwise_sum(leaves, add);
            let right = pairwise_sum(right, add);
            join(left, right, add)
        }
    }
}

fn join<T>(left: Option<T>, right: Option<T>, add: &mut impl FnMut(T, T) -> T) -> Option<T> {
    match (left, right) {
        (Some(a), Some(b)) => Some(add(a, b)),
        (a, None) => a,
        (None, b) => b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tree's shape as a string, to compare the two ways of building it.
    fn shape(leaves: &[Option<usize>], streamed: bool) -> Option<String> {
        let mut add = |a: String, b: String| format!("({a}+{b})");
        let leaves: Vec<Option<String>> = leaves.iter().map(|x| x.map(|i| i.to_string())).collect();
        if streamed {
            let mut sum = PairwiseSum::default();
            for leaf in leaves {
                sum.push(leaf, &mut add);
            }
            sum.finish(&mut add)
        } else {
            pairwise_sum(leaves, &mut add)
        }
    }

    #[test]
    fn streamed_and_halving_trees_agree_on_powers_of_two_and_ranks_are_subtrees() {
        assert_eq!(shape(&[Some(0), Some(1), Some(2), Some(3)], true).unwrap(), "((0+1)+(2+3))");
        for blocks in [1usize, 2, 4, 8, 16] {
            let leaves: Vec<Option<usize>> = (0..blocks).map(|i| (i % 3 != 1).then_some(i)).collect();
            let whole = shape(&leaves, true);
            assert_eq!(whole, shape(&leaves, false), "{blocks} blocks");
            // every power-of-two rank count dividing the blocks: each rank's streamed subtree,
            // then the ranks' partials halved, is the one-rank tree
            for world in [1usize, 2, 4, 8, 16].into_iter().filter(|w| blocks % w == 0) {
                let per = blocks / world;
                let rank_sums: Vec<Option<String>> = (0..world).map(|r| shape(&leaves[r * per..(r + 1) * per], true)).collect();
                let mut add = |a: String, b: String| format!("({a}+{b})");
                let across = pairwise_sum(rank_sums, &mut add);
                assert_eq!(across, whole, "{blocks} blocks on {world} ranks");
            }
        }
    }

    #[test]
    fn absent_leaves_are_skipped_and_floats_follow_the_tree() {
        assert_eq!(shape(&[None, Some(1), None, None], true).unwrap(), "1");
        assert_eq!(shape(&[None, None], false), None);
        // a float sum whose value depends on the order: the tree's, not the left fold's
        let v = [1e8f32, 1.0, -1e8, 1.0];
        let mut add = |a: f32, b: f32| a + b;
        let tree = pairwise_sum(v.iter().map(|&x| Some(x)).collect(), &mut add).unwrap();
        assert_eq!(tree.to_bits(), ((1e8f32 + 1.0) + (-1e8f32 + 1.0)).to_bits());
        assert_ne!(tree.to_bits(), (((1e8f32 + 1.0) + -1e8) + 1.0).to_bits());
    }
}
