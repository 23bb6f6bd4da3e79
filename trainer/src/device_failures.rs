//! Failures that reach `lockstep` only indirectly: a warning from cubecl's device thread (a
//! kernel that failed to compile, a task that panicked there) and where the last panic was, for
//! the error the user sees instead of a raw panic.

/// Where the last panic happened (set by `main`'s panic hook).
pub static PANIC_AT: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Ends the process at the first failure cubecl reports only as a warning from its device
/// thread: a GPU kernel that fails to compile (cubecl carries on, and every later launch of that
/// kernel tries again, seconds each, thousands a step, so a run would look hung for hours), and
/// a task that panicked there (cubecl catches the panic and carries on without the launches it
/// held, so the results would be silently wrong).
pub struct StopOnDeviceThreadFailure;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for StopOnDeviceThreadFailure {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() != tracing::Level::WARN {
            return;
        }
        let mut message = String::new();
        event.record(&mut |field: &tracing::field::Field, value: &dyn std::fmt::Debug| {
            if field.name() == "message" {
                message = format!("{value:?}");
            }
        });
        if message.contains("A compilation error happened during launch") {
            let detail: Vec<&str> = message.lines().map(str::trim).filter(|l| !l.is_empty()).take(6).collect();
            eprintln!("error: a GPU kernel failed to compile on this device ({}); stopping instead of retrying it at every launch: {}", shared_kernels::device::runtime_name(), detail.join(" | "));
            exit_now(1);
        }
        if message.contains("task panicked on device runner thread") {
            let at = PANIC_AT.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_default();
            let launch = shared_kernels::error::last_op_any_thread().map_or_else(|| "no kernel launch yet".to_string(), |op| format!("the last kernel launch entered: `{op}`"));
            let detail = message.trim().trim_start_matches("CallError(").trim_end_matches(')');
            eprintln!("error: internal failure on cubecl's device thread ({detail}, at {at}); {launch}. Stopping: the launches queued with it did not run, so results would be wrong. Rerun with RUST_BACKTRACE=1 and report it with the command and config");
            exit_now(1);
        }
    }
}

/// Ends the process from cubecl's device thread without running exit handlers or thread-local
/// destructors: after a failure there, cubecl's destructors panic during cleanup and the
/// process aborts (exit 134) instead of exiting with the error printed. Every file lockstep
/// writes is written atomically (a temporary file renamed into place), so nothing half-written
/// is left behind; the two standard streams are flushed first.
fn exit_now(code: i32) -> ! {
    use std::io::Write;
    trainer::child::end_all();
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` takes no pointers and never returns.
    unsafe { libc::_exit(code) }
}

