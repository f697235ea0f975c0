//! What the application receives: messages, in batches that share one buffer.

use crate::rpc::request::{ReplyError, Request};
use busway_core::body::Span;
use busway_core::BusId;
use bytes::Bytes;
use std::sync::Arc;

/// One received message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The node that sent it (for a publish, its publisher, whichever node passed it on).
    pub src: BusId,
    /// The payload, sharing the receive buffer (no copy).
    pub payload: Bytes,
    /// Set when the message is a request (sent with `Node::call`): answer it with
    /// [`Message::reply`]. Dropped unanswered, the caller gets an error reply at once.
    pub request: Option<Request>,
    /// Set when the message was published to a group this node joined (`Node::publish`):
    /// the group's name.
    pub group: Option<Arc<str>>,
}

impl Message {
    /// Answers the request this message is, waiting while the queue to the caller is full.
    pub async fn reply(&self, payload: Bytes) -> Result<(), ReplyError> {
        match &self.request {
            Some(r) => r.reply(payload).await,
            None => Err(ReplyError::NotARequest),
        }
    }
}

/// Messages from one sender, in the order sent, sharing one buffer.
#[derive(Clone, Debug)]
pub struct MessageBatch {
    src: BusId,
    buf: Bytes,
    /// Where each message lies in `buf`, and its kind (a request's body starts with its call id:
    /// see [`Span::payload_range`]).
    spans: Vec<Span>,
    /// The requests among the messages, by index, in order (most batches have none).
    requests: Vec<(u32, Request)>,
    /// The group every message of the batch was published to, if they were.
    group: Option<Arc<str>>,
}

impl busway_core::turns::Batch for MessageBatch {
    fn of_spans(src: BusId, group: Option<&str>, chunk: &Bytes, spans: Vec<Span>) -> Self {
        Self {
            group: group.map(Arc::from),
            ..Self::new(src, chunk.clone(), spans)
        }
    }

    fn of_payload(src: BusId, group: Option<&str>, payload: Bytes) -> Self {
        let len = payload.len() as u32;
        Self::of_spans(src, group, &payload, vec![Span::data(0, len)])
    }

    fn is_of(&self, src: BusId, group: Option<&str>) -> bool {
        self.src == src && self.group() == group
    }

    fn push_span(&mut self, span: Span) {
        self.spans.push(span);
    }

    fn footprint(&self) -> usize {
        MessageBatch::footprint(self)
    }
}

impl MessageBatch {
    pub(crate) fn new(src: BusId, buf: Bytes, spans: Vec<Span>) -> Self {
        Self {
            src,
            buf,
            spans,
            requests: Vec::new(),
            group: None,
        }
    }

    /// The group the batch's messages were published to, if they were (all of them were, or
    /// none).
    pub fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// A batch whose messages include the `requests` (index in `spans`, handle).
    pub(crate) fn with_requests(
        src: BusId,
        buf: Bytes,
        spans: Vec<Span>,
        requests: Vec<(u32, Request)>,
    ) -> Self {
        Self {
            src,
            buf,
            spans,
            requests,
            group: None,
        }
    }

    pub(crate) fn single(src: BusId, payload: Bytes) -> Self {
        let len = payload.len() as u32;
        Self::new(src, payload, vec![Span::data(0, len)])
    }

    /// The node that sent every message of the batch (for publishes, their publisher).
    pub fn src(&self) -> BusId {
        self.src
    }

    /// How many messages the batch holds.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether the batch holds no message.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The payload of message `i`, borrowed from the batch.
    pub fn payload(&self, i: usize) -> &[u8] {
        &self.buf[self.spans[i].payload_range()]
    }

    /// Every payload, in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.spans.iter().map(|s| &self.buf[s.payload_range()])
    }

    /// The request message `i` is, if it is one (answer it with [`Request::reply`]).
    pub fn request(&self, i: usize) -> Option<&Request> {
        let i = i as u32;
        self.requests
            .binary_search_by_key(&i, |(at, _)| *at)
            .ok()
            .map(|k| &self.requests[k].1)
    }

    /// Message `i` as an owned [`Message`] (shares the buffer; no copy).
    pub fn message(&self, i: usize) -> Message {
        Message {
            src: self.src,
            payload: self.buf.slice(self.spans[i].payload_range()),
            request: self.request(i).cloned(),
            group: self.group.clone(),
        }
    }

    /// Message `i`, its request handle (if any) moved out of the batch.
    pub(crate) fn take_message(&mut self, i: usize) -> Message {
        let at = i as u32;
        let request = self
            .requests
            .binary_search_by_key(&at, |(k, _)| *k)
            .ok()
            .map(|k| self.requests.remove(k).1);
        Message {
            src: self.src,
            payload: self.buf.slice(self.spans[i].payload_range()),
            request,
            group: self.group.clone(),
        }
    }

    /// Drops the first `n` messages (already read).
    pub(crate) fn skip(&mut self, n: usize) {
        self.spans.drain(..n);
        if !self.requests.is_empty() {
            let n = n as u32;
            self.requests.retain(|(at, _)| *at >= n);
            self.requests.iter_mut().for_each(|(at, _)| *at -= n);
        }
    }

    /// Bytes of buffer the batch holds (what it counts against the inbox limit).
    pub fn footprint(&self) -> usize {
        self.buf.len()
    }
}
