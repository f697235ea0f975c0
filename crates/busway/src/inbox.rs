//! The application's receive side: messages from every link, bounded in bytes.
//!
//! Links hand over whole batches (everything one `read` produced), so the cost of the channel
//! and of waking the application is paid once per batch, not once per message. A link first
//! takes byte permits for its batch; while the inbox holds its limit, links stop reading and the
//! kernel's flow control slows the senders. Nothing is dropped.

use busway_core::BusId;
use bytes::Bytes;
use std::sync::Arc;
use tokio::sync::{mpsc, Semaphore};

/// One received message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The node that sent it.
    pub src: BusId,
    /// The payload, sharing the receive buffer (no copy).
    pub payload: Bytes,
}

pub(crate) struct Batch {
    messages: Vec<Message>,
    permits: u32,
}

/// The sending half, cloned into every link.
#[derive(Clone)]
pub(crate) struct InboxSender {
    tx: mpsc::UnboundedSender<Batch>,
    budget: Arc<Semaphore>,
    limit: u32,
}

/// The application's end: owned by one task; `recv` takes `&mut self`.
pub struct Inbox {
    rx: mpsc::UnboundedReceiver<Batch>,
    budget: Arc<Semaphore>,
    current: std::vec::IntoIter<Message>,
}

pub(crate) fn inbox(limit_bytes: usize) -> (InboxSender, Inbox) {
    let limit = u32::try_from(limit_bytes).unwrap_or(u32::MAX);
    let budget = Arc::new(Semaphore::new(limit as usize));
    let (tx, rx) = mpsc::unbounded_channel();
    (
        InboxSender {
            tx,
            budget: budget.clone(),
            limit,
        },
        Inbox {
            rx,
            budget,
            current: Vec::new().into_iter(),
        },
    )
}

impl InboxSender {
    /// Hands a batch of `bytes` payload bytes to the application, waiting while the inbox is
    /// full. Returns false if the application dropped its inbox (the messages are discarded;
    /// nobody is left to read them).
    pub(crate) async fn deliver(&self, messages: Vec<Message>, bytes: usize) -> bool {
        let permits = u32::try_from(bytes).unwrap_or(u32::MAX).min(self.limit);
        match self.budget.acquire_many(permits).await {
            Ok(p) => p.forget(),
            Err(_) => return false,
        }
        self.tx.send(Batch { messages, permits }).is_ok()
    }
}

impl InboxSender {
    /// Like `deliver`, without waiting: false if the inbox is full or gone.
    pub(crate) fn try_deliver(&self, messages: Vec<Message>, bytes: usize) -> bool {
        let permits = u32::try_from(bytes).unwrap_or(u32::MAX).min(self.limit);
        match self.budget.try_acquire_many(permits) {
            Ok(p) => p.forget(),
            Err(_) => return false,
        }
        self.tx.send(Batch { messages, permits }).is_ok()
    }
}

impl Inbox {
    /// The next message; `None` once the node has shut down and everything was read.
    pub async fn recv(&mut self) -> Option<Message> {
        if let Some(m) = self.current.next() {
            return Some(m);
        }
        loop {
            let batch = self.rx.recv().await?;
            self.budget.add_permits(batch.permits as usize);
            self.current = batch.messages.into_iter();
            if let Some(m) = self.current.next() {
                return Some(m);
            }
        }
    }

    /// Moves every message that is ready now into `out` (waiting for at least one); returns how
    /// many, 0 once the node has shut down.
    pub async fn recv_many(&mut self, out: &mut Vec<Message>) -> usize {
        let before = out.len();
        out.extend(self.current.by_ref());
        if out.len() == before {
            match self.rx.recv().await {
                Some(batch) => {
                    self.budget.add_permits(batch.permits as usize);
                    out.extend(batch.messages);
                }
                None => return 0,
            }
        }
        self.try_recv_many(out);
        out.len() - before
    }

    /// Moves every message that is ready now into `out` without waiting; returns how many.
    pub fn try_recv_many(&mut self, out: &mut Vec<Message>) -> usize {
        let before = out.len();
        out.extend(self.current.by_ref());
        while let Ok(batch) = self.rx.try_recv() {
            self.budget.add_permits(batch.permits as usize);
            out.extend(batch.messages);
        }
        out.len() - before
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        // Wake links waiting for room: their batches now have nowhere to go.
        self.budget.close();
    }
}
