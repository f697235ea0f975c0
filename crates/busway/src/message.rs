//! What the application receives: messages, in batches that share one buffer.

use busway_core::BusId;
use bytes::Bytes;

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

    /// Drops the first `n` messages (already read).
    pub(crate) fn skip(&mut self, n: usize) {
        self.spans.drain(..n);
    }

    /// Bytes of buffer the batch holds (what it counts against the inbox limit).
    pub(crate) fn footprint(&self) -> usize {
        self.buf.len()
    }
}
