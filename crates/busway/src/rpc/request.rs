//! A request received (a CALL from another node's `Node::call`): the application answers it
//! with [`Request::reply`]. A request dropped unanswered is answered for it, with an error
//! the caller sees at once ("no handler") rather than a timeout.

use crate::node::errors::SendError;
use busway_core::error_kind::ErrorKind;
use busway_core::frame::{REPLY_NO_HANDLER, REPLY_OK};
use busway_core::BusId;
use bytes::Bytes;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

/// A future a [`Replier`] returns.
pub(crate) type ReplyFuture<'a> = Pin<Box<dyn Future<Output = Result<(), ReplyError>> + Send + 'a>>;

/// Sends replies on behalf of a node (its shared state implements it; a trait so that this
/// module needs nothing of the node's).
pub(crate) trait Replier: Send + Sync {
    /// Queues a REPLY to `to` for call `id`, waiting for room.
    fn reply(&self, to: BusId, id: u64, status: u8, payload: Bytes) -> ReplyFuture<'_>;
    /// Queues a REPLY to `to` for call `id` without waiting.
    fn try_reply(&self, to: BusId, id: u64, status: u8, payload: Bytes) -> Result<(), ReplyError>;
}

/// Why a reply was not queued.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplyError {
    /// The message is not a request (sent with `send`, not `call`).
    NotARequest,
    /// The request was answered already; a request gets one answer.
    AlreadyAnswered,
    /// The node that received the request is gone.
    NodeGone,
    /// `try_reply` only: the send queue toward the caller (`BusId`) is full (it is not
    /// taking its replies as fast as they come); the request may be answered again.
    Full(BusId),
    /// The reply could not be queued; the send's error says why (no route to the caller, too
    /// large, shutting down).
    Send(SendError),
}

impl fmt::Display for ReplyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotARequest => write!(f, "the message is not a request"),
            Self::AlreadyAnswered => write!(f, "the request was answered already"),
            Self::NodeGone => write!(f, "the node that received the request is gone"),
            Self::Full(id) => write!(f, "the send queue to bus id {id} is full"),
            Self::Send(e) => write!(f, "the reply could not be sent: {e}"),
        }
    }
}

impl std::error::Error for ReplyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Send(e) => Some(e),
            _ => None,
        }
    }
}

impl ReplyError {
    /// What kind of failure this is (a send's own kind for `Send`).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::NotARequest | Self::AlreadyAnswered => ErrorKind::NotAnswerable,
            Self::NodeGone => ErrorKind::Closed,
            Self::Full(_) => ErrorKind::Full,
            Self::Send(e) => e.kind(),
        }
    }
}

/// A request to answer. Clones share one answer: the first `reply` wins, and the request is
/// answered with an error ("no handler") when the last clone is dropped unanswered.
#[derive(Clone)]
pub struct Request {
    inner: Arc<Pending>,
}

struct Pending {
    from: BusId,
    id: u64,
    answered: AtomicBool,
    node: Weak<dyn Replier>,
}

impl Request {
    pub(crate) fn new(from: BusId, id: u64, node: Weak<dyn Replier>) -> Self {
        Self {
            inner: Arc::new(Pending {
                from,
                id,
                answered: AtomicBool::new(false),
                node,
            }),
        }
    }

    /// The node that made the call.
    pub fn from(&self) -> BusId {
        self.inner.from
    }

    /// The call's id at its caller (unique among the caller's pending calls).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Whether an answer was queued.
    pub fn is_answered(&self) -> bool {
        // Relaxed: a flag read for information; `claim` decides who answers.
        self.inner.answered.load(Ordering::Relaxed)
    }

    /// Answers the request with `payload`, waiting while the queue to the caller is full.
    ///
    /// A server that serves many callers from one loop should not wait here: a caller that
    /// stops taking its replies keeps its queue full, and the loop, with every other caller,
    /// would wait with it. Either answer with [`Request::try_reply`] and let such a caller
    /// lose its own replies (what `busway listen --echo` does: an error names the caller),
    /// or answer each request from a task of its own (`tokio::spawn`), at most so many at
    /// once, so that one waits and the rest go on.
    pub async fn reply(&self, payload: Bytes) -> Result<(), ReplyError> {
        let node = self.claim()?;
        let sent = node
            .reply(self.inner.from, self.inner.id, REPLY_OK, payload)
            .await;
        self.release_if(sent)
    }

    /// Answers the request with `payload` without waiting; on an error (e.g. a full queue) it
    /// stays unanswered and may be answered again. The way to serve many callers from one
    /// loop (see [`Request::reply`]): a caller whose queue is full loses only its own reply.
    pub fn try_reply(&self, payload: Bytes) -> Result<(), ReplyError> {
        let node = self.claim()?;
        let sent = node.try_reply(self.inner.from, self.inner.id, REPLY_OK, payload);
        self.release_if(sent)
    }

    fn claim(&self) -> Result<Arc<dyn Replier>, ReplyError> {
        let node = self.inner.node.upgrade().ok_or(ReplyError::NodeGone)?;
        // AcqRel: exactly one claimer wins the answer (pairs with the swap in other clones).
        if self.inner.answered.swap(true, Ordering::AcqRel) {
            return Err(ReplyError::AlreadyAnswered);
        }
        Ok(node)
    }

    fn release_if(&self, sent: Result<(), ReplyError>) -> Result<(), ReplyError> {
        if sent.is_err() {
            // Not queued: the request may be answered again (or answered for it at drop).
            self.inner.answered.store(false, Ordering::Release);
        }
        sent
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if *self.answered.get_mut() {
            return;
        }
        if let Some(node) = self.node.upgrade() {
            let why = Bytes::from_static(b"the request was dropped unanswered");
            // Best effort without waiting (a drop cannot wait): with no room, the caller's
            // timeout ends the call instead.
            let _ = node.try_reply(self.from, self.id, REPLY_NO_HANDLER, why);
        }
    }
}

impl PartialEq for Request {
    fn eq(&self, other: &Self) -> bool {
        (self.inner.from, self.inner.id) == (other.inner.from, other.inner.id)
    }
}

impl Eq for Request {}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("from", &self.inner.from)
            .field("id", &self.inner.id)
            .field("answered", &self.is_answered())
            .finish()
    }
}
