//! Launching a step's forward and sampling on the device, and reading its tokens back.

use super::Engine;
use burn::tensor::{DType, Int, Tensor};
use shared_kernels::model::moe::RoutingLog;
use shared_kernels::model::{Forward, Rows, Tokens};
use shared_kernels::ops::logits::top_tokens::top_tokens;
use shared_kernels::{bridge::ReadBack, row_rng_key, sample, SamplingRow};
use std::time::Instant;

/// A step's sampled tokens and logprobs on the device, not read yet.
pub(super) struct InFlight {
    /// On the device: the next step's decode rows read their token from here.
    pub(super) tokens: Tensor<1, Int>,
    /// Logprobs and tokens on their way to the host.
    pub(super) copy: ReadBack,
    /// The request each sampled row belongs to, in row order.
    pub(super) owners: Vec<u64>,
    /// The sampled rows that asked for `top_logprobs` (their index among the sampled rows and
    /// how many), in order, and the most any asked (each row's share of the copy).
    pub(super) top: Vec<(usize, usize)>,
    pub(super) top_n: usize,
    /// Each sampled row's routing digest (`RoutingLog::row_digests`; a mixture-of-experts
    /// model only, else empty).
    pub(super) routing: Vec<u64>,
}

/// What one step did, for progress bars and benchmarks.
impl Engine {
    /// Enqueues a step's forward and sampling; `None` when no row is sampled (prompt chunks
    /// that end no prompt). Nothing is read back here.
    pub(super) fn launch(&mut self, rows: &Rows, sample_at: &[(usize, usize)], fed: Option<(&Tensor<1, Int>, &[i32])>) -> Result<Option<InFlight>, String> {
        let launching = Instant::now();
        let params: Vec<SamplingRow> = sample_at
            .iter()
            .map(|&(a, _)| {
                let act = &self.active[a];
                let p = &act.request.params;
                let position = (act.request.prompt.len() + act.tokens.len() + act.in_flight) as u32;
                SamplingRow { temperature: p.temperature, top_k: p.top_k, top_p: p.top_p, rng_key: row_rng_key(p.seed, p.noise_key.unwrap_or(act.request.id), position), processed: p.processed_logprobs }
            })
            .collect();
        // rows that asked for their most likely tokens: the logits are needed, so no graph
        let top: Vec<(usize, usize)> = sample_at.iter().enumerate().map(|(i, &(a, _))| (i, self.active[a].request.params.top_logprobs)).filter(|&(_, n)| n > 0).collect();
        let top_n = top.iter().map(|&(_, n)| n).max().unwrap_or(0);
        let graphed = if top.is_empty() && self.replayable(rows, sample_at) { self.launch_graphed(rows, &params, fed)? } else { None };
        let mut alternatives = None;
        let mut routing = Vec::new();
        let (tokens, logprobs) = match graphed {
            Some(sampled) => sampled,
            None => {
                // logits only for the rows that are sampled (the last row of a prompt, decode rows)
                let at: Vec<usize> = sample_at.iter().map(|&(_, r)| r).collect();
                let tokens = fed.map_or(Tokens::Host, |(sampled, index)| Tokens::Device { sampled, index });
                let mut log = RoutingLog::default();
                let forward = Forward::rows(rows).cache(&mut self.cache).logits_at(&at).tokens(tokens);
                let logits = self.model.run(if self.model.config.moe.is_some() { forward.routing(&mut log) } else { forward });
                let digests = log.row_digests(rows.len());
                routing = if digests.is_empty() { Vec::new() } else { at.iter().map(|&r| digests[r]).collect() };
                let Some(picked) = logits.map_err(|e| e.to_string())? else {
                    self.phase.launch_s += launching.elapsed().as_secs_f64();
                    return Ok(None);
                };
                if !top.is_empty() {
                    let device = picked.device();
                    let which = Tensor::<1, Int>::from_data(burn::tensor::TensorData::new(top.iter().map(|&(i, _)| i as i32).collect::<Vec<_>>(), [top.len()]), &device);
                    let temps = Tensor::<1>::from_data(burn::tensor::TensorData::new(top.iter().map(|&(i, _)| params[i].temperature).collect::<Vec<_>>(), [top.len()]), &device);
                    alternatives = Some(top_tokens(picked.clone().select(0, which), temps, top_n).map_err(|e| e.to_string())?);
                }
                let (tokens, logprobs) = sample(picked, &params).map_err(|e| e.to_string())?;
                (tokens, logprobs.cast(DType::F32))
            }
        };
        // the copy to the host is queued right behind this step, so a later step enqueued
        // before the wait does not delay it
        let copy = match alternatives {
            Some((ids, lps)) => ReadBack::start(vec![logprobs, lps], vec![tokens.clone(), ids]),
            None => ReadBack::start(vec![logprobs], vec![tokens.clone()]),
        }
        .map_err(|e| e.to_string())?;
        let owners = sample_at.iter().map(|&(a, _)| self.active[a].request.id).collect();
        for &(a, _) in sample_at {
            self.active[a].in_flight += 1;
        }
        self.phase.launch_s += launching.elapsed().as_secs_f64();
        Ok(Some(InFlight { tokens, copy, owners, top, top_n, routing }))
    }

    /// Waits for a step's tokens and logprobs and hands them to the requests still active.
    pub(super) fn read(&mut self, step: InFlight) -> Result<(), String> {
        let waiting = Instant::now();
        // A failed launch anywhere in the forward surfaces here, at the first read: an error for
        // this step's requests, not a panic of the engine.
        let mut data = step.copy.wait().map_err(|e| format!("the device failed while computing this step: {e}"))?.into_iter();
        if shared_kernels::knobs::var("LOCKSTEP_FAULT_OOM").as_deref() == Some("engine") {
            return Err("the device failed while computing this step: An IO error happened\nCaused by:\n  out of device memory allocating 6890192896 bytes (fault injection: LOCKSTEP_FAULT_OOM=engine)".into());
        }
        let short = || "the step's read-back returned fewer tensors than asked".to_string();
        let logprobs = data.next().ok_or_else(short)?;
        let top_lps = if step.top.is_empty() { None } else { Some(data.next().ok_or_else(short)?) };
        let tokens = data.next().ok_or_else(short)?;
        let top_ids = if step.top.is_empty() { None } else { Some(data.next().ok_or_else(short)?) };
        let tokens = tokens.convert::<i64>().try_to_vec::<i64>().map_err(|e| format!("{e:?}"))?;
        let logprobs = logprobs.try_to_vec::<f32>().map_err(|e| format!("{e:?}"))?;
        // each asking row's alternatives, by its index among the sampled rows
        let mut alternatives: std::collections::HashMap<usize, Vec<(u32, f32)>> = Default::default();
        if let (Some(ids), Some(lps)) = (top_ids, top_lps) {
            let ids = ids.convert::<i64>().try_to_vec::<i64>().map_err(|e| format!("{e:?}"))?;
            let lps = lps.try_to_vec::<f32>().map_err(|e| format!("{e:?}"))?;
            for (k, &(i, n)) in step.top.iter().enumerate() {
                let at = k * step.top_n;
                alternatives.insert(i, (at..at + n).map(|j| (ids[j] as u32, lps[j])).collect());
            }
        }
        self.phase.wait_s += waiting.elapsed().as_secs_f64();
        let now = Instant::now();
        let index: std::collections::HashMap<u64, usize> = self.active.iter().enumerate().map(|(a, act)| (act.request.id, a)).collect();
        for (i, id) in step.owners.iter().enumerate() {
            if let Some(&a) = index.get(id) {
                let act = &mut self.active[a];
                act.tokens.push(tokens[i] as u32);
                act.logprobs.push(logprobs[i]);
                if let Some(listed) = alternatives.remove(&i) {
                    act.top.push(listed);
                }
                if let Some(&digest) = step.routing.get(i) {
                    act.routing.push(digest);
                }
                act.in_flight -= 1;
                act.first_token.get_or_insert(now);
            }
        }
        Ok(())
    }

}
