//! A peer's shared-memory ring writer: set when its link switched its messages to a ring,
//! filled from the outbox by whoever sends (or by the link's writer), taken back when the
//! link ends.

use super::Peer;
use crate::ring_tx::{Flush, RingWriter};
use busway_shm::RingError;
use std::sync::MutexGuard;

impl Peer {
    pub(super) fn ring_slot(&self) -> MutexGuard<'_, Option<RingWriter>> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The attached link wrote SWITCH: its messages go into `w` from now on.
    pub(crate) fn start_ring(&self, w: RingWriter) {
        let mut slot = self.ring_slot();
        *slot = Some(w);
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
        let mut st = self.lock();
        st.ring_mode = false;
        st.outbox.set_checks(true);
        drop(st);
        slot.take()
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
