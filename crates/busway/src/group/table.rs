//! A node's group state under its locks: the rules are busway-core's
//! (`busway_core::group::state` for membership, interest, numbering, retention and the streams
//! seen; `busway_core::group::repairs` for the repairs under way); this module holds them
//! behind mutexes for the I/O threads, each call under its lock alone (`group::handover::InTurn`: a
//! call that delivers to this node's application takes its turn to hand over under it).

use crate::group::forwards::WaitingForwards;
use crate::group::handover::{Delivered, InTurn};
use busway_core::group::repairs::Repairs;
use busway_core::group::state::GroupState;
use busway_core::group::stream::HeldBudget;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

pub use busway_core::group::state::GroupPolicy;
pub(crate) use busway_core::group::state::{GroupName, GROUPS_PER_LINK_MAX, GROUPS_PER_PEER_MAX};

/// A node's group state, behind its locks.
pub(crate) struct GroupTable {
    state: InTurn<GroupState>,
    /// Repairs under way, oldest first (`GROUP_REPAIRS_PENDING_MAX`).
    repairs: Mutex<Repairs>,
    /// Publishes a relay passes on that wait for room toward a peer (see `group::forwards`).
    pub(crate) waiting: WaitingForwards,
    /// Held from a look at what each peer is to be told to the record of what was (see
    /// `Shared::sync_group_adverts`): two at once could each record what the other's look
    /// did not see.
    adverts_turn: Mutex<()>,
    /// Whether the state may owe a peer a mark (`GroupState::owes_none`), for the look every
    /// forward makes without the lock: set after each `with`, where marks are owed and paid.
    owes: AtomicBool,
    /// When (ms on the node's clock) a link last found the application's inbox holding
    /// `GROUP_INBOX_BYTES_MAX` of publishes not taken; `u64::MAX`: never.
    app_behind_ms: AtomicU64,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl GroupTable {
    /// A table that keeps up to `retain_bytes` of recent publishes per group for repairs.
    pub(crate) fn new(retain_bytes: usize, held: Arc<HeldBudget>) -> Self {
        Self {
            state: InTurn::new(GroupState::new(retain_bytes, held)),
            repairs: Mutex::default(),
            waiting: WaitingForwards::default(),
            app_behind_ms: AtomicU64::new(u64::MAX),
            owes: AtomicBool::new(false),
            adverts_turn: Mutex::default(),
        }
    }

    /// The turn to look at and record what each peer is told (see `adverts_turn`).
    pub(crate) fn adverts_turn(&self) -> MutexGuard<'_, ()> {
        locked(&self.adverts_turn)
    }

    /// A link found the application behind on its group publishes at `now_ms`.
    pub(crate) fn note_app_behind(&self, now_ms: u64) {
        // Relaxed: a time read by `app_behind_at` to decide a cut-off, ordering nothing.
        self.app_behind_ms.store(now_ms, Relaxed);
    }

    /// When the application was last found behind on its group publishes, if ever (see
    /// `busway_core::group::stream::cuts_off`).
    pub(crate) fn app_behind_at(&self) -> Option<u64> {
        // Relaxed: see `note_app_behind`.
        let at = self.app_behind_ms.load(Relaxed);
        (at != u64::MAX).then_some(at)
    }

    /// The state, for a call that delivers nothing (see `InTurn::lock`).
    pub(crate) fn lock(&self) -> MutexGuard<'_, GroupState> {
        self.state.lock()
    }

    /// Runs `f` on the state under its lock, taking the turn to hand over if `delivers`
    /// (see `InTurn::with`); the hint of marks owed is set after.
    pub(crate) fn with<R>(
        &self,
        delivers: fn(&R) -> bool,
        f: impl FnOnce(&mut GroupState) -> R,
        out: &mut Delivered<'_>,
    ) -> R {
        // Relaxed: a hint; a forward that reads it stale looks under the lock (true) or
        // misses a mark owed since by another link's drop, which its tick pays.
        let after = |s: &GroupState| self.owes.store(!s.owes_none(), Relaxed);
        self.state.with(delivers, f, out, after)
    }

    /// Whether a peer may be owed a mark (see `owes`).
    pub(crate) fn owes_marks(&self) -> bool {
        // Relaxed: see `with`.
        self.owes.load(Relaxed)
    }

    /// Runs `f` on the repairs under way, under their lock alone.
    pub(crate) fn repairs_with<R>(&self, f: impl FnOnce(&mut Repairs) -> R) -> R {
        f(&mut locked(&self.repairs))
    }

    /// Whether repairs are under way.
    pub(crate) fn has_repairs(&self) -> bool {
        !locked(&self.repairs).is_empty()
    }
}
