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
use crate::group_table::GroupName;
use crate::message::MessageBatch;
use crate::node::Node;
use crate::shared::Shared;
use crate::stats::bump;
use busway_core::frame::{FrameKind, SPAN_INTEREST, SPAN_LEN_MASK, SPAN_PUBLISH, SPAN_TAG_MASK};
use busway_core::group::{check_name, decode_interest, decode_publish, encode_interest};
use busway_core::group::{encode_publish_head, PUBLISH_FIXED_BYTES};
use busway_core::BusId;
use bytes::Bytes;
use std::sync::Arc;

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
    /// member. Waits while a link's queue is full (the publisher moves at the pace of its
    /// slowest linked peer; relays further on never wait: see `docs/SEMANTICS.md`). Returns
    /// how many places it went to (links, and this node's inbox): 0 when no member is known,
    /// which is counted in `Stats::publishes_unheard`.
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
        let (number, to) = shared.groups.publish(group);
        let head = encode_publish_head(shared.config.id, shared.incarnation, number, group);
        let mut reached = 0;
        for id in to {
            let Some(peer) = shared.peer(id) else {
                continue;
            };
            if peer.frame_body_max().is_some_and(|m| len > m) {
                // The peer closes a link over a frame past its stated limit: it cannot have it.
                bump(&shared.counters.group_forwards_dropped);
                continue;
            }
            loop {
                match peer.push_framed(FrameKind::Publish, &head, &payload) {
                    Ok(_) => {
                        reached += 1;
                        break;
                    }
                    Err(crate::peer::PushError::Full) => peer.wait_for_room(len).await,
                    // Closed or given up: that peer will not hear it (and forgets its interest).
                    Err(_) => break,
                }
            }
        }
        if shared.groups.is_member(group) {
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
    fn sort_out(
        &self,
        from: BusId,
        chunk: &Bytes,
        spans: &mut Vec<(u32, u32)>,
    ) -> Vec<MessageBatch> {
        self.sort_out_groups(from, chunk, spans)
    }
}

impl Shared {
    /// Tells each peer what this node now wants through it (see `group_table`); a change
    /// that does not fit a peer's queue is told on a later call (the retry tick calls this).
    pub(crate) fn sync_group_adverts(&self) {
        let upstream = self.upstream_id();
        let peers: Vec<(BusId, bool)> = self
            .peers_snapshot()
            .iter()
            .map(|p| {
                (
                    p.id,
                    Some(p.id) == upstream || p.neighbor().serves.is_some(),
                )
            })
            .collect();
        for advert in self.groups.adverts(&peers) {
            let Some(peer) = self.peer(advert.peer) else {
                continue;
            };
            let body = encode_interest(advert.join, &advert.name);
            if peer
                .push_framed(FrameKind::Interest, &body, &Bytes::new())
                .is_ok()
            {
                self.groups.told(&advert);
            }
        }
    }

    /// A peer is gone for good (given up on, or restarted): its interest is forgotten, and
    /// what others were told because of it is taken back.
    pub(crate) fn group_peer_gone(&self, peer: BusId, path: Path) {
        if path == Path::Direct {
            self.groups.peer_gone(peer);
            self.sync_group_adverts();
        }
    }

    /// Takes the INTEREST and PUBLISH messages out of `spans` (messages from the direct peer
    /// `from` in `chunk`): interest is recorded, publishes are passed on to the peers that
    /// asked and returned as batches for this node's inbox (one per run of publishes from
    /// one publisher to one group).
    pub(crate) fn sort_out_groups(
        &self,
        from: BusId,
        chunk: &Bytes,
        spans: &mut Vec<(u32, u32)>,
    ) -> Vec<MessageBatch> {
        let mut out: Vec<MessageBatch> = Vec::new();
        let mut interest_changed = false;
        spans.retain(|&(start, tagged)| {
            let tag = tagged & SPAN_TAG_MASK;
            if tag != SPAN_INTEREST && tag != SPAN_PUBLISH {
                return true;
            }
            let body = chunk.slice(start as usize..(start + (tagged & SPAN_LEN_MASK)) as usize);
            if tag == SPAN_INTEREST {
                // Checked by `message_spans`.
                if let Ok(i) = decode_interest(&body) {
                    if self.groups.interest(from, i.join, i.name) {
                        interest_changed = true;
                    } else {
                        bump(&self.counters.group_interest_refused);
                    }
                }
                return false;
            }
            let Ok(head) = decode_publish(&body) else {
                return false;
            };
            let Some(fresh) = self.groups.received(self.config.id, from, &head) else {
                bump(&self.counters.group_copies_dropped);
                return false;
            };
            if !fresh.deliver && fresh.forward_to.is_empty() {
                tracing::debug!(peer = %from, group = head.name, "publish for a group nobody here wants");
                bump(&self.counters.publishes_unwanted);
                return false;
            }
            for id in fresh.forward_to {
                // A frame past the peer's stated limit would close its link: not sent.
                let sent = self
                    .peer(id)
                    .filter(|p| p.frame_body_max().is_none_or(|m| body.len() <= m))
                    .map(|p| p.push_framed(FrameKind::Publish, &[], &body));
                if !matches!(sent, Some(Ok(_))) {
                    // Relays never wait for one member: that member sees the gap.
                    bump(&self.counters.group_forwards_dropped);
                }
            }
            if fresh.missed > 0 {
                self.emit(Event::GroupGap {
                    group: head.name.to_owned(),
                    publisher: head.publisher,
                    missed: fresh.missed,
                });
            }
            if fresh.deliver {
                let at = head.payload_at as u32;
                let span = (start + at, (tagged & SPAN_LEN_MASK) - at);
                match out.last_mut() {
                    Some(b) if b.src() == head.publisher && b.group() == Some(head.name) => {
                        b.push_span(span)
                    }
                    _ => out.push(MessageBatch::published_in(
                        head.publisher,
                        Arc::from(head.name),
                        chunk.clone(),
                        vec![span],
                    )),
                }
            }
            false
        });
        if interest_changed {
            self.sync_group_adverts();
        }
        out
    }
}
