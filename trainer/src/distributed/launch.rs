//! Starting and joining a data-parallel run: `lockstep train --gpus N` starts one process per
//! GPU of this host, each with torchrun's variables; a process started with them (by this
//! launcher, torchrun or a cluster's own launcher) joins its group through NCCL.

use super::{Communicator, Rendezvous};
use crate::error::{invalid, RunError};
use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a collective (and the rendezvous) may wait for the other ranks.
pub fn collective_timeout() -> Result<Duration, RunError> {
    match shared_kernels::knobs::var("LOCKSTEP_COLLECTIVE_TIMEOUT_S") {
        None => Ok(Duration::from_secs(600)),
        Some(text) => match text.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 => Ok(Duration::from_secs_f64(s)),
            _ => Err(invalid("LOCKSTEP_COLLECTIVE_TIMEOUT_S", format!("{text:?} is not a number of seconds > 0"))),
        },
    }
}

/// This process's end of its group when torchrun's variables say it has one (`RANK` set), else
/// `None`. Across processes the communicator is NCCL's, which needs the CUDA build.
pub fn join_from_env() -> Result<Option<Arc<dyn Communicator>>, RunError> {
    let timeout = collective_timeout()?;
    let Some(r) = Rendezvous::from_env(|k| std::env::var(k).ok(), timeout).map_err(|e| invalid("RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT", e))? else { return Ok(None) };
    join(&r)
}

#[cfg(feature = "cuda")]
fn join(r: &Rendezvous) -> Result<Option<Arc<dyn Communicator>>, RunError> {
    let comm = super::nccl::NcclComm::join(r).map_err(|e| RunError::Other(format!("data parallel: {e}")))?;
    Ok(Some(Arc::new(comm)))
}

#[cfg(not(feature = "cuda"))]
fn join(r: &Rendezvous) -> Result<Option<Arc<dyn Communicator>>, RunError> {
    Err(RunError::Other(format!(
        "RANK={} and WORLD_SIZE={} are set: data parallel across processes runs on NCCL, which needs the CUDA build (this one runs {}); unset RANK for a one-process run",
        r.rank,
        r.world,
        shared_kernels::device::runtime_name()
    )))
}

/// The command line without `--gpus N` / `--gpus=N` (what each rank runs).
pub fn without_gpus(args: &[OsString]) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
            continue;
        }
        match a.to_str() {
            Some("--gpus") => skip = true,
            Some(s) if s.starts_with("--gpus=") => {}
            _ => out.push(a.clone()),
        }
    }
    out
}

/// Runs `args` (this program's `train` command line without `--gpus`) as `gpus` ranks, each on
/// its own GPU (`CUDA_VISIBLE_DEVICES`), and waits for them. A rank that fails makes the others
/// fail at their next collective; any left after the collective timeout are stopped. Ok only
/// when every rank exits 0; otherwise an error listing each rank's exit.
pub fn launch_local(gpus: usize, args: &[OsString]) -> Result<(), RunError> {
    if gpus == 0 {
        return Err(invalid("--gpus", "must be at least 1".into()));
    }
    if std::env::var_os("RANK").is_some() {
        return Err(invalid("--gpus", "RANK is already set (a launcher such as torchrun started this process): leave --gpus out".into()));
    }
    let visible: Vec<String> = match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) if !v.trim().is_empty() => v.split(',').map(|s| s.trim().to_string()).collect(),
        _ => (0..gpus).map(|i| i.to_string()).collect(),
    };
    if visible.len() < gpus {
        return Err(invalid("--gpus", format!("is {gpus} but CUDA_VISIBLE_DEVICES lists {} devices", visible.len())));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| RunError::Other(format!("finding a free port for the rendezvous: {e}")))?.port();
    let exe = std::env::current_exe().map_err(|e| RunError::Other(format!("this program's path: {e}")))?;
    let mut children: Vec<(usize, Child)> = Vec::new();
    for rank in 0..gpus {
        let mut cmd = Command::new(&exe);
        cmd.args(args).env("RANK", rank.to_string()).env("WORLD_SIZE", gpus.to_string()).env("LOCAL_RANK", rank.to_string());
        cmd.env("MASTER_ADDR", "127.0.0.1").env("MASTER_PORT", port.to_string()).env("CUDA_VISIBLE_DEVICES", &visible[rank]);
        // NVLink multicast stays off (it can take a shared host's GPUs out of service)
        cmd.env("NCCL_NVLS_ENABLE", "0");
        // its own process group: a terminal's Ctrl-C reaches the launcher alone, which passes
        // one SIGTERM to every rank (each then finishes its step and the ranks checkpoint together)
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        match cmd.spawn() {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                for (_, c) in &mut children {
                    let _ = c.kill();
                }
                return Err(RunError::Other(format!("starting rank {rank}: {e}")));
            }
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).map_err(|e| RunError::Other(format!("installing the signal handler: {e}")))?;
    }
    let mut forwarded = false;
    let grace = collective_timeout()? + Duration::from_secs(30);
    let mut status: Vec<Option<String>> = vec![None; gpus];
    let mut first_failure: Option<Instant> = None;
    while status.iter().any(Option::is_none) {
        for (rank, c) in children.iter_mut() {
            if status[*rank].is_some() {
                continue;
            }
            if let Ok(Some(s)) = c.try_wait() {
                if !s.success() {
                    first_failure.get_or_insert_with(Instant::now);
                }
                status[*rank] = Some(s.to_string());
            }
        }
        if stop.load(Ordering::SeqCst) && !forwarded {
            forwarded = true;
            eprintln!("stopping: every rank finishes its step and the run is checkpointed");
            for (rank, c) in children.iter() {
                if status[*rank].is_none() {
                    // SAFETY: kill(2) on a child this process started and has not reaped
                    unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
                }
            }
        }
        if first_failure.is_some_and(|t| t.elapsed() > grace) {
            for (rank, c) in children.iter_mut() {
                if status[*rank].is_none() {
                    let _ = c.kill();
                    let _ = c.wait();
                    status[*rank] = Some("stopped by the launcher after another rank failed".into());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let report: Vec<String> = status.iter().enumerate().map(|(r, s)| format!("rank {r}: {}", s.as_deref().unwrap_or("?"))).collect();
    if report.iter().all(|r| r.ends_with("exit status: 0")) {
        Ok(())
    } else {
        Err(RunError::Other(format!("data-parallel run failed: {}", report.join("; "))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ranks_command_line_drops_gpus_in_both_spellings() {
        let a = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(without_gpus(&a(&["train", "c.toml", "--gpus", "2", "--set", "x=1"])), a(&["train", "c.toml", "--set", "x=1"]));
        assert_eq!(without_gpus(&a(&["train", "--gpus=4", "--resume"])), a(&["train", "--resume"]));
    }
}
