//! (g): steps replayed as captured graphs give the launched steps' bits.

use super::{bits, random_request, EngineCheck, CONTEXT};
use crate::{Engine, EngineConfig, Request};
use rand::rngs::StdRng;
use rand::Rng;
use shared_kernels::model::Qwen3;

/// Steps replayed as captured graphs (`LOCKSTEP_DECODE_GRAPHS`) = launched steps: `n` random
/// requests (truncating and greedy rows mixed, answers of different lengths so the row count
/// falls through several graphs), overlapped and synchronous, with the engine stepped on
/// another thread than the one that built it (as the tokio front does), and with row counts
/// padded (stand-in rows repeating the last) or exact: the same tokens,
/// logprob bits and finish reasons, steps replayed and no capture failed.
pub fn graphs_replay_the_launched_steps(model: &Qwen3, rng: &mut StdRng, n: usize) -> EngineCheck {
    let vocab = model.config.vocab_size;
    // short prompts and long answers: runs of steps whose rows are all sampled
    let requests: Vec<Request> = (0..n as u64)
        .map(|i| {
            let mut r = random_request(rng, 500 + i, vocab);
            r.prompt.truncate(rng.random_range(1..6));
            r.params.max_new_tokens = rng.random_range(8..24);
            r
        })
        .collect();
    let chunk = [1, 16][rng.random_range(0..2)];
    let mut report = Vec::new();
    for (overlap, elsewhere, padding) in [(true, false, false), (false, false, false), (true, true, false), (true, false, true), (false, true, true)] {
        let run = |graphs: bool| {
            let mut e = Engine::new(model.clone(), EngineConfig { max_batch: n, kv_blocks: 0, context: CONTEXT, chunk_size: chunk, share_prompt_prefix: true, overlap, reserve: 1.0 }).expect("valid engine config");
            e.set_decode_graphs(graphs);
            e.set_decode_graph_padding(padding);
            let requests = requests.clone();
            let go = move || {
                let out = e.generate(requests);
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
        if let Some(Err(e)) = replayed.iter().find(|r| r.is_err()) {
            return EngineCheck::new(name, Some(format!("a request failed with graphs on: {e}")));
        }
        if phases.replayed_steps == 0 || phases.failed_captures > 0 {
            return EngineCheck::new(name, Some(format!("{} steps replayed, {} captures failed: the graphs were not exercised", phases.replayed_steps, phases.failed_captures)));
        }
        for (r, (a, b)) in requests.iter().zip(launched.iter().zip(&replayed)) {
            let same = matches!((a, b), (Ok(a), Ok(b)) if bits(a) == bits(b));
            if !same {
                return EngineCheck::new(name, Some(format!("request {} differs: launched {:?}, replayed {:?}", r.id, a.as_ref().map(bits), b.as_ref().map(bits))));
            }
        }
        report.push(format!("{how}: {} steps replayed", phases.replayed_steps));
    }
    EngineCheck::new(format!("replayed graphs = launched steps ({n} requests, chunk {chunk}): {}", report.join("; ")), None)
}
