//! The bookkeeping of on-demand direct links (see `direct`): when each pair was last hinted
//! (relay side), hints waiting to be dialed and the dials running (source side). Bounded.

use crate::limits::{DIRECT_DIALS_MAX, DIRECT_HINTS_TRACKED_MAX, DIRECT_HINT_INTERVAL_MS};
use busway_core::BusId;
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use tokio::sync::Notify;

#[derive(Default)]
struct HintState {
    /// Relay side: when each (source, destination) pair was last hinted, in ms.
    hinted: HashMap<(BusId, BusId), u64>,
    /// Source side: hints waiting for the discovery task.
    hints: Vec<(BusId, Vec<String>)>,
    /// Destinations being dialed (or whose direct link a dial task keeps up).
    dialing: HashSet<BusId>,
}

/// A node's on-demand direct link bookkeeping. Safe to share between threads.
#[derive(Default)]
pub(crate) struct Hints {
    state: Mutex<HintState>,
    wake: Notify,
}

impl Hints {
    fn lock(&self) -> MutexGuard<'_, HintState> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Relay side: whether to hint `src` about `dst` now (at most every
    /// `DIRECT_HINT_INTERVAL_MS` per pair); if so, it counts as hinted.
    pub(crate) fn due(&self, src: BusId, dst: BusId, now_ms: u64) -> bool {
        let mut st = self.lock();
        if st.hinted.len() >= DIRECT_HINTS_TRACKED_MAX {
            st.hinted.clear();
        }
        let last = st.hinted.entry((src, dst)).or_insert(0);
        if *last != 0 && now_ms.saturating_sub(*last) < DIRECT_HINT_INTERVAL_MS {
            return false;
        }
        *last = now_ms.max(1);
        true
    }

    /// Source side: queues a hint for the discovery task unless `dst` is dialed already or
    /// `DIRECT_DIALS_MAX` dials run or wait (then the hint is dropped; a later one comes).
    pub(crate) fn queue(&self, dst: BusId, addrs: Vec<String>) {
        let mut st = self.lock();
        if st.dialing.contains(&dst) || st.dialing.len() + st.hints.len() >= DIRECT_DIALS_MAX {
            return;
        }
        st.hints.push((dst, addrs));
        drop(st);
        self.wake.notify_one();
    }

    /// Waits for hints and takes them.
    pub(crate) async fn next_hints(&self) -> Vec<(BusId, Vec<String>)> {
        loop {
            let hints = std::mem::take(&mut self.lock().hints);
            if !hints.is_empty() {
                return hints;
            }
            self.wake.notified().await;
        }
    }

    /// A dial of `dst` starts; false if one runs already.
    pub(crate) fn start_dial(&self, dst: BusId) -> bool {
        self.lock().dialing.insert(dst)
    }

    /// The dial of `dst` ended.
    pub(crate) fn end_dial(&self, dst: BusId) {
        self.lock().dialing.remove(&dst);
    }
}
