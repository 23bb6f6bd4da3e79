//! One process at a time in a run folder. Two `lockstep train` processes with the same
//! `log.run_name` would both start fresh (neither sees the other's checkpoints yet), interleave
//! their steps in metrics.jsonl and overwrite each other's checkpoints, each exiting 0. The
//! first holds an advisory lock on `<run>/.lockstep.lock` for its lifetime (the OS releases it
//! when the process ends, also after a kill -9), and a second is refused naming the first's pid.

use crate::error::RunError;
use std::io::{Read, Seek, Write};
use std::path::Path;

/// Held while the process trains in the folder; dropping it releases the lock.
pub struct RunLock {
    _file: std::fs::File,
}

/// Makes `dir` (naming `log.runs_dir` if it cannot) and locks it for this process. A file
/// system without advisory locks (some network mounts) gets a warning, not a refusal.
pub fn lock(dir: &Path) -> Result<RunLock, RunError> {
    std::fs::create_dir_all(dir).map_err(|e| RunError::Other(format!("log.runs_dir: cannot make the run folder {}: {e}", dir.display())))?;
    let path = dir.join(".lockstep.lock");
    let mut file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(|e| RunError::Other(format!("{}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => {
            // the holder's pid, for the message a second process prints
            let _ = file.set_len(0).and_then(|_| file.rewind()).and_then(|_| write!(file, "{}", std::process::id())).and_then(|_| file.flush());
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            let who = if holder.is_empty() { String::new() } else { format!(" (pid {holder})") };
            return Err(RunError::Other(format!("{}: another lockstep process{who} is training in this run folder; wait for it to end, or choose another log.run_name", dir.display())));
        }
        Err(std::fs::TryLockError::Error(e)) => eprintln!("warning: {}: the run folder cannot be locked ({e}); make sure no other process trains in it", path.display()),
    }
    Ok(RunLock { _file: file })
}
