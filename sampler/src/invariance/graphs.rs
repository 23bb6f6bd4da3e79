//! (g): steps replayed as captured graphs give the launched steps' bits.

use super::{bits, random_request, EngineCheck, CONTEXT};
use crate::{EngineConfig, Request};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use shared_kernels::model::Qwen3;

/// Steps between two requests joining: a prompt's step, then two decode steps at one row count
/// (the second captures), then one replay before the next joins.
const ARRIVAL: usize = 4;

/// Steps replayed as captured graphs (`LOCKSTEP_DECODE_GRAPHS`) = launched steps: `n` random
/// requests joining one every [`ARRIVAL`] steps (truncating and greedy rows mixed, answers of
/// distinct lengths: the row count rises and falls through several graphs, and a padded graph
/// captured at one real row count is replayed at others), overlapped and synchronous, with the
/// engine stepped on another thread than the one that built it (as the tokio front does), and
/// with row counts padded (stand-in rows repeating real rows) or exact: the same tokens, logprob
/// bits and finish reasons, steps replayed and no capture failed.
pub fn graphs_replay_the_launched_steps(model: &Qwen3, rng: &mut StdRng, n: usize) -> EngineCheck {
    if model.config.moe.is_some() {
        // nothing to compare, and said so: the engine launches every step of such a model
        return EngineCheck::new("replayed graphs = launched steps: no graphs for a mixture-of-experts model (its routing is read on the host mid-forward, so every step is launched)".into(), None);
    }
    let vocab = model.config.vocab_size;
    // short prompts and long answers: runs of steps whose rows are all sampled
    let mut lengths: Vec<usize> = (8..8 + n).collect();
    lengths.shuffle(rng);
    let requests: Vec<Request> = (0..n as u64)
        .map(|i| {
            let mut r = random_request(rng, 500 + i, vocab);
            r.prompt.truncate(rng.random_range(1..6));
            r.params.max_new_tokens = lengths[i as usize];
            // a step with a row asking for alternatives is launched, not replayed: only the
            // first request asks, so most steps still replay while its steps are mixed in
            r.params.top_logprobs = if i == 0 { 3 } else { 0 };
            r
        })
        .collect();
    let chunk = [1, 16][rng.random_range(0..2)];
    let mut report = Vec::new();
    for (overlap, elsewhere, padding) in [(true, false, false), (false, false, false), (true, true, false), (true, false, true), (false, true, true)] {
        let run = |graphs: bool| {
            let mut e = super::engine_with(model, EngineConfig { max_batch: n, kv_blocks: 0, context: CONTEXT, chunk_size: chunk, share_prompt_prefix: true, overlap, reserve: 1.0 });
            e.set_decode_graphs(graphs);
            e.set_decode_graph_padding(padding);
            let requests = requests.clone();
            let mut go = move || {
                // one request joins every ARRIVAL steps: a padded graph captured at one real row
                // count is replayed at a larger one (stand-ins held where real rows now are)
                let (mut done, mut next, mut step) = (std::collections::HashMap::new(), 0, 0);
                while next < requests.len() || !e.is_idle() {
                    if step % ARRIVAL == 0 && next < requests.len() {
                        e.add(requests[next].clone());
                        next += 1;
                    }
                    e.step();
                    done.extend(e.take_done());
                    step += 1;
                }
                let out: Vec<_> = requests.iter().map(|r| done.remove(&r.id)).collect();
                (out, e.take_phase_times())
            };
            if elsewhere {
                std::thread::spawn(go).join().expect("the engine thread panicked")
            } else {
                go()
            }
        };
        let (launched, _) = run(false);
        let (replayed, phases) = run(true);
        let how = format!("overlap {overlap}{}{}", if elsewhere { ", stepped on another thread" } else { "" }, if padding { ", padded row counts" } else { "" });
        let name = format!("replayed graphs = launched steps ({n} requests, chunk {chunk}, {how})");
        if let Some(r) = replayed.iter().chain(&launched).find(|r| !matches!(r, Some(Ok(_)))) {
            return EngineCheck::new(name, Some(format!("a request failed or never finished: {:?}", r.as_ref().map(|r| r.as_ref().err()))));
        }
        if phases.replayed_steps == 0 || phases.failed_captures > 0 {
            return EngineCheck::new(name, Some(format!("{} steps replayed, {} captures failed: the graphs were not exercised", phases.replayed_steps, phases.failed_captures)));
        }
        for (r, (a, b)) in requests.iter().zip(launched.iter().zip(&replayed)) {
            let same = matches!((a, b), (Some(Ok(a)), Some(Ok(b))) if bits(a) == bits(b));
            if !same {
                return EngineCheck::new(name, Some(format!("request {} differs: launched {:?}, replayed {:?}", r.id, shown(a), shown(b))));
            }
        }
        report.push(format!("{how}: {} steps replayed", phases.replayed_steps));
    }
    EngineCheck::new(format!("replayed graphs = launched steps ({n} requests, chunk {chunk}): {}", report.join("; ")), None)
}

fn shown(result: &Option<Result<crate::Completion, crate::SampleError>>) -> Option<Result<super::Bits, String>> {
    result.as_ref().map(|r| r.as_ref().map(bits).map_err(|e| e.to_string()))
}
