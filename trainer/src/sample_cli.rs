//! `lockstep sample`: prompts from JSONL (`{"prompt": "text"}`, `{"messages": [..]}` rendered
//! with the chat template, or `{"prompt_ids": [..]}`, each with an optional `"id"`) to JSONL
//! completions with token ids and logprobs, on the kernel set `ablation.sampler_kernels` names;
//! prints the throughput. A line's sampling noise is keyed by its `seed` (else `sampler.seed`)
//! and its own identity (its `id`, else its prompt and which repeat of it it is), never by its
//! place in the file: a reordered file gives every line the same completion.

use crate::config::Config;
use crate::error::RunError;
use crate::policy::{encode, Policy};
use sampler::{Request, SamplingParams};
use std::io::Write;
use std::path::Path;

/// `load_s`: the seconds the checkpoint took to load, for the timing line.
pub fn run(cfg: &Config, policy: Policy, progress: bool, load_s: f64) -> Result<Failed, RunError> {
    let s = &cfg.sampler;
    if s.input.is_empty() || s.output.is_empty() {
        return Err(RunError::Other("config keys `sampler.input` and `sampler.output` must name the prompt and result JSONL files".into()));
    }
    if same_file(Path::new(&s.input), Path::new(&s.output)) {
        return Err(RunError::Other(format!("sampler.output {:?} is the prompt file sampler.input: it would be overwritten", s.output)));
    }
    if let Some(note) = generation_config_note(cfg) {
        eprintln!("note: {note}");
    }
    let lines = crate::jsonl::lines(Path::new(&s.input)).map_err(|(line, m)| match line {
        0 => crate::error::invalid("sampler.input", format!("{:?}: {m}", s.input)),
        _ => RunError::Other(format!("{}:{line}: {m}", s.input)),
    })?;
    if lines.is_empty() {
        return Err(crate::error::invalid("sampler.input", format!("{:?} holds no prompts (every line is blank)", s.input)));
    }
    // the output's folder must take a file before any sampling is spent
    let output = Path::new(&s.output);
    if output.is_dir() {
        return Err(crate::error::invalid("sampler.output", format!("{:?} is a folder; name the result file", s.output)));
    }
    // written atomically (shared_kernels::model::save): a file is replaced whole, a symlink's
    // target rather than the link, and a pipe (`/dev/stdout`) is written into
    shared_kernels::model::save::check_writable(output).map_err(|e| crate::error::invalid("sampler.output", format!("{:?} cannot be written ({e})", s.output)))?;
    // a chat template only when some line holds messages (so plain prompt files need none)
    let mut chat: Option<crate::chat::ChatPrompts> = None;
    let mut requests = Vec::new();
    // the user's ids (strings or integers, echoed as given), in line order
    let mut user_ids: Vec<serde_json::Value> = Vec::new();
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut prompt_repeats: std::collections::HashMap<Vec<u32>, usize> = std::collections::HashMap::new();
    for (line_no, line) in &lines {
        let i = line_no - 1;
        let at = |m: String| RunError::Other(format!("{}:{line_no}: {m}", s.input));
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| at(format!("not valid JSON: {e}")))?;
        check_line_keys(&v).map_err(at)?;
        let prompt = if let Some(t) = v.get("prompt").and_then(|p| p.as_str()) {
            encode(&policy.tokenizer, t)?
        } else if let Some(messages) = v.get("messages") {
            let Some(list) = messages.as_array().filter(|list| list.iter().all(|m| m.get("role").is_some_and(|r| r.is_string()) && m.get("content").is_some())) else {
                return Err(at("`messages` must be a list of {\"role\", \"content\"} objects".into()));
            };
            if chat.is_none() {
                let over = (!cfg.task.chat_template.is_empty()).then(|| Path::new(&cfg.task.chat_template));
                if cfg.model.path.is_empty() && over.is_none() {
                    return Err(at("`messages` needs a chat template: model.path (a checkpoint with one) or task.chat_template".into()));
                }
                let template = crate::chat::ChatTemplate::from_checkpoint(Path::new(&cfg.model.path), over).map_err(RunError::Other)?;
                chat = Some(crate::chat::ChatPrompts::new(template, &cfg.task.system_prompt, &cfg.task.chat_args).map_err(RunError::Other)?);
            }
            let text = chat.as_ref().expect("set above").render_messages(list.clone()).map_err(|e| at(e))?;
            encode(&policy.tokenizer, &text)?
        } else if let Some(ids) = v.get("prompt_ids").and_then(|p| p.as_array()) {
            ids.iter().map(|x| x.as_u64().filter(|&n| n <= u32::MAX as u64).map(|n| n as u32).ok_or_else(|| at(format!("prompt_ids holds {x}, not a token id")))).collect::<Result<_, _>>()?
        } else {
            return Err(at("needs a string `prompt`, a `messages` list or an array `prompt_ids`".into()));
        };
        let user_id = match v.get("id") {
            None => serde_json::Value::from(i as u64),
            Some(x @ serde_json::Value::String(_)) => x.clone(),
            Some(x) if x.as_u64().is_some() => x.clone(),
            Some(x) => return Err(at(format!("`id` must be a string or a non-negative integer, got {x}"))),
        };
        // "3" and 3 are different ids; an implicit id is the line's index from 0
        let key = user_id.to_string();
        if let Some(first) = seen.insert(key.clone(), i + 1) {
            return Err(at(format!("id {user_id} repeats line {first}'s (ids must be unique: each completion is written under its id)")));
        }
        let seed = match v.get("seed") {
            None => s.seed,
            Some(x) => x.as_u64().ok_or_else(|| at(format!("`seed` must be a non-negative integer, got {x}")))?,
        };
        // the request's noise key: the line's own id, else its prompt (and which repeat of that
        // prompt it is), never its place in the file, so a reordered file samples the same
        let key = match v.get("id") {
            Some(_) => format!("id {key}"),
            None => {
                let repeat = prompt_repeats.entry(prompt.clone()).or_insert(0usize);
                *repeat += 1;
                format!("prompt {:?} #{}", prompt, *repeat - 1)
            }
        };
        user_ids.push(user_id);
        let request = Request { id: i as u64, prompt, params: SamplingParams { temperature: s.temperature, top_k: s.top_k, top_p: s.top_p, max_new_tokens: s.max_new_tokens, stop_tokens: policy.stop_tokens.clone(), stop: s.stop.clone(), seed, noise_key: Some(noise_key(&key)), processed_logprobs: s.logprobs_mode == crate::config::LogprobsMode::Processed, top_logprobs: 0 } };
        // a prompt the engine would refuse fails here, naming its line, before any sampling
        request.validate(policy.model.config.vocab_size, s.context).map_err(|e| at(refused_prompt(e)))?;
        requests.push(request);
    }
    let total = requests.len();
    // the engine holds the only copy of the weights (sampling needs no trainer's)
    let Policy { model, tokenizer, .. } = policy;
    let mut model = model;
    model.kernels = cfg.ablation.sampler_kernels.kernel_set();
    let mut engine = crate::run::sampler_engine(cfg, &tokenizer, model)?;
    let started = std::time::Instant::now();
    let bar = indicatif::ProgressBar::new(total as u64);
    if !progress {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let order: Vec<(u64, serde_json::Value)> = requests.iter().map(|r| r.id).zip(user_ids).collect();
    for r in requests {
        engine.add(r);
    }
    let mut results = std::collections::HashMap::new();
    // the first wave (the first max_batch completions) carries the kernels' compilation; the
    // steady state is what follows it
    let first_wave = cfg.sampler.max_batch.min(total);
    let mut first_wave_end: Option<(f64, usize)> = None;
    let mut first_wave_phases = sampler::EnginePhaseTimes::default();
    while !engine.is_idle() || results.len() < total {
        engine.step();
        for (id, r) in engine.take_done() {
            bar.inc(1);
            results.insert(id, r);
        }
        if first_wave_end.is_none() && results.len() >= first_wave {
            let tokens = results.values().filter_map(|r| r.as_ref().ok()).map(|c| c.tokens.len()).sum();
            first_wave_end = Some((started.elapsed().as_secs_f64(), tokens));
            // the steady state's host view starts here
            first_wave_phases = engine.take_phase_times();
        }
        if engine.is_idle() && results.len() < total {
            break;
        }
    }
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    let steady_phases = engine.take_phase_times();
    let generated: usize = results.values().filter_map(|r| r.as_ref().ok()).map(|c| c.tokens.len()).sum();
    eprintln!("sampled {total} prompts on the {} kernels: {generated} tokens in {seconds:.2} s ({:.0} tokens/s, {:.2} prompts/s)", cfg.ablation.sampler_kernels, generated as f64 / seconds.max(1e-9), total as f64 / seconds.max(1e-9));
    let (first_wave_s, first_wave_tokens) = first_wave_end.unwrap_or((seconds, generated));
    let steady_s = seconds - first_wave_s;
    let steady_tokens = generated - first_wave_tokens;
    if steady_tokens > 0 {
        eprintln!("  the first {first_wave} completions (one wave of sampler.max_batch, with the kernels' compilation) took {first_wave_s:.2} s; the rest {steady_s:.2} s ({:.0} tokens/s); the checkpoint loaded in {load_s:.2} s", steady_tokens as f64 / steady_s.max(1e-9));
        // what bounds the steady state: the host enqueueing a step's launches, or the device
        host_view("steady state", &steady_phases);
    } else {
        // one wave (max_batch >= the prompts): the host view of the whole sampling
        host_view("one wave (with the kernels' compilation, if the cache was cold)", &first_wave_phases);
    }
    let mut all_phases = first_wave_phases;
    all_phases.absorb(&steady_phases);
    // one machine-readable line for benchmark scripts (experiments/bench/seed_bench.sh)
    eprintln!("sample-timing {}", serde_json::json!({"load_s": load_s, "first_wave_s": first_wave_s, "steady_s": steady_s, "steady_tokens": steady_tokens, "tokens": generated, "sample_s": seconds, "kernels": cfg.ablation.sampler_kernels, "steady_engine_steps": steady_phases.steps, "steady_launch_s": steady_phases.launch_s, "steady_wait_s": steady_phases.wait_s, "steady_replayed_steps": steady_phases.replayed_steps, "all_engine_steps": all_phases.steps, "all_launch_s": all_phases.launch_s, "all_wait_s": all_phases.wait_s, "all_replayed_steps": all_phases.replayed_steps}));
    let mut failed = Failed::default();
    shared_kernels::model::save::write_atomic_with(output, |out| {
        failed = write_results(out, order, &mut results, &tokenizer).map_err(|e| shared_kernels::model::ModelError::io(output, e))?;
        Ok(())
    })
    .map_err(|e| RunError::Other(format!("writing {e} (sampler.output is left as it was)")))?;
    Ok(failed)
}

/// The requests that failed: how many, and whether the device ran out of memory (with the
/// bytes asked, where cubecl says).
#[derive(Debug, Default)]
pub struct Failed {
    pub count: usize,
    pub out_of_memory: Option<Option<u64>>,
}

/// The results in `order` as JSON lines into `out`; returns what failed.
fn write_results(out: &mut dyn Write, order: Vec<(u64, serde_json::Value)>, results: &mut std::collections::HashMap<u64, Result<sampler::Completion, sampler::SampleError>>, tokenizer: &tokenizers::Tokenizer) -> std::io::Result<Failed> {
    let mut failed = Failed::default();
    for (engine_id, id) in order {
        let line = match results.remove(&engine_id) {
            Some(Ok(c)) => match c.logprobs.iter().position(|l| !l.is_finite()) {
                // a NaN or infinite logprob is a device or model fault, never a result
                Some(k) => {
                    failed.count += 1;
                    serde_json::json!({"id": id, "error": format!("non-finite logprob {} at completion position {k} (token {})", c.logprobs[k], c.tokens[k])})
                }
                None => match tokenizer.decode(&c.tokens, true) {
                    Ok(text) => serde_json::json!({"id": id, "completion": text, "token_ids": c.tokens, "logprobs": c.logprobs, "finish_reason": format!("{:?}", c.finish).to_lowercase()}),
                    Err(e) => {
                        failed.count += 1;
                        serde_json::json!({"id": id, "error": format!("decoding its tokens: {e}"), "token_ids": c.tokens})
                    }
                },
            },
            Some(Err(e)) => {
                failed.count += 1;
                let text = e.to_string();
                failed.out_of_memory = failed.out_of_memory.or(crate::out_of_memory::reported(&text));
                serde_json::json!({"id": id, "error": text})
            }
            None => {
                failed.count += 1;
                serde_json::json!({"id": id, "error": "the engine returned no result for this request"})
            }
        };
        writeln!(out, "{line}")?;
    }
    Ok(failed)
}

/// Where `p`'s engine steps spent the host's time, per step.
fn host_view(what: &str, p: &sampler::EnginePhaseTimes) {
    let per_step = |s: f64| 1e3 * s / p.steps.max(1) as f64;
    eprintln!("  {what}, {} engine steps ({} replayed as graphs): per step {:.2} ms enqueueing launches, {:.2} ms waiting for the device, {:.2} ms scheduling", p.steps, p.replayed_steps, per_step(p.launch_s), per_step(p.wait_s), per_step(p.schedule_s + p.prefix_copy_s));
}

/// Why the engine refuses a prompt, in the terms of the prompt file and the config keys.
fn refused_prompt(e: sampler::SampleError) -> String {
    use sampler::SampleError::*;
    match e {
        EmptyPrompt { .. } => "the prompt has no tokens".into(),
        TokenOutOfRange { token, position, vocab, .. } => format!("token id {token} at prompt position {position} is past the model's vocabulary ({vocab} ids)"),
        TooLong { prompt, max_new, context, .. } => format!("the prompt's {prompt} tokens + sampler.max_new_tokens ({max_new}) exceed sampler.context ({context})"),
        other => other.to_string(),
    }
}

/// A line names one prompt, and no per-request sampling setting: the config's keys set those
/// for every line, so a line's own `max_tokens` or `temperature` would be silently ignored.
fn check_line_keys(v: &serde_json::Value) -> Result<(), String> {
    let given: Vec<&str> = ["prompt", "messages", "prompt_ids"].into_iter().filter(|k| v.get(k).is_some()).collect();
    if given.len() > 1 {
        return Err(format!("holds {}: give exactly one prompt per line", given.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(" and ")));
    }
    const PER_REQUEST: [(&str, &str); 8] = [("max_tokens", "sampler.max_new_tokens"), ("max_new_tokens", "sampler.max_new_tokens"), ("temperature", "sampler.temperature"), ("top_p", "sampler.top_p"), ("top_k", "sampler.top_k"), ("stop", "sampler.stop"), ("n", "one line per completion (or train.group_size in GRPO)"), ("sampling_params", "the [sampler] keys")];
    match PER_REQUEST.iter().find(|(k, _)| v.get(k).is_some()) {
        Some((k, instead)) => Err(format!("`{k}` is not read per line: the config's settings apply to every line; set {instead} instead")),
        None => Ok(()),
    }
}

/// `lockstep sample`: the memory plan, the policy, then [`run`]; an error when a request failed.
pub fn main(cfg: Config) -> Result<(), RunError> {
    let device = shared_kernels::device::default_device();
    let cfg = crate::memory_plan::plan(&cfg, &device, crate::memory_plan::Purpose::Sample)?;
    let loading = std::time::Instant::now();
    let policy = crate::policy::load_policy(&cfg, None, &device)?;
    let load_s = loading.elapsed().as_secs_f64();
    let failed = run(&cfg, policy, cfg.log.progress, load_s)?;
    if let Some(asked) = failed.out_of_memory {
        return Err(RunError::Other(out_of_memory_message(&cfg, asked, failed.count)));
    }
    if failed.count > 0 {
        return Err(RunError::Other(format!("{} request(s) failed; see their `error` in {}", failed.count, cfg.sampler.output)));
    }
    Ok(())
}

/// The device ran out of memory in a sampling step: the sizes, and the keys that shrink a step
/// or the KV cache.
fn out_of_memory_message(cfg: &Config, asked: Option<u64>, failed: usize) -> String {
    let sizes = crate::out_of_memory::sizes(asked);
    let s = &cfg.sampler;
    let kv = s.kv_budget_mib.set().map_or("auto".to_string(), |m| m.to_string());
    format!(
        "out of device memory in a sampling step ({sizes}); {failed} request(s) failed (their `error` in {}): lower sampler.kv_budget_mib (now {kv}), sampler.max_batch (now {}) or sampler.chunk_size (now {}), or leave sampler.kv_budget_mib \"auto\" if another process took the memory",
        s.output, s.max_batch, s.chunk_size
    )
}

/// A request's noise key from its identity (FNV-1a over the text: the same on every build and
/// machine).
pub(crate) fn noise_key(identity: &str) -> u64 {
    crate::input_files::fnv1a(crate::input_files::FNV_START, identity.as_bytes())
}

/// Whether `a` and `b` name one file (`b` need not exist yet: its folder is resolved).
fn same_file(a: &Path, b: &Path) -> bool {
    let resolve = |p: &Path| -> Option<std::path::PathBuf> {
        if let Ok(c) = p.canonicalize() {
            return Some(c);
        }
        let parent = p.parent().filter(|q| !q.as_os_str().is_empty()).unwrap_or(Path::new("."));
        Some(parent.canonicalize().ok()?.join(p.file_name()?))
    };
    matches!((resolve(a), resolve(b)), (Some(x), Some(y)) if x == y)
}

/// What the checkpoint's generation_config.json suggests for sampling where it differs from this
/// run's `[sampler]`: vLLM applies those settings by default, lockstep samples with its config
/// alone, so a vLLM user comparing outputs is told which settings differ.
fn generation_config_note(cfg: &Config) -> Option<String> {
    if cfg.model.path.is_empty() {
        return None;
    }
    let path = Path::new(&cfg.model.path).join("generation_config.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).ok()?).ok()?;
    let s = &cfg.sampler;
    let ours = [("temperature", s.temperature), ("top_p", s.top_p), ("top_k", s.top_k as f32)];
    let differing: Vec<String> = ours
        .iter()
        .filter_map(|&(key, value)| {
            let suggested = v.get(key)?.as_f64()?;
            ((suggested as f32) != value).then(|| format!("{key} {suggested} (sampler.{key} = {value})"))
        })
        .collect();
    (!differing.is_empty()).then(|| format!("{} suggests {}; lockstep samples with its [sampler] settings only (vLLM applies the checkpoint's by default): set them to sample as it does", path.display(), differing.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_config_whose_sampling_differs_is_named_setting_by_setting() {
        let dir = shared_kernels::testing::Scratch::new("generation-config-note");
        std::fs::write(dir.join("generation_config.json"), r#"{"temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": 1}"#).unwrap();
        let mut cfg = Config::default();
        cfg.model.path = dir.display().to_string();
        let note = generation_config_note(&cfg).expect("a note");
        assert!(note.contains("temperature 0.6 (sampler.temperature = 1)") && note.contains("top_p 0.95 (sampler.top_p = 1)") && note.contains("top_k 20 (sampler.top_k = 0)"), "{note}");
        // the same settings, or none in the file, or no checkpoint: nothing to say
        cfg.sampler.temperature = 0.6;
        cfg.sampler.top_p = 0.95;
        cfg.sampler.top_k = 20;
        assert_eq!(generation_config_note(&cfg), None);
        std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": 1}"#).unwrap();
        assert_eq!(generation_config_note(&Config::default()), None);
        assert_eq!(generation_config_note(&cfg), None);
        std::fs::remove_dir_all(&dir).ok();
    }
}
