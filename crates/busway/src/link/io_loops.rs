//! The event loops that run a node's links.
//!
//! Each dedicated loop is one thread running a single-threaded tokio runtime; a link is spawned
//! onto one loop and stays there. Other threads reach a loop only by spawning onto its handle.

use crate::node::config::IoThreads;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

pub(crate) struct IoLoops {
    handles: Vec<Handle>,
    next: AtomicUsize,
    /// Dropping or firing a sender stops its loop (its tasks are dropped).
    stops: Mutex<Vec<oneshot::Sender<()>>>,
}

impl IoLoops {
    /// Must be called from within a tokio runtime when `io` is [`IoThreads::Current`].
    pub(crate) fn start(io: IoThreads, name: &str) -> std::io::Result<Self> {
        let mut handles = Vec::new();
        let mut stops = Vec::new();
        match io {
            IoThreads::Current => handles.push(Handle::current()),
            IoThreads::Dedicated(n) => {
                for i in 0..n {
                    let (stop_tx, stop_rx) = oneshot::channel::<()>();
                    let (handle_tx, handle_rx) = std::sync::mpsc::channel();
                    std::thread::Builder::new()
                        .name(format!("{name}-io-{i}"))
                        .spawn(move || {
                            let rt = match tokio::runtime::Builder::new_current_thread()
                                .enable_all()
                                .build()
                            {
                                Ok(rt) => rt,
                                Err(e) => {
                                    let _ = handle_tx.send(Err(e));
                                    return;
                                }
                            };
                            let _ = handle_tx.send(Ok(rt.handle().clone()));
                            rt.block_on(async {
                                let _ = stop_rx.await;
                            });
                        })?;
                    let handle = handle_rx.recv().map_err(|_| {
                        std::io::Error::other("an I/O loop thread died while starting")
                    })??;
                    handles.push(handle);
                    stops.push(stop_tx);
                }
            }
        }
        Ok(Self {
            handles,
            next: AtomicUsize::new(0),
            stops: Mutex::new(stops),
        })
    }

    /// The loop for the next link (round robin).
    pub(crate) fn pick(&self) -> &Handle {
        let i = self.next.fetch_add(1, Relaxed) % self.handles.len();
        &self.handles[i]
    }

    /// Stops the dedicated loops; their remaining tasks are dropped.
    pub(crate) fn stop(&self) {
        self.stops.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}
