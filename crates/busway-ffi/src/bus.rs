//! A node for a caller that is not a tokio program (C, C++, Python): the node, a runtime of its
//! own (one worker thread, besides the node's I/O threads) that takes what arrives, and the
//! queues and eventfd through which the caller's loop collects it. The C functions and the
//! Python package are thin layers over this safe type.

use crate::ready::{Ready, ReadyEvent};
use busway::{BusId, ErrorKind, MessageBatch, Node, NodeConfig};
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::{EnterGuard, Runtime};

/// How long stopping lets the runtime finish its tasks, in milliseconds.
const RUNTIME_STOP_WAIT_MS: u64 = 1_000;

/// Why a bus did not start: the kind (as every busway error has) and the words.
#[derive(Clone, Debug)]
pub struct StartFailure {
    /// What kind of failure (`Config` for a bad setting, `Io` for a system call).
    pub kind: ErrorKind,
    /// What failed and where.
    pub message: String,
}

/// A running node whose arrivals wait in queues for the caller, announced by an eventfd.
///
/// Thread safety: `Sync`; every method may be called from any thread that is not one of the
/// bus's own (its runtime's `block_on` is not allowed there).
pub struct Bus {
    node: Node,
    runtime: Runtime,
    ready: Arc<Ready>,
}

impl Bus {
    /// Starts a node from `config` on a runtime of its own, and the tasks that move its inbox
    /// and events to the caller's queues.
    pub fn start(config: NodeConfig) -> Result<Bus, StartFailure> {
        let io = |message: String| StartFailure {
            kind: ErrorKind::Io,
            message,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("busway-ffi")
            .enable_all()
            .build()
            .map_err(|e| io(format!("cannot start the node's runtime: {e}")))?;
        let ready = Ready::new().map_err(|e| io(format!("cannot make the node's eventfd: {e}")))?;
        let node = runtime
            .block_on(Node::start(config))
            .map_err(|e| StartFailure {
                kind: e.kind(),
                message: format!("the node did not start: {e}"),
            })?;
        if let Some(inbox) = node.take_inbox() {
            runtime.spawn(ready.clone().pump_inbox(inbox));
        }
        if let Some(events) = node.take_events() {
            runtime.spawn(ready.clone().pump_events(events));
        }
        Ok(Bus {
            node,
            runtime,
            ready,
        })
    }

    /// The node, for its API (sends, groups, stats).
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Runs `f` to its end on the calling thread, with the bus's runtime for its timers and I/O.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// Makes the bus's runtime the calling thread's current one until the guard is dropped
    /// (for the node's calls that do not wait but may need a runtime).
    pub fn enter(&self) -> EnterGuard<'_> {
        self.runtime.enter()
    }

    /// The eventfd, readable while batches or events wait. Owned by the bus: never read or
    /// close it.
    pub fn fd(&self) -> i32 {
        self.ready.raw_fd()
    }

    /// The next received batch, if one waits.
    pub fn take_batch(&self) -> Option<MessageBatch> {
        self.ready.pop_batch()
    }

    /// The next event or finished call, if one waits.
    pub fn take_event(&self) -> Option<ReadyEvent> {
        self.ready.pop_event()
    }

    /// Starts a call to `dst`; its end comes as `ReadyEvent::CallDone` with `token`.
    pub fn call_start(&self, dst: BusId, payload: Bytes, timeout: Duration, token: u64) {
        let (node, ready) = (self.node.clone(), self.ready.clone());
        self.runtime.spawn(async move {
            let result = node.call(dst, payload, timeout).await;
            ready.push_event(ReadyEvent::CallDone { token, result });
        });
    }

    /// Closes the node gracefully, leaving its threads to `stop` or the drop: waits up to
    /// `drain` for what was sent to be acknowledged (none if zero), then closes the links
    /// telling peers it shut down. Calls made after it fail with `Closed`.
    pub fn close(&self, drain: Duration) {
        self.runtime.block_on(async {
            if !drain.is_zero() {
                self.node.drain(drain).await;
            }
            self.node.clone().shutdown().await;
        });
    }

    /// Stops gracefully: `close`, then stops the threads.
    pub fn stop(self, drain: Duration) {
        self.close(drain);
        self.runtime
            .shutdown_timeout(Duration::from_millis(RUNTIME_STOP_WAIT_MS));
    }

    /// Stops at once: no wait, no CLOSE (peers keep what this node had not acknowledged for its
    /// next incarnation, or report it).
    pub fn stop_now(self) {
        let Bus { node, runtime, .. } = self;
        drop(node);
        runtime.shutdown_timeout(Duration::from_millis(RUNTIME_STOP_WAIT_MS));
    }
}
