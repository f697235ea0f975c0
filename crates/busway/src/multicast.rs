//! Multicast: `Node::multicast` to an explicit list of receivers, and what a node does with
//! the MULTICAST messages its peers send (see `busway_core::multicast` for the frame and
//! `multicast_table` for the numbers, what is kept and the receivers' streams).
//!
//! The source numbers the multicast per receiver, splits the receivers by the link that leads
//! to each (its unicast route) and writes one MULTICAST per link naming the receivers behind
//! it, the payload shared. A relay does the same with the receivers it got: delivers to
//! itself if named, passes the rest on, one frame per link. Each MULTICAST is a message of its
//! link like any other (numbered, acknowledged, resent over a link that drops and comes back);
//! what a relay loses (it died, or a link's queue was full) the receiver sees as a gap in its
//! numbers and asks the source to repair, as a group member does.

use crate::event::Event;
use crate::handover::Delivered;
use crate::node::Node;
use crate::peer::{Peer, PushError};
use crate::routing::Hops;
use crate::shared::Shared;
use crate::stats::bump;
use busway_core::frame::FrameKind;
use busway_core::group::stream::Offer;
use busway_core::group::{encode_repair_unreachable, Repair, MULTICAST_STREAM};
use busway_core::multicast::{decode_multicast, encode_multicast_head, MulticastHead};
use busway_core::multicast::{MULTICAST_FIXED_BYTES, MULTICAST_HOPS_MAX};
use busway_core::multicast::{MULTICAST_RECEIVERS_MAX, MULTICAST_RECEIVER_BYTES};
use busway_core::BusId;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Receivers of a multicast with their numbers.
type Numbered = Vec<(BusId, u64)>;

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
        let numbered = shared.multicasts.number(&receivers, &payload, now_ms);
        let mut reached = 0;
        let mut later = Vec::new();
        for (peer, list) in shared.split_by_hop(numbered.into_iter(), None, &mut later) {
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

impl Shared {
    /// The link a multicast to `dst` takes: a direct link to it (even while it is down: its
    /// queue is resent when it is back), else the unicast next hop; never `except` (the peer
    /// it came from).
    fn multicast_hop(&self, dst: BusId, except: Option<BusId>, hops: &Hops) -> Option<Arc<Peer>> {
        if let Some(p) = self.peer(dst) {
            if !(p.discovered && p.is_dead()) && Some(p.id) != except {
                return Some(p);
            }
        }
        hops.next(dst, except)
    }

    /// Receivers (with their numbers) split by the link that leads to each, in chunks of at
    /// most `MULTICAST_RECEIVERS_MAX`; receivers without a link now are put in `unrouted`
    /// (a relay reports them; a source's receivers ask once a link is back).
    fn split_by_hop(
        &self,
        receivers: impl Iterator<Item = (BusId, u64)>,
        except: Option<BusId>,
        unrouted: &mut Numbered,
    ) -> Vec<(Arc<Peer>, Numbered)> {
        let hops = self.hops();
        let mut by_hop: BTreeMap<BusId, (Arc<Peer>, Numbered)> = BTreeMap::new();
        for (id, number) in receivers {
            match self.multicast_hop(id, except, &hops) {
                Some(p) => by_hop
                    .entry(p.id)
                    .or_insert_with(|| (p, Vec::new()))
                    .1
                    .push((id, number)),
                None => unrouted.push((id, number)),
            }
        }
        let mut out = Vec::with_capacity(by_hop.len());
        for (_, (peer, list)) in by_hop {
            for chunk in list.chunks(MULTICAST_RECEIVERS_MAX) {
                out.push((peer.clone(), chunk.to_vec()));
            }
        }
        out
    }

    /// A MULTICAST (or mark) from the direct peer `from`, its body at `start..start + len`
    /// of `chunk`: delivered here if this node is named (in its source's order, into `out`),
    /// passed on toward the others; true if this node's stream has a gap to ask for.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn multicast_received(
        &self,
        from: BusId,
        link: &mut Option<busway_core::relay::Sources>,
        chunk: &Bytes,
        (start, len): (u32, u32),
        body: &Bytes,
        now_ms: u64,
        out: &mut Delivered<'_>,
    ) -> bool {
        // Checked by `message_spans`.
        let Ok(head) = decode_multicast(body) else {
            return false;
        };
        let me = self.config.id;
        if let Err(why) = self.may_speak_for(from, head.source, "MULTICAST", link) {
            bump(&self.counters.multicasts_refused);
            self.refuse_link(from, why);
            return false;
        }
        let mut gap = false;
        let mut onward = Vec::new();
        for (id, number) in head.receivers() {
            if id != me {
                onward.push((id, number));
                continue;
            }
            let at = head.payload_at as u32;
            let payload = || body.slice(head.payload_at..);
            let got = self.multicasts.received(
                head.source,
                head.incarnation,
                number,
                head.mark,
                now_ms,
                payload,
                out,
            );
            if let Some(ended) = got.ended {
                let why = format!("source {} restarted before they came", head.source);
                multicast_skipped(self, head.source, ended, why, out);
            }
            match got.offer {
                Some(Offer::Deliver { then }) => {
                    out.span(head.source, None, chunk, (start + at, len - at));
                    out.payloads(head.source, None, then);
                }
                Some(Offer::Stale) => bump(&self.counters.group_copies_dropped),
                _ => {}
            }
            gap |= got.gap;
        }
        if !onward.is_empty() {
            self.pass_multicast_on(from, &head, body, onward);
        }
        gap
    }

    /// Passes a multicast on toward `onward` (receivers other than this node), one frame per
    /// link, with one hop less; what cannot go (no hop left, no route, a full queue) is
    /// dropped and counted, and those receivers ask the source for copies.
    fn pass_multicast_on(
        &self,
        from: BusId,
        head: &MulticastHead<'_>,
        body: &Bytes,
        onward: Vec<(BusId, u64)>,
    ) {
        if head.hops_left <= 1 {
            let why = format!(
                "out of hops (MULTICAST_HOPS_MAX) at relay {}",
                self.config.id
            );
            self.multicast_unreachable(head, &onward, &why);
            return;
        }
        let payload = body.slice(head.payload_at..);
        let mut unrouted = Vec::new();
        let split = self.split_by_hop(onward.into_iter(), Some(from), &mut unrouted);
        if !unrouted.is_empty() {
            let why = format!("no route at relay {}", self.config.id);
            self.multicast_unreachable(head, &unrouted, &why);
        }
        let upstream = self.upstream_id();
        for (peer, list) in split {
            // Up there a multicast in the name of a source the upstream does not hold
            // registered for us would close our link (see `registrations`).
            if Some(peer.id) == upstream && !self.may_pass_to(peer.id, head.source) {
                self.counters
                    .multicast_forwards_dropped
                    .fetch_add(list.len() as u64, std::sync::atomic::Ordering::Relaxed);
                continue;
            }
            let new_head = encode_multicast_head(
                head.source,
                head.incarnation,
                head.mark,
                head.hops_left - 1,
                &list,
            );
            let fits = peer
                .frame_body_max()
                .is_none_or(|m| new_head.len() + payload.len() <= m);
            // A relay never waits for one receiver: a full link's receivers repair the gap.
            if !fits
                || peer
                    .push_framed(FrameKind::Multicast, &new_head, &payload)
                    .is_err()
            {
                self.counters
                    .multicast_forwards_dropped
                    .fetch_add(list.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// A REPAIR about the multicast stream (`MULTICAST_STREAM`) from `from`, end to end, its
    /// body at `start` of `chunk`: an ask answered from what this source keeps, a copy or a
    /// loss applied to this receiver's stream; true if a gap is left to ask for.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn multicast_repair_received(
        &self,
        from: BusId,
        chunk: &Bytes,
        start: u32,
        body: &Bytes,
        repair: Repair<'_>,
        now_ms: u64,
        out: &mut Delivered<'_>,
    ) -> bool {
        match repair {
            Repair::Ask {
                incarnation,
                from: first,
                to,
                ..
            } => {
                self.answer_repair_ask(from, MULTICAST_STREAM, (first, to), now_ms, || {
                    self.multicasts
                        .repair(from, incarnation, self.incarnation, (first, to))
                });
                false
            }
            Repair::Copy(head) => {
                if head.publisher != from {
                    tracing::warn!(peer = %from, source = %head.publisher, "REPAIR copy of another node's multicast: dropped");
                    bump(&self.counters.group_repairs_refused);
                    return false;
                }
                let payload = || body.slice(head.payload_at..);
                let got = self.multicasts.repaired(
                    from,
                    head.incarnation,
                    head.number,
                    now_ms,
                    payload,
                    out,
                );
                let Some((offer, gap)) = got else {
                    bump(&self.counters.group_repairs_refused);
                    return false;
                };
                if let Offer::Deliver { then } = offer {
                    let at = head.payload_at as u32;
                    out.span(from, None, chunk, (start + at, body.len() as u32 - at));
                    out.payloads(from, None, then);
                }
                gap
            }
            Repair::Lost {
                incarnation,
                from: first,
                to,
                ..
            } => {
                match self
                    .multicasts
                    .lost(from, incarnation, (first, to), now_ms, out)
                {
                    Some(skipped) => {
                        let why = format!(
                            "source {from} no longer holds multicasts {first}.. (its group_retain_bytes)"
                        );
                        multicast_skipped(self, from, skipped, why, out);
                    }
                    None => bump(&self.counters.group_repairs_refused),
                }
                false
            }
            // About a group, never the multicast stream (a refusal names its group).
            Repair::Refused { .. } => false,
            Repair::Unreachable {
                incarnation,
                receiver,
                number,
                reason,
            } => {
                if incarnation == self.incarnation {
                    tracing::warn!(relay = %from, %receiver, number, reason, "multicast receiver unreachable");
                    self.emit(Event::MulticastUnreachable {
                        receiver,
                        number,
                        relay: from,
                        reason: reason.to_owned(),
                    });
                } else {
                    bump(&self.counters.group_repairs_refused);
                }
                false
            }
        }
    }

    /// Receivers of a multicast this relay cannot pass it on to: dropped and counted, and
    /// the source is told (REPAIR unreachable, at most once a second per receiver); the
    /// receivers' own gap, if they exist, is theirs to repair once a way is back.
    fn multicast_unreachable(&self, head: &MulticastHead<'_>, receivers: &Numbered, why: &str) {
        self.counters
            .multicast_forwards_dropped
            .fetch_add(receivers.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let now_ms = self.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
        for &(receiver, number) in receivers {
            if !self
                .multicasts
                .report_unreachable(head.source, receiver, now_ms)
            {
                continue;
            }
            let text = format!("{why} for bus id {receiver}");
            tracing::debug!(source = %head.source, %receiver, "multicast receiver unreachable: {text}");
            let body = encode_repair_unreachable(head.incarnation, receiver, number, &text);
            // Best effort: a report that does not fit is made at a later multicast.
            let _ = self.try_send_framed(head.source, FrameKind::Repair, &body, &Bytes::new());
        }
    }

    /// Sends marks (the last number) for `marks` (receiver, number), one frame per link;
    /// returns those that did not fit a queue.
    fn send_multicast_marks(&self, marks: Vec<(BusId, u64)>) -> Vec<(BusId, u64)> {
        let mut unsent = Vec::new();
        let mut later = Vec::new();
        for (peer, list) in self.split_by_hop(marks.into_iter(), None, &mut later) {
            let head = encode_multicast_head(
                self.config.id,
                self.incarnation,
                true,
                MULTICAST_HOPS_MAX,
                &list,
            );
            if peer
                .push_framed(FrameKind::Multicast, &head, &Bytes::new())
                .is_err()
            {
                unsent.extend(list);
            }
        }
        unsent
    }

    /// A link to `peer` came up: the receivers this node multicast to behind it get a mark,
    /// so that one behind a relay that restarted (and lost what it held) sees its gap.
    pub(crate) fn multicast_link_up(&self, peer: BusId) {
        let marks = self.multicasts.all_marks();
        if marks.is_empty() {
            // Every link that comes up passes here: a node that never multicast is done.
            return;
        }
        let hops = self.hops();
        let behind: Vec<(BusId, u64)> = marks
            .into_iter()
            .filter(|&(id, _)| {
                self.multicast_hop(id, None, &hops)
                    .is_some_and(|p| p.id == peer)
            })
            .collect();
        if !behind.is_empty() {
            self.send_multicast_marks(behind);
        }
    }

    /// The multicasts' timers, on the retry tick: tail marks of receivers gone quiet, and
    /// gaps given up on (what waited behind them goes to the inbox).
    pub(crate) fn multicast_tick(&self, now_ms: u64) {
        if self.multicasts.is_idle() {
            return;
        }
        let marks = self.multicasts.tail_marks(now_ms);
        if !marks.is_empty() {
            for (id, _) in self.send_multicast_marks(marks) {
                // Its queue was full: marked again on a later tick.
                self.multicasts.unmark(id);
            }
        }
        let mut out = self.delivered();
        for (source, skipped, why) in self.multicasts.overdue(now_ms, &mut out) {
            multicast_skipped(self, source, skipped, why, &mut out);
        }
    }
}

/// Multicasts of `source` that will never come were skipped: what waited behind them is
/// delivered, then the application is told how many (`Event::MulticastGap`).
pub(crate) fn multicast_skipped(
    shared: &Shared,
    source: BusId,
    skipped: busway_core::group::stream::Skipped,
    reason: String,
    out: &mut Delivered<'_>,
) {
    out.payloads(source, None, skipped.deliver);
    if skipped.missed == 0 {
        return;
    }
    tracing::warn!(%source, missed = skipped.missed, %reason, "multicasts lost");
    shared.emit(Event::MulticastGap {
        source,
        missed: skipped.missed,
        reason,
    });
}
