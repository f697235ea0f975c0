//! The node's registration tables (rules in `busway_core::registry`; what is done with them
//! is `registrations`): what its downstreams registered with it, and what it asked of its
//! upstream.

use busway_core::registry::{Registry, Upward};
use busway_core::BusId;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use tokio::sync::Notify;

/// The node's registrations, both ways.
#[derive(Default)]
pub(crate) struct Registrations {
    /// What its downstreams registered with it; replaced whole on a change (rare), so that a
    /// routing snapshot holds it without a lock.
    below: RwLock<Arc<Registry>>,
    up: Mutex<UpState>,
    /// Notified when the upstream answers.
    pub(crate) answered: Notify,
}

#[derive(Default)]
pub(crate) struct UpState {
    pub(crate) upward: Upward,
    /// The upstream (id and incarnation) `upward` was asked of.
    pub(crate) asked_of: Option<(BusId, u64)>,
    /// The upstream answers REGISTER (`caps::REGISTER`).
    pub(crate) upstream_registers: bool,
}

impl Registrations {
    pub(crate) fn up(&self) -> MutexGuard<'_, UpState> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.up.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the downstreams registered, now.
    pub(crate) fn below(&self) -> Arc<Registry> {
        self.below.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The downstream that registered `id`, if any.
    pub(crate) fn registered_by(&self, id: BusId) -> Option<BusId> {
        self.below
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .lookup(id)
    }

    /// Changes what the downstreams registered (on a copy if a routing snapshot holds it).
    pub(crate) fn change_below<T>(&self, f: impl FnOnce(&mut Registry) -> T) -> T {
        let mut below = self.below.write().unwrap_or_else(|p| p.into_inner());
        f(Arc::make_mut(&mut below))
    }

    /// Forgets what `peer` registered (it came back as another incarnation).
    pub(crate) fn forget(&self, peer: BusId) {
        self.change_below(|r| r.forget(peer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_of_the_registry_outlives_a_change() {
        let r = Registrations::default();
        r.change_below(|reg| reg.add(BusId(9), BusId(1), (BusId(2), BusId(3)), None))
            .unwrap();
        let before = r.below();
        r.change_below(|reg| reg.forget(BusId(1)));
        assert_eq!(before.lookup(BusId(2)), Some(BusId(1)));
        assert_eq!(r.registered_by(BusId(2)), None);
    }
}
