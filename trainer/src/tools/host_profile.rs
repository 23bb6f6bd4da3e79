//! `LOCKSTEP_HOST_PROFILE=FILE lockstep bench ...` (built with the `host-profile` feature): samples
//! every host thread at ~5 kHz while the command runs and writes, per thread, the functions most
//! often on its stack (inclusive) and on top of it (self). It answers where the host time of a
//! kernel launch goes (the benchmarks measure 20-30 µs per call against a few µs on the GPU).

/// Runs `run`, profiled when `LOCKSTEP_HOST_PROFILE` names a file (and the feature is on).
#[cfg(feature = "host-profile")]
pub fn profiled<T>(run: impl FnOnce() -> T) -> T {
    let Some(path) = shared_kernels::knobs::var("LOCKSTEP_HOST_PROFILE") else { return run() };
    let guard = match pprof::ProfilerGuardBuilder::default().frequency(4999).blocklist(&["libc", "libgcc", "pthread", "vdso"]).build() {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("host profile: not started ({e}); running unprofiled");
            return run();
        }
    };
    let out = run();
    match guard.report().build() {
        Ok(report) => {
            let text = summary(report.data.iter().map(|(frames, &count)| {
                let stack: Vec<String> = frames.frames.iter().flat_map(|inlined| inlined.iter().map(|s| s.name())).collect();
                (frames.thread_name.clone(), stack, count.max(0) as u64)
            }));
            if let Err(e) = std::fs::write(&path, text) {
                eprintln!("host profile: {path}: {e}");
            }
        }
        Err(e) => eprintln!("host profile: no report ({e})"),
    }
    out
}

#[cfg(not(feature = "host-profile"))]
pub fn profiled<T>(run: impl FnOnce() -> T) -> T {
    run()
}

/// Per thread (most samples first): the top functions by inclusive and by self samples, as
/// markdown tables. `samples`: (thread, stack innermost first, count).
#[cfg_attr(not(feature = "host-profile"), allow(dead_code))]
fn summary(samples: impl Iterator<Item = (String, Vec<String>, u64)>) -> String {
    use std::collections::{BTreeMap, HashMap, HashSet};
    let mut threads: BTreeMap<String, (u64, HashMap<String, u64>, HashMap<String, u64>)> = BTreeMap::new();
    for (thread, stack, count) in samples {
        let (total, inclusive, own) = threads.entry(thread).or_default();
        *total += count;
        let mut seen = HashSet::new();
        for name in &stack {
            if seen.insert(name) {
                *inclusive.entry(name.clone()).or_default() += count;
            }
        }
        if let Some(top) = stack.first() {
            *own.entry(top.clone()).or_default() += count;
        }
    }
    let mut order: Vec<_> = threads.into_iter().collect();
    order.sort_by(|a, b| b.1 .0.cmp(&a.1 .0));
    let mut text = String::new();
    for (thread, (total, inclusive, own)) in order {
        text += &format!("\n## thread {thread}: {total} samples\n");
        for (title, map, rows) in [("inclusive", &inclusive, 45), ("self", &own, 30)] {
            let mut rows_sorted: Vec<_> = map.iter().collect();
            rows_sorted.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            text += &format!("\n| {title} % | function |\n|---|---|\n");
            for (name, count) in rows_sorted.into_iter().take(rows) {
                let short: String = name.chars().take(160).collect();
                text += &format!("| {:.1} | `{short}` |\n", 100.0 * *count as f64 / total.max(1) as f64);
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_counts_a_function_once_per_stack_and_its_own_time_at_the_top() {
        let text = summary(
            [
                ("main".to_string(), vec!["leaf".to_string(), "recursive".to_string(), "recursive".to_string()], 3),
                ("main".to_string(), vec!["recursive".to_string()], 1),
                ("device".to_string(), vec!["launch".to_string()], 1),
            ]
            .into_iter(),
        );
        assert!(text.starts_with("\n## thread main: 4 samples"), "{text}");
        assert!(text.contains("| 100.0 | `recursive` |"), "{text}");
        assert!(text.contains("| 75.0 | `leaf` |"), "{text}");
        assert!(text.contains("| 25.0 | `recursive` |\n"), "{text}");
        assert!(text.contains("## thread device: 1 samples"), "{text}");
    }
}
