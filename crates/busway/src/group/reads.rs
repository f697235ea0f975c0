//! What a node does with the group messages its peers send, read by a socket's link or a
//! ring's reader: a read's INTEREST, PUBLISH, MULTICAST and REPAIR messages, log offers and
//! answers, the group logs read from a peer's ring. The receive dispatcher (`node::dispatch`) and the
//! ring readers reach this through `peer::ring_link::GroupMessages`.

use crate::group::log_in::{self, AttachedLog};
use crate::group::{host, relay};
use crate::node::stats::bump;
use crate::peer::ring_link::GroupMessages;
use crate::shared::Shared;
use busway_core::body::Span;
use busway_core::frame::FrameKind;
use busway_core::group::state::GroupName;
use busway_core::group::{encode_log_answer, GroupLog, LogOffer};
use busway_core::{group, BusId};
use bytes::Bytes;
use std::sync::Weak;

/// The node's groups as its reads see them ([`GroupMessages`]), for the receive dispatcher
/// and the ring readers. Holds the node weakly: the node owns it (`GroupPart::reads`), and
/// its links and rings reach it through there.
pub(crate) struct NodeGroups(pub(crate) Weak<Shared>);

/// Why a read finds no node to hand its group messages to.
const NODE_GONE: &str = "the node stopped";

impl GroupMessages for NodeGroups {
    fn read(&self, from: BusId, chunk: &Bytes, spans: &[Span]) -> bool {
        (self.0.upgrade()).is_some_and(|node| read_groups(&node, from, chunk, spans))
    }

    fn log_answered(&self, from: BusId, answer: GroupLog<'_>) {
        if let Some(node) = self.0.upgrade() {
            log_answered(&node, from, answer);
        }
    }

    fn backlogged(&self, ring_peer: BusId) -> bool {
        (self.0.upgrade()).is_some_and(|node| backlogged(&node, ring_peer))
    }

    fn open_log(&self, from: BusId, offer: &LogOffer<'_>) -> Result<AttachedLog, String> {
        let node = self.0.upgrade().ok_or(NODE_GONE)?;
        open_log(&node, from, offer)
    }

    fn wants_group(&self, name: &str) -> bool {
        (self.0.upgrade()).is_some_and(|node| node.group.table.lock().wants(name))
    }

    fn sort_out_log(
        &self,
        from: BusId,
        group: &GroupName,
        chunk: &Bytes,
        spans: &[(u32, u32)],
    ) -> Result<bool, String> {
        let node = self.0.upgrade().ok_or(NODE_GONE)?;
        sort_out_log(&node, from, group, chunk, spans)
    }
}

/// Whether the inbox holds too many publishes not taken, or a publish waits for room
/// toward a peer other than `ring_peer` (see [`GroupMessages::backlogged`]).
fn backlogged(shared: &Shared, ring_peer: BusId) -> bool {
    if shared.app.inbox().group_backlogged() {
        host::note_app_behind(shared);
        return true;
    }
    // Not for a publish that waits for the ring's own peer: the room toward it comes
    // with what the ring brings (see `wait_blocked_forwards`).
    relay::push_blocked_forwards(shared)
        .is_some_and(|(peer, _, _)| peer.id != ring_peer || shared.group.table.waiting.over_bound())
}

/// Opens the log of a group the direct peer `from` offered on its ring, or says why not.
fn open_log(shared: &Shared, from: BusId, offer: &LogOffer<'_>) -> Result<AttachedLog, String> {
    if !shared.config().group_logs {
        return Err("group logs are off on this node (NodeConfig::group_logs)".into());
    }
    let group = {
        let groups = shared.group.table.lock();
        if !groups.wants(offer.name) {
            return Err("this node does not want the group".into());
        }
        // A publisher reached by `connect` does not know that this node relays the group.
        // The log's records would overtake the publishes still on the link, and they would
        // be passed on in the order they came (those the link brings later, never).
        if groups.passes_on_from(offer.name, from) {
            return Err("this node passes the group on: it takes the publisher's stream by the link, in order".into());
        }
        groups.name_of(offer.name)
    };
    log_in::open(from, offer, group, shared.config().shm_ring_bytes)
}

/// Publishes read from the log of `group` that the direct peer `from` offered (see
/// `busway_core::group::publishes::log_read`). True if publishes went to the inbox, or
/// wait for room.
fn sort_out_log(
    shared: &Shared,
    from: BusId,
    group: &GroupName,
    chunk: &Bytes,
    spans: &[(u32, u32)],
) -> Result<bool, String> {
    let now_ms = shared.clock.coarse_ms();
    let (read, handed) = host::group_call(shared, None, |h| {
        group::publishes::log_read(h, (from, group), chunk, spans, now_ms)
    });
    read?;
    Ok(handed || shared.group.table.waiting.any())
}

/// Declines the direct peer `from`'s offer of its log of a group, read from a socket, not a
/// ring: a log is read beside the ring of the link it was offered on.
pub(crate) fn decline_log_offer(shared: &Shared, from: BusId, offer: LogOffer<'_>) {
    if let Some(peer) = shared.peer(from) {
        let answer = encode_log_answer(offer.name, offer.token, offer.serial, false);
        let _ = peer.push_framed(FrameKind::GroupLog, &answer, &Bytes::new());
    }
}

/// Acts on a read's group messages (`spans`, from `from` in `chunk`: a direct peer, or for
/// REPAIR the source end to end; see `busway_core::group::reads`): publishes are handed to
/// this node's inbox in each publisher's order (see `busway_core::turns`: the caller stops
/// reading while the inbox is backlogged). True if publishes went to the inbox, or wait for
/// room.
fn read_groups(shared: &Shared, from: BusId, chunk: &Bytes, spans: &[Span]) -> bool {
    let now_ms = shared.clock.coarse_ms();
    let (interest_changed, handed, left) = host::group_decide(shared, None, |h| {
        group::reads::read(h, from, chunk, spans, now_ms)
    });
    if interest_changed {
        shared.group.active.notify_waiters();
    }
    if interest_changed || left {
        host::sync_group_adverts(shared);
    }
    handed || shared.group.table.waiting.any()
}

/// `from` answered the offer of this node's log of a group (see `group::log_out`).
fn log_answered(shared: &Shared, from: BusId, answer: GroupLog<'_>) {
    let GroupLog::Answer {
        name,
        token,
        serial,
        accept,
    } = answer
    else {
        return;
    };
    let Some(peer) = shared.peer(from) else {
        return;
    };
    if !accept {
        bump(&shared.counters.group_logs_declined);
    }
    // The log's own account of its readers decides what goes by link (see `publish`).
    if shared
        .group
        .logs
        .answered(name, &peer, (token, serial), accept)
    {
        bump(&shared.counters.group_logs_accepted);
    }
}
