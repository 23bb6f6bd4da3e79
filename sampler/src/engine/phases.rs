//! Where the engine's host time went, step by step.

/// Where the engine's wall-clock time went since the last [`super::Engine::take_phase_times`], as the
/// host sees it: enqueueing a step's launches returns before the device has run them, and the
/// read-back of the sampled tokens waits for all of it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnginePhaseTimes {
    /// Engine steps (batched forwards) run.
    pub steps: usize,
    /// Enqueueing each step's forward and sampling launches (host work, kernel launches, allocations).
    pub launch_s: f64,
    /// Waiting for each step's tokens and logprobs to come back (device time not hidden by the host).
    pub wait_s: f64,
    /// Copying shared prompt prefixes between cache slots.
    pub prefix_copy_s: f64,
    /// Everything else in `step`: admitting requests, building rows, retiring finished ones.
    pub schedule_s: f64,
    /// Requests preempted for want of cache blocks (each runs again from its prompt).
    pub preempted: usize,
    /// Steps replayed as captured graphs (`LOCKSTEP_DECODE_GRAPHS=on`).
    pub replayed_steps: usize,
    /// Graph captures that failed (each warned about; those steps are launched instead).
    pub failed_captures: usize,
}

impl EnginePhaseTimes {
    /// Adds `other`'s steps, times and counts to these.
    pub fn absorb(&mut self, other: &EnginePhaseTimes) {
        self.steps += other.steps;
        self.launch_s += other.launch_s;
        self.wait_s += other.wait_s;
        self.prefix_copy_s += other.prefix_copy_s;
        self.schedule_s += other.schedule_s;
        self.preempted += other.preempted;
        self.replayed_steps += other.replayed_steps;
        self.failed_captures += other.failed_captures;
    }
}
