//! Groups: `Node::join`, `Node::leave` and `Node::publish`, and what a node does with the
//! INTEREST and PUBLISH messages its peers send (see `busway_core::group` for the frames and
//! `busway_core::group::locked` for the state behind its locks).
//!
//! A publish is framed once per link: the publisher sends one PUBLISH to each peer that asked
//! for the group, sharing the payload; a node that receives one hands it to its application
//! if it is a member and passes the same bytes on to each other peer that asked, so a
//! relay fans out to the members linked to it. Each PUBLISH is a message of its pair like any
//! other: numbered, acknowledged, and resent over a link that drops and comes back.

use crate::group::Delivered;
use crate::node::event::Path;
use crate::node::message::MessageBatch;
use crate::node::stats::bump;
use crate::node::Node;
use crate::peer::Peer;
use crate::shared::Shared;
use busway_core::frame::FrameKind;
use busway_core::group::calls::check_publish;
use busway_core::group::check_name;
use busway_core::group::encode_publish_head;
use busway_core::group::publishes::{plain_push, push_own, OwnPush};
use busway_core::group::reads::{is_group_span, take_log_frames};
use busway_core::group::state::{GroupName, GroupPolicy, Published};
use busway_core::group::PUBLISH_BACKPRESSURE_BIT;
use busway_core::group::{encode_log_answer, GroupLog};
use busway_core::turns::Batch;
use busway_core::{group, BusId};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

pub use busway_core::group::calls::GroupError;

impl Node {
    /// Joins `group`: from the moment each peer has read this node's INTEREST, publishes to
    /// the group reach this node's inbox (`Message::group` names the group, `Message::src`
    /// the publisher), wherever they are published: this node, a linked node, or a node
    /// that reaches this one through relays (see `docs/SEMANTICS.md`, "Groups"). Joining a
    /// group twice is joining it once.
    pub fn join(&self, group: &str) -> Result<(), GroupError> {
        check_name(group).map_err(GroupError::BadName)?;
        let joined = self.shared().group.table.lock().join(group);
        if joined.map_err(GroupError::BadName)? {
            self.shared().group.active.notify_waiters();
            self.shared().sync_group_adverts();
        }
        Ok(())
    }

    /// Leaves `group`: its publishes stop coming once the peers have read this node's
    /// INTEREST (a few may still be in flight).
    pub fn leave(&self, group: &str) {
        if self.shared().group.table.lock().leave(group) {
            self.shared().sync_group_adverts();
        }
    }

    /// Sets what `publish` to `group` does when a link toward its members stays full:
    /// [`GroupPolicy::CutOff`] (the default: the others keep their rate, a member that falls
    /// too far behind is cut off) or [`GroupPolicy::Backpressure`] (the group moves at its
    /// slowest linked member).
    pub fn set_group_policy(&self, group: &str, policy: GroupPolicy) {
        self.shared().group.table.lock().set_policy(group, policy);
    }

    /// The groups this node joined, sorted.
    pub fn groups(&self) -> Vec<String> {
        self.shared().group.table.lock().joined()
    }

    /// The peers this node sends `group`'s publishes to (those that asked for them, for
    /// themselves or for nodes behind them), sorted.
    pub fn group_links(&self, group: &str) -> Vec<BusId> {
        self.shared().group.table.lock().wanted_by(group)
    }

    /// Publishes `payload` to every member of `group`: one PUBLISH per link that leads to a
    /// member, the payload shared, not copied per link; this node's own inbox too if it is a
    /// member. It is kept (`NodeConfig::group_retain_bytes`) for members that lose it with a
    /// relay and ask for a copy. A link whose queue is full is waited for at most
    /// `GROUP_SLOW_MEMBER_WAIT_MS` (`GROUP_HOP_WAIT_MS` toward a relay) and then skipped while it stays full
    /// (`GroupPolicy::CutOff`, the default), or as long as it takes, relays on the way waiting
    /// too (`GroupPolicy::Backpressure`; see [`Node::set_group_policy`] and
    /// `docs/SEMANTICS.md`). Returns how many places it went to (links, and this node's
    /// inbox): 0 when no member is known, which is counted in `Stats::publishes_unheard`.
    pub async fn publish(&self, group: &str, payload: Bytes) -> Result<usize, GroupError> {
        let shared = self.shared();
        let len = check_publish(group, payload.len(), shared.config().frame_body_max)?;
        if shared.is_shutting_down() {
            return Err(GroupError::Closed);
        }
        let now_ms = shared.clock.coarse_ms();
        let published = shared.group.table.lock().publish(group, &payload, now_ms);
        let policy = published.policy;
        let flag = match policy {
            GroupPolicy::Backpressure => PUBLISH_BACKPRESSURE_BIT,
            GroupPolicy::CutOff => 0,
        };
        let head = encode_publish_head(
            shared.config().id,
            shared.incarnation(),
            published.number | flag,
            group,
        );
        let mut reached = 0;
        // Once into the group's log for every peer on this host that reads it (never under
        // backpressure: a log does not wait); those it was written for are skipped below.
        let logged = match policy {
            GroupPolicy::CutOff => shared.group.logs.append(group, &head, &payload),
            GroupPolicy::Backpressure => Default::default(),
        };
        let in_log: &[BusId] = logged.written_for.as_deref().map_or(&[], |v| &v[..]);
        reached += in_log.len();
        shared
            .counters
            .group_log_bytes
            .fetch_add(logged.bytes as u64, std::sync::atomic::Ordering::Relaxed);
        // Both sorted: one walk.
        let mut in_log = in_log.iter().peekable();
        for &id in &published.to {
            while in_log.next_if(|&&r| r < id).is_some() {}
            if in_log.next_if(|&&r| r == id).is_some() {
                continue;
            }
            let Some(peer) = shared.peer(id) else {
                continue;
            };
            // Not to a peer that may be owed a gap mark of this group: it goes by the link
            // first (`push_own`), and the log's records could overtake it.
            if policy == GroupPolicy::CutOff && published.owed.binary_search(&id).is_err() {
                shared
                    .group
                    .logs
                    .offer(group, &peer, || shared.passes_groups_on(&peer));
            }
            // The common case costs one push; whatever else `push_own` decides.
            let fits = peer.frame_body_max().is_none_or(|m| len <= m);
            if plain_push(&published, id, fits)
                && shared.push_own_publish(&peer, &head, &payload).is_ok()
            {
                reached += 1;
                continue;
            }
            if push_own_waiting(shared, &peer, (group, id), (&head, &payload), &published).await {
                reached += 1;
            }
        }
        if published.member {
            let batch = MessageBatch::of_payload(shared.config().id, Some(group), payload);
            shared.app.inbox.deliver(batch).await;
            reached += 1;
        }
        if reached == 0 {
            bump(&shared.counters.publishes_unheard);
        }
        Ok(reached)
    }
}

impl crate::peer::ring_link::GroupMessages for Shared {
    fn sort_out(&self, from: BusId, chunk: &Bytes, spans: &mut Vec<(u32, u32)>) -> bool {
        self.sort_out_groups(from, chunk, spans)
    }

    fn backlogged(&self, ring_peer: BusId) -> bool {
        if self.app.inbox.group_backlogged() {
            self.note_app_behind();
            return true;
        }
        // Not for a publish that waits for the ring's own peer: the room toward it comes
        // with what the ring brings (see `wait_blocked_forwards`).
        self.push_blocked_forwards().is_some_and(|(peer, _, _)| {
            peer.id != ring_peer || self.group.table.waiting.over_bound()
        })
    }

    fn open_log(
        &self,
        from: BusId,
        offer: &busway_core::group::LogOffer<'_>,
    ) -> Result<crate::group::log_in::AttachedLog, String> {
        if !self.config().group_logs {
            return Err("group logs are off on this node (NodeConfig::group_logs)".into());
        }
        let group = {
            let groups = self.group.table.lock();
            if !groups.wants(offer.name) {
                return Err("this node does not want the group".into());
            }
            groups.name_of(offer.name)
        };
        crate::group::log_in::open(from, offer, group, self.config().shm_ring_bytes)
    }

    fn wants_group(&self, name: &str) -> bool {
        self.group.table.lock().wants(name)
    }

    /// Publishes read from the log of `group` that the direct peer `from` offered (see
    /// `busway_core::group::publishes::log_read`). True if publishes went to the inbox, or
    /// wait for room.
    fn sort_out_log(
        &self,
        from: BusId,
        group: &GroupName,
        chunk: &Bytes,
        spans: &[(u32, u32)],
    ) -> Result<bool, String> {
        let now_ms = self.clock.coarse_ms();
        let (read, handed) = self.group_call(None, |h| {
            group::publishes::log_read(h, (from, group), chunk, spans, now_ms)
        });
        read?;
        Ok(handed || self.group.table.waiting.any())
    }
}

impl Shared {
    /// Tells each peer what this node now wants through it (see
    /// `busway_core::group::reads::sync_adverts`); a change that does not fit a peer's queue
    /// is told on a later call (the retry tick calls this).
    pub(crate) fn sync_group_adverts(&self) {
        let _turn = self.group.table.adverts_turn();
        let upstream = self.upstream_id();
        // A link dialed on a relay's hint carries no group traffic: the two ends reach each
        // other through the tree already, and publishes by a second path would start a
        // member's stream wherever the faster path's first publish or mark falls, skipping
        // what the tree still carries (see `sort_out_groups`).
        let peers: Vec<(BusId, bool)> = self
            .peers_snapshot()
            .iter()
            .filter(|p| !p.discovered)
            .map(|p| {
                (
                    p.id,
                    Some(p.id) == upstream || p.neighbor().serves.is_some(),
                )
            })
            .collect();
        // Not `group_call`: a call that left a group would come back here, under the turn.
        let (_, _, left) = self.group_decide(None, |h| group::reads::sync_adverts(h, &peers));
        debug_assert!(!left, "telling the peers leaves no group");
    }

    /// Declines the GROUP_LOG offers left in `spans` (read from a socket, not a ring: a log
    /// is read beside the ring of the link it was offered on).
    pub(crate) fn decline_log_offers(
        &self,
        from: BusId,
        chunk: &Bytes,
        spans: &mut Vec<(u32, u32)>,
    ) {
        let peer = self.peer(from);
        take_log_frames(chunk, spans, |frame| {
            if let (GroupLog::Offer(o), Some(peer)) = (frame, &peer) {
                let answer = encode_log_answer(o.name, o.token, o.serial, false);
                let _ = peer.push_framed(FrameKind::GroupLog, &answer, &Bytes::new());
            }
            true
        });
    }

    /// A peer is gone for good (given up on, or restarted): its interest is forgotten, and
    /// what others were told because of it is taken back.
    pub(crate) fn group_peer_gone(&self, peer: BusId, path: Path) {
        if path == Path::Direct {
            self.group.logs.forget_peer(peer);
            self.group.table.lock().peer_gone(peer);
            self.group.table.waiting.peer_gone(peer);
            self.sync_group_adverts();
        }
    }

    /// Takes the group messages out of `spans` (messages from `from` in `chunk`: a direct
    /// peer, or for REPAIR the source end to end) and acts on them (see
    /// `busway_core::group::reads`): publishes are handed to this node's inbox in each
    /// publisher's order (see `busway_core::turns`: the caller stops reading while the inbox is
    /// backlogged). A GROUP_LOG answer is taken here; an offer stays for the reader of the
    /// ring it came on (see `ring_rx`; a socket's reader declines it). True if publishes went
    /// to the inbox, or wait for room.
    pub(crate) fn sort_out_groups(
        &self,
        from: BusId,
        chunk: &Bytes,
        spans: &mut Vec<(u32, u32)>,
    ) -> bool {
        // Every read of every link passes here: one that carries no group message takes
        // none of the groups' locks.
        if !spans.iter().any(|&(_, tagged)| is_group_span(tagged)) {
            return false;
        }
        self.take_log_answers(from, chunk, spans);
        let now_ms = self.clock.coarse_ms();
        let (interest_changed, handed, left) =
            self.group_decide(None, |h| group::reads::read(h, from, chunk, spans, now_ms));
        if interest_changed {
            self.group.active.notify_waiters();
        }
        if interest_changed || left {
            self.sync_group_adverts();
        }
        handed || self.group.table.waiting.any()
    }

    /// Takes the GROUP_LOG answers out of `spans`: `from` answered the offer of this node's
    /// log of a group (see `group::log_out`).
    fn take_log_answers(&self, from: BusId, chunk: &Bytes, spans: &mut Vec<(u32, u32)>) {
        let peer = self.peer(from);
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
            let answered = |p| self.group.logs.answered(name, p, (token, serial), accept);
            if peer.as_ref().is_some_and(answered) {
                bump(&self.counters.group_logs_accepted);
            }
            true
        });
    }

    /// Deliveries to this node's application about to be decided, handed over in the order
    /// decided (see `busway_core::turns`).
    pub(crate) fn delivered(&self) -> Delivered<'_> {
        Delivered::new(&self.group.handover, &self.app.inbox)
    }

    /// A link stops reading because the application left `GROUP_INBOX_BYTES_MAX` of group
    /// publishes unread: a member cut off then fell behind (see `busway_core::group::node::skipped`).
    pub(crate) fn note_app_behind(&self) {
        let now_ms = self.clock.coarse_ms();
        self.group.table.note_app_behind(now_ms);
    }
}

/// A publisher's push of its own publish to a member `at.1` that takes more than one plain
/// push: busway-core's `push_own` decides (wait for room, for how long, skip, a gap mark
/// first); this waits as told. Returns whether the publish went to the member's link.
async fn push_own_waiting(
    shared: &Shared,
    peer: &Arc<Peer>,
    at: (&str, BusId),
    own: (&[u8], &Bytes),
    published: &Published,
) -> bool {
    let mut timed_out = false;
    loop {
        let push = shared.group_call(Some(peer), |h| push_own(h, at, own, published, timed_out));
        match push.0 {
            OwnPush::Sent => return true,
            OwnPush::Wait { len, ms: None } => peer.wait_for_room(len).await,
            OwnPush::Wait { len, ms: Some(ms) } => {
                let wait = Duration::from_millis(ms);
                let room = tokio::time::timeout(wait, peer.wait_for_room(len));
                timed_out = room.await.is_err();
            }
            OwnPush::Skipped | OwnPush::Gone => return false,
        }
    }
}
