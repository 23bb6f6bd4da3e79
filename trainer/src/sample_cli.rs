//! `lockstep sample`: prompts from JSONL (`{"prompt": "text"}` or `{"prompt_ids": [..]}`, with
//! an optional `"id"`) to JSONL completions with token ids and logprobs.

use crate::config::Config;
use crate::run::{encode, Policy, RunError};
use sampler::{Engine, Request, SamplingParams};
use std::io::Write;
use std::path::Path;

pub fn run(cfg: &Config, policy: Policy, progress: bool) -> Result<usize, RunError> {
    let s = &cfg.sampler;
    if s.input.is_empty() || s.output.is_empty() {
        return Err(RunError::Other("config keys `sampler.input` and `sampler.output` must name the prompt and result JSONL files".into()));
    }
    let text = std::fs::read_to_string(&s.input).map_err(|e| RunError::Other(format!("{}: {e}", s.input)))?;
    let mut requests = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = |m: String| RunError::Other(format!("{}:{}: {m}", s.input, i + 1));
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| at(format!("not valid JSON: {e}")))?;
        let prompt = if let Some(t) = v.get("prompt").and_then(|p| p.as_str()) {
            encode(&policy.tokenizer, t)?
        } else if let Some(ids) = v.get("prompt_ids").and_then(|p| p.as_array()) {
            ids.iter().map(|x| x.as_u64().filter(|&n| n <= u32::MAX as u64).map(|n| n as u32).ok_or_else(|| at(format!("prompt_ids holds {x}, not a token id")))).collect::<Result<_, _>>()?
        } else {
            return Err(at("needs a string `prompt` or an array `prompt_ids`".into()));
        };
        let id = v.get("id").and_then(|x| x.as_u64()).unwrap_or(i as u64);
        requests.push(Request { id, prompt, params: SamplingParams { temperature: s.temperature, top_k: s.top_k, top_p: s.top_p, max_new_tokens: s.max_new_tokens, stop_tokens: vec![policy.eos], seed: s.seed } });
    }
    let total = requests.len();
    let engine_cfg = crate::run::engine_config(cfg, &policy.model)?;
    let mut engine = Engine::new(policy.model, engine_cfg).map_err(RunError::Other)?;
    let bar = indicatif::ProgressBar::new(total as u64);
    if !progress {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let order: Vec<u64> = requests.iter().map(|r| r.id).collect();
    for r in requests {
        engine.add(r);
    }
    let mut results = std::collections::HashMap::new();
    while !engine.is_idle() || results.len() < total {
        engine.step();
        for (id, r) in engine.take_done() {
            bar.inc(1);
            results.insert(id, r);
        }
        if engine.is_idle() && results.len() < total {
            break;
        }
    }
    bar.finish_and_clear();
    let tmp = Path::new(&s.output).with_extension("jsonl.tmp");
    let mut out = std::fs::File::create(&tmp).map_err(|e| RunError::Other(format!("{}: {e}", tmp.display())))?;
    let mut failed = 0;
    for id in order {
        let line = match results.remove(&id) {
            Some(Ok(c)) => {
                let text = policy.tokenizer.decode(&c.tokens, true).unwrap_or_default();
                serde_json::json!({"id": id, "completion": text, "token_ids": c.tokens, "logprobs": c.logprobs, "finish_reason": format!("{:?}", c.finish).to_lowercase()})
            }
            Some(Err(e)) => {
                failed += 1;
                serde_json::json!({"id": id, "error": e.to_string()})
            }
            None => {
                failed += 1;
                serde_json::json!({"id": id, "error": "duplicate id"})
            }
        };
        writeln!(out, "{line}").map_err(|e| RunError::Other(format!("{}: {e}", tmp.display())))?;
    }
    out.sync_all().map_err(|e| RunError::Other(e.to_string()))?;
    std::fs::rename(&tmp, &s.output).map_err(|e| RunError::Other(format!("{}: {e}", s.output)))?;
    Ok(failed)
}
