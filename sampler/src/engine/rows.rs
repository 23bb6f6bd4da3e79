//! Building a step's rows: which requests share a prompt prefix (copied, not recomputed),
//! which cache blocks each needs (the newest preempted when none is left), and the rows
//! themselves.

use super::{Engine, InFlight, Pending, StepStats};
use shared_kernels::model::Rows;

/// A step's rows and which of them are sampled.
pub(super) struct StepRows {
    pub(super) rows: Rows,
    /// (active request, row) for every row whose logits are sampled.
    pub(super) sample_at: Vec<(usize, usize)>,
    /// For each fed row, its token's index in the previous step's sampled tokens.
    pub(super) fed_index: Vec<i32>,
    /// The first `fed_rows` rows take their tokens from the device.
    pub(super) fed_rows: usize,
}

/// Why a step failed; every request of the step fails with it.
#[derive(Debug, thiserror::Error)]
pub(super) enum StepError {
    #[error("{0}")]
    PrefixCopy(#[from] shared_kernels::KernelError),
    #[error("engine bookkeeping: request {0} decodes but its last token is neither read nor in the step in flight")]
    LostToken(u64),
    #[error("{0}")]
    Launch(String),
    #[error("{0}")]
    Read(String),
}

impl Engine {
    /// The step's rows: each prefilling request's next chunk of prompt tokens, each decoding
    /// request's newest token. Fed rows first (their tokens are on the device, in `previous`),
    /// then rows whose tokens the host has; row order does not change a bit (batch invariance).
    pub(super) fn build_rows(&mut self, held: &[bool], previous: Option<&InFlight>, stats: &mut StepStats) -> Result<StepRows, StepError> {
        let previous_row: std::collections::HashMap<u64, i32> = previous.iter().flat_map(|p| p.owners.iter().enumerate().map(|(i, &id)| (id, i as i32))).collect();
        let (mut fed, mut fed_index, mut fed_sampled) = (Rows::default(), Vec::new(), Vec::new());
        let (mut host, mut host_sampled) = (Rows::default(), Vec::new());
        let mut lost = None;
        let mut prefilled_to = Vec::new(); // (active index, prompt tokens in the cache after this step)
        for (a, act) in self.active.iter().enumerate() {
            if held.get(a).copied().unwrap_or(false) {
                continue;
            }
            let prompt = &act.request.prompt;
            if act.prefilled < prompt.len() {
                let end = (act.prefilled + self.config.chunk_size).min(prompt.len());
                for p in act.prefilled..end {
                    host.push(prompt[p], act.slot, p as u32);
                }
                stats.prefill_rows += end - act.prefilled;
                prefilled_to.push((a, end));
                if end == prompt.len() {
                    host_sampled.push((a, host.len() - 1));
                }
            } else {
                let generated = act.tokens.len() + act.in_flight;
                if generated >= act.request.params.max_new_tokens {
                    continue; // its last token is in flight; it finishes when that is read
                }
                let position = (prompt.len() + generated - 1) as u32;
                match (act.in_flight > 0, previous_row.get(&act.request.id), act.tokens.last()) {
                    (true, Some(&i), _) => {
                        fed.push(0, act.slot, position);
                        fed_index.push(i);
                        fed_sampled.push((a, fed.len() - 1));
                    }
                    (false, _, Some(&last)) => {
                        host.push(last, act.slot, position);
                        host_sampled.push((a, host.len() - 1));
                    }
                    _ => lost = Some(act.request.id),
                }
                stats.decode_rows += 1;
            }
        }
        if let Some(id) = lost {
            return Err(StepError::LostToken(id));
        }
        for (a, end) in prefilled_to {
            self.active[a].prefilled = end;
        }
        let fed_rows = fed.len();
        let mut rows = fed;
        for r in 0..host.len() {
            rows.push(host.tokens[r], host.slots[r], host.positions[r]);
        }
        let sample_at = fed_sampled.into_iter().chain(host_sampled.into_iter().map(|(a, r)| (a, fed_rows + r))).collect();
        Ok(StepRows { rows, sample_at, fed_index, fed_rows })
    }

    /// Before a step's rows are built: every request that has not started its prefill and
    /// shares its prompt (of 2+ tokens) with an earlier active request (the donor) either copies
    /// the donor's KV for the first `len - 1` prompt positions, when the donor has written them
    /// (in earlier steps), or is held until it has. Returns which active requests are held (a
    /// mask: the step's row loop looks each one up, ~1000 requests in a GRPO step).
    pub(super) fn share_prefixes(&mut self, stats: &mut StepStats) -> Result<Vec<bool>, shared_kernels::KernelError> {
        let mut held = vec![false; self.active.len()];
        let mut donors: std::collections::HashMap<&[u32], usize> = std::collections::HashMap::new();
        let mut copies: Vec<(usize, usize)> = Vec::new();
        for (a, act) in self.active.iter().enumerate() {
            let prompt = act.request.prompt.as_slice();
            if prompt.len() < 2 {
                continue;
            }
            match donors.get(prompt) {
                Some(&d) if act.prefilled == 0 => {
                    if self.active[d].prefilled >= prompt.len() - 1 {
                        copies.push((d, a));
                    } else {
                        held[a] = true;
                    }
                }
                Some(_) => {}
                None => {
                    donors.insert(prompt, a);
                }
            }
        }
        let slot_copies: Vec<(usize, usize, usize)> = copies.iter().map(|&(d, a)| (self.active[d].slot as usize, self.active[a].slot as usize, self.active[a].request.prompt.len() - 1)).collect();
        // a copy with no free block for its prompt's partial block is not made: that request
        // prefills its prompt itself
        let made = self.cache.copy_prefixes(&slot_copies)?;
        for (&(_, a), (&(_, _, n), made)) in copies.iter().zip(slot_copies.iter().zip(made)) {
            if made {
                self.active[a].prefilled = n;
                stats.shared_prefix_tokens += n;
            }
        }
        Ok(held)
    }

    /// Before a step's rows are built: every running request gets the cache blocks for the
    /// positions it writes in this step (its next prompt chunk, or its decode position). When
    /// the cache has none left, the newest request is preempted (blocks released, back to the
    /// front of the queue) until the older ones fit; a request the step cannot serve is never
    /// given a row. `held` (the requests waiting for a prefix donor) is kept in step.
    pub(super) fn reserve_blocks(&mut self, held: &mut Vec<bool>, stats: &mut StepStats) {
        held.resize(self.active.len(), false);
        let mut a = 0;
        while a < self.active.len() {
            let act = &self.active[a];
            let prompt = act.request.prompt.len();
            let generated = act.tokens.len() + act.in_flight;
            let need = if held[a] {
                0
            } else if act.prefilled < prompt {
                (act.prefilled + self.config.chunk_size).min(prompt)
            } else if generated >= act.request.params.max_new_tokens {
                0
            } else {
                prompt + generated
            };
            if self.cache.reserve(act.slot as usize, need) {
                a += 1;
                continue;
            }
            // the newest goes first; when that is this request, it waits itself
            let victim = self.active.len() - 1;
            let act = self.active.remove(victim);
            held.remove(victim);
            self.cache.release(act.slot as usize);
            self.free_slots.push(act.slot);
            self.waiting.push_front(Pending { request: act.request, added: act.added });
            stats.preempted += 1;
            self.phase.preempted += 1;
        }
    }
}
