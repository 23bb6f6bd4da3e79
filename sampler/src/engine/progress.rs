//! What a server asks of a running engine between steps: each running request's tokens so far
//! (to stream them), how full it is (for `/metrics`), and cancelling a request whose client
//! went away (its slot and cache blocks freed at once).

use super::Engine;

/// How busy the engine is, read between steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Occupancy {
    pub running: usize,
    pub waiting: usize,
    /// Cache blocks held by running requests, and the pool's size (`None`: a contiguous cache).
    pub kv_blocks_used: usize,
    pub kv_blocks: Option<usize>,
}

impl Engine {
    /// Every running request's id with the tokens, logprobs and top alternatives (empty unless
    /// asked) it has so far. A preempted request starts again from its prompt and samples the
    /// same tokens again (same bits), so its list may shrink between steps and then regrow to
    /// the same values.
    pub fn partial(&self) -> impl Iterator<Item = (u64, &[u32], &[f32], &[Vec<(u32, f32)>])> {
        self.active.iter().map(|a| (a.request.id, a.tokens.as_slice(), a.logprobs.as_slice(), a.top.as_slice()))
    }

    pub fn occupancy(&self) -> Occupancy {
        let total = self.cache.total_blocks();
        let used = match (total, self.cache.free_blocks()) {
            (Some(t), Some(f)) => t - f,
            _ => 0,
        };
        Occupancy { running: self.active.len(), waiting: self.waiting.len(), kv_blocks_used: used, kv_blocks: total }
    }

    /// Drops request `id` wherever it is (queued or running), with no result. A token of it
    /// still in flight (overlap mode) is dropped when its step is read, as after a stop token.
    /// `false` when no such request is queued or running.
    pub fn cancel(&mut self, id: u64) -> bool {
        if let Some(i) = self.waiting.iter().position(|p| p.request.id == id) {
            self.waiting.remove(i);
            return true;
        }
        if let Some(i) = self.active.iter().position(|a| a.request.id == id) {
            let act = self.active.remove(i);
            self.cache.release(act.slot as usize);
            self.free_slots.push(act.slot);
            return true;
        }
        false
    }
}
