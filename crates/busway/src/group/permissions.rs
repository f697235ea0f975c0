//! What a peer may ask of this node's groups: its interest quota, charged to whom it stands
//! for, and whether it passes groups on (who may join and publish is
//! `busway_core::group::permissions`, over `NodeConfig::group_permissions`).

use crate::shared::Shared;
use busway_core::group::permitted::interest_quota as quota_for;
use busway_core::BusId;

/// How many groups the peer `from` may ask for (see
/// `busway_core::group::permitted::interest_quota`).
pub(crate) fn interest_quota(shared: &Shared, from: BusId) -> usize {
    let declared = shared.peer(from).and_then(|p| p.neighbor().serves);
    let registered = shared.routes.registered_below().ranges_held_by(from);
    quota_for(shared.upstream_id() == Some(from), declared, registered)
}

/// Whether `peer` passes groups on to others: this node's upstream, or a downstream that
/// registered more ids than its own.
pub(crate) fn passes_groups_on(shared: &Shared, peer: &crate::peer::Peer) -> bool {
    let serves_others = peer
        .neighbor()
        .serves
        .is_some_and(|(lo, hi)| (lo, hi) != (peer.id, peer.id));
    serves_others
        || shared.upstream_id() == Some(peer.id)
        || shared.routes.registered_below().holds_any(peer.id)
}
