//! Groups: `Node::join`, `Node::leave` and `Node::publish`, and what a node does with the
//! INTEREST and PUBLISH messages its peers send (see `busway_core::group` for the frames and
//! `group_table` for the state and the rules).
//!
//! A publish is framed once per link: the publisher sends one PUBLISH to each peer that asked
//! for the group, sharing the payload; a node that receives one hands it to its application
//! if it is a member and passes the same bytes on to each other peer that asked, so a
//! relay fans out to the members linked to it. Each PUBLISH is a message of its pair like any
//! other: numbered, acknowledged, and resent over a link that drops and comes back.

use crate::event::{Event, Path};
use crate::group_table::{GroupName, GroupPolicy};
use crate::handover::Delivered;
use crate::limits::{GROUP_HOP_WAIT_MS, GROUP_SLOW_MEMBER_WAIT_MS, ROUTED_RETRY_INTERVAL_MS};
use crate::message::MessageBatch;
use crate::node::{Node, SendError};
use crate::shared::Shared;
use crate::stats::bump;
use busway_core::frame::SPAN_GROUP_LOG;
use busway_core::frame::SPAN_MULTICAST;
use busway_core::frame::SPAN_TAG_MASK;
use busway_core::frame::{FrameKind, SPAN_INTEREST, SPAN_LEN_MASK, SPAN_PUBLISH, SPAN_REPAIR};
use busway_core::group::forwards::{Push, CAUGHT_UP_ROOM_BYTES};
use busway_core::group::intake::{Handed, Intake};
use busway_core::group::log_records::decode_log_records;
use busway_core::group::repairs::{AskRefused, RepairJob};
use busway_core::group::split_publish_batch;
use busway_core::group::state::Published;
use busway_core::group::stream::{cuts_off, Offer, Skipped};
use busway_core::group::MULTICAST_STREAM;
use busway_core::group::PUBLISH_BACKPRESSURE_BIT;
use busway_core::group::{check_name, decode_interest, decode_publish, decode_repair};
use busway_core::group::{decode_group_log, encode_log_answer, GroupLog, LogOffer};
use busway_core::group::{encode_interest, encode_mark, encode_publish_head, PUBLISH_FIXED_BYTES};
use busway_core::group::{encode_repair_ask, encode_repair_copy_head, encode_repair_lost, Repair};
use busway_core::BusId;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

/// Why a group call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupError {
    /// The name is empty, too long, or the node joined too many groups; the text says which.
    BadName(String),
    /// The payload and the PUBLISH head do not fit one frame.
    TooLarge { len: usize, max: usize },
    /// The node is shutting down.
    Closed,
}

impl std::fmt::Display for GroupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupError::BadName(why) => write!(f, "{why}"),
            GroupError::TooLarge { len, max } => write!(
                f,
                "a publish of {len} bytes to this group does not fit a frame (at most {max})"
            ),
            GroupError::Closed => write!(f, "the node is shutting down"),
        }
    }
}

impl std::error::Error for GroupError {}

impl Node {
    /// Joins `group`: from the moment each peer has read this node's INTEREST, publishes to
    /// the group reach this node's inbox (`Message::group` names the group, `Message::src`
    /// the publisher), wherever they are published: this node, a linked node, or a node
    /// that reaches this one through relays (see `docs/SEMANTICS.md`, "Groups"). Joining a
    /// group twice is joining it once.
    pub fn join(&self, group: &str) -> Result<(), GroupError> {
        check_name(group).map_err(GroupError::BadName)?;
        if self
            .shared()
            .groups
            .join(group)
            .map_err(GroupError::BadName)?
        {
            self.shared().groups_active.notify_waiters();
            self.shared().sync_group_adverts();
        }
        Ok(())
    }

    /// Leaves `group`: its publishes stop coming once the peers have read this node's
    /// INTEREST (a few may still be in flight).
    pub fn leave(&self, group: &str) {
        if self.shared().groups.leave(group) {
            self.shared().sync_group_adverts();
        }
    }

    /// Sets what `publish` to `group` does when a link toward its members stays full:
    /// [`GroupPolicy::CutOff`] (the default: the others keep their rate, a member that falls
    /// too far behind is cut off) or [`GroupPolicy::Backpressure`] (the group moves at its
    /// slowest linked member).
    pub fn set_group_policy(&self, group: &str, policy: GroupPolicy) {
        self.shared().groups.set_policy(group, policy);
    }

    /// The groups this node joined, sorted.
    pub fn groups(&self) -> Vec<String> {
        self.shared().groups.joined()
    }

    /// The peers this node sends `group`'s publishes to (those that asked for them, for
    /// themselves or for nodes behind them), sorted.
    pub fn group_links(&self, group: &str) -> Vec<BusId> {
        self.shared().groups.wanted_by(group)
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
        check_name(group).map_err(GroupError::BadName)?;
        let shared = self.shared();
        let max = shared.config.frame_body_max;
        let len = PUBLISH_FIXED_BYTES + group.len() + payload.len();
        if len > max {
            return Err(GroupError::TooLarge {
                len: payload.len(),
                max: max - PUBLISH_FIXED_BYTES - group.len(),
            });
        }
        if shared.is_shutting_down() {
            return Err(GroupError::Closed);
        }
        let now_ms = shared.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
        let Published {
            number,
            to,
            policy,
            lagging,
            member,
        } = shared.groups.publish(group, &payload, now_ms);
        let flag = match policy {
            GroupPolicy::Backpressure => PUBLISH_BACKPRESSURE_BIT,
            GroupPolicy::CutOff => 0,
        };
        let head = encode_publish_head(shared.config.id, shared.incarnation, number | flag, group);
        let mut reached = 0;
        // Once into the group's log for every peer on this host that reads it (never under
        // backpressure: a log does not wait); those it was written for are skipped below.
        let logged = match policy {
            GroupPolicy::CutOff => shared.group_logs.append(group, &head, &payload),
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
        for id in to {
            while in_log.next_if(|&&r| r < id).is_some() {}
            if in_log.next_if(|&&r| r == id).is_some() {
                continue;
            }
            let Some(peer) = shared.peer(id) else {
                continue;
            };
            if policy == GroupPolicy::CutOff {
                if let Some(offer) = shared
                    .group_logs
                    .offer(group, &peer, || shared.passes_groups_on(&peer))
                {
                    if peer
                        .push_framed(FrameKind::GroupLog, &offer, &Bytes::new())
                        .is_err()
                    {
                        // Made again at a later publish.
                        shared.group_logs.withdraw(group, id);
                    }
                }
            }
            if peer.frame_body_max().is_some_and(|m| len > m) {
                // The peer closes a link over a frame past its stated limit: it cannot have it.
                bump(&shared.counters.group_forwards_dropped);
                continue;
            }
            loop {
                match peer.push_publish(&head, &payload, shared.deferred.looks()) {
                    Ok((_, note)) => {
                        if note {
                            shared.deferred.note(&peer);
                        }
                        // Caught up only with room for more than this one (see
                        // `CAUGHT_UP_ROOM_BYTES`).
                        if lagging.contains(&id) && peer.has_room(CAUGHT_UP_ROOM_BYTES) {
                            shared.groups.set_lagging(group, id, false);
                        }
                        reached += 1;
                        break;
                    }
                    Err(crate::peer::PushError::Full) => match policy {
                        GroupPolicy::Backpressure => peer.wait_for_room(len).await,
                        GroupPolicy::CutOff => {
                            let wait = Duration::from_millis(shared.group_wait_ms(&peer));
                            if lagging.contains(&id)
                                || tokio::time::timeout(wait, peer.wait_for_room(len))
                                    .await
                                    .is_err()
                            {
                                // The others keep their rate; the members behind this link
                                // ask for what they missed, or are told they lost it.
                                if !lagging.contains(&id) {
                                    shared.groups.set_lagging(group, id, true);
                                    bump(&shared.counters.group_links_skipped);
                                }
                                bump(&shared.counters.group_forwards_dropped);
                                break;
                            }
                        }
                    },
                    // Closed or given up: that peer will not hear it (and forgets its interest).
                    Err(_) => break,
                }
            }
        }
        if member {
            let name: GroupName = group.into();
            let batch = MessageBatch::published(shared.config.id, name, payload);
            shared.inbox.deliver(batch).await;
            reached += 1;
        }
        if reached == 0 {
            bump(&shared.counters.publishes_unheard);
        }
        Ok(reached)
    }
}

impl crate::ring_link::GroupMessages for Shared {
    fn sort_out(&self, from: BusId, chunk: &Bytes, spans: &mut Vec<(u32, u32)>) -> bool {
        self.sort_out_groups(from, chunk, spans)
    }

    fn backlogged(&self, ring_peer: BusId) -> bool {
        if self.inbox.group_backlogged() {
            self.note_app_behind();
            return true;
        }
        // Not for a publish that waits for the ring's own peer: the room toward it comes
        // with what the ring brings (see `wait_blocked_forwards`).
        self.push_blocked_forwards()
            .is_some_and(|(peer, _, _)| peer.id != ring_peer || self.groups.waiting.over_bound())
    }

    fn open_log(
        &self,
        from: BusId,
        offer: &busway_core::group::LogOffer<'_>,
    ) -> Result<crate::group_log_in::AttachedLog, String> {
        if !self.config.group_logs {
            return Err("group logs are off on this node (NodeConfig::group_logs)".into());
        }
        if !self.groups.wants(offer.name) {
            return Err("this node does not want the group".into());
        }
        let group = self.groups.name_of(offer.name);
        crate::group_log_in::open(from, offer, group, self.config.shm_ring_bytes)
    }

    fn wants_group(&self, name: &str) -> bool {
        self.groups.wants(name)
    }

    /// Publishes read from the log of `group` that the direct peer `from` offered (their
    /// bodies at `spans` of `chunk`): each must be a publish (not a mark) of `from` itself to
    /// `group`, else the error names the first that is not and none is taken. Then as if they
    /// came by the ring, taken in one go (one look at the group table for the lot): passed
    /// on, delivered in order, gaps asked for. True if publishes went to the inbox.
    fn sort_out_log(
        &self,
        from: BusId,
        group: &GroupName,
        chunk: &Bytes,
        spans: &[(u32, u32)],
    ) -> Result<bool, String> {
        let heads = decode_log_records(chunk, spans, from, group)?;
        let now_ms = self.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
        if !self.publish_permitted(from, group, heads.len() as u64, now_ms) {
            // Its publishes to the group are not taken here, by the log or otherwise.
            return Ok(false);
        }
        let payloads = heads
            .iter()
            .zip(spans)
            .map(|(h, &(start, len))| (start as usize + h.payload_at, len as usize - h.payload_at))
            .collect();
        let mut out = self.delivered();
        let intake = self.groups.take_run(
            self.config.id,
            from,
            &heads,
            chunk,
            payloads,
            now_ms,
            &mut out,
        );
        let gap = self.act_on_intake(chunk, 0, (from, group), intake, now_ms, &mut out);
        let (handed, left) = out.finish();
        if left {
            self.sync_group_adverts();
        }
        if gap {
            self.ask_repairs();
        }
        self.pump_repairs();
        Ok(handed || self.groups.waiting.any())
    }
}

impl Shared {
    /// Tells each peer what this node now wants through it (see `group_table`); a change
    /// that does not fit a peer's queue is told on a later call (the retry tick calls this).
    pub(crate) fn sync_group_adverts(&self) {
        let _turn = self.groups.adverts_turn();
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
        let ads = self.groups.adverts(&peers);
        for advert in ads {
            let Some(peer) = self.peer(advert.peer) else {
                continue;
            };
            let body = encode_interest(advert.join, &advert.name);
            if peer
                .push_framed(FrameKind::Interest, &body, &Bytes::new())
                .is_ok()
            {
                self.groups.told(&advert);
            } else {
                self.groups.advert_not_sent(&advert);
            }
        }
    }

    /// `from` answered the offer of this node's log of `name` (see `group_log_out`).
    fn log_answered(&self, from: BusId, name: &str, offer: (u64, u64), accept: bool) {
        let Some(peer) = self.peer(from) else {
            return;
        };
        // The log's own account of its readers decides what goes by link (see `publish`).
        if self.group_logs.answered(name, &peer, offer, accept) {
            bump(&self.counters.group_logs_accepted);
        }
    }

    /// Declines the GROUP_LOG offers left in `spans` (read from a socket, not a ring: a log
    /// is read beside the ring of the link it was offered on).
    pub(crate) fn decline_log_offers(
        &self,
        from: BusId,
        chunk: &Bytes,
        spans: &mut Vec<(u32, u32)>,
    ) {
        spans.retain(|&(start, tagged)| {
            if tagged & SPAN_TAG_MASK != SPAN_GROUP_LOG {
                return true;
            }
            let body = &chunk[start as usize..(start + (tagged & SPAN_LEN_MASK)) as usize];
            if let Ok(GroupLog::Offer(LogOffer {
                name,
                token,
                serial,
                ..
            })) = decode_group_log(body)
            {
                if let Some(peer) = self.peer(from) {
                    let answer = encode_log_answer(name, token, serial, false);
                    let _ = peer.push_framed(FrameKind::GroupLog, &answer, &Bytes::new());
                }
            }
            false
        });
    }

    /// A peer is gone for good (given up on, or restarted): its interest is forgotten, and
    /// what others were told because of it is taken back.
    pub(crate) fn group_peer_gone(&self, peer: BusId, path: Path) {
        if path == Path::Direct {
            self.group_logs.forget_peer(peer);
            self.groups.peer_gone(peer);
            self.groups.waiting.peer_gone(peer);
            self.sync_group_adverts();
        }
    }

    /// Takes the INTEREST, PUBLISH and REPAIR messages out of `spans` (messages from `from`
    /// in `chunk`: a direct peer, or for REPAIR the source end to end): interest is recorded
    /// (and a peer that newly asks is sent a mark per publisher known), publishes are passed
    /// on to the peers that asked and handed to this node's inbox in each publisher's order
    /// (see `handover`: the caller stops reading while the inbox is backlogged); a
    /// member's gaps are asked to be repaired, and a publisher answers asks.
    /// True if publishes went to the inbox.
    pub(crate) fn sort_out_groups(
        &self,
        from: BusId,
        chunk: &Bytes,
        spans: &mut Vec<(u32, u32)>,
    ) -> bool {
        let is_group = |tagged: u32| {
            matches!(
                tagged & SPAN_TAG_MASK,
                SPAN_INTEREST | SPAN_PUBLISH | SPAN_REPAIR | SPAN_MULTICAST | SPAN_GROUP_LOG
            )
        };
        // Every read of every link passes here: one that carries no group message takes
        // none of the groups' locks.
        if !spans.iter().any(|&(_, tagged)| is_group(tagged)) {
            return false;
        }
        let mut out = self.delivered();
        let mut interest_changed = false;
        let mut newly_asked: Vec<String> = Vec::new();
        let mut gaps = false;
        let now_ms = self.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
        // Who the link may speak for, looked up once per read (see `may_speak_for`).
        let mut link = None;
        // Whether this node dialed the link on a hint, looked up once per read.
        let mut hinted_link: Option<bool> = None;
        spans.retain(|&(start, tagged)| {
            if !is_group(tagged) {
                return true;
            }
            let tag = tagged & SPAN_TAG_MASK;
            let len = tagged & SPAN_LEN_MASK;
            let body = chunk.slice(start as usize..(start + len) as usize);
            match tag {
                SPAN_GROUP_LOG => {
                    // Checked by `message_spans`. An offer stays for the reader of the ring
                    // it came on (see `ring_rx`); a socket's reader declines it.
                    match decode_group_log(&body) {
                        Ok(GroupLog::Answer {
                            name,
                            token,
                            serial,
                            accept,
                        }) => self.log_answered(from, name, (token, serial), accept),
                        Ok(GroupLog::Offer(_)) => return true,
                        Err(_) => {}
                    }
                }
                SPAN_INTEREST => {
                    // Checked by `message_spans`. Not taken on a link this node dialed on a
                    // hint (see `sync_group_adverts`): the peer hears publishes by the tree.
                    let hinted = hinted_link
                        .get_or_insert_with(|| self.peer(from).is_some_and(|p| p.discovered));
                    if *hinted {
                        return false;
                    }
                    if let Ok(i) = decode_interest(&body) {
                        if i.join && !self.join_permitted(from, i.name) {
                            return false;
                        }
                        if !i.join {
                            self.group_logs.forget(i.name, from);
                        }
                        let quota = self.interest_quota(from);
                        match self.groups.interest(from, i.join, i.name, quota) {
                            None => bump(&self.counters.group_interest_refused),
                            Some(new) => {
                                interest_changed = true;
                                if new {
                                    newly_asked.push(i.name.to_owned());
                                }
                            }
                        }
                    }
                }
                SPAN_PUBLISH => {
                    gaps |= self
                        .publish_received(from, &mut link, chunk, start, &body, now_ms, &mut out)
                }
                SPAN_MULTICAST => {
                    let at = (start, len);
                    gaps |=
                        self.multicast_received(from, &mut link, chunk, at, &body, now_ms, &mut out)
                }
                _ => gaps |= self.repair_received(from, chunk, start, &body, now_ms, &mut out),
            }
            false
        });
        let (handed, left) = out.finish();
        if interest_changed {
            self.groups_active.notify_waiters();
        }
        if interest_changed || left {
            self.sync_group_adverts();
        }
        for name in newly_asked {
            self.send_marks(from, &name);
        }
        if gaps {
            self.ask_repairs();
        }
        self.pump_repairs();
        handed || self.groups.waiting.any()
    }

    /// Passes on the publishes that wait for room, in order, as far as the queues allow
    /// (cut-off ones past their time are dropped instead, see `forward_publish`); returns the
    /// first that still waits: its peer, length and give-up time.
    pub(crate) fn push_blocked_forwards(
        &self,
    ) -> Option<(Arc<crate::peer::Peer>, usize, Option<u64>)> {
        let now_ms = self.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
        let upstream = self.upstream_id();
        let pushed = self.groups.waiting.push(now_ms, |id, body| {
            // A forward that waited may no longer go up: its publisher's range was taken back
            // meanwhile (see `forward_publish`).
            if Some(id) == upstream
                && decode_publish(body).is_ok_and(|h| !self.may_pass_to(id, h.publisher))
            {
                self.forwards_dropped(body);
                return Push::Gone;
            }
            match self
                .peer(id)
                .map(|p| p.push_framed(FrameKind::Publish, &[], body))
            {
                Some(Err(crate::peer::PushError::Full)) => Push::Full,
                Some(Ok(_)) => Push::Sent,
                // Gone: that peer will not hear it.
                _ => {
                    self.forwards_dropped(body);
                    Push::Gone
                }
            }
        });
        for (i, (id, body)) in pushed.dropped.iter().enumerate() {
            if i == 0 || pushed.dropped[i - 1].0 != *id {
                // A peer's dropped publishes come together: one skip each.
                bump(&self.counters.group_links_skipped);
            }
            self.forwards_dropped(body);
            if let Ok(head) = decode_publish(body) {
                self.groups.owe_mark(*id, head.publisher, head.name);
            }
        }
        if !pushed.dropped.is_empty() {
            tracing::debug!(
                dropped = pushed.dropped.len(),
                "a link to members stayed full: its cut-off publishes are dropped until it has room"
            );
        }
        let (id, len, give_up_at) = pushed.waits?;
        match self.peer(id) {
            Some(p) => Some((p, len, give_up_at)),
            None => self.push_blocked_forwards(),
        }
    }

    /// Waits until every publish that waited for room is passed on, or (cut-off) given up
    /// on (the caller's link, to `link_peer`, stops reading meanwhile). Not while the first
    /// waits for `link_peer` itself: the room toward it comes with the acknowledgements
    /// that link reads (unless `WAITING_BYTES_MAX` wait already).
    pub(crate) async fn wait_blocked_forwards(&self, link_peer: BusId) {
        while let Some((peer, len, give_up_at)) = self.push_blocked_forwards() {
            if peer.id == link_peer && !self.groups.waiting.over_bound() {
                return;
            }
            match give_up_at {
                None => peer.wait_for_room(len).await,
                Some(at) => {
                    let now = self.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
                    // The coarse clock moves every `ROUTED_RETRY_INTERVAL_MS`: one more
                    // interval and the give-up time is surely past on it.
                    let left = at.saturating_sub(now) + ROUTED_RETRY_INTERVAL_MS;
                    let _ =
                        tokio::time::timeout(Duration::from_millis(left), peer.wait_for_room(len))
                            .await;
                }
            }
        }
    }

    /// Deliveries to this node's application about to be decided, handed over in the order
    /// decided (see `handover`).
    pub(crate) fn delivered(&self) -> Delivered<'_> {
        Delivered::new(&self.handover, &self.inbox)
    }

    /// A PUBLISH (one publish, a batch or a mark) from the direct peer `from`, its body
    /// `body` at `start` of `chunk`: passed on, and for this node's application if a member;
    /// true if a gap is open.
    #[allow(clippy::too_many_arguments)]
    fn publish_received(
        &self,
        from: BusId,
        link: &mut Option<busway_core::relay::Sources>,
        chunk: &Bytes,
        start: u32,
        body: &Bytes,
        now_ms: u64,
        out: &mut Delivered<'_>,
    ) -> bool {
        let Ok(head) = decode_publish(body) else {
            return false;
        };
        let what = if head.mark { "PUBLISH mark" } else { "PUBLISH" };
        if let Err(why) = self.may_speak_for(from, head.publisher, what, link) {
            bump(&self.counters.publishes_refused);
            self.refuse_link(from, why);
            return false;
        }
        if !self.publish_permitted(head.publisher, head.name, head.count, now_ms) {
            return false;
        }
        let intake = self
            .groups
            .take_publish(self.config.id, from, body, &head, now_ms, out);
        let source = (head.publisher, head.name);
        self.act_on_intake(chunk, start as usize, source, intake, now_ms, out)
    }

    /// Acts on what the group table made of publishes of `source` (publisher, group) whose
    /// body starts at `base` of `chunk` (see `busway_core::group::intake`): passes them on,
    /// tells of a restarted stream, hands over what is next, counts copies and publishes
    /// nobody wants. True if a gap is open.
    fn act_on_intake(
        &self,
        chunk: &Bytes,
        base: usize,
        (publisher, group): (BusId, &str),
        intake: Intake,
        now_ms: u64,
        out: &mut Delivered<'_>,
    ) -> bool {
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        self.counters
            .group_copies_dropped
            .fetch_add(intake.copies, relaxed);
        if intake.unwanted > 0 {
            tracing::debug!(%publisher, group, "publishes for a group nobody here wants");
            self.counters
                .publishes_unwanted
                .fetch_add(intake.unwanted, relaxed);
        }
        for onward in intake.onward {
            // Made or checked by the group table: it decodes (else counted, not sent).
            let Ok(head) = decode_publish(&onward.body) else {
                for _ in &onward.to {
                    self.forwards_dropped(&onward.body);
                }
                continue;
            };
            for id in onward.to {
                self.forward_publish(id, &onward.body, &head, now_ms);
            }
        }
        if let Some(ended) = intake.ended {
            let why = format!(
                "publisher {publisher} restarted before they came (a new incarnation's stream starts afresh)"
            );
            self.skipped(publisher, group, ended, (why, false), out);
        }
        let at = |(start, len): (usize, usize)| ((base + start) as u32, len as u32);
        for handed in intake.handed {
            match handed {
                Handed::Spans(spans) if spans.len() == 1 => {
                    out.span(publisher, Some(group), chunk, at(spans[0]));
                }
                Handed::Spans(spans) => {
                    let spans = spans.into_iter().map(at).collect();
                    out.run(publisher, group, chunk, spans);
                }
                Handed::Waited(payloads) => out.payloads(publisher, Some(group), payloads),
            }
        }
        intake.gap
    }

    /// The publishes of a PUBLISH `body` (a batch's each) could not be passed on: counted.
    fn forwards_dropped(&self, body: &[u8]) {
        let n = decode_publish(body).map_or(1, |h| h.count.max(1));
        self.counters
            .group_forwards_dropped
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Passes a publish (or mark) `body` on to the peer `id`, behind any that wait for it.
    /// One that does not fit waits (the links that bring publishes stop reading meanwhile,
    /// see `push_blocked_forwards`): under backpressure as long as it takes, under cut-off
    /// at most `group_wait_ms`, then it is dropped for that peer, which is owed a mark and
    /// skipped at once while it stays full (it lags).
    fn forward_publish(
        &self,
        id: BusId,
        body: &Bytes,
        head: &busway_core::group::PublishHead<'_>,
        now_ms: u64,
    ) {
        let waiting = &self.groups.waiting;
        let Some(peer) = self.peer(id) else {
            self.forwards_dropped(body);
            return;
        };
        if head.batch && !peer.takes_publish_batches() {
            // A peer that does not read batches has them publish by publish.
            for one in split_publish_batch(body, head) {
                let one = Bytes::from(one);
                if let Ok(h) = decode_publish(&one) {
                    self.forward_publish(id, &one, &h, now_ms);
                }
            }
            return;
        }
        // A frame past the peer's stated limit would close its link: not sent. Nor one in
        // the name of a publisher the upstream does not hold registered for us (a publisher
        // whose registration was refused, or is on its way: see `registrations`).
        if peer.frame_body_max().is_some_and(|m| body.len() > m)
            || !self.may_pass_to(id, head.publisher)
        {
            self.forwards_dropped(body);
            return;
        }
        let lagging = !head.backpressure && waiting.is_lagging(id);
        // A lagging peer's cut-off publishes go past what waits for it (only backpressure
        // publishes do: its cut-off ones were dropped), a mark never does: it may be of one
        // of those streams (a mark does not say its stream's policy), and ahead of them it
        // would show a gap that is not there.
        if !waiting.waits_for(id) || (lagging && !head.mark) {
            match peer.push_framed(FrameKind::Publish, &[], body) {
                Ok(_) => {
                    if !head.backpressure && peer.has_room(CAUGHT_UP_ROOM_BYTES) {
                        waiting.caught_up(id);
                    }
                    return;
                }
                Err(crate::peer::PushError::Full) => {}
                // Closed or given up: that peer will not hear it.
                Err(_) => {
                    self.forwards_dropped(body);
                    return;
                }
            }
        }
        if lagging {
            // Its members ask the publisher for what they missed, or are told they lost it. It is owed
            // a mark, in case this was the end of the stream.
            self.groups.owe_mark(id, head.publisher, head.name);
            self.forwards_dropped(body);
            return;
        }
        let give_up_at = (!head.backpressure).then(|| now_ms + self.group_wait_ms(&peer));
        waiting.wait(id, body.clone(), give_up_at);
    }

    /// A link stops reading because the application left `GROUP_INBOX_BYTES_MAX` of group
    /// publishes unread: a member cut off then fell behind (see `Shared::skipped`).
    pub(crate) fn note_app_behind(&self) {
        let now_ms = self.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
        self.groups.note_app_behind(now_ms);
    }

    /// How long a cut-off publish waits for room toward `peer`: `GROUP_HOP_WAIT_MS` if it
    /// passes groups on, `GROUP_SLOW_MEMBER_WAIT_MS` otherwise.
    fn group_wait_ms(&self, peer: &crate::peer::Peer) -> u64 {
        if self.passes_groups_on(peer) {
            GROUP_HOP_WAIT_MS
        } else {
            GROUP_SLOW_MEMBER_WAIT_MS
        }
    }

    /// Whether the member `from` may join `name` here (`NodeConfig::group_permissions`); if
    /// not, it is counted and told why (a REPAIR refused). Interest from a node that passes
    /// groups on (a relay, for its members) is its own rules' business, and always taken.
    fn join_permitted(&self, from: BusId, name: &str) -> bool {
        let Some(rules) = &self.config.group_permissions else {
            return true;
        };
        let Some(peer) = self.peer(from) else {
            return false;
        };
        if self.passes_groups_on(&peer) {
            return true;
        }
        let Err(why) = rules.may_join(from, name) else {
            return true;
        };
        bump(&self.counters.group_joins_refused);
        tracing::debug!(member = %from, group = name, %why, "join refused");
        let body = busway_core::group::encode_repair_refused(false, name, &why);
        let _ = peer.push_framed(FrameKind::Repair, &body, &Bytes::new());
        false
    }

    /// Whether `count` publishes (0: a mark) of `publisher` to `group` may be taken here
    /// (`NodeConfig::group_permissions`); if not, each is counted, and the publisher is told
    /// why at most once a second per group (a mark alone tells nothing).
    fn publish_permitted(&self, publisher: BusId, group: &str, count: u64, now_ms: u64) -> bool {
        let Some(rules) = &self.config.group_permissions else {
            return true;
        };
        let Err(why) = rules.may_publish(publisher, group) else {
            return true;
        };
        self.counters
            .publishes_denied
            .fetch_add(count.max(1), std::sync::atomic::Ordering::Relaxed);
        if count > 0 && self.refusal_reports.due(publisher, group, now_ms) {
            tracing::debug!(%publisher, group, %why, "publishes refused");
            let body = busway_core::group::encode_repair_refused(true, group, &why);
            let _ = self.try_send_framed(publisher, FrameKind::Repair, &body, &Bytes::new());
        }
        false
    }

    /// How many groups the peer `from` may ask for: `GROUPS_PER_PEER_MAX` for each node it
    /// stands for (itself, the ids of its HELLO range, each range it registered since), up to
    /// `GROUPS_PER_LINK_MAX`; the upstream, which asks for the rest of the bus, that much.
    /// So one downstream below a relay that asks for its whole quota leaves the relay room to
    /// ask for what its other downstreams want (issue #26, item 4).
    fn interest_quota(&self, from: BusId) -> usize {
        use crate::group_table::{GROUPS_PER_LINK_MAX, GROUPS_PER_PEER_MAX};
        if self.upstream_id() == Some(from) {
            return GROUPS_PER_LINK_MAX;
        }
        let declared = self
            .peer(from)
            .and_then(|p| p.neighbor().serves)
            .map_or(1, |(lo, hi)| hi.0.saturating_sub(lo.0).saturating_add(1));
        let registered = self.registrations.below().ranges_held_by(from) as u64;
        let nodes = declared.saturating_add(registered);
        let quota = nodes.saturating_mul(GROUPS_PER_PEER_MAX as u64);
        quota.min(GROUPS_PER_LINK_MAX as u64) as usize
    }

    /// Whether `peer` passes groups on to others: this node's upstream, or a downstream that
    /// registered more ids than its own.
    fn passes_groups_on(&self, peer: &crate::peer::Peer) -> bool {
        let serves_others = peer
            .neighbor()
            .serves
            .is_some_and(|(lo, hi)| (lo, hi) != (peer.id, peer.id));
        serves_others
            || self.upstream_id() == Some(peer.id)
            || self.registrations.below().holds_any(peer.id)
    }

    /// A REPAIR from `from` (end to end), its body at `start` of `chunk`: an ask answered,
    /// a copy or a loss applied to this member's stream; true if a gap is left to ask for.
    fn repair_received(
        &self,
        from: BusId,
        chunk: &Bytes,
        start: u32,
        body: &Bytes,
        now_ms: u64,
        out: &mut Delivered<'_>,
    ) -> bool {
        // Checked by `message_spans`.
        let Ok(repair) = decode_repair(body) else {
            return false;
        };
        if repair_names(&repair) == MULTICAST_STREAM {
            return self.multicast_repair_received(from, chunk, start, body, repair, now_ms, out);
        }
        match repair {
            Repair::Ask {
                incarnation,
                from: first,
                to,
                name,
            } => {
                self.answer_repair_ask(from, name, (first, to), now_ms, || {
                    self.groups
                        .repair(name, incarnation, self.incarnation, (first, to))
                });
                false
            }
            Repair::Copy(head) => {
                if head.publisher != from {
                    tracing::warn!(peer = %from, publisher = %head.publisher, group = head.name, "REPAIR copy of another node's publish: dropped");
                    bump(&self.counters.group_repairs_refused);
                    return false;
                }
                let payload = || body.slice(head.payload_at..);
                match self.groups.repaired(&head, now_ms, payload, out) {
                    None => {
                        bump(&self.counters.group_repairs_refused);
                        false
                    }
                    Some((offer, gap)) => {
                        if let Offer::Deliver { then } = offer {
                            let at = head.payload_at as u32;
                            let span = (start + at, body.len() as u32 - at);
                            out.span(head.publisher, Some(head.name), chunk, span);
                            out.payloads(head.publisher, Some(head.name), then);
                        }
                        gap
                    }
                }
            }
            Repair::Lost {
                incarnation,
                from: first,
                to,
                name,
            } => {
                match self
                    .groups
                    .lost(from, incarnation, name, (first, to), now_ms, out)
                {
                    Some(skipped) => {
                        let why = format!(
                            "publisher {from} no longer holds publishes {first}.. (its group_retain_bytes)"
                        );
                        self.skipped(from, name, skipped, (why, true), out)
                    }
                    None => bump(&self.counters.group_repairs_refused),
                }
                false
            }
            // Sorted out to `multicast_repair_received` above.
            Repair::Unreachable { .. } => false,
            Repair::Refused {
                publish,
                name,
                reason,
            } => {
                tracing::warn!(by = %from, group = name, publish, reason, "group refused");
                self.emit(crate::event::Event::GroupRefused {
                    group: name.to_owned(),
                    by: from,
                    publish,
                    reason: reason.to_owned(),
                });
                false
            }
        }
    }

    /// `from`'s ask for `range` of `stream` (a group, or `MULTICAST_STREAM`), planned by
    /// `plan`: queued, or refused (counted, and logged with why) as `Repairs::answer` says.
    /// The one way this publisher takes an ask, for groups and multicast alike.
    pub(crate) fn answer_repair_ask(
        &self,
        from: BusId,
        stream: &str,
        range: (u64, u64),
        now_ms: u64,
        plan: impl FnOnce() -> busway_core::group::state::RepairPlan,
    ) {
        let answered =
            self.groups
                .answer_ask(from, stream, range, (self.incarnation, now_ms), plan);
        match answered {
            Ok(()) => return,
            Err(AskRefused::TooMany) => {
                tracing::warn!(member = %from, stream, "repair refused: too many under way");
            }
            Err(AskRefused::TooSoon) => {
                tracing::debug!(member = %from, stream, "repair refused: asked again too soon");
            }
        }
        bump(&self.counters.group_repairs_refused);
    }

    /// Publishes of `publisher` to `group` that will never come were skipped: the member
    /// gets what waited behind them, then is told how many and `why`. A gap given up on
    /// (`given_up`: no repair came, the publisher no longer holds them, too much waited) cuts
    /// the member off only if its own application fell behind (the core's `cuts_off`): it leaves
    /// the group (`GroupCutOff`; the caller tells the peers, see `Delivered::left`). Else
    /// (they were lost on the way, or the publisher restarted) it stays, told by `GroupGap`:
    /// nothing a publisher or a hop does can make a member that keeps up leave its group.
    fn skipped(
        &self,
        publisher: BusId,
        group: &str,
        mut skipped: Skipped,
        (why, given_up): (String, bool),
        out: &mut Delivered<'_>,
    ) {
        out.payloads(publisher, Some(group), std::mem::take(&mut skipped.deliver));
        if skipped.missed == 0 {
            return;
        }
        let missed = skipped.missed;
        let now_ms = self.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
        let behind_now = self.inbox.group_backlogged();
        let behind_at = self.groups.app_behind_at();
        if cuts_off(given_up, behind_now, behind_at, &skipped, now_ms) {
            tracing::warn!(%publisher, group, missed, reason = %why, "cut off from the group: its application fell behind");
            out.left |= self.groups.leave(group);
            self.emit(Event::GroupCutOff {
                group: group.to_owned(),
                publisher,
                missed,
                reason: why,
            });
        } else {
            tracing::warn!(%publisher, group, missed, reason = %why, "publishes lost");
            self.emit(Event::GroupGap {
                group: group.to_owned(),
                publisher,
                missed,
                reason: why,
            });
        }
    }

    /// Sends `peer`, which newly asked for `group`, a mark per publisher this node knows:
    /// a member behind it that lost the end of a stream (its relay died) sees the gap.
    fn send_marks(&self, peer: BusId, group: &str) {
        let Some(p) = self.peer(peer) else {
            return;
        };
        for (publisher, incarnation, number) in
            self.groups
                .marks_for(group, self.config.id, self.incarnation)
        {
            // Never a mark up in a name the upstream does not hold for us (a publisher above
            // is the upstream's own business): it would close the link.
            if !self.may_pass_to(peer, publisher) {
                continue;
            }
            // A mark that does not fit is sent on a later tick.
            if !push_mark(&p, &encode_mark(publisher, incarnation, number, group)) {
                self.groups.owe_mark(peer, publisher, group);
            }
        }
    }

    /// Asks the publishers of streams with a gap for copies; an ask that cannot be sent now
    /// is made again on the next tick.
    pub(crate) fn ask_repairs(&self) {
        let now_ms = self.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
        let asks = self.groups.asks(now_ms).into_iter();
        for ask in asks.chain(self.multicasts.asks(now_ms)) {
            let body = encode_repair_ask(ask.incarnation, ask.from, ask.to, &ask.group);
            match self.try_send_framed(ask.publisher, FrameKind::Repair, &body, &Bytes::new()) {
                Ok(_) => bump(&self.counters.group_repairs_asked),
                Err(e) => {
                    tracing::debug!(publisher = %ask.publisher, group = %ask.group, error = %e, "repair ask not sent yet");
                    if &*ask.group == MULTICAST_STREAM {
                        self.multicasts.unask(&ask);
                    } else {
                        self.groups.unask(&ask);
                    }
                }
            }
        }
    }

    /// Sends the repairs under way as far as the queues toward their members allow.
    pub(crate) fn pump_repairs(&self) {
        // Each job under way is taken once per call, oldest first. One whose way is full
        // goes behind the others, and the member's other jobs are not tried again in this
        // call: a member that makes no room holds up no one else's repair (issue #26, item
        // 3), and costs a call at most its `REPAIR_JOBS_PER_MEMBER_MAX` jobs.
        let now_ms = self.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
        let mut full: std::collections::HashSet<BusId> = std::collections::HashSet::new();
        for _ in 0..self.groups.repairs_len() {
            let Some(mut job) = self.groups.take_repair(now_ms) else {
                break;
            };
            if full.contains(&job.to) {
                self.groups.requeue_repair(job);
                continue;
            }
            match self.send_repair(&mut job) {
                Ok(()) => {}
                Err(SendError::Full(_)) => {
                    full.insert(job.to);
                    self.groups.requeue_repair(job);
                }
                Err(e) => {
                    tracing::debug!(member = %job.to, group = %job.group, error = %e, "repair dropped");
                }
            }
        }
    }

    /// Sends what fits of one repair: the loss first, then the copies in order.
    fn send_repair(&self, job: &mut RepairJob) -> Result<(), SendError> {
        if let Some((first, to)) = job.lost {
            let body = encode_repair_lost(job.incarnation, first, to, &job.group);
            self.try_send_framed(job.to, FrameKind::Repair, &body, &Bytes::new())?;
            job.lost = None;
        }
        while let Some((number, payload)) = job.copies.front() {
            let head =
                encode_repair_copy_head(self.config.id, job.incarnation, *number, &job.group);
            self.try_send_framed(job.to, FrameKind::Repair, &head, payload)?;
            bump(&self.counters.group_copies_sent);
            job.copies.pop_front();
        }
        Ok(())
    }

    /// The groups' timers, on the retry tick: tail marks of publishes gone quiet and to
    /// lagging links, asks not sent yet, repairs waiting for room, and gaps given up on (what
    /// waited behind them goes to the inbox).
    pub(crate) fn group_tick(&self, now_ms: u64) {
        for (group, number, to) in self.groups.tail_marks(now_ms) {
            let body = encode_mark(self.config.id, self.incarnation, number, &group);
            for p in to.into_iter().filter_map(|id| self.peer(id)) {
                if !push_mark(&p, &body) {
                    // Sent again, on later ticks, once it fits (the owed marks below).
                    self.groups.owe_mark(p.id, self.config.id, &group);
                }
            }
        }
        let owed = self.groups.owed_marks(self.config.id, self.incarnation);
        for (peer, publisher, incarnation, number, group) in owed {
            if self.groups.waiting.waits_for(peer) {
                // Behind the publishes that wait for that peer, on a later tick.
                continue;
            }
            let body = encode_mark(publisher, incarnation, number, &group);
            // Paid without a word where it may not go (see `send_marks`).
            if !self.may_pass_to(peer, publisher)
                || self.peer(peer).is_none_or(|p| push_mark(&p, &body))
            {
                self.groups.mark_paid(peer, publisher, &group);
            }
        }
        for (group, number, id) in self.groups.lagging() {
            let body = encode_mark(self.config.id, self.incarnation, number, &group);
            // Room again (`CAUGHT_UP_ROOM_BYTES`, not only for the mark): the next publish
            // goes to it.
            let room = |p: &crate::peer::Peer| p.has_room(CAUGHT_UP_ROOM_BYTES);
            if self
                .peer(id)
                .is_some_and(|p| room(&p) && push_mark(&p, &body))
            {
                self.groups.set_lagging(&group, id, false);
            }
        }
        // Forwards waiting for room, and cut-off ones past their time (a ring's reader
        // retries them itself; a socket's link waits for them).
        self.push_blocked_forwards();
        self.ask_repairs();
        self.pump_repairs();
        let mut out = self.delivered();
        for (publisher, group, skipped, why) in self.groups.overdue(now_ms, &mut out) {
            self.skipped(publisher, &group, skipped, (why, true), &mut out);
        }
        let (_, left) = out.finish();
        if left {
            self.sync_group_adverts();
        }
    }
}

/// Queues a mark (`encode_mark`'s body) for `peer`; false if its queue had no room.
fn push_mark(peer: &crate::peer::Peer, body: &[u8]) -> bool {
    peer.push_framed(FrameKind::Publish, body, &Bytes::new())
        .is_ok()
}

/// The name a REPAIR carries (a group's, or `MULTICAST_STREAM`).
fn repair_names<'a>(repair: &Repair<'a>) -> &'a str {
    match *repair {
        Repair::Ask { name, .. } | Repair::Lost { name, .. } => name,
        Repair::Copy(head) => head.name,
        Repair::Unreachable { .. } => MULTICAST_STREAM,
        Repair::Refused { name, .. } => name,
    }
}
