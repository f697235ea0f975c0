//! The group part's state, each piece behind its own lock.

/// The group part's state, each piece behind its own lock.
pub(crate) struct GroupPart {
    /// The groups this node joined and the groups its peers asked for.
    pub(in crate::group) table: busway_core::group::locked::GroupTable,
    /// Hands what links decide for the application's group streams to the inbox in the
    /// order decided.
    pub(in crate::group) handover: busway_core::turns::Handover<crate::node::message::MessageBatch>,
    /// Notified when this node starts taking part in groups (it joins, or a peer asks for a
    /// group): links with rings stop looking at them only every `RING_IDLE_WATCH_MS`.
    pub(in crate::group) active: tokio::sync::Notify,
    /// This node's logs of the groups it publishes to, for peers on its host.
    pub(in crate::group) logs: std::sync::Arc<crate::group::log_out::GroupLogs>,
    /// This node's multicasts (numbers, what it keeps for repairs) and the streams of
    /// multicasts to it.
    pub(in crate::group) multicasts:
        busway_core::turns::InTurn<busway_core::multicast::state::MulticastState>,
    /// The node's groups as its reads see them: the receive dispatcher and the ring readers
    /// hand group messages here (`group::reads::NodeGroups`).
    pub(in crate::group) reads: std::sync::Arc<dyn crate::peer::ring_link::GroupMessages>,
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

    /// Whether this node takes part in no group (joined none, asked for none).
    pub(crate) fn is_idle(&self) -> bool {
        self.table.lock().is_idle()
    }

    /// Resolves once this node starts taking part in groups (see `is_idle`); enable it
    /// before looking at `is_idle` so that no start is missed.
    pub(crate) fn became_active(&self) -> tokio::sync::futures::Notified<'_> {
        self.active.notified()
    }

    /// Whether a relay's publishes wait for room toward a full peer.
    pub(crate) fn forwards_waiting(&self) -> bool {
        self.table.waiting.any()
    }

    /// A peer came (or came back as a new incarnation): it is told what this node wants.
    pub(crate) fn peer_came(&self, peer: busway_core::BusId) {
        self.table.lock().peer_came(peer);
    }

    /// The groups this node published to, and whether it made any multicast (what a drain
    /// waits for members and receivers of).
    pub(crate) fn published(&self) -> (Vec<String>, bool) {
        let groups = self.table.lock().published_groups();
        (groups, self.multicasts.lock().made_any())
    }

    /// This node's logs of the groups it publishes to.
    pub(crate) fn logs(&self) -> &std::sync::Arc<crate::group::log_out::GroupLogs> {
        &self.logs
    }

    /// Where reads hand their group messages (the dispatcher, the ring readers).
    pub(crate) fn reads(&self) -> &std::sync::Arc<dyn crate::peer::ring_link::GroupMessages> {
        &self.reads
    }
}
