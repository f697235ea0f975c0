//! How a node's replies leave it: the [`Replier`] its call table hands each request.

use crate::route::outgoing::{self, Blocked, Outgoing};
use crate::rpc::call_table::reply_head;
use crate::rpc::request::{Replier, ReplyError, ReplyFuture};
use crate::shared::Shared;
use busway_core::frame::FrameKind;
use busway_core::frame::REPLY_HEADER_LEN;
use busway_core::BusId;
use bytes::Bytes;
use std::sync::Weak;

/// Sends this node's replies ([`Replier`]) for the requests its call table hands out. Holds
/// the node weakly: the node owns its call table, which owns this.
pub(crate) struct NodeReplier(pub(crate) Weak<Shared>);

/// The head of a REPLY to `to`, or `None` when the reply is to this node's own call
/// (which it ends here).
fn reply_head_to(
    shared: &Shared,
    to: BusId,
    id: u64,
    status: u8,
    payload: &Bytes,
) -> Option<[u8; REPLY_HEADER_LEN]> {
    if to == shared.config().id {
        shared.calls.on_reply(to, id, status, payload.clone());
        return None;
    }
    Some(reply_head(id, status))
}

impl Replier for NodeReplier {
    fn reply(&self, to: BusId, id: u64, status: u8, payload: Bytes) -> ReplyFuture<'_> {
        Box::pin(async move {
            let node = self.0.upgrade().ok_or(ReplyError::NodeGone)?;
            let Some(head) = reply_head_to(&node, to, id, status, &payload) else {
                return Ok(());
            };
            let reply = Outgoing::framed(FrameKind::Reply, &head, &payload);
            outgoing::enqueue(&node, to, reply)
                .await
                .map(drop)
                .map_err(ReplyError::Send)
        })
    }

    fn try_reply(&self, to: BusId, id: u64, status: u8, payload: Bytes) -> Result<(), ReplyError> {
        let node = self.0.upgrade().ok_or(ReplyError::NodeGone)?;
        let Some(head) = reply_head_to(&node, to, id, status, &payload) else {
            return Ok(());
        };
        outgoing::check_size(&node, head.len() + payload.len()).map_err(ReplyError::Send)?;
        let reply = Outgoing::framed(FrameKind::Reply, &head, &payload);
        match outgoing::try_enqueue(&node, to, None, &reply) {
            Ok(_) => Ok(()),
            Err(Blocked::Full(_)) => Err(ReplyError::Full(to)),
            Err(Blocked::Failed(e)) => Err(ReplyError::Send(e)),
        }
    }
}
