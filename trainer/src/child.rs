//! Child programs lockstep starts (reward programs; environment programs next), run one way:
//! each in a process group of its own, its input written and its output read under the same
//! deadline as the program itself, and the whole group ended when the program exits (helpers it
//! left in the background), times out (SIGTERM, then SIGKILL a second later for a program that
//! ignores it), or when lockstep returns, unwinds or exits while it runs.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The longest timeout a child program may be given: a week. A larger figure (a user's "no
/// timeout", 1e30) is refused by name when the config is read.
pub const MAX_TIMEOUT_S: f64 = 7.0 * 24.0 * 3600.0;

/// How long a program that was sent SIGTERM has before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(1);

/// What a finished program left: its exit status and everything it wrote.
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

#[derive(Debug)]
pub enum Failure {
    /// The program could not be started (`sh` missing, too many processes).
    Start(std::io::Error),
    /// It ran past its deadline (or its output stayed open past it) and its group was ended;
    /// what it had written to stderr by then.
    TimedOut { stderr: Vec<u8> },
}

/// The process groups of the child programs running now, for [`end_all`] (a slot is 0 when free;
/// enough for `environment.concurrency` episodes' programs at once).
static LIVE: [AtomicI32; 1024] = [const { AtomicI32::new(0) }; 1024];

/// Ends every child program's group now (SIGKILL): for lockstep's own abrupt exits. Only
/// async-signal-safe calls, so a signal handler may call it.
pub fn end_all() {
    for slot in &LIVE {
        let group = slot.load(Ordering::SeqCst);
        if group > 0 {
            // SAFETY: kill(2) takes no pointers; a group that is gone gives ESRCH, ignored.
            unsafe { libc::kill(-group, libc::SIGKILL) };
        }
    }
}

/// A running program's group: registered in [`LIVE`] while it lives, killed when dropped.
struct Group(i32);

impl Group {
    fn register(group: i32) -> Self {
        // the first free slot takes it (past 1024 programs at once the rest go unregistered, and
        // are still ended by their own drop)
        let _ = LIVE.iter().any(|s| s.compare_exchange(0, group, Ordering::SeqCst, Ordering::SeqCst).is_ok());
        Group(group)
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) takes no pointers; a group that is gone gives ESRCH, ignored.
        unsafe { libc::kill(-self.0, signal) };
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
        for slot in &LIVE {
            let _ = slot.compare_exchange(self.0, 0, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
}

/// Runs `command` through `sh -c` with `input` on its stdin, and waits at most `timeout` for it
/// to exit and for its stdout and stderr to close.
pub fn run(command: &str, input: Vec<u8>, timeout: Duration) -> Result<Finished, Failure> {
    run_with_env(command, &[], input, timeout)
}

/// [`run`] with `env` added to the program's environment.
pub fn run_with_env(command: &str, env: &[(&str, String)], input: Vec<u8>, timeout: Duration) -> Result<Finished, Failure> {
    let deadline = Instant::now() + timeout;
    let mut child = Command::new("sh").args(["-c", command]).envs(env.iter().map(|(k, v)| (*k, v.as_str()))).process_group(0).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(Failure::Start)?;
    let group = Group::register(child.id() as i32);
    // stdin written and stdout/stderr drained on their own threads, so a program that answers
    // before reading everything (or fills a pipe) cannot deadlock with us; a thread still
    // blocked at the deadline (a process outside the group holds the pipe) is left behind
    let mut stdin = child.stdin.take().expect("piped stdin");
    std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let drain = |mut pipe: Box<dyn Read + Send>| {
        let (send, receive) = mpsc::channel();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            let _ = send.send(bytes);
        });
        receive
    };
    let stdout = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            // past the deadline, or it cannot be waited on: end it
            _ => break None,
        }
    };
    let Some(status) = status else {
        group.signal(libc::SIGTERM);
        let grace = Instant::now() + TERM_GRACE;
        while Instant::now() < grace && !matches!(child.try_wait(), Ok(Some(_))) {
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(group);
        let _ = child.wait();
        return Err(Failure::TimedOut { stderr: stderr.recv_timeout(TERM_GRACE).unwrap_or_default() });
    };
    // the program is done: helpers it left in its group (holding its stdout, say) end with it
    drop(group);
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(200));
    let out = stdout.recv_timeout(left);
    let err = stderr.recv_timeout(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(200)));
    match (out, err) {
        (Ok(stdout), Ok(stderr)) => Ok(Finished { status, stdout, stderr }),
        (_, err) => Err(Failure::TimedOut { stderr: err.unwrap_or_default() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(pid: i32) -> bool {
        // SAFETY: kill(2) with signal 0 only checks the process exists
        unsafe { libc::kill(pid, 0) == 0 }
    }

    fn pids(file: &std::path::Path) -> Vec<i32> {
        std::fs::read_to_string(file).unwrap_or_default().split_whitespace().filter_map(|p| p.parse().ok()).collect()
    }

    /// Waits up to 5 s for every pid in `file` to be gone (a killed process is reaped by init).
    fn all_gone(file: &std::path::Path) -> bool {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if pids(file).iter().all(|&p| !alive(p)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    #[test]
    fn a_helper_left_holding_stdout_neither_hangs_the_run_nor_outlives_it() {
        let dir = shared_kernels::testing::Scratch::new("child-helper");
        let pidfile = dir.join("pids");
        let started = Instant::now();
        let done = run(&format!("echo 1; sleep 600 & echo $! > {}; echo 2", pidfile.display()), Vec::new(), Duration::from_secs(20)).unwrap();
        assert!(started.elapsed() < Duration::from_secs(5), "the run waited for the helper: {:?}", started.elapsed());
        assert_eq!(String::from_utf8_lossy(&done.stdout), "1\n2\n");
        assert!(done.status.success());
        assert!(!pids(&pidfile).is_empty() && all_gone(&pidfile), "the helper outlived the program");
    }

    #[test]
    fn a_timeout_ends_the_program_and_its_workers_even_when_they_ignore_sigterm() {
        let dir = shared_kernels::testing::Scratch::new("child-timeout");
        let pidfile = dir.join("pids");
        let started = Instant::now();
        let script = format!("trap '' TERM; (trap '' TERM; sleep 600) & echo $! >> {p}; sleep 600 & echo $! >> {p}; echo working >&2; wait", p = pidfile.display());
        match run(&script, Vec::new(), Duration::from_millis(700)) {
            Err(Failure::TimedOut { stderr }) => assert!(String::from_utf8_lossy(&stderr).contains("working")),
            other => panic!("expected a timeout, got {:?}", other.map(|f| f.status)),
        }
        assert!(started.elapsed() < Duration::from_secs(6), "{:?}", started.elapsed());
        assert_eq!(pids(&pidfile).len(), 2);
        assert!(all_gone(&pidfile), "workers outlived the timeout");
    }
}
