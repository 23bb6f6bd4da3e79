//! `sampler.stop` (vLLM's stop strings) end to end: `lockstep sample` ends each completion at
//! the token that first completes a string, with the logprob bits the unstopped completion had
//! there; GRPO on stopped completions keeps sampler and trainer bit-equal; an empty string is a
//! config error naming the key.

mod common;

use common::{lockstep, metrics, scratch, SMALL};
use std::path::Path;

fn completions(dir: &Path, stop: Option<&str>) -> Vec<serde_json::Value> {
    let mut args = vec!["sample", "--set", "sampler.input=prompts.jsonl", "--set", "sampler.output=out.jsonl", "--set", "log.progress=false", "--set", "sampler.max_new_tokens=24", "--set", "sampler.context=64"];
    let set = stop.map(|s| format!("sampler.stop=[{}]", serde_json::to_string(s).unwrap()));
    if let Some(set) = &set {
        args.extend(["--set", set]);
    }
    let out = lockstep(&args, dir);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::read_to_string(dir.join("out.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn stop_strings_end_completions_at_their_first_occurrence_with_unchanged_bits() {
    let dir = scratch("stop-strings");
    let prompts: String = (0..6).map(|i| format!("{{\"prompt\": \"{i}+{}=\"}}\n", 7 * i)).collect();
    std::fs::write(dir.join("prompts.jsonl"), prompts).unwrap();
    let free = completions(&dir, None);
    // two characters from the middle of the first completion (the embedded tokenizer has a
    // token a character), so at least that completion stops
    let text0: Vec<char> = free[0]["completion"].as_str().unwrap().chars().collect();
    assert_eq!(text0.len(), 24, "no stop token expected in the unstopped run: {}", free[0]);
    let stop: String = text0[12..14].iter().collect();
    let stopped = completions(&dir, Some(&stop));
    let mut ended = 0;
    for (f, s) in free.iter().zip(&stopped) {
        let (full_text, ids, lps) = (f["completion"].as_str().unwrap(), f["token_ids"].as_array().unwrap(), f["logprobs"].as_array().unwrap());
        let keep = match full_text.find(&stop) {
            // characters up to the string's end = tokens (one token a character)
            Some(at) => {
                ended += 1;
                assert_eq!(s["finish_reason"], "stop", "{s}");
                full_text[..at + stop.len()].chars().count()
            }
            None => ids.len(),
        };
        assert_eq!(s["token_ids"].as_array().unwrap()[..], ids[..keep], "stop {stop:?}: {f} vs {s}");
        let bits = |v: &[serde_json::Value]| v.iter().map(|x| (x.as_f64().unwrap() as f32).to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(s["logprobs"].as_array().unwrap()), bits(&lps[..keep]), "stop {stop:?}: logprob bits");
    }
    assert!(ended >= 1);

    // GRPO with the string: every step's stopped completions score the same bits in the trainer
    std::fs::write(dir.join("small.toml"), SMALL).unwrap();
    let set = format!("sampler.stop=[{}]", serde_json::to_string(&stop).unwrap());
    let out = lockstep(&["train", "small.toml", "--set", "train.steps=2", "--set", "sampler.max_new_tokens=12", "--set", &set, "--set", "log.run_name=stop"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for m in metrics(&dir.join("runs/stop")) {
        assert_eq!(m["agreement"]["bit_equal_frac"].as_f64(), Some(1.0), "{m}");
    }

    // an empty string would end every completion at once: a config error naming the key
    let out = lockstep(&["train", "small.toml", "--set", "sampler.stop=[\"</a>\", \"\"]", "--set", "log.run_name=bad"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("sampler.stop") && err.contains("entry 1"), "{err}");
}
