//! `Node::drain`: what a node that sent does before it goes, so that nothing it sent is lost
//! with it: its messages acknowledged, and the members of its groups (and the receivers of
//! its multicasts) given the time to ask it for what a link or relay lost.

use crate::limits::{DRAIN_LINKS_BACK_MS, DRAIN_LINKS_POLL_MS, DRAIN_QUIET_MS};
use crate::node::{Node, PeerInfo};
use busway_core::BusId;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::time::Instant;

impl Node {
    /// Waits, at most `timeout`, until what this node sent is settled, as a process about to
    /// exit needs: every message acknowledged by its destination or reported undeliverable
    /// ([`Node::flush`]); and, if it published to a group or multicast, no member asked it
    /// for copies for `DRAIN_QUIET_MS` (2 s) while the links that lead to members stayed as
    /// they were (a member that lost publishes with a relay learns it from what follows, or
    /// from the tail mark after the last publish, and asks at once; the copies it gets are
    /// acknowledged before this returns). A link to members that is down, a peer that led to
    /// members and came back without asking for the group again (a relay that restarted,
    /// before its members are back below it), or an upstream that led to members and is down
    /// is waited for up to `DRAIN_LINKS_BACK_MS` (10 s) first: only once it is back can the
    /// members behind it learn what they lost. A member that shut down is gone at once and
    /// not waited for. True if settled within `timeout`; a publisher's drain takes
    /// `DRAIN_QUIET_MS` at least, and fails with a shorter `timeout`.
    pub async fn drain(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        if !self.flush(timeout).await {
            return false;
        }
        let (groups, multicast) = self.shared().group.published();
        if groups.is_empty() && !multicast {
            return true;
        }
        let links_back_by = Instant::now() + Duration::from_millis(DRAIN_LINKS_BACK_MS);
        let copies_sent = || self.shared().counters.group_copies_sent.load(Relaxed);
        let moment = || {
            (
                copies_sent(),
                links_to_members(self, &groups, &self.peers()),
            )
        };
        // The peers that led to members, with the incarnation they had then.
        let mut led = BTreeMap::new();
        loop {
            let peers = self.peers();
            let up = links_to_members(self, &groups, &peers);
            for p in &peers {
                if up.iter().any(|&(id, _)| id == p.id) {
                    led.insert(p.id, p.incarnation);
                }
            }
            let pending = links_pending(self.upstream_id(), &peers, &up, &led);
            if pending && Instant::now() < links_back_by {
                // Polled: interest arrives as messages, not events.
                tokio::time::sleep(Duration::from_millis(DRAIN_LINKS_POLL_MS)).await;
                continue;
            }
            let before = moment();
            let quiet_until = Instant::now() + Duration::from_millis(DRAIN_QUIET_MS);
            if quiet_until > deadline {
                return false;
            }
            // A linger, not a synchronization: members ask within it if they miss anything.
            tokio::time::sleep_until(quiet_until).await;
            if !self
                .flush(deadline.saturating_duration_since(Instant::now()))
                .await
            {
                return false;
            }
            if moment() == before {
                return true;
            }
        }
    }
}

/// The peers `node` sends `groups`' publishes to, sorted, each with whether a link to it is
/// up (among `peers`, one look at the node's peers).
fn links_to_members(node: &Node, groups: &[String], peers: &[PeerInfo]) -> Vec<(BusId, bool)> {
    let mut ids: Vec<BusId> = groups.iter().flat_map(|g| node.group_links(g)).collect();
    ids.sort_unstable();
    ids.dedup();
    let up = |id: BusId| peers.iter().any(|p| p.id == id && p.up);
    ids.into_iter().map(|id| (id, up(id))).collect()
}

/// Whether links to members may yet come back: one is down (its peer may reconnect: what it
/// asked for is kept meanwhile), a peer that led to members (`led`, with its incarnation
/// then) is up again as a new incarnation that has not asked again, or the `upstream` led to
/// members and is down (it is dialed again).
fn links_pending(
    upstream: Option<BusId>,
    peers: &[PeerInfo],
    up: &[(BusId, bool)],
    led: &BTreeMap<BusId, u64>,
) -> bool {
    if up.iter().any(|&(_, up)| !up) {
        return true;
    }
    let is_up = |id: BusId| peers.iter().any(|p| p.id == id && p.up);
    if upstream.is_some_and(|u| led.contains_key(&u) && !is_up(u)) {
        return true;
    }
    peers.iter().any(|p| {
        let restarted = led.get(&p.id).is_some_and(|&i| i != p.incarnation);
        p.up && restarted && !up.iter().any(|&(id, _)| id == p.id)
    })
}
