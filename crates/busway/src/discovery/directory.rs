//! What a node knows from etcd (`discovery` fills it): the other nodes' registrations, the
//! state of its session there, and the session's lease (revoked at shutdown).

use crate::discovery::etcd_http::Etcd;
use busway_core::BusId;
use std::collections::HashMap;
use std::sync::Mutex;

/// A node as its registration in etcd names it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiscoveredNode {
    /// Its bus id.
    pub id: BusId,
    /// Its incarnation (a new one each time the node starts).
    pub incarnation: u64,
    /// Where it listens.
    pub addrs: Vec<String>,
}

/// What `Node::discovery` reports: etcd's state as this node sees it, and the nodes it knows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiscoveryInfo {
    /// A session with etcd is up (connected, registered, watching).
    pub connected: bool,
    /// Times this node registered (once per session: more than one means etcd went away and
    /// came back).
    pub registrations: u64,
    /// Why the last session ended or could not start, if one did.
    pub last_error: Option<String>,
    /// The other nodes registered, sorted by id (what this node knew last, while etcd is away).
    pub nodes: Vec<DiscoveredNode>,
}

/// A node's view of the directory.
#[derive(Default)]
pub(crate) struct Directory {
    state: Mutex<DirectoryState>,
}

#[derive(Default)]
pub(crate) struct DirectoryState {
    pub(crate) info: DiscoveryInfo,
    pub(crate) known: HashMap<BusId, DiscoveredNode>,
    /// The session's client and lease, to revoke at shutdown.
    pub(crate) session: Option<(Etcd, i64)>,
}

impl Directory {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, DirectoryState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where `id` listens, if etcd named it.
    pub(crate) fn lookup(&self, id: BusId) -> Option<DiscoveredNode> {
        self.lock().known.get(&id).cloned()
    }

    pub(crate) fn info(&self) -> DiscoveryInfo {
        let st = self.lock();
        let mut info = st.info.clone();
        info.nodes = st.known.values().cloned().collect();
        info.nodes.sort_by_key(|n| n.id);
        info
    }
}
