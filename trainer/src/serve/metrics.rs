//! `GET /metrics`: Prometheus' text format, named as vLLM names its own (`vllm:` becomes
//! `lockstep:`), so a dashboard built for one reads the other.

use sampler::{EngineMetrics, LatencyHistogram, LATENCY_BUCKETS};
use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::Instant;

/// Generation speed between two scrapes (`lockstep:generation_tokens_per_second`).
#[derive(Default)]
pub struct Rate {
    last: Mutex<Option<(Instant, u64)>>,
}

impl Rate {
    fn per_second(&self, total: u64) -> f64 {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let rate = match *last {
            Some((then, before)) if now > then => total.saturating_sub(before) as f64 / (now - then).as_secs_f64(),
            _ => 0.0,
        };
        *last = Some((now, total));
        rate
    }
}

/// The exposition text: the engine's gauges and counters and the server's own.
pub fn text(m: &EngineMetrics, rate: &Rate, in_flight: usize, rejected: u64) -> String {
    let kv_total = m.kv_blocks.load(Relaxed);
    let kv_used = m.kv_blocks_used.load(Relaxed);
    let generated = m.generated_tokens.load(Relaxed);
    let usage = if kv_total > 0 { kv_used as f64 / kv_total as f64 } else { 0.0 };
    let seconds = |us: &std::sync::atomic::AtomicU64| us.load(Relaxed) as f64 / 1e6;
    let rows: [(&str, &str, &str, f64); 20] = [
        ("num_requests_running", "gauge", "Requests in the engine's batch.", m.running.load(Relaxed) as f64),
        ("num_requests_waiting", "gauge", "Requests queued for a slot or cache blocks.", m.waiting.load(Relaxed) as f64),
        ("num_choices_in_flight", "gauge", "Choices admitted by the server (serve.max_queue bounds them).", in_flight as f64),
        ("kv_cache_usage_perc", "gauge", "Fraction of the KV cache's blocks held (1 = full).", usage),
        ("kv_cache_blocks_used", "gauge", "KV cache blocks held by running requests.", kv_used as f64),
        ("kv_cache_blocks_total", "gauge", "KV cache blocks in the pool.", kv_total as f64),
        ("generation_tokens_per_second", "gauge", "Tokens sampled per second since the previous scrape.", rate.per_second(generated)),
        ("generation_tokens_total", "counter", "Tokens sampled.", generated as f64),
        ("prompt_tokens_total", "counter", "Prompt tokens submitted.", m.prompt_tokens.load(Relaxed) as f64),
        ("num_preemptions_total", "counter", "Requests preempted for cache blocks (each reruns to the same bits).", m.preemptions.load(Relaxed) as f64),
        ("engine_steps_total", "counter", "Batched engine steps.", m.steps.load(Relaxed) as f64),
        ("engine_replayed_steps_total", "counter", "Engine steps replayed as captured graphs (the rest launched op by op).", m.replayed_steps.load(Relaxed) as f64),
        ("engine_launch_seconds_total", "counter", "Engine thread: enqueueing the steps' launches.", seconds(&m.launch_us)),
        ("engine_wait_seconds_total", "counter", "Engine thread: waiting for the device's results.", seconds(&m.wait_us)),
        ("engine_schedule_seconds_total", "counter", "Engine thread: admitting, building rows, retiring (inside steps).", seconds(&m.schedule_us)),
        ("engine_between_steps_seconds_total", "counter", "Engine thread between busy steps: taking requests, cancelling, handing out tokens.", seconds(&m.between_steps_us)),
        ("request_success_total", "counter", "Choices finished.", m.finished.load(Relaxed) as f64),
        ("request_failure_total", "counter", "Choices the engine failed.", m.failed.load(Relaxed) as f64),
        ("request_cancelled_total", "counter", "Choices cancelled because their client went away.", m.cancelled.load(Relaxed) as f64),
        ("request_rejected_total", "counter", "Requests answered 429 (serve.max_queue).", rejected as f64),
    ];
    let mut out = String::new();
    for (name, kind, help, value) in rows {
        let _ = writeln!(out, "# HELP lockstep:{name} {help}\n# TYPE lockstep:{name} {kind}\nlockstep:{name} {value}");
    }
    histogram(&mut out, "time_to_first_token_seconds", "Seconds from the engine's receipt of a choice to its first token.", &m.time_to_first_token);
    histogram(&mut out, "e2e_request_latency_seconds", "Seconds from the engine's receipt of a choice to its end (finished choices).", &m.request_latency);
    out
}

/// One histogram in Prometheus' text: cumulative `_bucket{le}` counts, `+Inf`, `_sum`, `_count`.
fn histogram(out: &mut String, name: &str, help: &str, h: &LatencyHistogram) {
    let _ = writeln!(out, "# HELP lockstep:{name} {help}\n# TYPE lockstep:{name} histogram");
    let mut below = 0;
    for (le, bucket) in LATENCY_BUCKETS.iter().zip(&h.buckets) {
        below += bucket.load(Relaxed);
        let _ = writeln!(out, "lockstep:{name}_bucket{{le=\"{le}\"}} {below}");
    }
    let _ = writeln!(out, "lockstep:{name}_bucket{{le=\"+Inf\"}} {}", below + h.over.load(Relaxed));
    let _ = writeln!(out, "lockstep:{name}_sum {}\nlockstep:{name}_count {}", h.sum_us.load(Relaxed) as f64 / 1e6, h.count.load(Relaxed));
}
