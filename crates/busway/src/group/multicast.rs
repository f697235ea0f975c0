//! Multicast: `Node::multicast` to an explicit list of receivers (see `busway_core::multicast`
//! for the frame, `busway_core::multicast::node` for what a node does with the MULTICASTs its
//! peers send, and `group::host` for the runtime's side of that).
//!
//! The source numbers the multicast per receiver, splits the receivers by the link that leads
//! to each (its unicast route) and writes one MULTICAST per link naming the receivers behind
//! it, the payload shared. A relay does the same with the receivers it got: delivers to
//! itself if named, passes the rest on, one frame per link. Each MULTICAST is a message of its
//! link like any other (numbered, acknowledged, resent over a link that drops and comes back);
//! what a relay loses (it died, or a link's queue was full) the receiver sees as a gap in its
//! numbers and asks the source to repair, as a group member does.

use crate::group::host::NodeRoutes;
use crate::node::stats::bump;
use crate::node::Node;
use crate::peer::PushError;
use crate::route;
use crate::route::Hops;
use busway_core::frame::FrameKind;
use busway_core::multicast::calls::receivers;
use busway_core::multicast::encode_multicast_head;
use busway_core::multicast::node::split_by_hop;
use busway_core::multicast::MULTICAST_HOPS_MAX;
use busway_core::BusId;
use bytes::Bytes;

pub use busway_core::multicast::calls::MulticastError;

impl Node {
    /// Sends `payload` to each of `to` (duplicates count once; this node's own id delivers
    /// to its own inbox): one MULTICAST per link that leads to some of them, naming those
    /// behind it, the payload shared; relays on the way split it the same way. Each receiver
    /// gets this source's multicasts in the order made, once, each as a message from this
    /// node (`Message::group` is `None`); a multicast a relay loses is repaired from the
    /// copies this node keeps (`NodeConfig::group_retain_bytes`), and one that cannot be is
    /// reported to the receiver (`Event::MulticastGap`). Waits for room on a full link, as
    /// `send` does. Returns how many places it went to (links, and this node's inbox); a
    /// receiver routed through a link that is down for now is reached when it is back. With
    /// etcd discovery (the `etcd` feature), receivers with no route that etcd names are
    /// dialed first, as `send` does for one.
    pub async fn multicast(&self, to: &[BusId], payload: Bytes) -> Result<usize, MulticastError> {
        let shared = self.shared();
        let me = shared.config().id;
        let frame_max = shared.config().frame_body_max;
        let (receivers, to_me) = receivers(to, me, payload.len(), frame_max)?;
        if shared.is_shutting_down() {
            return Err(MulticastError::Closed);
        }
        let unrouted_of = |hops: Hops| -> Vec<BusId> {
            receivers
                .iter()
                .copied()
                .filter(|&id| !route::has_route(shared, id, &hops))
                .collect()
        };
        let unrouted = unrouted_of(route::hops(shared));
        // Receivers only etcd knows are dialed first, as a send to one of them is.
        let unrouted = if !unrouted.is_empty()
            && crate::route::outgoing::discover_all(shared, &unrouted).await
        {
            unrouted_of(route::hops(shared))
        } else {
            unrouted
        };
        if !unrouted.is_empty() {
            return Err(MulticastError::NoRoute(unrouted));
        }
        let now_ms = shared.clock.coarse_ms();
        let numbered = shared
            .group
            .multicasts
            .lock()
            .number(&receivers, &payload, now_ms);
        let mut reached = 0;
        // Checked above: every receiver had a route (one lost since asks once it is back).
        let (split, _) = split_by_hop(&NodeRoutes(shared), numbered.into_iter(), None);
        for (peer, list) in split {
            let Some(peer) = shared.peer(peer) else {
                // Gone since: those receivers ask for copies once a path is back.
                bump(&shared.counters.multicast_forwards_dropped);
                continue;
            };
            let head =
                encode_multicast_head(me, shared.incarnation(), false, MULTICAST_HOPS_MAX, &list);
            let len = head.len() + payload.len();
            if peer.frame_body_max().is_some_and(|m| len > m) {
                // The peer closes a link over a frame past its stated limit.
                bump(&shared.counters.multicast_forwards_dropped);
                continue;
            }
            loop {
                match peer.push_framed(FrameKind::Multicast, &head, &payload) {
                    Ok(_) => {
                        reached += 1;
                        break;
                    }
                    Err(PushError::Full) => peer.wait_for_room(len).await,
                    // Gone for good: those receivers ask for copies once a path is back.
                    Err(_) => {
                        bump(&shared.counters.multicast_forwards_dropped);
                        break;
                    }
                }
            }
        }
        if to_me {
            let batch = crate::node::message::MessageBatch::single(me, payload);
            shared.app.inbox().deliver(batch).await;
            reached += 1;
        }
        Ok(reached)
    }
}
