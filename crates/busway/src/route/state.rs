//! The route part's state: its tables.

/// The route part's tables: destinations behind relays, direct links on hints, and the
/// registrations along the tree.
#[derive(Default)]
pub(crate) struct RouteTables {
    /// Destinations reached through relays, and sources of relayed messages.
    pub(in crate::route) relayed: crate::route::relayed_table::RelayedTable,
    /// On-demand direct links: hints given and taken, dials running.
    pub(in crate::route) hints: crate::route::hints::Hints,
    /// What downstreams registered here, and what this node registered upstream.
    pub(in crate::route) registrations: crate::route::registration_table::Registrations,
}

impl RouteTables {
    /// What downstreams registered here (a snapshot).
    pub(crate) fn registered_below(&self) -> std::sync::Arc<busway_core::registry::Registry> {
        self.registrations.below()
    }

    /// The downstream that registered the range holding `id`, if any.
    pub(crate) fn registered_by(&self, id: busway_core::BusId) -> Option<busway_core::BusId> {
        self.registrations.registered_by(id)
    }

    /// Forgets what the downstream `peer` registered (it restarted, or is gone).
    pub(crate) fn forget_registrations(&self, peer: busway_core::BusId) {
        self.registrations.forget(peer);
    }

    /// The relayed sources' claims on their hand-over (see `RelayedTable::claim`).
    pub(crate) fn relayed_sources(&self) -> &crate::route::relayed_table::RelayedTable {
        &self.relayed
    }

    /// Queues a dial of `dst` at `addrs` (a hint, or an address etcd gave) for the direct
    /// dialer (`link::connector::direct_dial_loop`).
    pub(crate) fn queue_dial(&self, dst: busway_core::BusId, addrs: Vec<String>) {
        self.hints.queue(dst, addrs);
    }

    /// The dials to start, once there are any.
    pub(crate) async fn next_dials(&self) -> Vec<(busway_core::BusId, Vec<String>)> {
        self.hints.next_dials().await
    }

    /// The direct dialer's task for `dst` ended.
    pub(crate) fn end_dial(&self, dst: busway_core::BusId) {
        self.hints.end_dial(dst);
    }
}
