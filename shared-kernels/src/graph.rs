//! Launch sequences captured once and replayed as one graph (cubecl's capture: a driver graph
//! on CUDA, a software graph on wgpu), so a repeated step costs one enqueue instead of hundreds.
//!
//! The rules the caller keeps: `prepare` before a warm-up run of the sequence; nothing inside
//! the captured closure reads from, writes to or syncs with the host (an upload there fails the
//! capture); a replay runs on the buffers the capture used, so each replay's inputs are written
//! into those first (`ops::in_place`) and its outputs read from the captured output tensors.

use burn::tensor::Device;
use burn_cubecl::cubecl::client::Client;
use burn::tensor::StreamId;

/// The device stream a thread's launches go to (cubecl gives each thread its own). A buffer
/// made on one stream and bound by a launch on another is a cross-stream binding: cubecl then
/// fences a side stream on the host, which a CUDA capture cannot hold (the capture is
/// invalidated). So whoever captures runs on the stream its buffers were made on.
#[derive(Clone, Copy, Debug)]
pub struct LaunchStream(StreamId);

impl LaunchStream {
    /// The calling thread's stream now.
    pub fn current() -> Self {
        LaunchStream(StreamId::current())
    }

    /// Runs `f` with its launches on this stream, on whichever thread calls.
    pub fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        self.0.executes(f)
    }
}

/// A captured launch sequence.
pub struct Captured {
    graph: burn_cubecl::cubecl::client::Graph,
}

fn client(device: &Device) -> Result<Client, String> {
    crate::device::client(device).ok_or_else(|| "graph capture needs a cubecl device".to_string())
}

/// Readies the device's stream for a capture; run the sequence once (the warm-up) after this
/// and before [`capture`].
pub fn prepare(device: &Device) -> Result<(), String> {
    client(device)?.graph_prepare().map_err(|e| format!("preparing a graph capture: {e:?}"))
}

/// Records the launches `record` enqueues (they do not run now) into a graph; `record`'s own
/// result is returned with it (its tensors are the graph's outputs). The window is closed
/// whatever `record` returns.
pub fn capture<T>(device: &Device, record: impl FnOnce() -> Result<T, String>) -> Result<(T, Captured), String> {
    let client = client(device)?;
    client.start_capture().map_err(|e| format!("starting a graph capture: {e:?}"))?;
    let out = record();
    let graph = client.stop_capture().map_err(|e| format!("the graph capture failed: {e:?}"));
    let out = out?;
    Ok((out, Captured { graph: graph? }))
}

impl Captured {
    /// Enqueues the captured launches on their buffers.
    pub fn replay(&self) -> Result<(), String> {
        // SAFETY: the graph's owner keeps every captured input and output tensor alive while
        // the graph lives, writes inputs only on the capture's stream, and never reads an
        // output before the replay that writes it is enqueued.
        unsafe { self.graph.replay() }.map_err(|e| format!("replaying a graph: {e:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_entered_on_a_launch_stream_runs_there_from_any_thread() {
        let builder = LaunchStream::current();
        let here = builder.enter(StreamId::current);
        let elsewhere = std::thread::spawn(move || (StreamId::current(), builder.enter(StreamId::current))).join().unwrap();
        assert_eq!(here, builder.0);
        // another thread has its own stream, unless it enters the builder's
        assert_ne!(elsewhere.0, builder.0);
        assert_eq!(elsewhere.1, builder.0);
    }
}
