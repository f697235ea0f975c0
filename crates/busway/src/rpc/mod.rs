//! The rpc part: calls and their replies.
//!
//! **Owns**: the calls this node made and waits on (`call_table`), and a received request
//! with its one answer (`request`).
//!
//! **Runs on**: the application's tasks (`Node::call`, `Request::reply`) and wherever messages
//! are delivered (a link's reader, the ring reader), which sort replies out to their callers.
//!
//! **May call**: the route part's queuing (a CALL or REPLY is a message on its path) and the
//! node's counters.
//!
//! # Request/reply
//!
//! Request/reply: `Node::call` sends a CALL and waits for its REPLY; a received request is
//! answered through the node (`Replier`). Requests and replies are messages like any other on
//! their path: numbered, in order with plain sends of the same pair, held and resent across a
//! dropped link, reported when given up.

pub(crate) mod call_table;
pub(crate) mod replier;
pub(crate) mod request;

use crate::node::message::MessageBatch;
use crate::node::Node;
use crate::route::outgoing;
use crate::route::outgoing::{Outgoing, Queued};
use crate::rpc::call_table::{CallError, Reply};
use crate::shared::Shared;
use busway_core::body::{BodyKind, Span};
use busway_core::frame::{FrameKind, CALL_HEADER_LEN};
use busway_core::BusId;
use bytes::{Bytes, BytesMut};
use std::time::Duration;

/// What a call does when `CALLS_PENDING_MAX` calls are pending already.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WhenFull {
    /// Wait (within the call's timeout) for a pending call to end.
    #[default]
    Wait,
    /// Fail at once with `CallError::TooManyPending`.
    Fail,
}

/// How a call is made (see [`Node::call_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallOptions {
    /// Longest wait for the reply, counted from the call (the wait for a free slot included).
    pub timeout: Duration,
    /// What to do past `CALLS_PENDING_MAX` pending calls.
    pub when_full: WhenFull,
}

impl Node {
    /// Sends `payload` to `dst` as a request and waits for its reply, at most `timeout`. The
    /// receiving application gets the request in its inbox (`Message::request`) and answers
    /// with `Message::reply`. Dropping the returned future cancels the call (a reply that
    /// comes later is dropped and counted in `Stats::late_replies`). Fails at once when `dst`
    /// cannot be reached (no route), and as soon as busway gives up on the request or on
    /// `dst` (down past its deadline, restarted).
    pub async fn call(
        &self,
        dst: BusId,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Reply, CallError> {
        let options = CallOptions {
            timeout,
            when_full: WhenFull::Wait,
        };
        self.call_with(dst, payload, options).await
    }

    /// [`Node::call`] with its options.
    pub async fn call_with(
        &self,
        dst: BusId,
        payload: Bytes,
        options: CallOptions,
    ) -> Result<Reply, CallError> {
        let shared = self.shared();
        let after_ms = options.timeout.as_millis() as u64;
        let timed_out = CallError::Timeout { after_ms };
        let work = async {
            let wait = options.when_full == WhenFull::Wait;
            let slot = shared
                .calls
                .slot(wait)
                .await
                .ok_or(CallError::TooManyPending {
                    max: crate::limits::CALLS_PENDING_MAX,
                })?;
            let mut call = shared.calls.register(dst, slot);
            let head = call.id.to_le_bytes();
            if dst == shared.config().id {
                call_self(shared, call.id, &payload)?;
            } else {
                let call_frame = Outgoing::framed(FrameKind::Call, &head, &payload);
                let queued: Queued = outgoing::enqueue(shared, dst, call_frame)
                    .await
                    .map_err(CallError::Send)?;
                shared.calls.sent(call.id, queued.path, queued.seqs.start);
            }
            (&mut call.done).await.unwrap_or(Err(CallError::Closed))
        };
        tokio::time::timeout(options.timeout, work)
            .await
            .unwrap_or(Err(timed_out))
    }
}

/// A call to this node itself: its request goes into the inbox as a message from us (checked
/// against the frame limit as a request to a peer is).
fn call_self(shared: &Shared, id: u64, payload: &Bytes) -> Result<(), CallError> {
    outgoing::check_size(shared, CALL_HEADER_LEN + payload.len()).map_err(CallError::Send)?;
    let mut buf = BytesMut::with_capacity(CALL_HEADER_LEN + payload.len());
    buf.extend_from_slice(&id.to_le_bytes());
    buf.extend_from_slice(payload);
    let buf = buf.freeze();
    let spans = vec![Span::new(0, buf.len() as u32, BodyKind::Call)];
    let me = shared.config().id;
    let requests = shared.calls.request(me, id).map(|r| (0, r));
    let batch = MessageBatch::with_requests(me, buf, spans, requests.into_iter().collect());
    match shared.app.inbox().deliver_now(batch) {
        Ok(true) => Ok(()),
        // As a peer's node answers a request its application cannot see.
        Ok(false) => Err(CallError::NoHandler {
            peer: me,
            reason: "this node's application dropped its inbox".into(),
        }),
        Err(_) => Err(CallError::Send(crate::SendError::InboxFull(me))),
    }
}
