//! `lockstep serve` through real HTTP on the CPU runtime (the embedded model): the same request
//! gives the same bits alone and among concurrent neighbours, at T = 0 and at T > 0 with a seed,
//! streamed or whole; a client that goes away is cancelled; `/metrics` counts it all; bad
//! requests get OpenAI-style errors naming the field; `tools` reach the template; SIGTERM stops
//! it with exit 0.
//!
//! One file past 400 lines: every test here drives the same server harness (`Server`: start,
//! HTTP calls, streams, metrics), which would otherwise be split from the tests that need it.

mod common;

use common::scratch;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::io::{BufRead, Read, Write};
use std::process::{Child, Command, Stdio};

struct Server {
    child: Child,
    address: String,
}

impl Server {
    fn start(dir: &std::path::Path, extra: &[&str]) -> Server {
        Self::start_with_env(dir, extra, &[])
    }

    fn start_with_env(dir: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut args = vec!["serve", "--set", "serve.port=0", "--set", "sampler.max_batch=32"];
        for s in extra {
            args.extend(["--set", s]);
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_lockstep")).args(&args).envs(env.iter().copied()).current_dir(dir).stderr(Stdio::piped()).spawn().expect("start lockstep serve");
        let mut lines = std::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
        let address = loop {
            let line = lines.next().expect("the server printed its address").expect("stderr line");
            if let Some(rest) = line.split("listening on http://").nth(1) {
                break rest.split_whitespace().next().expect("address").to_string();
            }
        };
        // keep reading stderr so the server never blocks on a full pipe
        std::thread::spawn(move || for _ in lines {});
        Server { child, address }
    }

    /// (status, body) of one request over a fresh connection.
    fn call(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        let (status, _, v) = self.call_with(method, path, body, "");
        (status, v)
    }

    /// (status, headers, body), with `headers` (lines ending in \r\n) added to the request.
    fn call_with(&self, method: &str, path: &str, body: &str, headers: &str) -> (u16, String, Value) {
        let mut stream = std::net::TcpStream::connect(&self.address).expect("connect");
        write!(stream, "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n{body}", self.address, body.len()).expect("send");
        let mut raw = String::new();
        stream.read_to_string(&mut raw).expect("read the response");
        let status: u16 = raw.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status line: {raw}"));
        let (head, text) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        (status, head.to_ascii_lowercase(), serde_json::from_str(text).unwrap_or(Value::String(text.to_string())))
    }

    /// The data of each server-sent event of a streamed request, `[DONE]` as a string.
    fn stream(&self, path: &str, body: &Value) -> Vec<Value> {
        let (status, head, raw) = self.call_raw("POST", path, &body.to_string(), "");
        assert_eq!(status, 200, "{raw}");
        assert!(head.contains("content-type: text/event-stream"), "{head}");
        let text = if head.contains("transfer-encoding: chunked") { dechunk(&raw) } else { raw };
        text.split("\n\n").filter_map(|event| event.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap_or(Value::String(d.to_string()))).collect()
    }

    /// (status, lower-case head, body text).
    fn call_raw(&self, method: &str, path: &str, body: &str, headers: &str) -> (u16, String, String) {
        let mut stream = std::net::TcpStream::connect(&self.address).expect("connect");
        write!(stream, "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n{body}", self.address, body.len()).expect("send");
        let mut raw = String::new();
        stream.read_to_string(&mut raw).expect("read the response");
        let status: u16 = raw.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status line: {raw}"));
        let (head, text) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        (status, head.to_ascii_lowercase(), text.to_string())
    }

    /// `/metrics`' samples by name.
    fn metrics(&self) -> std::collections::BTreeMap<String, f64> {
        let (status, head, text) = self.call_raw("GET", "/metrics", "", "");
        assert!(status == 200 && head.contains("text/plain"), "{head}");
        text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split_once(' ')).map(|(k, v)| (k.to_string(), v.trim().parse().expect("a number"))).collect()
    }

    /// Sends SIGTERM and waits (at most 30 s) for the server's exit status.
    fn terminate(&mut self) -> std::process::ExitStatus {
        assert!(Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().expect("kill").success());
        let signalled = std::time::Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                return s;
            }
            assert!(signalled.elapsed().as_secs() < 30, "the server did not stop within 30 s of SIGTERM");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    fn complete(&self, body: Value) -> Value {
        let (status, v) = self.call("POST", "/v1/completions", &body.to_string());
        assert_eq!(status, 200, "{v}");
        v
    }
}

/// HTTP/1.1 chunked transfer coding undone.
fn dechunk(mut raw: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = raw.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or_else(|_| panic!("a chunk size, got {size:?}"));
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        raw = &rest[n + 2..];
    }
    out
}

/// Each choice's joined text, token ids, logprobs and last finish reason from a stream's chunks
/// (`text_key` "text" or the chat delta's "content"), and the usage chunk's completion tokens.
fn assemble(chunks: &[Value], chat: bool) -> (Vec<(String, Vec<u64>, Vec<f64>, String)>, Option<u64>) {
    assert_eq!(chunks.last(), Some(&json!("[DONE]")), "the stream ends with [DONE]: {chunks:?}");
    let mut choices: Vec<(String, Vec<u64>, Vec<f64>, String)> = Vec::new();
    let mut usage = None;
    for chunk in &chunks[..chunks.len() - 1] {
        assert!(chunk.get("error").is_none(), "{chunk}");
        if let Some(u) = chunk.get("usage") {
            usage = u["completion_tokens"].as_u64();
        }
        for c in chunk["choices"].as_array().expect("choices") {
            let i = c["index"].as_u64().expect("index") as usize;
            if choices.len() <= i {
                choices.resize(i + 1, Default::default());
            }
            let piece = if chat { &c["delta"]["content"] } else { &c["text"] };
            choices[i].0.push_str(piece.as_str().expect("text"));
            choices[i].1.extend(c["token_ids"].as_array().expect("token_ids").iter().map(|t| t.as_u64().expect("id")));
            let logprobs = if chat { c["logprobs"]["content"].as_array().map(|l| l.iter().map(|t| t["logprob"].clone()).collect()) } else { c["logprobs"]["token_logprobs"].as_array().cloned() };
            choices[i].2.extend(logprobs.unwrap_or_default().iter().map(|l| l.as_f64().expect("logprob")));
            if let Some(f) = c["finish_reason"].as_str() {
                choices[i].3 = f.to_string();
            }
        }
    }
    (choices, usage)
}

/// The same of a whole response.
fn whole_choices(v: &Value, chat: bool) -> Vec<(String, Vec<u64>, Vec<f64>, String)> {
    v["choices"].as_array().expect("choices").iter().map(|c| {
        let text = if chat { &c["message"]["content"] } else { &c["text"] };
        let logprobs: Vec<f64> = if chat { c["logprobs"]["content"].as_array().map(|l| l.iter().map(|t| t["logprob"].as_f64().expect("logprob")).collect()) } else { c["logprobs"]["token_logprobs"].as_array().map(|l| l.iter().map(|x| x.as_f64().expect("logprob")).collect()) }.unwrap_or_default();
        (text.as_str().expect("text").to_string(), c["token_ids"].as_array().expect("ids").iter().map(|t| t.as_u64().expect("id")).collect(), logprobs, c["finish_reason"].as_str().expect("finish").to_string())
    }).collect()
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The same request `copies` times on threads of their own, each beside random neighbours
/// (other prompts, lengths and temperatures) sent at the same time: every copy's token ids and
/// logprobs.
fn under_load(server: &Server, request: &Value, copies: usize, seed: u64) -> Vec<(Value, Value)> {
    under_load_choices(server, request, copies, seed).into_iter().map(|c| (c["token_ids"].clone(), c["logprobs"]["token_logprobs"].clone())).collect()
}

/// [`under_load`]'s copies' first choices, whole.
fn under_load_choices(server: &Server, request: &Value, copies: usize, seed: u64) -> Vec<Value> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let neighbours: Vec<Value> = (0..12)
        .map(|_| {
            let prompt: String = (0..rng.random_range(1..20)).map(|_| char::from(b'a' + rng.random_range(0..26u8))).collect();
            json!({"prompt": prompt, "max_tokens": rng.random_range(1..24), "temperature": rng.random_range(0.0..1.5), "seed": rng.random::<u32>()})
        })
        .collect();
    std::thread::scope(|scope| {
        for n in &neighbours {
            scope.spawn(move || server.complete(n.clone()));
        }
        let copies: Vec<_> = (0..copies).map(|_| scope.spawn(|| server.complete(request.clone()))).collect();
        copies.into_iter().map(|h| h.join().expect("a request thread")).map(|v| v["choices"][0].clone()).collect()
    })
}

#[test]
fn the_same_request_gives_the_same_bits_under_any_load() {
    let dir = scratch("serve-bits");
    let server = Server::start(&dir, &[]);
    assert_eq!(server.call("GET", "/health", "").0, 200);
    let (status, models) = server.call("GET", "/v1/models", "");
    assert_eq!((status, models["data"][0]["id"].as_str()), (200, Some("lockstep-tiny")), "{models}");
    let context = models["data"][0]["max_model_len"].as_u64().expect("max_model_len");
    let (status, v) = server.call("POST", "/v1/completions", &json!({"prompt": [5], "max_tokens": context}).to_string());
    assert!(status == 400 && v["error"]["message"].as_str().unwrap_or("").contains(&format!("context of {context}")), "max_model_len {context}: {v}");
    for (name, request) in [
        ("greedy", json!({"prompt": "sort 312:", "max_tokens": 12, "temperature": 0, "logprobs": 1})),
        ("T 1, seed 7", json!({"prompt": "sort 312:", "max_tokens": 12, "temperature": 1.0, "seed": 7, "logprobs": 1})),
    ] {
        let alone = server.complete(request.clone());
        let alone = (alone["choices"][0]["token_ids"].clone(), alone["choices"][0]["logprobs"]["token_logprobs"].clone());
        assert_eq!(alone.0.as_array().map(Vec::len), Some(12), "{name}: {alone:?}");
        let loaded = under_load(&server, &request, 6, 1);
        let unique: std::collections::BTreeSet<String> = loaded.iter().map(|(t, l)| format!("{t} {l}")).collect();
        assert_eq!(unique.len(), 1, "{name}: {} different answers under load", unique.len());
        // logprobs as written: serde_json writes the shortest text that round-trips, so equal
        // text is equal bits
        assert_eq!(loaded[0], alone, "{name}: under load differs from alone");
    }
    // another seed draws another completion; n = 3 gives three draws, the first the n = 1 one
    let seeded = |seed: u64, n: u64| server.complete(json!({"prompt": "sort 312:", "max_tokens": 12, "temperature": 1.0, "seed": seed, "n": n}));
    let (a, b) = (seeded(7, 1), seeded(8, 1));
    assert_ne!(a["choices"][0]["token_ids"], b["choices"][0]["token_ids"], "seeds 7 and 8 drew the same 12 tokens");
    let three = seeded(7, 3);
    assert_eq!(three["choices"].as_array().map(Vec::len), Some(3));
    assert_eq!(three["choices"][0]["token_ids"], a["choices"][0]["token_ids"]);
    assert_ne!(three["choices"][1]["token_ids"], three["choices"][0]["token_ids"]);
    assert_eq!(three["usage"]["completion_tokens"], json!(36));
}

/// The negative control: the ablation's split-K sampler (a deterministic matmul whose K split
/// follows the batch's rows) answers the same request differently alone and among neighbours,
/// so the test above would see a kernel that is not batch invariant.
#[test]
fn a_sampler_that_is_not_batch_invariant_fails_the_same_test() {
    let dir = scratch("serve-control");
    let server = Server::start(&dir, &["ablation.sampler_kernels=split_k"]);
    let request = json!({"prompt": "sort 312:", "max_tokens": 12, "temperature": 0, "logprobs": 1});
    let alone = server.complete(request.clone());
    let alone = (alone["choices"][0]["token_ids"].clone(), alone["choices"][0]["logprobs"]["token_logprobs"].clone());
    let answers: std::collections::BTreeSet<String> = under_load(&server, &request, 6, 1).into_iter().chain([alone]).map(|(t, l)| format!("{t} {l}")).collect();
    assert!(answers.len() > 1, "split-K gave one answer alone and under load: the test could not see a batch-dependent kernel");
}

#[test]
fn bad_requests_get_errors_naming_the_field_and_sigterm_stops_the_server() {
    let dir = scratch("serve-errors");
    let mut server = Server::start(&dir, &["sampler.context=48"]);
    for (path, body, status, needle) in [
        ("/v1/completions", "{bad json", 400, "not valid JSON"),
        ("/v1/completions", "[1, 2]", 400, "JSON object"),
        ("/v1/completions", r#"{"max_tokens": 4}"#, 400, "`prompt` is required"),
        ("/v1/completions", r#"{"prompt": "1+1=", "temperature": -1}"#, 400, "temperature"),
        ("/v1/completions", r#"{"prompt": "1+1=", "top_p": 0}"#, 400, "top_p"),
        ("/v1/completions", r#"{"prompt": "1+1=", "max_tokens": 0}"#, 400, "max_tokens"),
        ("/v1/completions", r#"{"prompt": "1+1=", "max_tokens": 100}"#, 400, "context of 48"),
        ("/v1/completions", r#"{"prompt": [1, 2, 99999]}"#, 400, "token id 99999"),
        ("/v1/completions", r#"{"prompt": "1+1=", "stop": [3]}"#, 400, "stop"),
        ("/v1/completions", r#"{"prompt": "1+1=", "stream": "yes"}"#, 400, "stream"),
        ("/v1/completions", r#"{"prompt": "1+1=", "stream_options": {"include_usage": true}}"#, 400, "stream_options"),
        ("/v1/completions", r#"{"prompt": "1+1=", "model": "gpt-4"}"#, 404, "lockstep-tiny"),
        // fields the sampler does not implement are refused, never ignored
        ("/v1/completions", r#"{"prompt": "1+1=", "presence_penalty": 0.5}"#, 400, "`presence_penalty` (0.5) is not supported"),
        ("/v1/completions", r#"{"prompt": "1+1=", "logit_bias": {"5": 100}}"#, 400, "`logit_bias`"),
        ("/v1/completions", r#"{"prompt": "1+1=", "echo": true}"#, 400, "`echo`"),
        ("/v1/completions", r#"{"prompt": "1+1=", "stop_token_ids": [99999]}"#, 400, "stop_token_ids"),
        ("/v1/chat/completions", r#"{"messages": [{"role": "user", "content": "hi"}]}"#, 400, "chat template"),
        ("/v1/nothing", "{}", 404, "no such endpoint"),
    ] {
        let (got, v) = server.call("POST", path, body);
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(got, status, "{path} {body}: {v}");
        assert!(message.contains(needle), "{path} {body}: {v}");
    }
    // a body past the limit (4 MiB at this context) is 413 in OpenAI's shape, not axum's text
    let huge = format!("{{\"prompt\": \"{}\"}}", "1".repeat(5 << 20));
    let (got, v) = server.call("POST", "/v1/completions", &huge);
    assert!(got == 413 && v["error"]["message"].as_str().unwrap_or("").contains("length limit"), "{got} {v}");
    // still serving after every error
    assert_eq!(server.complete(json!({"prompt": "1+1=", "max_tokens": 2}))["choices"][0]["token_ids"].as_array().map(Vec::len), Some(2));
    // a stop token id ends the choice where it is sampled, as the model's end-of-sequence does;
    // the neutral values of unsupported fields are accepted
    let greedy = server.complete(json!({"prompt": "1+1=", "max_tokens": 6, "temperature": 0}));
    let ids: Vec<u64> = greedy["choices"][0]["token_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    let cut = server.complete(json!({"prompt": "1+1=", "max_tokens": 6, "temperature": 0, "stop_token_ids": [ids[2]], "presence_penalty": 0, "ignore_eos": true}));
    let first = ids.iter().position(|&t| t == ids[2]).unwrap();
    assert_eq!(cut["choices"][0]["token_ids"], json!(ids[..=first]), "{greedy} {cut}");
    assert_eq!(cut["choices"][0]["finish_reason"], "stop", "{cut}");
    let status = server.terminate();
    assert!(status.success(), "{status}");
}

#[test]
fn an_api_key_is_required_when_set_and_past_the_queue_bound_requests_get_429() {
    let dir = scratch("serve-limits");
    // the key from the environment (serve.api_key left empty), as a deployment keeps it out of files
    let server = Server::start_with_env(&dir, &["serve.max_queue=1"], &[("LOCKSTEP_API_KEY", "sesame")]);
    let body = json!({"prompt": "sort 312:", "max_tokens": 20}).to_string();
    // /health is open; the API needs the key
    assert_eq!(server.call("GET", "/health", "").0, 200);
    let (status, _, v) = server.call_with("POST", "/v1/completions", &body, "");
    assert_eq!(status, 401, "{v}");
    let (status, _, v) = server.call_with("POST", "/v1/completions", &body, "Authorization: Bearer sesam\r\n");
    assert_eq!(status, 401, "{v}");
    assert_eq!(server.call_with("POST", "/tokenize", r#"{"prompt": "1"}"#, "").0, 401);
    let key = "Authorization: Bearer sesame\r\n";
    let (status, _, v) = server.call_with("POST", "/v1/completions", &body, key);
    assert_eq!(status, 200, "{v}");
    // a request that alone asks more choices than the bound (n = 2, or two prompts) can never
    // be admitted: 400 naming `n`, not a 429 to retry forever
    for body in [json!({"prompt": "sort 312:", "n": 2}), json!({"prompt": ["a", "b"], "max_tokens": 2})] {
        let (status, _, v) = server.call_with("POST", "/v1/completions", &body.to_string(), key);
        assert!(status == 400 && v["error"]["param"] == "n" && v["error"]["message"].as_str().unwrap_or("").contains("serve.max_queue = 1"), "{body}: {status} {v}");
    }
    // concurrent requests past the bound get 429 with Retry-After
    // (36 tokens each, the context's most beside the prompt: the first admitted holds its place while the others arrive)
    let long = json!({"prompt": "sort 312:", "max_tokens": 36}).to_string();
    let answers: Vec<(u16, String, Value)> = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..6).map(|_| scope.spawn(|| server.call_with("POST", "/v1/completions", &long, key))).collect();
        calls.into_iter().map(|h| h.join().expect("a request thread")).collect()
    });
    let statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
    assert!(statuses.contains(&200) && statuses.contains(&429) && statuses.iter().all(|s| *s == 200 || *s == 429), "{statuses:?}");
    for (_, head, v) in answers.iter().filter(|a| a.0 == 429) {
        assert!(head.contains("retry-after: 1") && v["error"]["message"].as_str().unwrap_or("").contains("serve.max_queue"), "{head} {v}");
    }
}

/// The official `openai` Python client (installed by `.ci/setup`) against the server: what a
/// user's code sees. The chat template is a file (the embedded model ships none).
#[test]
fn the_openai_python_client_gets_completions_chat_logprobs_and_typed_errors() {
    let dir = scratch("serve-openai");
    std::fs::write(dir.join("t.jinja"), "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
    let server = Server::start(&dir, &["task.chat_template=t.jinja"]);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/openai_client.py");
    let out = Command::new("python3").arg(&script).arg(&server.address).output().expect("run python3");
    assert!(out.status.success(), "the client failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("the script's JSON");
    assert_eq!(v["models"], json!(["lockstep-tiny"]), "{v}");
    assert_eq!(v["completion"]["logprobs"].as_array().map(Vec::len), Some(8), "{v}");
    assert_eq!(v["completion"]["usage"], json!(8), "{v}");
    assert_eq!(v["same_again"], json!(true), "{v}");
    assert_eq!(v["chat"]["role"], json!("assistant"), "{v}");
    assert!(v["chat"]["logprobs"].as_array().is_some_and(|l| !l.is_empty() && l.len() <= 6), "{v}");
    assert_eq!(v["stream"], json!({"same": true, "usage": 8, "finish": "length"}), "{v}");
    assert_eq!(v["chat_stream_same"], json!(true), "{v}");
    assert_eq!(v["batch"], json!({"indices": [0, 1], "first_same": true}), "{v}");
    assert_eq!(v["parts_same"], json!(true), "{v}");
    assert_eq!(v["ignore_eos_tokens"], json!(8), "{v}");
    assert_eq!(v["unsupported"], json!("presence_penalty"), "{v}");
    assert_eq!(v["error"], json!({"status": 400, "param": "temperature"}), "{v}");
}

/// A streamed answer is the whole answer in pieces: per choice the same text, token ids,
/// logprobs (as written, so as bits) and finish reason, alone or among neighbours, with stop
/// strings (the text ends where one begins, in both), for both endpoints; the usage chunk counts
/// the tokens.
#[test]
fn a_streamed_answer_is_the_whole_answer_in_pieces_under_any_load() {
    let dir = scratch("serve-stream");
    std::fs::write(dir.join("t.jinja"), "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
    let server = Server::start(&dir, &["task.chat_template=t.jinja"]);
    let greedy = server.complete(json!({"prompt": "sort 312:", "max_tokens": 16, "temperature": 0}));
    let text = greedy["choices"][0]["text"].as_str().expect("text").to_string();
    // a stop string from the middle of the greedy text: the answer ends where it first begins
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 8, "{text:?}");
    let stop: String = chars[4..6].iter().collect();
    let cut = &text[..text.find(&stop).expect("the stop string is in the text")];
    for (name, path, request) in [
        ("greedy", "/v1/completions", json!({"prompt": "sort 312:", "max_tokens": 16, "temperature": 0, "logprobs": 1})),
        ("T 1, seed 5, n 3", "/v1/completions", json!({"prompt": "sort 312:", "max_tokens": 16, "temperature": 1.0, "seed": 5, "n": 3, "logprobs": 1})),
        ("stop string", "/v1/completions", json!({"prompt": "sort 312:", "max_tokens": 16, "temperature": 0, "logprobs": 1, "stop": [stop.clone()]})),
        ("chat", "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "sort 312:"}], "max_tokens": 12, "temperature": 0.8, "seed": 2, "logprobs": true})),
    ] {
        let chat = path.contains("chat");
        let (status, whole) = server.call("POST", path, &request.to_string());
        assert_eq!(status, 200, "{name}: {whole}");
        let expected = whole_choices(&whole, chat);
        let mut streamed = request.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        let chunks = server.stream(path, &streamed);
        let (choices, usage) = assemble(&chunks, chat);
        assert_eq!(choices, expected, "{name}: streamed differs from whole");
        assert_eq!(usage, whole["usage"]["completion_tokens"].as_u64(), "{name}");
        assert!(chunks.len() > 2 + expected.len(), "{name}: {} chunks: not streamed token by token", chunks.len());
        if chat {
            assert_eq!(chunks[0]["choices"][0]["delta"]["role"], json!("assistant"), "{name}: {}", chunks[0]);
            assert_eq!(chunks[0]["object"], json!("chat.completion.chunk"));
        }
        if name == "stop string" {
            assert_eq!((expected[0].0.as_str(), expected[0].3.as_str()), (cut, "stop"), "{name}");
        }
        // among neighbours, four streamed copies at once: the same pieces joined
        let server = &server;
        let copies: Vec<_> = std::thread::scope(|scope| {
            let neighbours: Vec<_> = (0..6).map(|i| scope.spawn(move || server.complete(json!({"prompt": "x".repeat(i + 1), "max_tokens": 3 + 2 * i, "temperature": 1.0})))).collect();
            let copies: Vec<_> = (0..4).map(|_| scope.spawn(|| assemble(&server.stream(path, &streamed), chat).0)).collect();
            neighbours.into_iter().for_each(|h| drop(h.join().expect("a neighbour")));
            copies.into_iter().map(|h| h.join().expect("a copy")).collect()
        });
        assert!(copies.iter().all(|c| *c == expected), "{name}: a streamed copy under load differs");
    }
}

/// A client that goes away mid-stream or mid-wait is cancelled (its slots and cache blocks
/// freed, the rest of its choices never run), and `/metrics` counts requests, tokens and
/// cancellations in Prometheus' text format.
#[test]
fn a_client_that_goes_away_is_cancelled_and_metrics_count_it() {
    let dir = scratch("serve-cancel");
    let server = Server::start(&dir, &["sampler.max_batch=4"]);
    let m = server.metrics();
    for name in ["lockstep:num_requests_running", "lockstep:num_requests_waiting", "lockstep:kv_cache_usage_perc", "lockstep:generation_tokens_total", "lockstep:num_preemptions_total", "lockstep:request_cancelled_total"] {
        assert_eq!(m.get(name), Some(&0.0), "{name}: {m:?}");
    }
    assert!(m["lockstep:kv_cache_blocks_total"] > 0.0, "{m:?}");
    server.complete(json!({"prompt": "sort 312:", "max_tokens": 5}));
    let m = server.metrics();
    assert_eq!((m["lockstep:generation_tokens_total"], m["lockstep:request_success_total"]), (5.0, 1.0), "{m:?}");
    // the latency histograms: one observation each, in a bucket no larger than the whole request
    for h in ["time_to_first_token_seconds", "e2e_request_latency_seconds"] {
        let count = m[&format!("lockstep:{h}_count")];
        assert_eq!((count, m[&format!("lockstep:{h}_bucket{{le=\"+Inf\"}}")]), (1.0, 1.0), "{h}: {m:?}");
        let buckets: Vec<f64> = m.iter().filter(|(k, _)| k.starts_with(&format!("lockstep:{h}_bucket"))).map(|(_, v)| *v).collect();
        assert!(buckets.len() == 23 && buckets.iter().all(|b| *b <= 1.0), "{h}: {buckets:?}");
        assert!(m[&format!("lockstep:{h}_sum")] > 0.0, "{h}: {m:?}");
    }
    assert!(m["lockstep:time_to_first_token_seconds_sum"] <= m["lockstep:e2e_request_latency_seconds_sum"], "{m:?}");
    // the engine thread's time: launching and waiting for the steps (each step launches work), all
    // of it within the request's own time
    let engine: Vec<f64> = ["launch", "wait", "schedule", "between_steps"].iter().map(|p| m[&format!("lockstep:engine_{p}_seconds_total")]).collect();
    assert!(engine[0] > 0.0 && engine[1] > 0.0 && engine.iter().all(|s| *s >= 0.0), "{m:?}");
    assert!(engine.iter().sum::<f64>() <= m["lockstep:e2e_request_latency_seconds_sum"] * 1.01 + 1e-3, "{m:?}");
    // 64 choices of 36 tokens, four at a time: far more work than the moment before each client leaves
    let body = |stream: bool| json!({"prompt": "sort 312:", "max_tokens": 36, "n": 64, "temperature": 1.0, "stream": stream}).to_string();
    for (stream, cancelled_before) in [(true, 0.0), (false, m["lockstep:request_cancelled_total"])] {
        let mut socket = std::net::TcpStream::connect(&server.address).expect("connect");
        let b = body(stream);
        write!(socket, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}", b.len()).expect("send");
        if stream {
            let mut first = [0u8; 64];
            let n = socket.read(&mut first).expect("the stream's first bytes");
            assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&first[..n]));
        } else {
            std::thread::sleep(std::time::Duration::from_millis(30));
        }
        drop(socket);
        let started = std::time::Instant::now();
        let m = loop {
            let m = server.metrics();
            if m["lockstep:request_cancelled_total"] > cancelled_before && m["lockstep:num_requests_running"] == 0.0 && m["lockstep:num_requests_waiting"] == 0.0 {
                break m;
            }
            assert!(started.elapsed().as_secs() < 30, "stream {stream}: the choices of a client that went away were not cancelled: {m:?}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(m["lockstep:kv_cache_blocks_used"], 0.0, "stream {stream}: {m:?}");
        assert_eq!(m["lockstep:num_choices_in_flight"], 0.0, "stream {stream}: {m:?}");
        assert!(m["lockstep:request_success_total"] < 1.0 + 64.0, "stream {stream}: every choice ran: {m:?}");
    }
    // and the server goes on serving
    assert_eq!(server.complete(json!({"prompt": "1+1=", "max_tokens": 2}))["choices"][0]["token_ids"].as_array().map(Vec::len), Some(2));
}

/// OpenAI's `tools` reach the chat template as its `tools` variable; an assistant message that
/// only calls tools may leave out its content; `tools` that are not a list are refused by name.
/// (Parsing Hermes `<tool_call>` blocks into `tool_calls` is unit-tested in `serve::tool_calls`.)
#[test]
fn tools_reach_the_chat_template_and_bad_tools_are_refused() {
    let dir = scratch("serve-tools");
    std::fs::write(dir.join("t.jinja"), "{# writes <tool_call> blocks #}{% if tools %}T{{ tools | length }}:{% endif %}{% for m in messages %}{{ m.content or 'c' }}{% endfor %}").unwrap();
    let server = Server::start(&dir, &["task.chat_template=t.jinja"]);
    let ask = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "sort 312:"}], "max_tokens": 4, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        server.call("POST", "/v1/chat/completions", &body.to_string())
    };
    let (status, plain) = ask(json!({}));
    assert_eq!(status, 200, "{plain}");
    let tool = json!({"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}});
    let (status, with_tools) = ask(json!({"tools": [tool.clone(), tool]}));
    assert_eq!(status, 200, "{with_tools}");
    let ids = |v: &Value| v["prompt_token_ids"].as_array().unwrap().len();
    assert_eq!(ids(&with_tools), ids(&plain) + 3, "the template saw two tools (\"T2:\"): {with_tools}");
    let (status, called) = ask(json!({"messages": [{"role": "user", "content": "sort 312:"}, {"role": "assistant", "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "calc", "arguments": "{}"}}]}, {"role": "tool", "content": "1"}]}));
    assert_eq!(status, 200, "an assistant message without content: {called}");
    let (status, bad) = ask(json!({"tools": 5}));
    assert_eq!(status, 400, "{bad}");
    assert!(bad["error"]["message"].as_str().unwrap().contains("`tools`"), "{bad}");
}

/// Waits (at most 30 s) until no request runs or waits and no cache block is held.
fn wait_idle(server: &Server, what: &str) -> std::collections::BTreeMap<String, f64> {
    let started = std::time::Instant::now();
    loop {
        let m = server.metrics();
        if m["lockstep:num_requests_running"] == 0.0 && m["lockstep:num_requests_waiting"] == 0.0 && m["lockstep:num_choices_in_flight"] == 0.0 && m["lockstep:kv_cache_blocks_used"] == 0.0 {
            return m;
        }
        assert!(started.elapsed().as_secs() < 30, "{what}: still busy 30 s later: {m:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `serve.request_timeout_s`: a request past it is answered 504 (a stream: an error event, then
/// `[DONE]`) and its choices are cancelled; a short request still passes. `serve.shutdown_grace_s`:
/// SIGTERM with a request that outlives the grace cancels it and exits 0.
#[test]
fn a_request_past_its_deadline_is_cancelled_and_sigterm_cancels_what_outlives_the_grace() {
    let dir = scratch("serve-deadline");
    // one sequence at a time: 64 choices of 36 tokens take far longer than the deadline
    let server = Server::start(&dir, &["sampler.max_batch=1", "serve.request_timeout_s=0.3"]);
    let long = |stream: bool| json!({"prompt": "sort 312:", "max_tokens": 36, "n": 64, "temperature": 1.0, "stream": stream});
    // a short request passes once the first steps' kernels are compiled (a cold first step may
    // itself take longer than the deadline), and the long ones below then run steps
    let started = std::time::Instant::now();
    loop {
        let (status, v) = server.call("POST", "/v1/completions", &json!({"prompt": "1+1=", "max_tokens": 2}).to_string());
        if status == 200 {
            assert_eq!(v["choices"][0]["token_ids"].as_array().map(Vec::len), Some(2), "{v}");
            break;
        }
        assert!(status == 504 && started.elapsed().as_secs() < 60, "{status}: {v}");
    }
    let mut cancelled = 0.0;
    for stream in [false, true] {
        if stream {
            let events = server.stream("/v1/completions", &long(true));
            assert_eq!(events.last(), Some(&Value::String("[DONE]".into())), "{events:?}");
            let error = &events[events.len() - 2];
            assert!(error["error"]["message"].as_str().unwrap_or("").contains("serve.request_timeout_s"), "{events:?}");
        } else {
            let (status, v) = server.call("POST", "/v1/completions", &long(false).to_string());
            assert_eq!(status, 504, "{v}");
            assert!(v["error"]["message"].as_str().unwrap_or("").contains("serve.request_timeout_s"), "{v}");
        }
        let started = std::time::Instant::now();
        while server.metrics()["lockstep:request_cancelled_total"] <= cancelled {
            assert!(started.elapsed().as_secs() < 30, "stream {stream}: the choices of a request past its deadline were not cancelled");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let m = wait_idle(&server, "a request past its deadline");
        assert!(m["lockstep:request_success_total"] < 1.0 + 64.0, "stream {stream}: every choice ran: {m:?}");
        cancelled = m["lockstep:request_cancelled_total"];
    }

    let dir = scratch("serve-grace");
    let mut server = Server::start(&dir, &["sampler.max_batch=1", "serve.shutdown_grace_s=0.5"]);
    let mut socket = std::net::TcpStream::connect(&server.address).expect("connect");
    socket.set_read_timeout(Some(std::time::Duration::from_secs(60))).expect("a read timeout");
    let b = long(true).to_string();
    write!(socket, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}", b.len()).expect("send");
    let mut first = [0u8; 64];
    let n = socket.read(&mut first).expect("the stream's first bytes");
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&first[..n]));
    let status = server.terminate();
    assert!(status.success(), "{status}");
    // the stream was cut, not finished: no [DONE] reached the client
    let mut rest = Vec::new();
    let _ = socket.read_to_end(&mut rest);
    assert!(!String::from_utf8_lossy(&rest).contains("[DONE]"), "the request finished inside the grace period: make it longer");
}

/// `top_logprobs` (completions' `logprobs: k`, chat's `top_logprobs: k`): k alternatives a
/// token, best first, the sampled token's entry its logprob's bits, the first the greedy token;
/// the same bits among neighbours and streamed; bad counts refused by name.
#[test]
fn top_logprobs_list_the_most_likely_tokens_with_the_same_bits_under_load_and_streamed() {
    let dir = scratch("serve-top");
    std::fs::write(dir.join("t.jinja"), "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
    let server = Server::start(&dir, &["task.chat_template=t.jinja"]);
    for request in [json!({"prompt": "sort 312:", "max_tokens": 10, "temperature": 0, "logprobs": 5}), json!({"prompt": "sort 312:", "max_tokens": 10, "temperature": 1.0, "seed": 3, "logprobs": 5})] {
        let alone = server.complete(request.clone())["choices"][0].clone();
        let (ids, lp) = (alone["token_ids"].as_array().expect("token_ids").clone(), &alone["logprobs"]);
        let top = lp["top_token_ids"].as_array().expect("top_token_ids");
        assert_eq!((ids.len(), top.len()), (10, 10), "{alone}");
        let mut listed = 0;
        for (i, list) in top.iter().enumerate() {
            let list = list.as_array().expect("a list");
            let values: Vec<f64> = list.iter().map(|e| e[1].as_f64().expect("a logprob")).collect();
            assert!(list.len() == 5 && values.windows(2).all(|w| w[0] >= w[1]), "position {i}: {list:?}");
            if let Some(e) = list.iter().find(|e| e[0] == ids[i]) {
                // serde_json writes the shortest text that round-trips: equal text, equal bits
                assert_eq!(e[1], lp["token_logprobs"][i], "position {i}");
                listed += 1;
            }
            if request["temperature"] == 0 {
                assert_eq!(list[0][0], ids[i], "position {i}: the greedy token is not first");
            }
            assert!(lp["top_logprobs"][i].as_object().is_some_and(|m| (1..=5).contains(&m.len())), "{}", lp["top_logprobs"][i]);
        }
        assert!(listed > 0, "no sampled token among its top 5: {alone}");
        for copy in under_load_choices(&server, &request, 4, 2) {
            assert_eq!(copy["logprobs"], alone["logprobs"], "under load");
        }
        let mut streamed = request.clone();
        streamed["stream"] = json!(true);
        let chunks = server.stream("/v1/completions", &streamed);
        let joined: Vec<Value> = chunks.iter().filter_map(|c| c["choices"][0]["logprobs"]["top_token_ids"].as_array()).flatten().cloned().collect();
        assert_eq!(&joined, top, "streamed");
    }
    // chat: logprobs true with top_logprobs 3, each entry with its id
    let chat = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "sort 312:"}], "max_tokens": 6, "temperature": 0, "logprobs": true});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        server.call("POST", "/v1/chat/completions", &body.to_string())
    };
    let (status, v) = chat(json!({"top_logprobs": 3}));
    assert_eq!(status, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().expect("content");
    assert_eq!(content.len(), 6);
    for (i, entry) in content.iter().enumerate() {
        let top = entry["top_logprobs"].as_array().expect("top_logprobs");
        assert_eq!(top.len(), 3, "{entry}");
        assert_eq!((top[0]["token_id"].clone(), top[0]["logprob"].clone()), (entry["token_id"].clone(), entry["logprob"].clone()), "position {i}: greedy");
    }
    for (extra, status, needle) in [(json!({"top_logprobs": 21}), 400, "at most 20"), (json!({"top_logprobs": 2, "logprobs": false}), 400, "needs `logprobs: true`")] {
        let (got, v) = chat(extra.clone());
        assert!(got == status && v["error"]["message"].as_str().unwrap_or("").contains(needle) && v["error"]["param"] == "top_logprobs", "{extra}: {got} {v}");
    }
    let (got, v) = server.call("POST", "/v1/completions", &json!({"prompt": "1+1=", "logprobs": 30}).to_string());
    assert!(got == 400 && v["error"]["param"] == "logprobs", "{got} {v}");
    // a server of processed logprobs cannot list alternatives of the full softmax beside them
    let dir = scratch("serve-top-processed");
    let processed = Server::start(&dir, &["sampler.logprobs_mode=processed_logprobs"]);
    let (got, v) = processed.call("POST", "/v1/completions", &json!({"prompt": "1+1=", "logprobs": 2}).to_string());
    assert!(got == 400 && v["error"]["message"].as_str().unwrap_or("").contains("processed"), "{got} {v}");
}

/// OpenAI's batch of prompts (a list of strings, or of token id lists): choice `i * n + j` is
/// prompt `i`'s `j`th, each the same bits as the prompt sent alone; usage counts each prompt once.
#[test]
fn a_batch_of_prompts_answers_each_as_it_would_alone() {
    let dir = scratch("serve-batch");
    let server = Server::start(&dir, &[]);
    let ask = |prompt: Value| json!({"prompt": prompt, "max_tokens": 6, "temperature": 0.9, "seed": 11, "n": 2, "logprobs": 0});
    let alone: Vec<_> = ["12+3=", "7*8="].iter().map(|p| whole_choices(&server.complete(ask(json!(p))), false)).collect();
    let batch = server.complete(ask(json!(["12+3=", "7*8=", "12+3="])));
    let choices = whole_choices(&batch, false);
    assert_eq!(choices.len(), 6, "{batch}");
    for (i, want) in [&alone[0], &alone[1], &alone[0]].into_iter().enumerate() {
        for j in 0..2 {
            assert_eq!(choices[i * 2 + j].1, want[j].1, "prompt {i} choice {j}: {batch}");
            let bits = |l: &[f64]| l.iter().map(|x| (*x as f32).to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&choices[i * 2 + j].2), bits(&want[j].2), "prompt {i} choice {j}");
            assert_eq!(batch["choices"][i * 2 + j]["index"], json!(i * 2 + j));
        }
    }
    let ids = &batch["prompt_token_ids"];
    assert_eq!(ids.as_array().map(Vec::len), Some(3), "{batch}");
    let prompt_tokens: usize = ids.as_array().unwrap().iter().map(|p| p.as_array().unwrap().len()).sum();
    assert_eq!(batch["usage"]["prompt_tokens"], json!(prompt_tokens));
    // token id lists batch the same way, and a streamed batch is the whole one in pieces
    let by_ids = server.complete(ask(ids.clone()));
    assert_eq!(whole_choices(&by_ids, false), choices);
    let mut streamed = ask(ids.clone());
    streamed["stream"] = json!(true);
    assert_eq!(assemble(&server.stream("/v1/completions", &streamed), false).0, choices);
    for (prompt, needle) in [(json!([]), "empty"), (json!(["12+3=", 5]), "a batch's prompt"), (json!([1, 99.5]), "not a token id"), (json!(["12+3=", ""]), "prompt 1: the prompt is empty"), (json!(["1", {"a": 1}]), "a batch's prompt")] {
        let (status, v) = server.call("POST", "/v1/completions", &json!({"prompt": prompt}).to_string());
        assert!(status == 400 && v["error"]["param"] == "prompt" && v["error"]["message"].as_str().unwrap_or("").contains(needle), "{prompt}: {status} {v}");
    }
}

/// vLLM's `/tokenize` and `/detokenize`: the ids a request would run (a completion's
/// `prompt_token_ids`, a chat's rendered template) and their text; bad input names the field.
#[test]
fn tokenize_gives_the_ids_a_request_runs_and_detokenize_their_text() {
    let dir = scratch("serve-tokenize");
    std::fs::write(dir.join("t.jinja"), "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}").unwrap();
    let server = Server::start(&dir, &["task.chat_template=t.jinja"]);
    let run = server.complete(json!({"prompt": "sort 312:", "max_tokens": 2}));
    let (status, v) = server.call("POST", "/tokenize", &json!({"prompt": "sort 312:"}).to_string());
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["tokens"], run["prompt_token_ids"], "{v} {run}");
    assert_eq!(v["count"], json!(v["tokens"].as_array().unwrap().len()));
    assert!(v["max_model_len"].as_u64().is_some_and(|c| c > 0), "{v}");
    let chat = json!({"messages": [{"role": "user", "content": "sort 312:"}], "max_tokens": 2});
    let (_, answered) = server.call("POST", "/v1/chat/completions", &chat.to_string());
    let (status, v) = server.call("POST", "/tokenize", &chat.to_string());
    assert_eq!((status, &v["tokens"]), (200, &answered["prompt_token_ids"]), "{v} {answered}");
    // a chat that sets no budget may run to the end of the context (vLLM's and OpenAI's rule)
    let (status, open) = server.call("POST", "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "sort 312:"}], "temperature": 0, "ignore_eos": true}).to_string());
    assert_eq!(status, 200, "{open}");
    assert_eq!(open["usage"]["total_tokens"], v["max_model_len"], "{open}");
    let (status, text) = server.call("POST", "/detokenize", &json!({"tokens": v["tokens"]}).to_string());
    assert_eq!((status, text["prompt"].as_str()), (200, Some("<user>sort 312:<assistant>")), "{text}");
    for (path, body, param) in [("/tokenize", json!({}), "prompt"), ("/tokenize", json!({"prompt": [1, 2]}), "prompt"), ("/tokenize", json!({"prompt": "a", "messages": []}), "prompt"),
        ("/tokenize", json!({"messages": "hi"}), "messages"), ("/detokenize", json!({"tokens": [1, 99999]}), "tokens"), ("/detokenize", json!({}), "tokens"), ("/detokenize", json!({"tokens": [1], "model": "other"}), "model")] {
        let (status, v) = server.call("POST", path, &body.to_string());
        assert!((status == 400 || status == 404) && v["error"]["param"] == param, "{path} {body}: {status} {v}");
    }
}

/// A supervisor may stop the server the moment it announces its address: SIGTERM is handled
/// from before the announcement (a graceful exit 0, not the default kill), and the process
/// exits only after the engine's thread has (exiting under a step crashed the CPU runtime).
#[test]
fn sigterm_right_at_the_announcement_is_a_graceful_stop() {
    let dir = scratch("serve-early-term");
    for _ in 0..4 {
        let mut server = Server::start(&dir, &[]);
        let status = server.terminate();
        assert!(status.success(), "{status}");
    }
}
