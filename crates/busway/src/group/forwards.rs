//! Publishes a relay passes on that wait for room toward a peer whose queue was full, behind
//! their lock: the rules are busway-core's (`busway_core::group::forwards`), the hints that
//! let every read of every link look without the lock are this module's.

use busway_core::group::forwards::{Push, Pushed, WaitingForwards as Waiting};
use busway_core::BusId;
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

/// The publishes waiting for room toward peers (see `busway_core::group::forwards`).
#[derive(Default)]
pub(crate) struct WaitingForwards {
    state: Mutex<Waiting>,
    /// Whether `state` holds any, for the look every read of every link makes (`any`)
    /// without taking the lock.
    any: AtomicBool,
    /// Whether `state` has a lagging peer, for the look every forward that fits makes.
    any_lagging: AtomicBool,
}

impl WaitingForwards {
    fn lock(&self) -> MutexGuard<'_, Waiting> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the hints from `st` (under its lock, as every change of the state).
    fn hint(&self, st: &Waiting) {
        // Relaxed: hints; the state itself is read under its lock (the link that changed it
        // reads the hint on its own thread right after).
        self.any.store(!st.is_empty(), Relaxed);
        self.any_lagging.store(st.any_lagging(), Relaxed);
    }

    /// Whether any publish waits for room.
    pub(crate) fn any(&self) -> bool {
        // Relaxed: a hint, see `hint`.
        self.any.load(Relaxed)
    }

    /// Whether a publish waits for room toward `peer` already (later ones go behind it).
    pub(crate) fn waits_for(&self, peer: BusId) -> bool {
        self.any() && self.lock().waits_for(peer)
    }

    /// Whether the publishes waiting hold more than `WAITING_BYTES_MAX`.
    pub(crate) fn over_bound(&self) -> bool {
        self.any() && self.lock().over_bound()
    }

    /// Whether cut-off publishes toward `peer` are dropped at once while it is full.
    pub(crate) fn is_lagging(&self, peer: BusId) -> bool {
        // Relaxed: a hint, see `hint`.
        self.any_lagging.load(Relaxed) && self.lock().is_lagging(peer)
    }

    /// Runs `f` on the waiting publishes under their lock, the hints set after.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Waiting) -> R) -> R {
        let mut st = self.lock();
        let got = f(&mut st);
        self.hint(&st);
        got
    }

    /// Pushes the waiting publishes in order with `push` (see `WaitingForwards::push` in the
    /// core), and calls `given_up` for each cut-off one dropped, before the lock goes: no
    /// other link sees that peer lagging before what it is owed is known.
    pub(crate) fn push(
        &self,
        now_ms: u64,
        push: impl FnMut(BusId, &Bytes) -> Push,
        mut given_up: impl FnMut(BusId, &Bytes),
    ) -> Pushed {
        let mut st = self.lock();
        let out = st.push(now_ms, push);
        for (peer, body) in &out.dropped {
            given_up(*peer, body);
        }
        self.hint(&st);
        out
    }

    /// `peer` is gone: nothing waits for it any more.
    pub(crate) fn peer_gone(&self, peer: BusId) {
        let mut st = self.lock();
        st.peer_gone(peer);
        self.hint(&st);
    }
}
