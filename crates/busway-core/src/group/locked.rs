//! A node's group state behind its locks, for a host whose links decide on many threads:
//! each call takes one state's lock alone (no lock is held across links), a call that
//! delivers takes its turn to hand over under it (`turns::InTurn`), and hints that every
//! read of every link can look at without a lock say whether a mark may be owed or a
//! publish waits for room.

use super::forwards::{Push, Pushed, WaitingForwards};
use super::repairs::Repairs;
use super::state::GroupState;
use super::stream::HeldBudget;
use crate::turns::{locked, Batch, Delivered, InTurn};
use crate::BusId;
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

/// A node's group state, behind its locks.
pub struct GroupTable {
    state: InTurn<GroupState>,
    /// Repairs under way, oldest first (`GROUP_REPAIRS_PENDING_MAX`).
    repairs: Mutex<Repairs>,
    /// Publishes a relay passes on that wait for room toward a peer (see [`LockedForwards`]).
    pub waiting: LockedForwards,
    /// Held from a look at what each peer is to be told to the record of what was (the
    /// host's `reads::sync_adverts`): two at once could each record what the other's look did
    /// not see.
    adverts_turn: Mutex<()>,
    /// Whether the state may owe a peer a mark (`GroupState::owes_none`), for the look every
    /// forward makes without the lock: set after each `with`, where marks are owed and paid.
    owes: AtomicBool,
    /// When (ms on the node's clock) a link last found the application's inbox holding
    /// `GROUP_INBOX_BYTES_MAX` of publishes not taken; `u64::MAX`: never.
    app_behind_ms: AtomicU64,
}

impl GroupTable {
    /// A table that keeps up to `retain_bytes` of recent publishes per group for repairs.
    pub fn new(retain_bytes: usize, held: Arc<HeldBudget>) -> Self {
        Self {
            state: InTurn::new(GroupState::new(retain_bytes, held)),
            repairs: Mutex::default(),
            waiting: LockedForwards::default(),
            app_behind_ms: AtomicU64::new(u64::MAX),
            owes: AtomicBool::new(false),
            adverts_turn: Mutex::default(),
        }
    }

    /// The turn to look at and record what each peer is told (see `adverts_turn`).
    pub fn adverts_turn(&self) -> MutexGuard<'_, ()> {
        locked(&self.adverts_turn)
    }

    /// A link found the application behind on its group publishes at `now_ms`.
    pub fn note_app_behind(&self, now_ms: u64) {
        // Relaxed: a time read by `app_behind_at` to decide a cut-off, ordering nothing.
        self.app_behind_ms.store(now_ms, Relaxed);
    }

    /// When the application was last found behind on its group publishes, if ever (see
    /// `busway_core::group::stream::cuts_off`).
    pub fn app_behind_at(&self) -> Option<u64> {
        // Relaxed: see `note_app_behind`.
        let at = self.app_behind_ms.load(Relaxed);
        (at != u64::MAX).then_some(at)
    }

    /// The state, for a call that delivers nothing (see `InTurn::lock`).
    pub fn lock(&self) -> MutexGuard<'_, GroupState> {
        self.state.lock()
    }

    /// Runs `f` on the state under its lock, taking the turn to hand over if `delivers`
    /// (see `InTurn::with`); the hint of marks owed is set after.
    pub fn with<R, B: Batch>(
        &self,
        delivers: fn(&R) -> bool,
        f: impl FnOnce(&mut GroupState) -> R,
        out: &mut Delivered<'_, B>,
    ) -> R {
        // Relaxed: a hint; a forward that reads it stale looks under the lock (true) or
        // misses a mark owed since by another link's drop, which its tick pays.
        let after = |s: &GroupState| self.owes.store(!s.owes_none(), Relaxed);
        self.state.with(delivers, f, out, after)
    }

    /// Whether a peer may be owed a mark (see `owes`).
    pub fn owes_marks(&self) -> bool {
        // Relaxed: see `with`.
        self.owes.load(Relaxed)
    }

    /// Runs `f` on the repairs under way, under their lock alone.
    pub fn repairs_with<R>(&self, f: impl FnOnce(&mut Repairs) -> R) -> R {
        f(&mut locked(&self.repairs))
    }

    /// Whether repairs are under way.
    pub fn has_repairs(&self) -> bool {
        !locked(&self.repairs).is_empty()
    }
}

/// The publishes waiting for room toward peers (see `busway_core::group::forwards`).
#[derive(Default)]
pub struct LockedForwards {
    state: Mutex<WaitingForwards>,
    /// Whether `state` holds any, for the look every read of every link makes (`any`)
    /// without taking the lock.
    any: AtomicBool,
    /// Whether `state` has a lagging peer, for the look every forward that fits makes.
    any_lagging: AtomicBool,
}

impl LockedForwards {
    fn lock(&self) -> MutexGuard<'_, WaitingForwards> {
        locked(&self.state)
    }

    /// Sets the hints from `st` (under its lock, as every change of the state).
    fn hint(&self, st: &WaitingForwards) {
        // Relaxed: hints; the state itself is read under its lock (the link that changed it
        // reads the hint on its own thread right after).
        self.any.store(!st.is_empty(), Relaxed);
        self.any_lagging.store(st.any_lagging(), Relaxed);
    }

    /// Whether any publish waits for room.
    pub fn any(&self) -> bool {
        // Relaxed: a hint, see `hint`.
        self.any.load(Relaxed)
    }

    /// Whether a publish waits for room toward `peer` already (later ones go behind it).
    pub fn waits_for(&self, peer: BusId) -> bool {
        self.any() && self.lock().waits_for(peer)
    }

    /// Whether the publishes waiting hold more than `WAITING_BYTES_MAX`.
    pub fn over_bound(&self) -> bool {
        self.any() && self.lock().over_bound()
    }

    /// Whether cut-off publishes toward `peer` are dropped at once while it is full.
    pub fn is_lagging(&self, peer: BusId) -> bool {
        // Relaxed: a hint, see `hint`.
        self.any_lagging.load(Relaxed) && self.lock().is_lagging(peer)
    }

    /// Runs `f` on the waiting publishes under their lock, the hints set after.
    pub fn with<R>(&self, f: impl FnOnce(&mut WaitingForwards) -> R) -> R {
        let mut st = self.lock();
        let got = f(&mut st);
        self.hint(&st);
        got
    }

    /// Pushes the waiting publishes in order with `push` (see [`WaitingForwards::push`]), and
    /// calls `given_up` for each cut-off one dropped, before the lock goes: no other link sees
    /// that peer lagging before what it is owed is known.
    pub fn push(
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
    pub fn peer_gone(&self, peer: BusId) {
        let mut st = self.lock();
        st.peer_gone(peer);
        self.hint(&st);
    }
}
