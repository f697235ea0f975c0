//! The application's receive side: messages from every link, bounded in bytes.
//!
//! A link hands over what one `read` produced as one [`MessageBatch`]: one shared buffer and the
//! places of the payloads in it, so neither a copy nor a reference count is paid per message,
//! and the channel and the wake-up are paid once per batch. A link first takes byte permits for
//! its batch; while the inbox holds its limit, links stop reading and the kernel's flow control
//! slows the senders. Nothing is dropped.

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

/// Messages from one sender, in the order sent, sharing one buffer.
#[derive(Clone, Debug)]
pub struct MessageBatch {
    src: BusId,
    buf: Bytes,
    /// (start, length) of each payload in `buf`.
    spans: Vec<(u32, u32)>,
}

impl MessageBatch {
    pub(crate) fn new(src: BusId, buf: Bytes, spans: Vec<(u32, u32)>) -> Self {
        Self { src, buf, spans }
    }

    pub(crate) fn single(src: BusId, payload: Bytes) -> Self {
        let len = payload.len() as u32;
        Self::new(src, payload, vec![(0, len)])
    }

    /// The node that sent every message of the batch.
    pub fn src(&self) -> BusId {
        self.src
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The payload of message `i`, borrowed from the batch.
    pub fn payload(&self, i: usize) -> &[u8] {
        let (start, len) = self.spans[i];
        &self.buf[start as usize..(start + len) as usize]
    }

    /// Every payload, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.spans
            .iter()
            .map(|&(start, len)| &self.buf[start as usize..(start + len) as usize])
    }

    /// Message `i` as an owned [`Message`] (shares the buffer; no copy).
    pub fn message(&self, i: usize) -> Message {
        let (start, len) = self.spans[i];
        Message {
            src: self.src,
            payload: self.buf.slice(start as usize..(start + len) as usize),
        }
    }

    /// Bytes of buffer the batch holds (what it counts against the inbox limit).
    fn footprint(&self) -> usize {
        self.buf.len()
    }
}

struct Delivery {
    batch: MessageBatch,
    permits: u32,
}

/// The sending half, cloned into every link.
#[derive(Clone)]
pub(crate) struct InboxSender {
    tx: mpsc::UnboundedSender<Delivery>,
    budget: Arc<Semaphore>,
    limit: u32,
}

/// The application's end. Owned by one task at a time (`recv` takes `&mut self`).
pub struct Inbox {
    rx: mpsc::UnboundedReceiver<Delivery>,
    budget: Arc<Semaphore>,
    /// A batch being read message by message, and the index of the next message.
    current: Option<(MessageBatch, usize)>,
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
            current: None,
        },
    )
}

impl InboxSender {
    fn permits(&self, batch: &MessageBatch) -> u32 {
        u32::try_from(batch.footprint())
            .unwrap_or(u32::MAX)
            .min(self.limit)
    }

    /// Hands a batch to the application, waiting while the inbox is full. Returns false if the
    /// application dropped its inbox (the batch is discarded: nobody is left to read it).
    pub(crate) async fn deliver(&self, batch: MessageBatch) -> bool {
        let permits = self.permits(&batch);
        match self.budget.acquire_many(permits).await {
            Ok(p) => p.forget(),
            Err(_) => return false,
        }
        self.tx.send(Delivery { batch, permits }).is_ok()
    }

    /// Like `deliver`, without waiting: false if the inbox is full or gone.
    pub(crate) fn try_deliver(&self, batch: MessageBatch) -> bool {
        let permits = self.permits(&batch);
        match self.budget.try_acquire_many(permits) {
            Ok(p) => p.forget(),
            Err(_) => return false,
        }
        self.tx.send(Delivery { batch, permits }).is_ok()
    }
}

impl Inbox {
    fn accept(&mut self, d: Delivery) -> MessageBatch {
        self.budget.add_permits(d.permits as usize);
        d.batch
    }

    /// The rest of a batch that `recv` had started on, if any.
    fn take_current(&mut self) -> Option<MessageBatch> {
        let (mut batch, next) = self.current.take()?;
        batch.spans.drain(..next);
        (!batch.is_empty()).then_some(batch)
    }

    /// The next message; `None` once the node is gone and everything was read.
    pub async fn recv(&mut self) -> Option<Message> {
        loop {
            if let Some((batch, next)) = &mut self.current {
                if *next < batch.len() {
                    *next += 1;
                    return Some(batch.message(*next - 1));
                }
                self.current = None;
            }
            let d = self.rx.recv().await?;
            let batch = self.accept(d);
            self.current = Some((batch, 0));
        }
    }

    /// The next batch of messages (all from one sender, in order); `None` once the node is gone
    /// and everything was read. The fastest way to receive.
    pub async fn recv_batch(&mut self) -> Option<MessageBatch> {
        if let Some(b) = self.take_current() {
            return Some(b);
        }
        let d = self.rx.recv().await?;
        Some(self.accept(d))
    }

    /// The next batch if one is ready now.
    pub fn try_recv_batch(&mut self) -> Option<MessageBatch> {
        if let Some(b) = self.take_current() {
            return Some(b);
        }
        let d = self.rx.try_recv().ok()?;
        Some(self.accept(d))
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        // Wake links waiting for room: their batches now have nowhere to go.
        self.budget.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn recv_and_recv_batch_see_every_message_once_in_order() {
        let (tx, mut rx) = inbox(1 << 20);
        let buf = Bytes::from_static(b"aabbbcc");
        assert!(
            tx.deliver(MessageBatch::new(
                BusId(9),
                buf,
                vec![(0, 2), (2, 3), (5, 2)]
            ))
            .await
        );
        assert!(tx.try_deliver(MessageBatch::single(BusId(8), Bytes::from_static(b"z"))));
        let first = rx.recv().await.unwrap();
        assert_eq!((first.src, &first.payload[..]), (BusId(9), &b"aa"[..]));
        let rest = rx.recv_batch().await.unwrap();
        assert_eq!(
            rest.iter().collect::<Vec<_>>(),
            vec![&b"bbb"[..], &b"cc"[..]]
        );
        let z = rx.try_recv_batch().unwrap();
        assert_eq!((z.src(), z.payload(0)), (BusId(8), &b"z"[..]));
        assert!(rx.try_recv_batch().is_none());
    }

    #[tokio::test]
    async fn a_full_inbox_refuses_without_waiting() {
        let (tx, _rx) = inbox(4);
        assert!(tx.try_deliver(MessageBatch::single(BusId(1), Bytes::from_static(b"1234"))));
        assert!(!tx.try_deliver(MessageBatch::single(BusId(1), Bytes::from_static(b"5"))));
    }
}
