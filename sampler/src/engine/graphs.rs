//! Steps replayed as captured graphs (`LOCKSTEP_DECODE_GRAPHS=on`): a step whose rows are all
//! sampled (decode rows, and prompts' last single-token chunks) runs the same launches for every
//! step of its row count, only on other inputs. The second such step in a row captures them
//! (a warm-up run that is the step's real result, then the recorded run); later steps of that
//! row count write their inputs into the captured buffers and replay. The replayed step equals
//! the launched one as bits (`sampler::invariance`, `graphs_replay_the_launched_steps`).

use super::Engine;
use std::borrow::Cow;
use burn::tensor::{DType, Int, Tensor, TensorData};
use shared_kernels::graph::{self, Captured};
use shared_kernels::model::forward::int_tensor;
use shared_kernels::ops::attention::one_row_per_tile;
use shared_kernels::model::{Forward, Rows, Tokens};
use shared_kernels::ops::in_place::{gather_tokens_into, write_ints};
use shared_kernels::{sample_with, SamplingInputs, SamplingRow};

/// Graphs kept at once: each holds one forward's activations at its row count.
const KEPT: usize = 4;

/// (rows, whether some row truncates, whether some truncating row's logprob is processed):
/// what the captured launches depend on.
type Key = (usize, bool, bool);

#[derive(Default)]
pub(super) struct StepGraphs {
    pub(super) on: bool,
    /// Row counts padded to few graphs ([`padded_rows`], `LOCKSTEP_DECODE_GRAPH_PADDING`).
    pub(super) padding: bool,
    /// Most recently used last.
    kept: Vec<(Key, StepGraph)>,
    /// Row counts whose capture failed: launched from then on.
    failed: Vec<Key>,
    last_key: Option<Key>,
}

impl StepGraphs {
    pub(super) fn new(on: bool, padding: bool) -> Self {
        StepGraphs { on, padding, ..Default::default() }
    }

    /// Drops every graph (their launches read the weights they were captured with).
    pub(super) fn clear(&mut self) {
        self.kept.clear();
        self.failed.clear();
        self.last_key = None;
    }
}

/// One captured step: its input buffers, the graph, and the tensors its sampling writes.
struct StepGraph {
    captured: Captured,
    ids: Tensor<1, Int>,
    slots: Tensor<1, Int>,
    positions: Tensor<1, Int>,
    sampling: SamplingInputs,
    tokens: Tensor<1, Int>,
    logprobs: Tensor<1>,
}

/// `LOCKSTEP_FAULT_GRAPH_CAPTURE`: what the engine tests do inside each capture window to fail
/// it, showing the steps are then launched with the same bits.
enum CaptureFault {
    None,
    /// An upload: no allocation may happen in a window (fails on every runtime).
    Upload(burn::tensor::Device),
    /// A launch binding a buffer made on another thread's stream (fails a CUDA capture, as the
    /// tokio front's did before the engine kept its own stream).
    CrossStream(Tensor<1>),
}

impl CaptureFault {
    fn from_env(device: &burn::tensor::Device) -> Self {
        match shared_kernels::knobs::var("LOCKSTEP_FAULT_GRAPH_CAPTURE").as_deref() {
            Some("upload") => CaptureFault::Upload(device.clone()),
            Some("cross-stream") => {
                let device = device.clone();
                let made = std::thread::spawn(move || Tensor::<1>::from_data(TensorData::new(vec![1.0f32; 8], [8]), &device)).join();
                made.map_or(CaptureFault::None, CaptureFault::CrossStream)
            }
            _ => CaptureFault::None,
        }
    }

    fn inject(&self) {
        match self {
            CaptureFault::None => {}
            CaptureFault::Upload(device) => drop(Tensor::<1, Int>::from_data(TensorData::new(vec![0i32], [1]), device)),
            CaptureFault::CrossStream(other) => drop(other.clone() + 1.0),
        }
    }
}

/// The row count a step of `rows` rows is replayed at: 1, 2, 4, then multiples of 8 (as vLLM
/// pads its CUDA graphs), never past the engine's batch. A shrinking batch (answers ending one
/// by one) then stays on one graph for up to 8 steps instead of capturing at every count.
fn padded_rows(rows: usize, max_batch: usize) -> usize {
    let bucket = if rows <= 4 { rows.next_power_of_two() } else { rows.div_ceil(8) * 8 };
    bucket.min(max_batch).max(rows)
}

/// The real row each stand-in row repeats: rows cycled in order (the host-token rows when only
/// some rows are fed, since a stand-in's token must come from the same place as its source's).
/// Cycling, not repeating the last row, keeps neighbours on distinct sequences: the attention
/// kernels tile consecutive rows of one sequence from the host's slots, a table a graph keeps
/// from its capture, so every replayed step must tile as one row per tile
/// ([`shared_kernels::ops::attention::one_row_per_tile`]).
fn stand_in_sources(real: usize, padded: usize, fed_rows: usize) -> Vec<usize> {
    let first = if fed_rows == real { 0 } else { fed_rows };
    (0..padded - real).map(|k| first + k % (real - first)).collect()
}

/// The device tensors of a step's inputs.
struct StepInputs<'a> {
    ids: &'a Tensor<1, Int>,
    slots: &'a Tensor<1, Int>,
    positions: &'a Tensor<1, Int>,
    sampling: &'a SamplingInputs,
}

impl Engine {
    /// Whether this step's rows are all sampled, in row order: then its launches depend only
    /// on the row count and the sampling mode, and a graph can stand in for them. lockstep's
    /// layers only: the ablation's other sets are burn's ops, not built to keep uploads out.
    pub(super) fn replayable(&self, rows: &Rows, sample_at: &[(usize, usize)]) -> bool {
        self.graphs.on && self.model.kernels.lockstep_layers() && sample_at.len() == rows.len() && sample_at.iter().enumerate().all(|(i, &(_, r))| r == i)
    }

    /// The step's sampled tokens and f32 logprobs from a graph: replayed when one is kept for
    /// this padded row count ([`padded_rows`]), else captured when the step before had the same
    /// one (this step's result is then the warm-up run's). `None`: launch this step as usual.
    /// The tensors hold the padded count's rows; the first `rows.len()` are this step's.
    pub(super) fn launch_graphed(&mut self, rows: &Rows, params: &[SamplingRow], fed: Option<(&Tensor<1, Int>, &[i32])>) -> Result<Option<(Tensor<1, Int>, Tensor<1>)>, String> {
        let vocab = self.model.config.vocab_size;
        let real = rows.len();
        if real == 0 {
            return Ok(None);
        }
        let padded = if self.graphs.padding { padded_rows(real, self.config.max_batch) } else { real };
        let key = (padded, SamplingInputs::truncates(params, vocab), SamplingInputs::processes(params, vocab));
        let again = self.graphs.last_key.replace(key) == Some(key);
        if self.graphs.failed.contains(&key) {
            return Ok(None);
        }
        // fed rows first (as `build_rows` orders them), then ids the host has
        let mut fed_rows = fed.map_or(0, |(_, index)| index.len());
        let mut spec: Vec<i32> = fed.map_or(&[][..], |(_, index)| index).iter().copied().chain(rows.tokens[fed_rows..].iter().map(|&t| t as i32)).collect();
        // stand-in rows repeat real rows: the same token at the same slot and position, so
        // their cache writes rewrite an entry with the same values, and batch invariance keeps
        // every real row's bits; their samples are never read
        let sources = stand_in_sources(real, padded, fed_rows);
        let (rows, params): (Cow<Rows>, Cow<[SamplingRow]>) = match sources.is_empty() {
            true => (Cow::Borrowed(rows), Cow::Borrowed(params)),
            false => {
                let (mut with_stand_ins, mut stand_in_params) = (rows.clone(), params.to_vec());
                for &r in &sources {
                    with_stand_ins.push(rows.tokens[r], rows.slots[r], rows.positions[r]);
                    stand_in_params.push(params[r]);
                    spec.push(spec[r]);
                }
                (Cow::Owned(with_stand_ins), Cow::Owned(stand_in_params))
            }
        };
        let (rows, params) = (&*rows, &*params);
        // a graph keeps the tile tables of its capture: steps that would tile otherwise launch
        if !one_row_per_tile(&rows.slots) {
            return Ok(None);
        }
        if fed_rows == real {
            fed_rows = padded;
        }
        // the block table is refreshed by a write, which no capture may hold
        self.cache.pages().map_err(|e| e.to_string())?;
        let fill_ids = |ids: &Tensor<1, Int>| match fed {
            Some((sampled, _)) => gather_tokens_into(ids, sampled, &spec, fed_rows),
            None => write_ints("gather_tokens_into", "ids", ids, &spec.iter().map(|&t| t as i64).collect::<Vec<_>>()),
        };
        let ints = |v: &[u32]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
        if let Some(at) = self.graphs.kept.iter().position(|(k, _)| *k == key) {
            let entry = self.graphs.kept.remove(at);
            let g = &entry.1;
            let refreshed = fill_ids(&g.ids)
                .and_then(|_| write_ints("graph inputs", "slots", &g.slots, &ints(&rows.slots)))
                .and_then(|_| write_ints("graph inputs", "positions", &g.positions, &ints(&rows.positions)))
                .and_then(|_| g.sampling.write(params, vocab));
            refreshed.map_err(|e| e.to_string())?;
            g.captured.replay()?;
            let out = (g.tokens.clone(), g.logprobs.clone());
            self.graphs.kept.push(entry);
            self.phase.replayed_steps += 1;
            return Ok(Some(out));
        }
        if !again {
            return Ok(None);
        }
        let device = self.model.embed.device();
        let n = rows.len();
        let (ids, slots, positions) = (int_tensor(&rows.tokens, &device), int_tensor(&rows.slots, &device), int_tensor(&rows.positions, &device));
        fill_ids(&ids).map_err(|e| e.to_string())?;
        let sampling = SamplingInputs::upload(params, vocab, &device).map_err(|e| e.to_string())?;
        let inputs = StepInputs { ids: &ids, slots: &slots, positions: &positions, sampling: &sampling };
        graph::prepare(&device)?;
        let warm = self.run_step(rows, &inputs)?;
        let fault = CaptureFault::from_env(&device);
        let record = || {
            let out = self.run_step(rows, &inputs);
            fault.inject();
            out
        };
        match graph::capture(&device, record) {
            Ok(((tokens, logprobs), captured)) => {
                self.graphs.kept.push((key, StepGraph { captured, ids: ids.clone(), slots: slots.clone(), positions: positions.clone(), sampling: sampling.clone(), tokens, logprobs }));
                if self.graphs.kept.len() > KEPT {
                    self.graphs.kept.remove(0);
                }
                Ok(Some(warm))
            }
            Err(e) => {
                eprintln!("warning: steps of {real} rows (padded to {n}) are launched, not replayed: {e}");
                self.graphs.failed.push(key);
                self.phase.failed_captures += 1;
                // cubecl marks what a recording that did not seal would have written (this
                // step's KV entries among it) as failed, and a launch reading a failed buffer
                // is skipped: the step is launched again, rewriting them with the same values
                drop(warm);
                self.run_step(rows, &inputs).map(Some)
            }
        }
    }

    /// One step's forward and sampling on device inputs (nothing uploaded: capturable).
    fn run_step(&mut self, rows: &Rows, inputs: &StepInputs) -> Result<(Tensor<1, Int>, Tensor<1>), String> {
        let forward = Forward::rows(rows).cache(&mut self.cache).tokens(Tokens::Ids(inputs.ids)).device_rows(inputs.slots, inputs.positions);
        let logits = self.model.run(forward).map_err(|e| e.to_string())?.ok_or("a replayable step samples every row")?;
        let (tokens, logprobs) = sample_with(logits, inputs.sampling).map_err(|e| e.to_string())?;
        Ok((tokens, logprobs.cast(DType::F32)))
    }
}

#[cfg(test)]
mod tests {
    use super::{padded_rows, stand_in_sources};
    use shared_kernels::model::Rows;
    use shared_kernels::ops::attention::one_row_per_tile;

    #[test]
    fn row_counts_pad_to_few_graphs_and_never_past_the_batch() {
        let padded: Vec<usize> = (1..=20).map(|n| padded_rows(n, 256)).collect();
        assert_eq!(padded, [1, 2, 4, 4, 8, 8, 8, 8, 16, 16, 16, 16, 16, 16, 16, 16, 24, 24, 24, 24]);
        assert_eq!(padded_rows(250, 256), 256);
        assert_eq!(padded_rows(250, 252), 252);
        assert_eq!(padded_rows(5, 6), 6);
        assert_eq!(padded_rows(7, 7), 7);
    }

    #[test]
    fn stand_ins_cycle_the_rows_whose_tokens_they_can_repeat() {
        assert_eq!(stand_in_sources(5, 8, 0), [0, 1, 2]);
        assert_eq!(stand_in_sources(5, 8, 5), [0, 1, 2]);
        // 3 fed rows: the stand-ins repeat the host-token rows 3 and 4
        assert_eq!(stand_in_sources(5, 8, 3), [3, 4, 3]);
        assert_eq!(stand_in_sources(9, 16, 9), [0, 1, 2, 3, 4, 5, 6]);
        assert!(stand_in_sources(8, 8, 8).is_empty());
    }

    #[test]
    fn padded_decode_rows_never_put_one_sequence_beside_itself() {
        // every real count up to 64, all fed or all from the host: the padded rows tile one
        // row per tile (repeating the last row made a two-row tile of its sequence)
        for real in 1..=64usize {
            for fed in [0, real] {
                let mut rows = Rows::default();
                for r in 0..real {
                    rows.push(7, 100 + r as u32, 3 * r as u32);
                }
                for s in stand_in_sources(real, padded_rows(real, 256), fed) {
                    let (t, slot, pos) = (rows.tokens[s], rows.slots[s], rows.positions[s]);
                    rows.push(t, slot, pos);
                }
                assert!(one_row_per_tile(&rows.slots), "{real} rows ({fed} fed) padded to {}: {:?}", rows.len(), rows.slots);
            }
        }
    }
}
