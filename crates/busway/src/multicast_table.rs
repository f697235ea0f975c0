//! A node's multicast state under its lock: the rules are busway-core's
//! (`busway_core::multicast::state`); each call takes the lock for itself alone, and one that
//! delivers to this node's application takes its turn to hand over under it (see `handover`).

use crate::group_table::{delivers_repaired, in_turn};
use crate::handover::Delivered;
use busway_core::group::state::{Ask, RepairPlan};
use busway_core::group::stream::{HeldBudget, Offer, Skipped};
use busway_core::multicast::state::{Arrived, MulticastState};
use busway_core::BusId;
use bytes::Bytes;
use std::sync::{Arc, Mutex};

/// A node's multicast state, behind its lock.
pub(crate) struct MulticastTable {
    state: Mutex<MulticastState>,
}

/// Wrappers that take the lock for one call of the core's method of the same name (see
/// `MulticastState` for what each does).
macro_rules! under_lock {
    ($(fn $name:ident(&self $(, $arg:ident: $ty:ty)*) $(-> $ret:ty)?;)*) => {
        $(
            pub(crate) fn $name(&self $(, $arg: $ty)*) $(-> $ret)? {
                self.state.lock().unwrap_or_else(|p| p.into_inner()).$name($($arg),*)
            }
        )*
    };
}

impl MulticastTable {
    /// A table that keeps up to `retain_bytes` of recent multicasts for repairs.
    pub(crate) fn new(retain_bytes: usize, held: Arc<HeldBudget>) -> Self {
        Self {
            state: Mutex::new(MulticastState::new(retain_bytes, held)),
        }
    }

    under_lock! {
        fn is_idle(&self) -> bool;
        fn number(&self, to: &[BusId], payload: &Bytes, now_ms: u64) -> Vec<(BusId, u64)>;
        fn tail_marks(&self, now_ms: u64) -> Vec<(BusId, u64)>;
        fn unmark(&self, receiver: BusId);
        fn report_unreachable(&self, source: BusId, receiver: BusId, now_ms: u64) -> bool;
        fn all_marks(&self) -> Vec<(BusId, u64)>;
        fn repair(&self, receiver: BusId, asked_incarnation: u64, incarnation: u64, range: (u64, u64)) -> RepairPlan;
        fn asks(&self, now_ms: u64) -> Vec<Ask>;
        fn unask(&self, ask: &Ask);
    }

    in_turn! {
        fn received(&self, source: BusId, incarnation: u64, number: u64, mark: bool, now_ms: u64, payload: impl FnOnce() -> Bytes) -> Arrived, if Arrived::delivers;
        fn repaired(&self, source: BusId, incarnation: u64, number: u64, now_ms: u64, payload: impl FnOnce() -> Bytes) -> Option<(Offer, bool)>, if delivers_repaired;
        fn lost(&self, source: BusId, incarnation: u64, range: (u64, u64), now_ms: u64) -> Option<Skipped>, if Option::is_some;
        fn overdue(&self, now_ms: u64) -> Vec<(BusId, Skipped, String)>, if |v: &Vec<_>| !v.is_empty();
    }
}
