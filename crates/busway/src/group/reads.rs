//! What a node does with the group messages its peers send, read by a socket's link or a
//! ring's reader: INTEREST and PUBLISH sorted out of a read, log offers and answers, the
//! group logs read from a peer's ring. The receive dispatcher (`node::dispatch`) and the
//! ring readers reach this through `peer::ring_link::GroupMessages`.

use crate::group::log_in::{self, AttachedLog};
use crate::group::{host, relay};
use crate::node::stats::bump;
use crate::peer::ring_link::GroupMessages;
use crate::shared::Shared;
use busway_core::frame::FrameKind;
use busway_core::group::reads::{is_group_span, take_log_frames};
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
    fn sort_out(&self, from: BusId, chunk: &Bytes, spans: &mut Vec<(u32, u32)>) -> bool {
        // Every read of every link passes here: one with no group message takes none of the
        // groups' locks, nor touches the node's count of references (every I/O thread's).
        if !spans.iter().any(|&(_, tagged)| is_group_span(tagged)) {
            return false;
        }
        (self.0.upgrade()).is_some_and(|node| sort_out_groups(&node, from, chunk, spans))
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

/// Declines the GROUP_LOG offers left in `spans` (read from a socket, not a ring: a log
/// is read beside the ring of the link it was offered on).
pub(crate) fn decline_log_offers(
    shared: &Shared,
    from: BusId,
    chunk: &Bytes,
    spans: &mut Vec<(u32, u32)>,
) {
    let peer = shared.peer(from);
    take_log_frames(chunk, spans, |frame| {
        if let (GroupLog::Offer(o), Some(peer)) = (frame, &peer) {
            let answer = encode_log_answer(o.name, o.token, o.serial, false);
            let _ = peer.push_framed(FrameKind::GroupLog, &answer, &Bytes::new());
        }
        true
    });
}

/// Takes the group messages out of `spans` (messages from `from` in `chunk`: a direct
/// peer, or for REPAIR the source end to end) and acts on them (see
/// `busway_core::group::reads`): publishes are handed to this node's inbox in each
/// publisher's order (see `busway_core::turns`: the caller stops reading while the inbox is
/// backlogged). A GROUP_LOG answer is taken here; an offer stays for the reader of the
/// ring it came on (see `ring_rx`; a socket's reader declines it). True if publishes went
/// to the inbox, or wait for room.
fn sort_out_groups(
    shared: &Shared,
    from: BusId,
    chunk: &Bytes,
    spans: &mut Vec<(u32, u32)>,
) -> bool {
    // `NodeGroups::sort_out` looked: the read carries a group message.
    take_log_answers(shared, from, chunk, spans);
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

/// Takes the GROUP_LOG answers out of `spans`: `from` answered the offer of this node's
/// log of a group (see `group::log_out`).
fn take_log_answers(shared: &Shared, from: BusId, chunk: &Bytes, spans: &mut Vec<(u32, u32)>) {
    let peer = shared.peer(from);
    take_log_frames(chunk, spans, |frame| {
        let GroupLog::Answer {
            name,
            token,
            serial,
            accept,
        } = frame
        else {
            return false;
        };
        // The log's own account of its readers decides what goes by link (see `publish`).
        let answered = |p| shared.group.logs.answered(name, p, (token, serial), accept);
        if peer.as_ref().is_some_and(answered) {
            bump(&shared.counters.group_logs_accepted);
        }
        true
    });
}
