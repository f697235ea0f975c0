//! A node's multicast state under its lock: the rules are busway-core's
//! (`busway_core::multicast::state`); each call takes the lock for itself alone, and one that
//! delivers to this node's application takes its turn to hand over under it (see `handover`).

use crate::handover::Delivered;
use busway_core::group::stream::HeldBudget;
use busway_core::multicast::state::MulticastState;
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
    }

    /// Runs `f` on the state under its lock; if `delivers` holds for its answer, takes the
    /// turn to hand over under it (see `Delivered::take_turn`).
    pub(crate) fn with<R>(
        &self,
        delivers: fn(&R) -> bool,
        f: impl FnOnce(&mut MulticastState) -> R,
        out: &mut Delivered<'_>,
    ) -> R {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let got = f(&mut state);
        if delivers(&got) {
            out.take_turn();
        }
        got
    }
}
