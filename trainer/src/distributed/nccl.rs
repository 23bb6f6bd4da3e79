//! The [`Communicator`] across processes, one per GPU, on NCCL (cudarc's bindings; libnccl is
//! loaded at run time). Ranks meet as torchrun's do: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `MASTER_ADDR`, `MASTER_PORT` ([`super::Rendezvous::from_env`]); rank 0 makes NCCL's unique id and
//! hands it to the others over one TCP connection each (the bootstrap only: every byte of the
//! run's data moves through NCCL).
//!
//! Collectives stage through host memory: [`Communicator::all_gather`] is two NCCL all-gathers
//! (the sizes, then the parts padded to the largest), and the gradient sum is the trait's: every
//! rank adds the gathered parts in rank order, so the bits are those of the in-process
//! communicator and do not depend on NCCL's algorithm, protocol or channels. Each collective
//! waits at most the group's timeout (`LOCKSTEP_COLLECTIVE_TIMEOUT_S`), then fails naming
//! itself: a rank that died or hung stops the others in bounded time, never a hang.

use super::{CommError, Communicator, Rendezvous};
use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::{Comm, Id};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A communicator handed from the thread that made it (NCCL communicators may be used from
/// any thread, one call at a time).
struct SendComm(Comm);
unsafe impl Send for SendComm {}

pub struct NcclComm {
    rank: usize,
    world: usize,
    timeout: Duration,
    // NCCL calls on one communicator are issued one at a time
    inner: Mutex<(Comm, Arc<CudaStream>)>,
}

// the communicator and its stream are only touched under the mutex
unsafe impl Send for NcclComm {}
unsafe impl Sync for NcclComm {}

impl NcclComm {
    /// Joins the group on this process's first visible GPU (the launcher gives each rank its
    /// own through `CUDA_VISIBLE_DEVICES`).
    pub fn join(r: &Rendezvous) -> Result<NcclComm, CommError> {
        let fail = |message: String| CommError { rank: r.rank, world: r.world, message };
        // cudarc panics on a missing library: ask first, and say where it looks
        if !unsafe { cudarc::nccl::sys::is_culib_present() } {
            return Err(fail("libnccl not found: lockstep loads `libnccl.so` from LD_LIBRARY_PATH and the system's library paths; put a directory holding `libnccl.so` (a link to `libnccl.so.2`, which CUDA's libnccl2 package and the nvidia-nccl wheel install) on LD_LIBRARY_PATH".into()));
        }
        let id = if r.rank == 0 { serve_id(r).map_err(fail)? } else { fetch_id(r).map_err(fail)? };
        let ctx = CudaContext::new(0).map_err(|e| fail(format!("CUDA device 0: {e:?}")))?;
        let stream = ctx.new_stream().map_err(|e| fail(format!("a CUDA stream: {e:?}")))?;
        // NCCL's init waits for every rank with no time limit (a rank that died after the
        // rendezvous would hang it): it runs on a thread this one waits for at most the timeout
        let (tx, rx) = std::sync::mpsc::channel();
        let (init_stream, rank, world) = (stream.clone(), r.rank, r.world);
        std::thread::spawn(move || {
            let _ = tx.send(Comm::from_rank(init_stream, rank, world, id).map(SendComm));
        });
        let comm = match rx.recv_timeout(r.timeout) {
            Ok(Ok(SendComm(c))) => c,
            Ok(Err(e)) => return Err(fail(format!("NCCL init: {e:?}"))),
            Err(_) => return Err(fail(format!("NCCL init did not complete within {:.0} s (LOCKSTEP_COLLECTIVE_TIMEOUT_S): a rank died or hung after the rendezvous", r.timeout.as_secs_f64()))),
        };
        Ok(NcclComm { rank: r.rank, world: r.world, timeout: r.timeout, inner: Mutex::new((comm, stream)) })
    }

    /// Waits for the stream's work so far, at most the timeout.
    fn wait(&self, stream: &CudaStream, what: &str, started: Instant) -> Result<(), CommError> {
        let event = stream.record_event(None).map_err(|e| self.error(format!("{what}: {e:?}")))?;
        loop {
            match event.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) if started.elapsed() < self.timeout => std::thread::sleep(Duration::from_micros(200)),
                Ok(false) => return Err(self.error(format!("{what}: not complete after {:.0} s (LOCKSTEP_COLLECTIVE_TIMEOUT_S); a rank died, hung or took another path", self.timeout.as_secs_f64()))),
                Err(e) => return Err(self.error(format!("{what}: {e:?}"))),
            }
        }
    }

    /// NCCL all-gather of `mine` (the same length on every rank): every rank's, in rank order.
    fn gather_equal(&self, what: &str, mine: &[u8]) -> Result<Vec<u8>, CommError> {
        let started = Instant::now();
        let guard = self.inner.lock().map_err(|_| self.error(format!("{what}: the communicator was poisoned by a panic")))?;
        let (comm, stream) = &*guard;
        let send = stream.clone_htod(mine).map_err(|e| self.error(format!("{what}: {e:?}")))?;
        let mut recv = stream.alloc_zeros::<u8>(mine.len() * self.world).map_err(|e| self.error(format!("{what}: {e:?}")))?;
        comm.all_gather(&send, &mut recv).map_err(|e| self.error(format!("{what}: NCCL all-gather: {e:?}")))?;
        self.wait(stream, what, started)?;
        stream.clone_dtoh(&recv).map_err(|e| self.error(format!("{what}: {e:?}")))
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_gather(&self, what: &str, mine: Vec<u8>) -> Result<Vec<Vec<u8>>, CommError> {
        // the collective's name travels with the sizes: ranks on different paths are an error
        let tag = fnv(what);
        let head: Vec<u8> = (mine.len() as u64).to_le_bytes().into_iter().chain(tag.to_le_bytes()).collect();
        let heads = self.gather_equal(what, &head)?;
        let mut lens = Vec::with_capacity(self.world);
        for (r, h) in heads.chunks_exact(16).enumerate() {
            if u64::from_le_bytes(h[8..16].try_into().unwrap()) != tag {
                return Err(self.error(format!("reached collective {what:?} while rank {r} reached another: the ranks took different paths")));
            }
            lens.push(u64::from_le_bytes(h[..8].try_into().unwrap()) as usize);
        }
        let most = lens.iter().copied().max().unwrap_or(0);
        if most == 0 {
            return Ok(vec![Vec::new(); self.world]);
        }
        let mut padded = mine;
        padded.resize(most, 0);
        let all = self.gather_equal(what, &padded)?;
        Ok(all.chunks_exact(most).zip(lens).map(|(part, n)| part[..n].to_vec()).collect())
    }
}

fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Rank 0: makes the unique id and gives it to each other rank as it connects.
fn serve_id(r: &Rendezvous) -> Result<Id, String> {
    let id = Id::new().map_err(|e| format!("NCCL unique id (is libnccl installed?): {e:?}"))?;
    if r.world == 1 {
        return Ok(id);
    }
    let port = r.master.rsplit(':').next().unwrap_or("");
    let listener = TcpListener::bind(format!("0.0.0.0:{port}")).map_err(|e| format!("listening on MASTER_PORT {port}: {e}"))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let bytes: Vec<u8> = id.internal().iter().map(|&c| c as u8).collect();
    let deadline = Instant::now() + r.timeout;
    let mut served = 0;
    while served < r.world - 1 {
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false).and_then(|_| s.write_all(&bytes)).map_err(|e| format!("sending the NCCL id: {e}"))?;
                served += 1;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Err(format!("{} of {} ranks connected to MASTER_PORT {port} within {:.0} s (wrong WORLD_SIZE, or ranks that never started)", served + 1, r.world, r.timeout.as_secs_f64())),
            Err(e) => return Err(format!("accepting on MASTER_PORT {port}: {e}")),
        }
    }
    Ok(id)
}

/// Ranks past 0: the unique id from rank 0, retrying until the timeout (rank 0 may start later).
fn fetch_id(r: &Rendezvous) -> Result<Id, String> {
    let deadline = Instant::now() + r.timeout;
    let addr = r.master.to_socket_addrs().map_err(|e| format!("MASTER_ADDR:MASTER_PORT {}: {e}", r.master))?.next().ok_or(format!("MASTER_ADDR:MASTER_PORT {} resolves to no address", r.master))?;
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(mut s) => {
                s.set_read_timeout(Some(r.timeout)).map_err(|e| e.to_string())?;
                let mut bytes = [0u8; 128];
                s.read_exact(&mut bytes).map_err(|e| format!("reading the NCCL id from rank 0 at {}: {e}", r.master))?;
                return Ok(Id::uninit(bytes.map(|b| b as std::ffi::c_char)));
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => return Err(format!("rank 0 at MASTER_ADDR:MASTER_PORT {} unreachable for {:.0} s: {e}", r.master, r.timeout.as_secs_f64())),
        }
    }
}
