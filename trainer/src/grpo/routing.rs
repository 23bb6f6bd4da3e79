//! Mixture-of-experts routing of a GRPO step: the trainer's routing of the rollouts (a pass
//! without gradients over the step's micro-batches, on the weights that sampled them), its
//! agreement with the sampler's token by token, each sparse layer's expert load, and the
//! load-balancing loss's constants for the update (`train.router_aux_loss_coef`).

use super::rollouts::Rollouts;
use super::Trainer;
use crate::config::{OnMismatch, SamplerKernels};
use crate::error::RunError;
use crate::telemetry::{LayerLoad, MoeTelemetry};
use shared_kernels::model::moe::RoutingLog;
use shared_kernels::model::moe_train::RouterAux;
use shared_kernels::model::{Forward, Rows};
use std::time::Instant;

impl Trainer {
    /// `None` for a dense model. In matched mode a token routed otherwise than the sampler did
    /// stops the run (`train.on_mismatch = "stop"`) or warns, as a logprob's bits do. With
    /// `train.router_aux_loss_coef` > 0, also the load-balancing loss's constants (every rank's
    /// rows together) for the update.
    pub(super) fn routing_telemetry(&self, step: usize, r: &Rollouts) -> Result<Option<(MoeTelemetry, Option<RouterAux>)>, RunError> {
        let model = &self.policy.model;
        let Some(moe) = model.config.moe.as_ref() else { return Ok(None) };
        let started = Instant::now();
        let (batches, _) = self.own_micro_batches(&r.sequences);
        let (mut counts, mut prob_sums, mut layer_rows) = (vec![0u64; moe.num_experts], vec![0.0f64; moe.num_experts], 0usize);
        let (mut compared, mut equal, mut first_other) = (0usize, 0usize, None);
        let mut load: Vec<(usize, Vec<u64>)> = Vec::new();
        for batch in &batches {
            let sequences = &r.sequences[batch.clone()];
            let rows = Rows::whole(sequences);
            let mut log = RoutingLog::default();
            model.run(Forward::rows(&rows).logits_at(&[]).routing(&mut log)).map_err(|e| super::score::pass_error(step, e))?;
            let digests = log.row_digests(rows.len());
            let (c, p, n) = log.load_balancing_sums(rows.len(), moe.num_experts);
            counts.iter_mut().zip(c).for_each(|(t, c)| *t += c);
            prob_sums.iter_mut().zip(p).for_each(|(t, p)| *t += p);
            layer_rows += n;
            for (layer, counts) in log.expert_load(0..rows.len(), rows.len(), moe.num_experts) {
                match load.iter_mut().find(|(l, _)| *l == layer) {
                    Some((_, total)) => total.iter_mut().zip(counts).for_each(|(t, c)| *t += c),
                    None => load.push((layer, counts)),
                }
            }
            let mut offset = 0;
            for (s, seq) in batch.clone().zip(sequences) {
                let sampled = &r.completions[s].routing;
                // agent episodes' completions carry no sampler routing: nothing to compare
                if sampled.len() == r.positions[s].len() {
                    for (t, (&digest, &row)) in sampled.iter().zip(&r.positions[s]).enumerate() {
                        compared += 1;
                        if digest == digests[offset + row] {
                            equal += 1;
                        } else if first_other.is_none() {
                            first_other = Some((r.requests[s].id, t));
                        }
                    }
                }
                offset += seq.len();
            }
        }
        let routing_agreement = if compared == 0 { 1.0 } else { equal as f64 / compared as f64 };
        if let (Some((request, t)), SamplerKernels::Matched) = (first_other, self.cfg.ablation.sampler_kernels) {
            let message = format!("step {step}: the sampler and the trainer routed {} of {compared} tokens to other experts (request {request}, token {t} first): the matched kernels give both sides the same router logits, so this breaks the contract", compared - equal);
            if self.cfg.train.on_mismatch == OnMismatch::Stop {
                return Err(RunError::Other(message));
            }
            tracing::warn!("{message}");
        }
        if self.comm.is_some() {
            // the loss is over the whole step: every rank's sums
            let mine: Vec<f64> = counts.iter().map(|&c| c as f64).chain(prob_sums.iter().copied()).chain([layer_rows as f64]).collect();
            let parts = self.gather_f64s(&format!("step {step}: the routers' load"), mine)?;
            let e = moe.num_experts;
            counts = (0..e).map(|i| parts.iter().map(|p| p[i]).sum::<f64>() as u64).collect();
            prob_sums = (0..e).map(|i| parts.iter().map(|p| p[e + i]).sum()).collect();
            layer_rows = parts.iter().map(|p| p[2 * e]).sum::<f64>() as usize;
        }
        let load_balancing_loss = shared_kernels::model::moe::load_balancing_loss(&counts, &prob_sums, layer_rows);
        // its gradient by a row's logits, per unit of counts (RouterAux)
        let unit = moe.num_experts as f64 / (layer_rows.max(1) as f64).powi(2);
        let coef = self.cfg.train.router_aux_loss_coef;
        let aux = (coef > 0.0).then(|| RouterAux { scale: (coef * unit) as f32, counts: counts.iter().map(|&c| c as f32).collect() });
        let layers: Vec<LayerLoad> = load.into_iter().map(|(layer, tokens_per_expert)| LayerLoad::of(layer, tokens_per_expert)).collect();
        let load_max_over_mean = layers.iter().map(|l| l.max_over_mean).fold(0.0, f64::max);
        Ok(Some((MoeTelemetry { routing_agreement, routed_tokens: compared, load_max_over_mean, load_balancing_loss, aux_loss: coef * load_balancing_loss, layers, routing_s: started.elapsed().as_secs_f64() }, aux)))
    }
}
