//! The engine's sizes and switches: slots, KV blocks, context, prefill chunk, prefix sharing,
//! overlapped steps and admission.

use shared_kernels::model::{KvCache, Qwen3};
use shared_kernels::ops::attention::BLOCK;

#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// The most requests running at once.
    pub max_batch: usize,
    /// KV cache blocks of [`BLOCK`] positions shared by all running requests (0: enough for
    /// `max_batch` requests of `context` tokens). A request takes blocks as it grows and gives
    /// them back when it finishes; when none is left the newest request is preempted (its
    /// blocks freed, it starts again later: the same tokens and bits, batch invariance and
    /// per-(request, position) random keys make the rerun equal).
    pub kv_blocks: usize,
    /// Tokens per slot: prompt + generated tokens must fit.
    pub context: usize,
    /// Prompt tokens per request per step while prefilling.
    pub chunk_size: usize,
    /// Requests with the same prompt (a GRPO group) prefill it once: the first prefills, the
    /// others copy its KV for all prompt tokens but the last and prefill only that one. The
    /// kernels are chunk invariant, so the copied rows are the very bits each would compute.
    pub share_prompt_prefix: bool,
    /// Enqueue each step before reading the previous step's tokens, so the host builds and
    /// launches step N+1 while the device runs step N (decode rows take their token straight
    /// from step N's device output). Same tokens and bits either way; a request that samples a
    /// stop token costs one more row, whose token is dropped.
    pub overlap: bool,
    /// Admission with a paged cache: the fraction of each running request's remaining
    /// `max_new_tokens` whose blocks are kept free before another request is admitted. 1.0
    /// never preempts (every admitted request can grow to its limit); 0.0 admits whenever the
    /// prompt fits and preempts the newest when blocks run out, which reruns its tokens (the
    /// same bits, more work). Lower values pay when most responses stop well before the limit.
    pub reserve: f32,
}

impl EngineConfig {
    /// `max_batch` requests at once over as many cache blocks as fit in `kv_budget_bytes`
    /// (0: enough blocks for `max_batch` requests of `context` tokens).
    pub fn from_budget(model: &Qwen3, kv_budget_bytes: usize, context: usize, max_batch: usize, chunk_size: usize) -> Result<Self, String> {
        let c = &model.config;
        let per_block = 2 * c.num_layers * BLOCK * c.num_kv_heads * c.head_dim * model.dtype.size();
        let width = KvCache::blocks_for(context);
        let kv_blocks = if kv_budget_bytes == 0 { max_batch * width } else { kv_budget_bytes / per_block.max(1) };
        if kv_blocks < width {
            return Err(format!("KV budget of {kv_budget_bytes} bytes holds {kv_blocks} blocks of {BLOCK} positions ({per_block} bytes each), fewer than one request of {context} tokens needs ({width})"));
        }
        Ok(Self { max_batch, kv_blocks, context, chunk_size, share_prompt_prefix: true, overlap: true, reserve: 1.0 })
    }
}
