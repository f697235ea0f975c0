//! The calls this node made and waits on (`Node::call`), by call id: the receive
//! dispatcher (`node::dispatch`) ends them with the replies it reads, and asks here for the
//! handle a request it reads is answered with.
//!
//! A call holds one of `CALLS_PENDING_MAX` slots from before its request is queued until it
//! ends: replied, timed out, cancelled (its future dropped), or failed (its request given up,
//! its peer restarted, dead or unknown). A reply that finds no call (it came after the end) is
//! dropped and counted, never given to another call: ids are never reused by a node.

use crate::node::errors::SendError;
use crate::node::event::Path;
use crate::node::stats::{bump, Counters};
use crate::rpc::request::{Replier, Request};
use busway_core::error_kind::ErrorKind;
use busway_core::frame::{CALL_HEADER_LEN, REPLY_HEADER_LEN, REPLY_OK};
use busway_core::BusId;
use bytes::Bytes;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::{oneshot, Notify, OwnedSemaphorePermit, Semaphore};

/// The answer to a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The node that answered.
    pub src: BusId,
    /// What it answered, sharing the receive buffer.
    pub payload: Bytes,
}

/// Why a call failed. Only that call fails; the link and other calls go on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallError {
    /// The request could not be queued; the send's error says why (no route, too large,
    /// shutting down, this node's own inbox full for a call to itself).
    Send(SendError),
    /// No reply within the call's timeout.
    Timeout {
        /// The timeout, in milliseconds.
        after_ms: u64,
    },
    /// busway gave up on the request or its reply: the peer was given up (down past its
    /// deadline), restarted (a new incarnation), or the request was undeliverable.
    Failed {
        /// The callee.
        peer: BusId,
        /// Why busway gave up.
        reason: String,
    },
    /// The request arrived but nothing answered it (dropped unanswered, or no inbox).
    NoHandler {
        /// The callee.
        peer: BusId,
        /// What became of the request there.
        reason: String,
    },
    /// `CALLS_PENDING_MAX` calls are pending and the caller chose not to wait.
    TooManyPending {
        /// `CALLS_PENDING_MAX`.
        max: usize,
    },
    /// The node is shutting down.
    Closed,
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Send(e) => write!(f, "the request could not be sent: {e}"),
            Self::Timeout { after_ms } => write!(f, "no reply within {after_ms} ms"),
            // The reason names the peer and what happened to it (callers name the call).
            Self::Failed { peer: _, reason } => write!(f, "busway gave up: {reason}"),
            Self::NoHandler { peer, reason } => {
                write!(f, "bus id {peer} did not handle the request: {reason}")
            }
            Self::TooManyPending { max } => write!(f, "{max} calls are pending already"),
            Self::Closed => write!(f, "the node is shutting down"),
        }
    }
}

impl std::error::Error for CallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Send(e) => Some(e),
            _ => None,
        }
    }
}

impl CallError {
    /// What kind of failure this is (a send's own kind for `Send`).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Send(e) => e.kind(),
            Self::Timeout { .. } => ErrorKind::Timeout,
            Self::Failed { .. } => ErrorKind::GaveUp,
            Self::NoHandler { .. } => ErrorKind::NoHandler,
            Self::TooManyPending { .. } => ErrorKind::TooManyPending,
            Self::Closed => ErrorKind::Closed,
        }
    }
}

type Outcome = Result<Reply, CallError>;

struct Pending {
    dst: BusId,
    /// Where its request went (path, sequence number), once queued.
    sent: Option<(Path, u64)>,
    done: oneshot::Sender<Outcome>,
    _slot: OwnedSemaphorePermit,
}

/// The calls pending at this node.
pub(crate) struct CallTable {
    pending: Mutex<HashMap<u64, Pending>>,
    /// Ids are never reused (a late reply can only miss).
    next_id: std::sync::atomic::AtomicU64,
    slots: Arc<Semaphore>,
    /// Told when a call is registered (links with rings watch for replies only meanwhile).
    registered: Notify,
    /// The node, to give received requests a way to be answered (set once it exists).
    replier: OnceLock<Arc<dyn Replier>>,
    counters: Arc<Counters>,
}

/// A call registered in the table; ends it (cancelled) when dropped before it is done.
pub(crate) struct CallGuard<'a> {
    table: &'a CallTable,
    pub(crate) id: u64,
    pub(crate) done: oneshot::Receiver<Outcome>,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        self.table.lock().remove(&self.id);
    }
}

impl CallTable {
    pub(crate) fn new(counters: Arc<Counters>, slots: usize) -> Self {
        Self {
            pending: Mutex::new(HashMap::new()),
            next_id: std::sync::atomic::AtomicU64::new(1),
            slots: Arc::new(Semaphore::new(slots)),
            registered: Notify::new(),
            replier: OnceLock::new(),
            counters,
        }
    }

    pub(crate) fn set_replier(&self, node: Arc<dyn Replier>) {
        let _ = self.replier.set(node);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Pending>> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A free slot: waits for one if `wait`, else `None` when all are taken.
    pub(crate) async fn slot(&self, wait: bool) -> Option<OwnedSemaphorePermit> {
        if wait {
            self.slots.clone().acquire_owned().await.ok()
        } else {
            self.slots.clone().try_acquire_owned().ok()
        }
    }

    /// Registers a call to `dst` holding `slot`.
    pub(crate) fn register(&self, dst: BusId, slot: OwnedSemaphorePermit) -> CallGuard<'_> {
        // Relaxed: a counter handing out unique numbers; nothing is published through it.
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.lock().insert(
            id,
            Pending {
                dst,
                sent: None,
                done: tx,
                _slot: slot,
            },
        );
        self.registered.notify_waiters();
        CallGuard {
            table: self,
            id,
            done: rx,
        }
    }

    /// The call's request was queued as message `seq` on `path`.
    pub(crate) fn sent(&self, id: u64, path: Path, seq: u64) {
        if let Some(p) = self.lock().get_mut(&id) {
            p.sent = Some((path, seq));
        }
    }

    /// Fails every call to `peer` (given up, restarted, or this node is going).
    pub(crate) fn fail_peer(&self, peer: BusId, reason: &str) {
        self.fail_where(peer, reason, |_| true);
    }

    /// Fails the calls to `peer` whose request is among the messages `seqs` on `path` that
    /// busway gave up on.
    pub(crate) fn fail_requests(
        &self,
        peer: BusId,
        path: Path,
        seqs: &std::ops::Range<u64>,
        reason: &str,
    ) {
        if !seqs.is_empty() {
            self.fail_where(
                peer,
                reason,
                |p| matches!(p.sent, Some((on, seq)) if on == path && seqs.contains(&seq)),
            );
        }
    }

    /// Fails the calls to `peer` that `which` picks, with `reason`.
    fn fail_where(&self, peer: BusId, reason: &str, which: impl Fn(&Pending) -> bool) {
        let mut pending = self.lock();
        let ids: Vec<u64> = pending
            .iter()
            .filter(|(_, p)| p.dst == peer && which(p))
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            if let Some(p) = pending.remove(&id) {
                let _ = p.done.send(Err(CallError::Failed {
                    peer,
                    reason: reason.to_owned(),
                }));
            }
        }
    }

    /// Fails every call: the node is going.
    pub(crate) fn fail_all(&self) {
        for (_, p) in self.lock().drain() {
            let _ = p.done.send(Err(CallError::Closed));
        }
    }

    /// Waits until a call is pending.
    pub(crate) async fn wait_pending(&self) {
        let registered = self.registered.notified();
        tokio::pin!(registered);
        // Enabled before the look: a call registered in between is not missed.
        registered.as_mut().enable();
        if self.len() == 0 {
            registered.await;
        }
    }

    /// Calls pending now.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// A REPLY from `src`: the call id, the status, and the payload (sharing the read's buffer).
    pub(crate) fn on_reply(&self, src: BusId, id: u64, status: u8, payload: Bytes) {
        let mut pending = self.lock();
        match pending.get(&id) {
            None => {
                drop(pending);
                // Its call ended (timed out, cancelled, failed) before it came.
                bump(&self.counters.late_replies);
            }
            Some(p) if p.dst != src => {
                let dst = p.dst;
                drop(pending);
                bump(&self.counters.misdirected_replies);
                tracing::warn!(%src, call = id, expected = %dst, "reply from a node the call was not made to; dropped");
            }
            Some(_) => {
                let Some(p) = pending.remove(&id) else {
                    return;
                };
                drop(pending);
                let outcome = if status == REPLY_OK {
                    Ok(Reply { src, payload })
                } else {
                    Err(CallError::NoHandler {
                        peer: src,
                        reason: String::from_utf8_lossy(&payload).into_owned(),
                    })
                };
                let _ = p.done.send(outcome);
            }
        }
    }

    /// The handle to answer a request from `src` with call id `id`, if the node that answers
    /// is still there.
    pub(crate) fn request(&self, src: BusId, id: u64) -> Option<Request> {
        let node = self.replier.get()?;
        Some(Request::new(src, id, Arc::downgrade(node)))
    }
}

/// A REPLY's head: call id and status.
pub(crate) fn reply_head(id: u64, status: u8) -> [u8; REPLY_HEADER_LEN] {
    let mut head = [0u8; REPLY_HEADER_LEN];
    head[..CALL_HEADER_LEN].copy_from_slice(&id.to_le_bytes());
    head[CALL_HEADER_LEN] = status;
    head
}
