//! The one receive dispatcher: what a read delivered is sorted the same way whichever way it
//! came (a socket, a relay, a peer's ring). Group messages go to the group part, a peer's
//! offers of its group logs to the reader's own rule, replies to the calls waiting for them;
//! plain messages and requests go on to the inbox as one batch.

use crate::node::message::MessageBatch;
use crate::peer::ring_link::GroupMessages;
use crate::rpc::call_table::CallTable;
use busway_core::BusId;
use bytes::Bytes;

/// Sorts what one read delivered from `src` (the spans of `chunk`): group messages to
/// `groups` (the node; `None` once it is gone), the peer's offers of its group logs to
/// `log_offers` (a ring's reader attaches them, as they live with its ring; a socket's reader
/// declines them), replies to the calls in `calls`. Returns the batch left for the inbox
/// (plain messages, and requests with the handle to answer them), if anything is left, and
/// whether group publishes went to the inbox.
pub(crate) fn dispatch(
    groups: Option<&dyn GroupMessages>,
    calls: &CallTable,
    src: BusId,
    chunk: Bytes,
    mut spans: Vec<(u32, u32)>,
    log_offers: impl FnOnce(&Bytes, &mut Vec<(u32, u32)>),
) -> (Option<MessageBatch>, bool) {
    let handed = groups.is_some_and(|g| g.sort_out(src, &chunk, &mut spans));
    log_offers(&chunk, &mut spans);
    let requests = calls.sort_out(src, &chunk, &mut spans);
    let batch =
        (!spans.is_empty()).then(|| MessageBatch::with_requests(src, chunk, spans, requests));
    (batch, handed)
}
