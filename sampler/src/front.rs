//! The tokio front: the engine runs on its own thread (kernel launches block), requests come
//! in over a channel from any number of tasks, each answered on its own oneshot.

use crate::engine::Engine;
use crate::request::{Completion, Request, SampleError};
use std::collections::HashMap;
use std::sync::mpsc;
use tokio::sync::oneshot;

type Reply = oneshot::Sender<Result<Completion, SampleError>>;

#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<(Request, Reply)>,
}

impl EngineHandle {
    /// Moves `engine` onto a dedicated thread. The thread ends when every handle is dropped.
    pub fn spawn(mut engine: Engine) -> Self {
        let (tx, rx) = mpsc::channel::<(Request, Reply)>();
        std::thread::Builder::new()
            .name("lockstep-sampler".into())
            .spawn(move || {
                let mut waiting: HashMap<u64, Vec<Reply>> = HashMap::new();
                let mut open = true;
                loop {
                    // idle: block for work; busy: take whatever has arrived and keep stepping
                    if engine.is_idle() && open {
                        match rx.recv() {
                            Ok((req, reply)) => {
                                waiting.entry(req.id).or_default().push(reply);
                                engine.add(req);
                            }
                            Err(_) => open = false,
                        }
                    }
                    loop {
                        match rx.try_recv() {
                            Ok((req, reply)) => {
                                waiting.entry(req.id).or_default().push(reply);
                                engine.add(req);
                            }
                            Err(mpsc::TryRecvError::Empty) => break,
                            Err(mpsc::TryRecvError::Disconnected) => {
                                open = false;
                                break;
                            }
                        }
                    }
                    engine.step();
                    for (id, result) in engine.take_done() {
                        if let Some(replies) = waiting.get_mut(&id) {
                            if !replies.is_empty() {
                                let _ = replies.remove(0).send(result);
                            }
                            if replies.is_empty() {
                                waiting.remove(&id);
                            }
                        }
                    }
                    if !open && engine.is_idle() {
                        break;
                    }
                }
            })
            .expect("spawn sampler thread");
        Self { tx }
    }

    /// Submit a request and wait for its completion (or its error).
    pub async fn submit(&self, request: Request) -> Result<Completion, SampleError> {
        let (reply, answer) = oneshot::channel();
        self.tx.send((request, reply)).map_err(|_| SampleError::Closed)?;
        answer.await.map_err(|_| SampleError::Closed)?
    }
}
