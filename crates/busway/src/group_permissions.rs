//! Who may join and publish to which groups at this node (`NodeConfig::group_permissions`):
//! the rules are busway-core's (`busway_core::group::permissions`); this module applies them
//! and the interest quotas to what peers send (when a refused publisher was last told is kept
//! in `group_table::RefusalReports`).

use crate::shared::Shared;
use crate::stats::bump;
use busway_core::frame::FrameKind;
use busway_core::BusId;
use bytes::Bytes;

impl Shared {
    /// Whether the member `from` may join `name` here (`NodeConfig::group_permissions`); if
    /// not, it is counted and told why (a REPAIR refused). Interest from a node that passes
    /// groups on (a relay, for its members) is its own rules' business, and always taken.
    pub(crate) fn join_permitted(&self, from: BusId, name: &str) -> bool {
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
    pub(crate) fn publish_permitted(
        &self,
        publisher: BusId,
        group: &str,
        count: u64,
        now_ms: u64,
    ) -> bool {
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
    pub(crate) fn interest_quota(&self, from: BusId) -> usize {
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
    pub(crate) fn passes_groups_on(&self, peer: &crate::peer::Peer) -> bool {
        let serves_others = peer
            .neighbor()
            .serves
            .is_some_and(|(lo, hi)| (lo, hi) != (peer.id, peer.id));
        serves_others
            || self.upstream_id() == Some(peer.id)
            || self.registrations.below().holds_any(peer.id)
    }
}
