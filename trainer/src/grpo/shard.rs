//! ZeRO-1 on a data-parallel rank ([`crate::distributed::zero`]): the optimizer step of this
//! rank's parameters and the exchange of the new weights, and checkpoints of the sharded state
//! (rank 0 writes them, gathering each parameter's state from its owner, one at a time).

use super::ranks::comm_error;
use super::Trainer;
use crate::checkpoint::{self, OptimizerState, RunState};
use crate::distributed::zero::Shards;
use crate::distributed::Communicator;
use crate::error::RunError;
use burn::tensor::{Tensor, TensorData};
use shared_kernels::model::{ModelError, Qwen3, Weight};
use std::collections::BTreeMap;
use std::path::PathBuf;

impl Trainer {
    /// The parameters' owners when this rank's optimizer state is sharded (several ranks and
    /// `train.shard_optimizer`).
    pub(super) fn shards(&self) -> Option<Shards> {
        let c = self.comm()?;
        (c.world() > 1 && self.cfg.train.shard_optimizer).then(|| {
            let sizes: Vec<(String, usize)> = self.policy.model.named_tensors().into_iter().map(|(n, w)| (n, w.flat().dims()[0])).collect();
            Shards::new(&sizes, c.world(), c.rank())
        })
    }

    /// AdamW on the clipped `grads`: of every weight on one rank or unsharded; of this rank's
    /// shard, then every weight from its owner, when sharded.
    pub(super) fn optimizer_step(&mut self, step: usize, grads: &BTreeMap<String, Tensor<1>>, lr: f64) -> Result<(), RunError> {
        let Some(shards) = self.shards() else {
            self.policy.model = self.opt.step(&self.policy.model, grads, lr);
            return Ok(());
        };
        let model = self.opt.step_owned(&self.policy.model, grads, lr, &|n| shards.owns(n));
        self.policy.model = self.exchange_weights(&format!("step {step}: the updated weights"), model, &shards)?;
        Ok(())
    }

    /// Every weight this rank does not own replaced by its owner's, as bits (in the model's dtype).
    fn exchange_weights(&self, what: &str, model: Qwen3, shards: &Shards) -> Result<Qwen3, RunError> {
        let c = self.comm().expect("shards exist only with ranks");
        let mut mine = Vec::new();
        for (name, w) in model.named_tensors() {
            if shards.owns(&name) {
                let data = w.flat().into_data();
                let bytes = data.bytes();
                mine.extend((name.len() as u64).to_le_bytes());
                mine.extend(name.as_bytes());
                mine.extend((bytes.len() as u64).to_le_bytes());
                mine.extend(&bytes[..]);
            }
        }
        let mut theirs: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for part in c.all_gather(what, mine).map_err(comm_error)? {
            let mut at = 0;
            let mut take = |n: usize| -> Result<Vec<u8>, RunError> {
                let s = part.get(at..at + n).ok_or_else(|| RunError::Other(format!("{what}: a truncated message")))?.to_vec();
                at += n;
                Ok(s)
            };
            let mut left = part.len();
            while left > 0 {
                let n = u64::from_le_bytes(take(8)?.try_into().unwrap()) as usize;
                let name = String::from_utf8_lossy(&take(n)?).into_owned();
                let len = u64::from_le_bytes(take(8)?.try_into().unwrap()) as usize;
                theirs.insert(name, take(len)?);
                left -= 16 + n + len;
            }
        }
        // every weight another rank owns must have come, as long as this rank's copy
        for (name, w) in model.named_tensors() {
            if shards.owns(&name) {
                continue;
            }
            let flat = w.flat();
            let want = flat.dims()[0] * flat.dtype().size();
            match theirs.get(&name) {
                Some(b) if b.len() == want => {}
                got => return Err(RunError::Other(format!("{what}: rank {} sent {} bytes for {name}, expected {want}", shards.owner(&name).unwrap_or(0), got.map_or(0, Vec::len)))),
            }
        }
        Ok(model.map_weights(&mut |name, w| {
            if shards.owns(name) {
                return w;
            }
            let flat = w.flat();
            let (n, dtype, device) = (flat.dims()[0], flat.dtype(), flat.device());
            let bytes = theirs.remove(name).expect("checked above");
            w.with_flat(Tensor::<1>::from_data(TensorData::from_bytes_vec(bytes, [n], dtype), &device).cast(dtype))
        }))
    }

    /// A checkpoint of the sharded state: every rank calls it; rank 0 writes the folder, asking
    /// each parameter's owner for its master and moments one parameter at a time; the others
    /// answer in the same order. Every rank gets rank 0's result.
    pub(super) fn checkpoint_sharded(&self, shards: &Shards, state: &RunState) -> Result<PathBuf, RunError> {
        let c = self.comm().expect("shards exist only with ranks");
        // a step saved already (the loop's checkpoint, then the run's last): rank 0 says so and
        // no rank gathers anything
        let dest = checkpoint::checkpoints_dir(&self.run_dir).join(format!("step-{:06}", state.step));
        let saved = c.all_gather(&format!("checkpoint of step {}: saved already?", state.step), vec![u8::from(c.rank() == 0 && dest.join("state.json").exists())]).map_err(comm_error)?;
        if saved[0] == [1] {
            return Ok(dest);
        }
        let mut source = ShardedState { opt: &self.opt, shards, comm: c, step: state.step };
        let written = if c.rank() == 0 {
            checkpoint::save_from(&self.run_dir, &self.policy.model, &mut source, state, &self.policy.tokenizer_json, self.cfg.train.keep_checkpoints).map_err(|e| e.to_string())
        } else {
            source.serve(&self.policy.model).map(|_| PathBuf::new()).map_err(|e| e.to_string())
        };
        // rank 0's outcome to every rank (a rank that failed answering makes rank 0's write fail too)
        let report = match &written {
            Ok(path) => format!("ok {}", path.display()),
            Err(e) => format!("error {e}"),
        };
        let all = c.all_gather(&format!("checkpoint of step {}: the result", state.step), report.into_bytes()).map_err(comm_error)?;
        let first = String::from_utf8_lossy(&all[0]).into_owned();
        match (written, first.strip_prefix("ok ")) {
            (Err(e), _) => Err(RunError::Other(format!("checkpoint of step {}: {e}", state.step))),
            (Ok(_), Some(path)) => Ok(PathBuf::from(path)),
            (Ok(_), None) => Err(RunError::Other(format!("checkpoint of step {}: rank 0: {}", state.step, first.trim_start_matches("error ")))),
        }
    }
}

/// The optimizer state of a sharded group, one parameter at a time from its owner.
struct ShardedState<'a> {
    opt: &'a crate::optim::AdamW,
    shards: &'a Shards,
    comm: &'a dyn Communicator,
    step: usize,
}

impl ShardedState<'_> {
    /// The owner's bytes of `what` (others send nothing).
    fn from_owner(&self, what: String, name: &str, mine: impl FnOnce() -> Result<Vec<u8>, ModelError>) -> Result<burn::tensor::Bytes, ModelError> {
        let owner = self.shards.owner(name).unwrap_or(0);
        let mine = if self.shards.owns(name) { mine()? } else { Vec::new() };
        let all = self.comm.all_gather(&format!("checkpoint of step {}: {what}", self.step), mine).map_err(|e| ModelError::Io { file: "checkpoint".into(), message: e.to_string() })?;
        Ok(burn::tensor::Bytes::from_bytes_vec(all[owner].clone()))
    }

    /// A rank past 0: the same requests, in the order rank 0's write makes them.
    fn serve(&mut self, model: &Qwen3) -> Result<(), ModelError> {
        let moments = self.moment_names()?;
        let mut weights = model.named_tensors();
        weights.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, w) in &weights {
            self.master(name, w)?;
        }
        for (name, _) in &moments {
            self.moment(name, false)?;
            self.moment(name, true)?;
        }
        Ok(())
    }
}

impl OptimizerState for ShardedState<'_> {
    fn moment_names(&mut self) -> Result<Vec<(String, usize)>, ModelError> {
        let mine: Vec<u8> = self.opt.moments.iter().flat_map(|(k, (m, _))| format!("{k}\t{}\n", m.dims()[0]).into_bytes()).collect();
        let all = self.comm.all_gather(&format!("checkpoint of step {}: the moments' names", self.step), mine).map_err(|e| ModelError::Io { file: "checkpoint".into(), message: e.to_string() })?;
        let mut names = BTreeMap::new();
        for part in all {
            for line in String::from_utf8_lossy(&part).lines() {
                if let Some((name, n)) = line.split_once('\t') {
                    names.insert(name.to_string(), n.parse().unwrap_or(0));
                }
            }
        }
        Ok(names.into_iter().collect())
    }

    fn master(&mut self, name: &str, weight: &Weight) -> Result<burn::tensor::Bytes, ModelError> {
        // from the owner even where every rank holds the same f32 weight: one path for f32
        // and bf16 models (a bf16 model's f32 master exists on its owner only)
        let opt = self.opt;
        self.from_owner(format!("master {name}"), name, || (&mut &*opt).master(name, weight).map(|b| b.to_vec()))
    }

    fn moment(&mut self, name: &str, second: bool) -> Result<burn::tensor::Bytes, ModelError> {
        let opt = self.opt;
        self.from_owner(format!("{} {name}", if second { "v" } else { "m" }), name, || (&mut &*opt).moment(name, second).map(|b| b.to_vec()))
    }
}

