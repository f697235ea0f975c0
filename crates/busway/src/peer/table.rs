//! The node's direct neighbors: one [`Peer`] per bus id (up, or down and waiting out its
//! deadline with the messages it holds), which of them is the upstream, and a wake-up for
//! whoever waits for a link to come or go; the peers' deferred ring sends and the numbering
//! of links. This module owns that table; links attach and detach through `peer::lifecycle`,
//! which reports what the table hands back.

use crate::id_hash::IdHashState;
use crate::peer::Peer;
use busway_core::relay::Neighbor;
use busway_core::BusId;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// This table among all of the process's (`TABLES`): what a thread's `LAST_LOOKUP`
    /// names, so that a table made where a dropped one was is never mistaken for it.
    table_id: u64,
    /// Moves on at every change of `peers`, under its write lock: a thread's `LAST_LOOKUP`
    /// of this table is the table's answer while it has not moved.
    generation: AtomicU64,
}

/// Tables made in this process, counted (`PeerTable::table_id`).
static TABLES: AtomicU64 = AtomicU64::new(0);

/// A thread's last look at a peer table: a thread that sends to one id in a loop looks the
/// table up once, not once per message (no lock, no hashing, no reference counted). It
/// holds the peer until the thread's next look that finds a peer (in any table), or its end:
/// at most one peer per thread.
struct LastLookup {
    table_id: u64,
    generation: u64,
    id: BusId,
    peer: Arc<Peer>,
}

thread_local! {
    static LAST_LOOKUP: RefCell<Option<LastLookup>> = const { RefCell::new(None) };
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
            // Relaxed: a unique number, publishing nothing.
            table_id: TABLES.fetch_add(1, Ordering::Relaxed),
            generation: AtomicU64::new(0),
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

    /// The peer of bus id `id`: the calling thread's last answer for it if the table has not
    /// changed since (see `LAST_LOOKUP`), else looked up (and kept as that answer).
    pub(crate) fn get(&self, id: BusId) -> Option<Arc<Peer>> {
        if let Some(peer) = self.with_last_looked_up(id, Arc::clone) {
            return Some(peer);
        }
        let (peer, generation) = {
            let peers = self.peers.read().unwrap_or_else(|p| p.into_inner());
            // Read under the read lock: no change has moved it since `peers` was read.
            // Relaxed: the lock orders it.
            (
                peers.get(&id).cloned(),
                self.generation.load(Ordering::Relaxed),
            )
        };
        if let Some(p) = &peer {
            // Set with the lock released: the look it replaces may hold the last reference to
            // a peer, dropped here.
            let look = LastLookup {
                table_id: self.table_id,
                generation,
                id,
                peer: p.clone(),
            };
            // Not kept on a thread whose locals are being torn down (a look from a drop).
            let _ = LAST_LOOKUP.try_with(|last| last.replace(Some(look)));
        }
        peer
    }

    /// Runs `f` on the peer of `id` if the calling thread's last look (`get`) found it and
    /// the table has not changed since: the table's answer, used in place. `None`, and `f`
    /// not run, otherwise.
    #[inline]
    pub(crate) fn with_last_looked_up<R>(
        &self,
        id: BusId,
        f: impl FnOnce(&Arc<Peer>) -> R,
    ) -> Option<R> {
        // Acquire: pairs with the Release in `changed_under_lock`; a generation seen
        // unchanged means no insert or removal since the look.
        let generation = self.generation.load(Ordering::Acquire);
        // Taken out while `f` runs, and put back after unless `f` looked something up
        // itself: `f` may come back here.
        let last = LAST_LOOKUP.try_with(RefCell::take).ok()??;
        let fits = last.table_id == self.table_id && last.generation == generation && last.id == id;
        let r = fits.then(|| f(&last.peer));
        // Back in its place, unless `f` put another there; a look left over is dropped after
        // the borrow ends (dropping a peer must not find the slot borrowed).
        let _left_over = LAST_LOOKUP.try_with(|slot| {
            let mut slot = slot.borrow_mut();
            match *slot {
                None => slot.replace(last),
                Some(_) => Some(last),
            }
        });
        r
    }

    /// `peers` changed (called under its write lock): every thread's cached look is stale.
    fn changed_under_lock(&self) {
        // Release: pairs with the Acquire load in `with_last_looked_up`.
        self.generation.fetch_add(1, Ordering::Release);
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
        let removed = dead
            .into_iter()
            .filter(|id| {
                let still = peers.get(id).is_some_and(|p| p.dead_for(now_ms, idle_ms));
                still && peers.remove(id).is_some()
            })
            .count();
        self.changed_under_lock();
        drop(peers);
        removed
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
                self.changed_under_lock();
                Ok(Attached {
                    peer: fresh,
                    replaced,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use busway_core::handshake::local_hello;

    /// A peer of bus id 2 and `incarnation`, with no link (down: a new incarnation may take
    /// its place).
    fn peer(incarnation: u64) -> Peer {
        let hello = local_hello(BusId(2), incarnation, 0, [0; 16], vec![]);
        Peer::new(hello, "tcp://127.0.0.1:1".into(), 1 << 20, false)
    }

    fn attach(table: &PeerTable, incarnation: u64) -> Arc<Peer> {
        let no_registry = || unreachable!("no registration asked");
        table
            .attach(BusId(1), BusId(2), incarnation, None, no_registry, || {
                peer(incarnation)
            })
            .unwrap()
            .peer
    }

    #[test]
    fn a_threads_last_look_is_the_tables_answer_until_the_table_changes() {
        let table = PeerTable::new(Default::default());
        let first = attach(&table, 7);
        assert!(Arc::ptr_eq(&table.get(BusId(2)).unwrap(), &first));
        let kept = table.with_last_looked_up(BusId(2), |p| Arc::ptr_eq(p, &first));
        assert_eq!(kept, Some(true), "the look is kept");
        assert!(
            table.with_last_looked_up(BusId(3), |_| ()).is_none(),
            "another id"
        );
        // A new incarnation takes the old one's place: the kept look is stale.
        let second = attach(&table, 8);
        assert!(table.with_last_looked_up(BusId(2), |_| ()).is_none());
        assert!(Arc::ptr_eq(&table.get(BusId(2)).unwrap(), &second));
        // Another table never answers with this one's look, even for the same id.
        let other = PeerTable::new(Default::default());
        assert!(other.with_last_looked_up(BusId(2), |_| ()).is_none());
        assert!(other.get(BusId(2)).is_none());
        // A look that comes back to the table inside `f` replaces nothing it should not.
        let nested = table.with_last_looked_up(BusId(2), |_| table.get(BusId(2)).is_some());
        assert_eq!(nested, Some(true));
        assert!(table
            .with_last_looked_up(BusId(2), |p| Arc::ptr_eq(p, &second))
            .unwrap());
    }

    #[test]
    fn a_forgotten_peer_is_not_found_through_a_kept_look() {
        let table = PeerTable::new(Default::default());
        let p = attach(&table, 7);
        assert!(table.get(BusId(2)).is_some());
        // Dead since 0 and idle for 1 ms: forgotten.
        p.lock().slot = crate::peer::slot::Slot::Dead { since_ms: 0 };
        assert_eq!(table.forget_dead(1, 1), 1);
        assert!(table.with_last_looked_up(BusId(2), |_| ()).is_none());
        assert!(table.get(BusId(2)).is_none());
    }
}
