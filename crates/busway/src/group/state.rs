//! The group part's state, each piece behind its own lock.

/// The group part's state, each piece behind its own lock.
pub(crate) struct GroupPart {
    /// The groups this node joined and the groups its peers asked for.
    pub(crate) table: busway_core::group::locked::GroupTable,
    /// Hands what links decide for the application's group streams to the inbox in the
    /// order decided.
    pub(crate) handover: busway_core::turns::Handover<crate::node::message::MessageBatch>,
    /// Notified when this node starts taking part in groups (it joins, or a peer asks for a
    /// group): links with rings stop looking at them only every `RING_IDLE_WATCH_MS`.
    pub(crate) active: tokio::sync::Notify,
    /// This node's logs of the groups it publishes to, for peers on its host.
    pub(crate) logs: std::sync::Arc<crate::group::log_out::GroupLogs>,
    /// This node's multicasts (numbers, what it keeps for repairs) and the streams of
    /// multicasts to it.
    pub(crate) multicasts:
        busway_core::turns::InTurn<busway_core::multicast::state::MulticastState>,
    /// The node's groups as its reads see them: the receive dispatcher and the ring readers
    /// hand group messages here (`group::reads::NodeGroups`).
    pub(crate) reads: std::sync::Arc<dyn crate::peer::ring_link::GroupMessages>,
}

impl GroupPart {
    /// The group part of node `id`: `retain_bytes` kept per stream for repairs (shared by
    /// groups and multicasts through one budget), `log_bytes` per group log (0: no logs),
    /// its reads handed to `reads`.
    pub(crate) fn new(
        id: busway_core::BusId,
        retain_bytes: usize,
        log_bytes: usize,
        reads: std::sync::Arc<dyn crate::peer::ring_link::GroupMessages>,
    ) -> Self {
        let held = std::sync::Arc::new(busway_core::group::stream::HeldBudget::default());
        GroupPart {
            table: busway_core::group::locked::GroupTable::new(retain_bytes, held.clone()),
            handover: Default::default(),
            active: Default::default(),
            logs: std::sync::Arc::new(crate::group::log_out::GroupLogs::new(id, log_bytes)),
            multicasts: busway_core::turns::InTurn::new(
                busway_core::multicast::state::MulticastState::new(retain_bytes, held),
            ),
            reads,
        }
    }
}
