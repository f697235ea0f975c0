//! The node's direct neighbors: one [`Peer`] per bus id (up, or down and waiting out its
//! deadline with the messages it holds), which of them is the upstream, and a wake-up for
//! whoever waits for a link to come or go; the peers' deferred ring sends and the numbering
//! of links. This module owns that table; links attach and detach through `peer::lifecycle`,
//! which reports what the table hands back.

use crate::id_hash::IdHashState;
use crate::peer::Peer;
use busway_core::relay::Neighbor;
use busway_core::BusId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::futures::Notified;
use tokio::sync::Notify;

/// The peers of one node, keyed by bus id.
pub(crate) struct PeerTable {
    peers: RwLock<HashMap<BusId, Arc<Peer>, IdHashState>>,
    /// The bus id behind the `upstream` address, once a link to it was up.
    upstream: Mutex<Option<BusId>>,
    /// Woken when a link comes up or goes down.
    changed: Notify,
    /// Peers whose rings hold single sends not yet published.
    deferred: Arc<crate::peer::deferred::Deferred>,
    /// The number of the node's next link (its connections and rings).
    next_link_id: std::sync::atomic::AtomicU64,
}

/// What [`PeerTable::attach`] found for an authenticated link.
pub(crate) struct Attached {
    pub(crate) peer: Arc<Peer>,
    /// The previous incarnation the new one replaced: what it held is lost (to be reported).
    pub(crate) replaced: Option<Arc<Peer>>,
}

impl PeerTable {
    /// An empty table whose peers' rings report deferred sends to `deferred`.
    pub(crate) fn new(deferred: Arc<crate::peer::deferred::Deferred>) -> Self {
        PeerTable {
            peers: Default::default(),
            upstream: Default::default(),
            changed: Default::default(),
            deferred,
            next_link_id: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// The peers whose rings hold single sends not yet published.
    pub(crate) fn deferred(&self) -> &crate::peer::deferred::Deferred {
        &self.deferred
    }

    /// A number for a new link, unique in this node.
    pub(crate) fn next_link_id(&self) -> u64 {
        // Relaxed: a unique number, publishing nothing.
        self.next_link_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn get(&self, id: BusId) -> Option<Arc<Peer>> {
        self.peers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    pub(crate) fn snapshot(&self) -> Vec<Arc<Peer>> {
        self.peers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    pub(crate) fn upstream(&self) -> Option<BusId> {
        *self.upstream.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_upstream(&self, id: BusId) {
        *self.upstream.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
    }

    /// A future that completes at the next change (register it before looking at the table,
    /// so that no change between the look and the wait is missed).
    pub(crate) fn changed(&self) -> Notified<'_> {
        self.changed.notified()
    }

    /// Wakes everyone waiting in [`PeerTable::changed`].
    pub(crate) fn notify_changed(&self) {
        self.changed.notify_waiters();
    }

    /// Runs `f` on what routing knows of every neighbor, under the table's lock: a REGISTER
    /// is checked and applied within it, as a HELLO's range is checked within `attach`'s,
    /// so the two cannot both take the same ids. (Lock order: this table, then the
    /// registrations.)
    pub(crate) fn with_neighbors<T>(&self, f: impl FnOnce(&[Neighbor]) -> T) -> T {
        let peers = self.peers.read().unwrap_or_else(|p| p.into_inner());
        let neighbors: Vec<Neighbor> = peers.values().map(|p| p.neighbor()).collect();
        f(&neighbors)
    }

    /// Forgets the peers dead (down past their deadline, nothing held) for `idle_ms` or more;
    /// returns how many. Looked for under the read lock (sends go on meanwhile), removed under
    /// the write lock, which an attaching link takes too, after a second look.
    pub(crate) fn forget_dead(&self, now_ms: u64, idle_ms: u64) -> usize {
        let dead: Vec<BusId> = self
            .peers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, p)| p.dead_for(now_ms, idle_ms))
            .map(|(&id, _)| id)
            .collect();
        if dead.is_empty() {
            return 0;
        }
        let mut peers = self.peers.write().unwrap_or_else(|p| p.into_inner());
        dead.into_iter()
            .filter(|id| {
                let still = peers.get(id).is_some_and(|p| p.dead_for(now_ms, idle_ms));
                still && peers.remove(id).is_some()
            })
            .count()
    }

    /// The peer an authenticated link of incarnation `incarnation` belongs to: the one of that
    /// incarnation, or a new one made by `make` in place of any previous incarnation that is
    /// down. A subtree the peer registers with node `me` (`registers`) is checked against every
    /// neighbor's under the same lock, so that two links cannot both pass the check. Refuses a
    /// second link to an id that is up from another incarnation, naming both.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attach(
        &self,
        me: BusId,
        id: BusId,
        incarnation: u64,
        registers: Option<(BusId, BusId)>,
        registry: impl FnOnce() -> Arc<busway_core::registry::Registry>,
        make: impl FnOnce() -> Peer,
    ) -> Result<Attached, String> {
        let mut peers = self.peers.write().unwrap_or_else(|p| p.into_inner());
        if let Some(range) = registers {
            let others: Vec<Neighbor> = peers.values().map(|p| p.neighbor()).collect();
            // Looked at under the lock (see `with_neighbors`).
            busway_core::relay::check_registration(me, id, range, &others, &registry())?;
        }
        match peers.get(&id) {
            Some(old) if old.incarnation() == incarnation => Ok(Attached {
                peer: old.clone(),
                replaced: None,
            }),
            Some(old) if old.is_up() => {
                let s = old.snapshot();
                Err(format!(
                    "bus id {id} is already connected from another incarnation ({:#x} via {}; this one is {incarnation:#x})",
                    s.intro.incarnation, s.addr
                ))
            }
            _ => {
                let fresh = Arc::new(make());
                let replaced = peers.insert(id, fresh.clone());
                Ok(Attached {
                    peer: fresh,
                    replaced,
                })
            }
        }
    }
}
