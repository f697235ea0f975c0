//! A node's group state under its locks: the rules are busway-core's
//! (`busway_core::group::state` for membership, interest, numbering, retention and the streams
//! seen; `busway_core::group::repairs` for the repairs under way); this module holds them
//! behind mutexes for the I/O threads, each call under its lock alone. A call that delivers
//! to this node's application takes its turn to hand over under that lock (see `handover`).

use crate::group_forwards::WaitingForwards;
use crate::handover::Delivered;
use busway_core::group::repairs::Repairs;
use busway_core::group::state::{GroupState, Published};
use busway_core::group::stream::HeldBudget;
use busway_core::BusId;
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

pub use busway_core::group::state::GroupPolicy;
pub(crate) use busway_core::group::state::{GroupName, GROUPS_PER_LINK_MAX, GROUPS_PER_PEER_MAX};

/// A node's group state, behind its locks.
pub(crate) struct GroupTable {
    state: Mutex<GroupState>,
    /// Repairs under way, oldest first (`GROUP_REPAIRS_PENDING_MAX`).
    repairs: Mutex<Repairs>,
    /// Publishes a relay passes on that wait for room toward a peer (see `group_forwards`).
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

/// Wrappers that take the state's lock for one call of the core's method of the same name
/// (see `GroupState` for what each does): a caller never holds it across its own work.
macro_rules! under_lock {
    ($(fn $name:ident(&self $(, $arg:ident: $ty:ty)*) $(-> $ret:ty)?;)*) => {
        $(
            pub(crate) fn $name(&self $(, $arg: $ty)*) $(-> $ret)? {
                locked(&self.state).$name($($arg),*)
            }
        )*
    };
}

impl GroupTable {
    /// A table that keeps up to `retain_bytes` of recent publishes per group for repairs.
    pub(crate) fn new(retain_bytes: usize, held: Arc<HeldBudget>) -> Self {
        Self {
            state: Mutex::new(GroupState::new(retain_bytes, held)),
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

    /// Runs `f` on the state under its lock; if `delivers` holds for its answer, takes the
    /// turn to hand over under it (see `Delivered::take_turn`).
    pub(crate) fn with<R>(
        &self,
        delivers: fn(&R) -> bool,
        f: impl FnOnce(&mut GroupState) -> R,
        out: &mut Delivered<'_>,
    ) -> R {
        let mut state = locked(&self.state);
        let got = f(&mut state);
        if delivers(&got) {
            out.take_turn();
        }
        // Relaxed: a hint; a forward that reads it stale looks under the lock (true) or
        // misses a mark owed since by another link's drop, which its tick pays.
        self.owes.store(!state.owes_none(), Relaxed);
        got
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

    under_lock! {
        fn join(&self, name: &str) -> Result<bool, String>;
        fn leave(&self, name: &str) -> bool;
        fn is_idle(&self) -> bool;
        fn joined(&self) -> Vec<String>;
        fn wanted_by(&self, name: &str) -> Vec<BusId>;
        fn publish(&self, name: &str, payload: &Bytes, now_ms: u64) -> Published;
        fn set_policy(&self, name: &str, policy: GroupPolicy);
        fn peer_gone(&self, peer: BusId);
        fn peer_came(&self, peer: BusId);
        fn name_of(&self, name: &str) -> GroupName;
        fn wants(&self, name: &str) -> bool;
    }
}
