//! The route part's state: its tables.

/// The route part's tables: destinations behind relays, direct links on hints, and the
/// registrations along the tree.
#[derive(Default)]
pub(crate) struct RouteTables {
    /// Destinations reached through relays, and sources of relayed messages.
    pub(crate) relayed: crate::route::relayed_table::RelayedTable,
    /// On-demand direct links: hints given and taken, dials running.
    pub(crate) hints: crate::route::hints::Hints,
    /// What downstreams registered here, and what this node registered upstream.
    pub(crate) registrations: crate::route::registration_table::Registrations,
}
