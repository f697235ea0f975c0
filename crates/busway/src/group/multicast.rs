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

use crate::node::Node;
use crate::peer::PushError;
use crate::routing::Hops;
use crate::stats::bump;
use busway_core::frame::FrameKind;
use busway_core::multicast::encode_multicast_head;
use busway_core::multicast::node::split_by_hop;
use busway_core::multicast::{MULTICAST_FIXED_BYTES, MULTICAST_HOPS_MAX};
use busway_core::multicast::{MULTICAST_RECEIVERS_MAX, MULTICAST_RECEIVER_BYTES};
use busway_core::BusId;
use bytes::Bytes;

/// Why a multicast failed; nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MulticastError {
    /// The list of receivers is empty.
    NoReceivers,
    /// More receivers than `MULTICAST_RECEIVERS_MAX` (after duplicates are removed).
    TooMany { count: usize, max: usize },
    /// The payload and a frame's head naming every receiver do not fit one frame.
    TooLarge { len: usize, max: usize },
    /// This node has no route to these receivers (never linked, no relay to ask).
    NoRoute(Vec<BusId>),
    /// The node is shutting down.
    Closed,
}

impl std::fmt::Display for MulticastError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoReceivers => write!(f, "a multicast needs at least one receiver"),
            Self::TooMany { count, max } => {
                write!(f, "a multicast to {count} receivers (at most {max})")
            }
            Self::TooLarge { len, max } => write!(
                f,
                "a multicast of {len} bytes to this many receivers does not fit a frame (at most {max})"
            ),
            Self::NoRoute(ids) => {
                let ids: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
                write!(f, "no route to bus ids {}", ids.join(", "))
            }
            Self::Closed => write!(f, "the node is shutting down"),
        }
    }
}

impl std::error::Error for MulticastError {}

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
        let me = shared.config.id;
        let mut receivers: Vec<BusId> = to.to_vec();
        receivers.sort_unstable();
        receivers.dedup();
        if receivers.is_empty() {
            return Err(MulticastError::NoReceivers);
        }
        if receivers.len() > MULTICAST_RECEIVERS_MAX {
            return Err(MulticastError::TooMany {
                count: receivers.len(),
                max: MULTICAST_RECEIVERS_MAX,
            });
        }
        let to_me = receivers.binary_search(&me).is_ok();
        receivers.retain(|&id| id != me);
        let head_max = MULTICAST_FIXED_BYTES + MULTICAST_RECEIVER_BYTES * receivers.len();
        let max = shared.config.frame_body_max;
        if head_max + payload.len() > max {
            return Err(MulticastError::TooLarge {
                len: payload.len(),
                max: max.saturating_sub(head_max),
            });
        }
        if shared.is_shutting_down() {
            return Err(MulticastError::Closed);
        }
        let unrouted_of = |hops: Hops| -> Vec<BusId> {
            receivers
                .iter()
                .copied()
                .filter(|&id| !shared.has_route(id, &hops))
                .collect()
        };
        let unrouted = unrouted_of(shared.hops());
        // Receivers only etcd knows are dialed first, as a send to one of them is.
        #[cfg(feature = "etcd")]
        let unrouted = if !unrouted.is_empty() && shared.discover_all(&unrouted).await {
            unrouted_of(shared.hops())
        } else {
            unrouted
        };
        if !unrouted.is_empty() {
            return Err(MulticastError::NoRoute(unrouted));
        }
        let now_ms = shared.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
        let numbered = shared
            .multicasts
            .lock()
            .number(&receivers, &payload, now_ms);
        let mut reached = 0;
        // Checked above: every receiver had a route (one lost since asks once it is back).
        let (split, _) = split_by_hop(shared, numbered.into_iter(), None);
        for (peer, list) in split {
            let Some(peer) = shared.peer(peer) else {
                // Gone since: those receivers ask for copies once a path is back.
                bump(&shared.counters.multicast_forwards_dropped);
                continue;
            };
            let head =
                encode_multicast_head(me, shared.incarnation, false, MULTICAST_HOPS_MAX, &list);
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
            let batch = crate::message::MessageBatch::single(me, payload);
            shared.inbox.deliver(batch).await;
            reached += 1;
        }
        Ok(reached)
    }
}
