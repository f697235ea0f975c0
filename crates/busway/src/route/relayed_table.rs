//! The end-to-end state of relayed traffic: one [`Remote`] per destination reached through
//! relays (its numbering and the messages it holds), where each source of relayed messages
//! stands ([`Arrivals`]), and the wake-up of the pump task that hands queued messages to their
//! next hops. This module owns those; `routing` decides with them.

use crate::id_hash::IdHashState;
use crate::route::remote::Remote;
use busway_core::e2e::Arrivals;
use busway_core::routed::RoutedHeader;
use busway_core::BusId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::futures::Notified;
use tokio::sync::Notify;

/// Relayed destinations and sources of one node.
#[derive(Default)]
pub(crate) struct RelayedTable {
    remotes: RwLock<HashMap<BusId, Arc<Remote>, IdHashState>>,
    arrivals: Mutex<Arrivals>,
    /// Readers waiting for another link's claim on a source (see [`RelayedTable::claim`]).
    claim_released: Notify,
    /// Wakes the pump task: relayed messages were queued.
    pump_wake: Notify,
}

impl RelayedTable {
    pub(crate) fn get(&self, dst: BusId) -> Option<Arc<Remote>> {
        self.remotes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&dst)
            .cloned()
    }

    /// The destination `dst`, made by `make` if it is new.
    pub(crate) fn get_or_insert(&self, dst: BusId, make: impl FnOnce() -> Remote) -> Arc<Remote> {
        self.remotes
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(dst)
            .or_insert_with(|| Arc::new(make()))
            .clone()
    }

    pub(crate) fn snapshot(&self) -> Vec<Arc<Remote>> {
        self.remotes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Where a ROUTED DATA frame stands against what its source delivered here: the number of
    /// its messages to skip, or `Err(expected)` for a gap (see [`Arrivals::check`]).
    pub(crate) fn check_arrival(&self, h: &RoutedHeader, pending: Option<u64>) -> Result<u64, u64> {
        self.arrivals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .check(h.src, h.src_incarnation, h.seq, pending, h.settled)
    }

    /// Waits until link `link_id` is the one reader handing over messages of `src` (see
    /// `Arrivals::claim`), and says how many of those numbered from `first` (incarnation
    /// `incarnation`) were delivered already, by any link. The claim ends with
    /// [`Claim::finish`], or when the guard is dropped (the link's task ended before the
    /// hand-over: nothing was marked delivered, and the source writes them again).
    pub(crate) async fn claim(
        &self,
        src: BusId,
        link_id: u64,
        (incarnation, first): (u64, u64),
    ) -> (Claim<'_>, u64) {
        loop {
            let released = self.claim_released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(got) = self.try_claim(src, link_id, (incarnation, first)) {
                return got;
            }
            released.await;
        }
    }

    /// The claim of [`RelayedTable::claim`] if it is free now (one lock for both answers).
    pub(crate) fn try_claim(
        &self,
        src: BusId,
        link_id: u64,
        (incarnation, first): (u64, u64),
    ) -> Option<(Claim<'_>, u64)> {
        let mut arrivals = self.lock_arrivals();
        if !arrivals.claim(src, link_id) {
            return None;
        }
        let done = arrivals.already_delivered(src, incarnation, first);
        drop(arrivals);
        // Made only once claimed: a `Claim` releases the claim when it is dropped.
        let claim = Claim {
            table: self,
            src,
            link_id,
            finished: false,
        };
        Some((claim, done))
    }

    fn lock_arrivals(&self) -> std::sync::MutexGuard<'_, Arrivals> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.arrivals.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets the sources no frame came from for `idle_ms`; returns how many.
    pub(crate) fn forget_sources(&self, now_ms: u64, idle_ms: u64) -> usize {
        self.arrivals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .forget_idle(now_ms, idle_ms)
    }

    /// Forgets the destinations that hold nothing and no send looked up for `idle_ms`;
    /// returns how many. A later send to one starts a fresh entry numbered from 0, which its
    /// destination takes once it forgot this source (`idle_ms` is twice its window: see
    /// `NodeConfig::forget_after_ms`).
    pub(crate) fn forget_destinations(&self, now_ms: u64, idle_ms: u64) -> usize {
        // Looked for under the read lock (sends go on meanwhile); removed under the write lock
        // once each is marked forgotten (see `Remote::forget_if_idle`).
        let idle: Vec<Arc<Remote>> = self
            .snapshot()
            .into_iter()
            .filter(|r| r.is_idle(now_ms, idle_ms))
            .collect();
        if idle.is_empty() {
            return 0;
        }
        let mut remotes = self.remotes.write().unwrap_or_else(|p| p.into_inner());
        idle.into_iter()
            .filter(|r| r.forget_if_idle(now_ms, idle_ms) && remotes.remove(&r.id).is_some())
            .count()
    }

    /// Wakes the pump task (one wake-up is kept if it is not waiting).
    pub(crate) fn wake_pump(&self) {
        self.pump_wake.notify_one();
    }

    /// The pump task's wait for [`RelayedTable::wake_pump`].
    pub(crate) fn pump_woken(&self) -> Notified<'_> {
        self.pump_wake.notified()
    }
}

/// One link's turn to hand over a source's relayed messages (see [`RelayedTable::claim`]).
pub(crate) struct Claim<'a> {
    table: &'a RelayedTable,
    src: BusId,
    link_id: u64,
    finished: bool,
}

impl Claim<'_> {
    /// Messages up to `next_expected` (incarnation `incarnation`) are in the inbox (at
    /// `now_ms`): marked delivered and the claim released under one lock.
    pub(crate) fn finish(mut self, incarnation: u64, next_expected: u64, now_ms: u64) {
        let mut arrivals = self.table.lock_arrivals();
        arrivals.delivered(self.src, incarnation, next_expected, now_ms);
        let waited = arrivals.release(self.src, self.link_id);
        drop(arrivals);
        self.finished = true;
        if waited {
            self.table.claim_released.notify_waiters();
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let waited = self.table.lock_arrivals().release(self.src, self.link_id);
        if waited {
            self.table.claim_released.notify_waiters();
        }
    }
}
