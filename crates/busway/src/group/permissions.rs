//! What a peer may ask of this node's groups: its interest quota, charged to whom it stands
//! for, and whether it passes groups on (who may join and publish is
//! `busway_core::group::permissions`, over `NodeConfig::group_permissions`).

use crate::shared::Shared;
use busway_core::BusId;

impl Shared {
    /// How many groups the peer `from` may ask for: `GROUPS_PER_PEER_MAX` for each node it
    /// stands for (itself, the ids of its HELLO range, each range it registered since), up to
    /// `GROUPS_PER_LINK_MAX`; the upstream, which asks for the rest of the bus, that much.
    /// So one downstream below a relay that asks for its whole quota leaves the relay room to
    /// ask for what its other downstreams want (issue #26, item 4).
    pub(crate) fn interest_quota(&self, from: BusId) -> usize {
        use crate::group::table::{GROUPS_PER_LINK_MAX, GROUPS_PER_PEER_MAX};
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
