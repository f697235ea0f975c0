//! The node's direct-link bookkeeping (`busway_core::hints::HintBook`: hints given and taken,
//! dials running), behind a lock, with the wake-up of the task that dials.

use busway_core::hints::HintBook;
use busway_core::BusId;
use std::sync::{Mutex, MutexGuard};
use tokio::sync::Notify;

/// Safe to share between threads; the dialing task waits on it.
#[derive(Default)]
pub(crate) struct Hints {
    book: Mutex<HintBook>,
    wake: Notify,
}

impl Hints {
    fn lock(&self) -> MutexGuard<'_, HintBook> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Relay side: see `HintBook::due`.
    pub(crate) fn due(&self, src: BusId, dst: BusId, now_ms: u64) -> bool {
        self.lock().due(src, dst, now_ms)
    }

    /// Source side: keeps a hint for the dialing task (see `HintBook::take_hint`).
    pub(crate) fn queue(&self, dst: BusId, addrs: Vec<String>) {
        if self.lock().take_hint(dst, addrs) {
            self.wake.notify_one();
        }
    }

    /// Waits for hints to dial; each becomes a running dial.
    pub(crate) async fn next_dials(&self) -> Vec<(BusId, Vec<String>)> {
        loop {
            let dials = self.lock().dials_to_start();
            if !dials.is_empty() {
                return dials;
            }
            self.wake.notified().await;
        }
    }

    /// The dial of `dst` ended.
    pub(crate) fn end_dial(&self, dst: BusId) {
        self.lock().dial_ended(dst);
    }
}
