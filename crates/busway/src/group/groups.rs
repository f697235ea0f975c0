//! Groups: `Node::join`, `Node::leave` and `Node::publish`, and what a node does with the
//! INTEREST and PUBLISH messages its peers send (see `busway_core::group` for the frames and
//! `busway_core::group::locked` for the state behind its locks).
//!
//! A publish is framed once per link: the publisher sends one PUBLISH to each peer that asked
//! for the group, sharing the payload; a node that receives one hands it to its application
//! if it is a member and passes the same bytes on to each other peer that asked, so a
//! relay fans out to the members linked to it. Each PUBLISH is a message of its pair like any
//! other: numbered, acknowledged, and resent over a link that drops and comes back.

use crate::group::host;
use crate::group::permissions;
use crate::node::event::Path;
use crate::node::message::MessageBatch;
use crate::node::stats::bump;
use crate::node::Node;
use crate::peer::Peer;
use crate::shared::Shared;
use busway_core::group::calls::check_publish;
use busway_core::group::check_name;
use busway_core::group::encode_publish_head;
use busway_core::group::publishes::{plain_push, push_own, OwnPush};
use busway_core::group::state::{GroupPolicy, Published};
use busway_core::group::PUBLISH_BACKPRESSURE_BIT;
use busway_core::turns::Batch;
use busway_core::BusId;
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
            host::sync_group_adverts(self.shared());
        }
        Ok(())
    }

    /// Leaves `group`: its publishes stop coming once the peers have read this node's
    /// INTEREST (a few may still be in flight).
    pub fn leave(&self, group: &str) {
        if self.shared().group.table.lock().leave(group) {
            host::sync_group_adverts(self.shared());
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
                shared.group.logs.offer(group, &peer, || {
                    permissions::passes_groups_on(shared, &peer)
                });
            }
            // The common case costs one push; whatever else `push_own` decides.
            let fits = peer.frame_body_max().is_none_or(|m| len <= m);
            if plain_push(&published, id, fits)
                && host::push_own_publish(shared, &peer, &head, &payload).is_ok()
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
            shared.app.inbox().deliver(batch).await;
            reached += 1;
        }
        if reached == 0 {
            bump(&shared.counters.publishes_unheard);
        }
        Ok(reached)
    }
}

/// A peer is gone for good (given up on, or restarted): its interest is forgotten, and
/// what others were told because of it is taken back.
pub(crate) fn group_peer_gone(shared: &Shared, peer: BusId, path: Path) {
    if path == Path::Direct {
        shared.group.logs.forget_peer(peer);
        shared.group.table.lock().peer_gone(peer);
        shared.group.table.waiting.peer_gone(peer);
        host::sync_group_adverts(shared);
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
        let push = host::group_call(shared, Some(peer), |h| {
            push_own(h, at, own, published, timed_out)
        });
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
