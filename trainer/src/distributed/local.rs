//! Ranks as threads of one process: the in-process [`Communicator`] the CPU tests run data
//! parallel GRPO on (each rank a thread with its own trainer on the CPU runtime).
//!
//! A collective completes when every rank has deposited its part; each rank then takes the
//! gathered list, and the last one to take it opens the next collective. A rank that does not
//! arrive within the group's timeout, or whose communicator is dropped (its thread ended or
//! failed), is an error on every waiting rank naming it, never a hang; so is a rank that
//! reaches a different collective.

use super::{CommError, Communicator};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

struct Round {
    /// The collective being gathered (counts from 0).
    number: u64,
    parts: Vec<Option<(String, Vec<u8>)>>,
    gathered: Option<Arc<Vec<Vec<u8>>>>,
    taken: usize,
    /// Ranks whose communicator was dropped.
    left: Vec<bool>,
}

struct Group {
    world: usize,
    timeout: Duration,
    round: Mutex<Round>,
    changed: Condvar,
}

/// One rank's end of an in-process group.
pub struct LocalComm {
    rank: usize,
    group: Arc<Group>,
    /// Collectives this rank has entered.
    calls: AtomicU64,
}

/// `world` connected ranks; a collective waits at most `timeout` for the others.
pub fn local_group(world: usize, timeout: Duration) -> Vec<LocalComm> {
    assert!(world > 0, "a group has at least one rank");
    let group = Arc::new(Group {
        world,
        timeout,
        round: Mutex::new(Round { number: 0, parts: vec![None; world], gathered: None, taken: 0, left: vec![false; world] }),
        changed: Condvar::new(),
    });
    (0..world).map(|rank| LocalComm { rank, group: group.clone(), calls: AtomicU64::new(0) }).collect()
}

impl LocalComm {
    fn fail(&self, message: String) -> CommError {
        CommError { rank: self.rank, world: self.group.world, message }
    }

    /// Waits on the group until `ready` holds, naming `what` and the missing ranks on a timeout
    /// or a departure.
    fn wait_until<'a>(&self, mut round: std::sync::MutexGuard<'a, Round>, what: &str, deadline: Instant, ready: impl Fn(&Round) -> bool) -> Result<std::sync::MutexGuard<'a, Round>, CommError> {
        while !ready(&round) {
            let missing: Vec<usize> = (0..self.group.world).filter(|&r| round.parts[r].is_none()).collect();
            if let Some(r) = missing.iter().find(|&&r| round.left[r]) {
                return Err(self.fail(format!("{what}: rank {r} left the group (its thread ended or failed) before this collective completed")));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.fail(format!("{what}: waited {:.0} s for ranks {missing:?} (collective #{}); a rank died, hung or took another path", self.group.timeout.as_secs_f64(), round.number)));
            }
            round = self.group.changed.wait_timeout(round, deadline - now).map_err(|_| self.fail(format!("{what}: another rank panicked inside a collective")))?.0;
        }
        Ok(round)
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.group.world
    }

    fn all_gather(&self, what: &str, mine: Vec<u8>) -> Result<Vec<Vec<u8>>, CommError> {
        let number = self.calls.fetch_add(1, Ordering::SeqCst);
        let deadline = Instant::now() + self.group.timeout;
        let round = self.group.round.lock().map_err(|_| self.fail(format!("{what}: another rank panicked inside a collective")))?;
        // the previous collective must be taken by every rank before this one opens
        let mut round = self.wait_until(round, what, deadline, |r| r.number == number)?;
        if let Some((other, _)) = round.parts.iter().flatten().find(|(w, _)| w != what) {
            return Err(self.fail(format!("reached collective {what:?} while another rank reached {other:?} (collective #{number}): the ranks took different paths")));
        }
        round.parts[self.rank] = Some((what.to_string(), mine));
        if round.parts.iter().all(Option::is_some) {
            let parts: Vec<Vec<u8>> = round.parts.iter_mut().map(|p| p.take().unwrap().1).collect();
            // keep the slots marked as filled until every rank has taken the list
            for p in round.parts.iter_mut() {
                *p = Some((what.to_string(), Vec::new()));
            }
            round.gathered = Some(Arc::new(parts));
            self.group.changed.notify_all();
        }
        let mut round = self.wait_until(round, what, deadline, |r| r.gathered.is_some())?;
        let out = round.gathered.as_ref().unwrap().as_ref().clone();
        round.taken += 1;
        if round.taken == self.group.world {
            round.number += 1;
            round.parts = vec![None; self.group.world];
            round.gathered = None;
            round.taken = 0;
            self.group.changed.notify_all();
        }
        Ok(out)
    }
}

impl Drop for LocalComm {
    fn drop(&mut self) {
        if let Ok(mut round) = self.group.round.lock() {
            round.left[self.rank] = true;
        }
        self.group.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Send + 'static>(world: usize, timeout: Duration, f: impl Fn(LocalComm) -> T + Send + Sync + 'static) -> Vec<T> {
        let f = Arc::new(f);
        let handles: Vec<_> = local_group(world, timeout).into_iter().map(|c| {
            let f = f.clone();
            std::thread::spawn(move || f(c))
        }).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn the_sum_is_the_pairwise_tree_and_the_same_bits_on_every_rank() {
        // 1e8, 1, -1e8, 1 in f32: the tree (r0 + r1) + (r2 + r3) gives 0, the left fold 1
        let out = run(4, Duration::from_secs(10), |c| {
            let v = vec![[1e8f32, 1.0, -1e8, 1.0][c.rank()], c.rank() as f32 * 0.1];
            for _ in 0..50 {
                c.all_reduce_sum("grads", Some(v.clone())).unwrap();
            }
            c.all_reduce_sum("grads", Some(v)).unwrap().unwrap().iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        });
        let expected = [((1e8f32 + 1.0) + (-1e8f32 + 1.0)).to_bits(), ((0.0f32 + 0.1) + (0.2f32 + 0.3)).to_bits()];
        assert!(out.iter().all(|v| v == &expected), "{out:?}");
        // an idle rank is skipped; ranks that disagree on the length are an error
        let out = run(3, Duration::from_secs(10), |c| c.all_reduce_sum("grads", (c.rank() != 1).then(|| vec![c.rank() as f32 + 0.5])).unwrap());
        assert!(out.iter().all(|v| v.as_deref() == Some(&[0.5f32 + 2.5][..])), "{out:?}");
        let out = run(2, Duration::from_secs(10), |c| c.all_reduce_sum("grads", Some(vec![1.0; c.rank() + 1])).map_err(|e| e.to_string()));
        assert!(out.iter().all(|r| r.as_ref().is_err_and(|e| e.contains("grads") && e.contains("1") && e.contains("2"))), "{out:?}");
    }

    #[test]
    fn a_gather_gives_every_rank_the_parts_in_rank_order() {
        let out = run(4, Duration::from_secs(10), |c| c.all_gather("ids", vec![c.rank() as u8; c.rank() + 1]).unwrap());
        for got in out {
            assert_eq!(got, vec![vec![0], vec![1, 1], vec![2, 2, 2], vec![3, 3, 3, 3]]);
        }
    }

    #[test]
    fn a_rank_that_leaves_is_named_on_the_others_without_a_hang() {
        let started = Instant::now();
        let out = run(3, Duration::from_secs(60), |c| {
            if c.rank() == 2 {
                return Ok(Vec::new()); // its communicator is dropped: the thread "died"
            }
            c.all_gather("rollouts", vec![1]).map(|_| Vec::<u8>::new())
        });
        assert!(started.elapsed() < Duration::from_secs(30));
        for r in 0..2 {
            let e = out[r].as_ref().unwrap_err();
            assert!(e.message.contains("rank 2 left") && e.message.contains("rollouts"), "{e}");
        }
    }

    #[test]
    fn a_rank_that_never_arrives_is_a_timeout_naming_it() {
        let keep = Arc::new(Mutex::new(Vec::new()));
        let kept = keep.clone();
        let out = run(2, Duration::from_millis(300), move |c| {
            if c.rank() == 1 {
                kept.lock().unwrap().push(c); // alive but silent
                return Ok(());
            }
            c.all_gather("config hash", vec![]).map(|_| ())
        });
        let e = out[0].as_ref().unwrap_err();
        assert!(e.message.contains("config hash") && e.message.contains("[1]"), "{e}");
        drop(keep);
    }

    #[test]
    fn ranks_on_different_collectives_are_an_error() {
        let out = run(2, Duration::from_secs(2), |c| {
            let what = if c.rank() == 0 { "gradients" } else { "fingerprint" };
            c.all_gather(what, vec![]).map(|_| ())
        });
        assert!(out.iter().any(|r| r.as_ref().is_err_and(|e| e.message.contains("different paths"))), "{out:?}");
    }
}
