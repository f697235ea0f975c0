//! The event loops that run a node's links.
//!
//! Each dedicated loop is one thread running a single-threaded tokio runtime; a link is spawned
//! onto one loop and stays there. Other threads reach a loop only by spawning onto its handle.
//! On the caller's runtime (`IoThreads::Current`) the node's tasks end when told, as they
//! would with a dedicated loop's runtime: a node dropped leaves no task behind.

use crate::node::config::IoThreads;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;
use tokio::runtime::Handle;
use tokio::sync::{oneshot, watch};

pub(crate) struct IoLoops {
    handles: Vec<Handle>,
    next: AtomicUsize,
    /// Dropping or firing a sender stops its loop (its tasks are dropped).
    stops: Mutex<Vec<oneshot::Sender<()>>>,
    /// On the caller's runtime: set to true to end the node's tasks there.
    stop_current: Option<watch::Sender<bool>>,
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
            stop_current: (io == IoThreads::Current).then(|| watch::channel(false).0),
        })
    }

    /// Runs `task` on the next loop (round robin) until it ends or the loops stop.
    pub(crate) fn spawn<F>(&self, task: F)
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = self.pick();
        match &self.stop_current {
            None => drop(handle.spawn(task)),
            Some(stop) => {
                let mut stopped = stop.subscribe();
                drop(handle.spawn(async move {
                    tokio::select! {
                        _ = task => {}
                        _ = stopped.wait_for(|s| *s) => {}
                    }
                }));
            }
        }
    }

    /// The loop for the next task (round robin).
    fn pick(&self) -> &Handle {
        let i = self.next.fetch_add(1, Relaxed) % self.handles.len();
        &self.handles[i]
    }

    /// Stops the loops; their remaining tasks are dropped (on the caller's runtime, at their
    /// next poll).
    pub(crate) fn stop(&self) {
        self.stops.lock().unwrap_or_else(|p| p.into_inner()).clear();
        if let Some(stop) = &self.stop_current {
            stop.send_replace(true);
        }
    }
}
