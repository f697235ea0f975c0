//! A peer's shared-memory ring writer: set when its link switched its messages to a ring,
//! filled from the outbox by whoever sends (or by the link's writer), taken back when the
//! link ends.

use super::Peer;
use crate::peer::ring_tx::{Flush, RingWriter};
use busway_shm::Ring;
use busway_shm::RingError;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, MutexGuard};

impl Peer {
    pub(super) fn ring_slot(&self) -> MutexGuard<'_, Option<RingWriter>> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The attached link wrote SWITCH: its messages go into `w` from now on.
    pub(crate) fn start_ring(&self, w: RingWriter) {
        let mut slot = self.ring_slot();
        *slot = Some(w);
        // Under the slot's lock, as in `end_ring`: the epoch moves with the slot.
        let e = self.ring_epoch.load(Relaxed);
        self.ring_epoch.store((e + 1) | 1, Relaxed);
        let mut st = self.lock();
        st.ring_mode = true;
        // The ring's reader does not verify frame checks: do not compute them.
        st.outbox.set_checks(false);
    }

    /// The attached link's ring is done with (its link ends): returns it. Messages taken from
    /// the outbox and still pending are written again on the next link, as every message not
    /// acknowledged is.
    pub(crate) fn end_ring(&self) -> Option<RingWriter> {
        let mut slot = self.ring_slot();
        let e = self.ring_epoch.load(Relaxed);
        self.ring_epoch.store((e + 1) & !1, Relaxed);
        let mut st = self.lock();
        st.ring_mode = false;
        st.outbox.set_checks(true);
        drop(st);
        slot.take()
    }

    /// Which ring the attached link writes into: odd while there is one (see
    /// [`Peer::outbound_ring`]). A plain read, no lock: the publish path reads it per reader.
    pub(crate) fn ring_epoch(&self) -> u64 {
        self.ring_epoch.load(Relaxed)
    }

    /// The ring the attached link writes into, if it switched, and its epoch (which changes
    /// when that ring ends).
    pub(crate) fn outbound_ring(&self) -> Option<(u64, Arc<Ring>)> {
        let slot = self.ring_slot();
        let ring = slot.as_ref()?.ring().clone();
        Some((self.ring_epoch.load(Relaxed), ring))
    }

    /// Moves queued messages into the ring until none is left or the ring is full. `None` if
    /// the link has no ring, or (when `wait_for_lock` is false) someone else is writing there.
    pub(crate) fn flush_ring(&self, wait_for_lock: bool) -> Option<Result<Flush, RingError>> {
        let mut slot = if wait_for_lock {
            self.ring_slot()
        } else {
            match self.ring.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return None,
            }
        };
        let w = slot.as_mut()?;
        loop {
            if w.has_pending() {
                match w.push_pending() {
                    Ok(Flush::Done) => {}
                    other => return Some(other),
                }
            }
            let mut st = self.lock();
            if st.held || !st.outbox.has_unwritten_messages() {
                return Some(Ok(Flush::Done));
            }
            st.outbox.take_messages(w.pending_mut());
        }
    }
}
