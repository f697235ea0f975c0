//! What a node keeps about a destination it reaches through relays: its end-to-end
//! [`Departures`] (the sans-IO protocol, in busway-core), behind a lock, with the wake-ups the
//! application and the pump task need.
//!
//! Shared by the application (any thread: `push_*`, `wait_for_room`), the pump task (`take_frames`)
//! and the links' readers (`ack`, `gap`, `stall`).

use crate::limits::RELAYED_WINDOW_BYTES;
use crate::peer::PushError;
use busway_core::e2e::{Check, Departures, FailOutcome, Verdict};
use busway_core::frame::FrameKind;
use busway_core::hints::HintGate;
use busway_core::outbox::Outbox;
use busway_core::routed::FailReason;
use busway_core::BusId;
use bytes::Bytes;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use tokio::sync::Notify;

struct RemoteState {
    departures: Departures,
    senders_waiting: bool,
    /// New messages wait for the node's pump task.
    pump_pending: bool,
    msgs_total: u64,
    /// Which relays may hint this destination.
    hints: HintGate,
    /// Dropped from the node's table (idle, nothing held): sends get `Rerouted` and take a
    /// fresh entry.
    forgotten: bool,
}

pub(crate) struct Remote {
    pub(crate) id: BusId,
    state: Mutex<RemoteState>,
    /// Senders waiting for room wait here; woken when acknowledgements free bytes.
    room: Notify,
    /// When a send last looked this destination up (the node's clock, ms): how long it has
    /// been idle.
    touched_ms: AtomicU64,
}

impl Remote {
    pub(crate) fn new(id: BusId, limit_bytes: usize, now_ms: u64) -> Self {
        Self {
            id,
            state: Mutex::new(RemoteState {
                departures: {
                    let mut d = Departures::new(limit_bytes, now_ms);
                    d.set_window(RELAYED_WINDOW_BYTES);
                    d
                },
                senders_waiting: false,
                pump_pending: false,
                msgs_total: 0,
                hints: HintGate::default(),
                forgotten: false,
            }),
            room: Notify::new(),
            touched_ms: AtomicU64::new(now_ms),
        }
    }

    /// A send looked this destination up at `now_ms`.
    pub(crate) fn touch(&self, now_ms: u64) {
        // Relaxed: a time stamp read by the sweep alone; a stale read only delays forgetting.
        self.touched_ms.fetch_max(now_ms, Relaxed);
    }

    /// Whether the destination holds nothing and no send looked it up for `idle_ms`.
    pub(crate) fn is_idle(&self, now_ms: u64, idle_ms: u64) -> bool {
        Self::idle(&self.lock(), self.touched_ms.load(Relaxed), now_ms, idle_ms)
    }

    fn idle(st: &RemoteState, touched_ms: u64, now_ms: u64, idle_ms: u64) -> bool {
        now_ms.saturating_sub(touched_ms) >= idle_ms
            && st.departures.outbox().unacked() == 0
            && !st.departures.has_unwritten()
    }

    /// Marks the destination forgotten if it is idle (see [`Remote::is_idle`]); true if so (the
    /// caller drops it from the table). Decided under the lock that every push takes: a push
    /// after it gets `Rerouted`, never a queue nobody pumps.
    pub(crate) fn forget_if_idle(&self, now_ms: u64, idle_ms: u64) -> bool {
        let mut st = self.lock();
        if st.forgotten || !Self::idle(&st, self.touched_ms.load(Relaxed), now_ms, idle_ms) {
            return false;
        }
        st.forgotten = true;
        true
    }

    fn lock(&self) -> MutexGuard<'_, RemoteState> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_open(st: &RemoteState) -> Result<(), PushError> {
        if st.departures.is_superseded() || st.forgotten {
            Err(PushError::Rerouted)
        } else if st.departures.is_dead() {
            Err(PushError::Dead)
        } else {
            Ok(())
        }
    }

    pub(crate) fn push_shared(&self, payload: &Bytes) -> Result<u64, PushError> {
        self.push_one(|o| o.push_shared(payload))
    }

    /// Queues one message framed on its own (a CALL or REPLY); returns its sequence number.
    pub(crate) fn push_framed(
        &self,
        kind: FrameKind,
        head: &[u8],
        payload: &Bytes,
    ) -> Result<u64, PushError> {
        self.push_one(|o| o.push_framed(kind, head, payload))
    }

    fn push_one(&self, push: impl FnOnce(&mut Outbox) -> Option<u64>) -> Result<u64, PushError> {
        let mut st = self.lock();
        Self::check_open(&st)?;
        let seq = push(st.departures.outbox_mut()).ok_or(PushError::Full)?;
        st.msgs_total += 1;
        Ok(seq)
    }

    pub(crate) fn push_copies<P: AsRef<[u8]>>(
        &self,
        payloads: &[P],
    ) -> Result<Range<u64>, PushError> {
        let mut st = self.lock();
        Self::check_open(&st)?;
        let first = st.departures.outbox().next_seq();
        let n = st.departures.outbox_mut().push_copies(payloads);
        st.msgs_total += n as u64;
        Ok(first..first + n as u64)
    }

    /// Waits until every message held for the destination is acknowledged or given up, woken
    /// as a sender waiting for room is: no polling.
    pub(crate) async fn wait_all_acked(&self) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                if st.departures.outbox().unacked() == 0 {
                    return;
                }
                st.senders_waiting = true;
            }
            notified.await;
        }
    }

    /// Waits until a message of `payload_len` bytes would fit, or the destination cannot
    /// take more (superseded by a direct link, forgotten, or given up).
    pub(crate) async fn wait_for_room(&self, payload_len: usize) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                if st.departures.is_superseded()
                    || st.forgotten
                    || st.departures.is_dead()
                    || st.departures.outbox().has_room(payload_len)
                {
                    return;
                }
                st.senders_waiting = true;
            }
            notified.await;
        }
    }

    /// A direct link to the destination came up: later sends must go there (they get
    /// `Rerouted` here). Returns how many messages are still unacknowledged: the direct link
    /// holds its messages until these are acknowledged, so order holds across the switch.
    pub(crate) fn supersede(&self) -> u64 {
        let unacked = self.lock().departures.supersede();
        self.room.notify_waiters();
        unacked
    }

    /// A send that found no direct link in use chose this destination: whether it may queue
    /// here (see `Departures::open_for_send`; `direct_in_use` looks at the direct link under
    /// this lock). False: a direct link superseded this path; route again.
    pub(crate) fn open_for_send(&self, direct_in_use: impl FnOnce() -> bool) -> bool {
        self.lock().departures.open_for_send(direct_in_use)
    }

    pub(crate) fn unacked(&self) -> u64 {
        self.lock().departures.outbox().unacked()
    }

    /// Marks new messages for the pump task; true if it must be woken (it was not already).
    pub(crate) fn mark_for_pump(&self) -> bool {
        !std::mem::replace(&mut self.lock().pump_pending, true)
    }

    /// Takes the pump mark; true if it was set.
    pub(crate) fn take_pump_mark(&self) -> bool {
        std::mem::take(&mut self.lock().pump_pending)
    }

    /// Every unwritten message as ROUTED DATA frames from `src`, each as the buffers it is
    /// written from.
    pub(crate) fn take_frame_parts(
        &self,
        src: BusId,
        src_incarnation: u64,
        ttl: u8,
        now_ms: u64,
    ) -> Vec<Vec<Bytes>> {
        self.lock()
            .departures
            .take_frame_parts(src, src_incarnation, self.id, ttl, now_ms)
    }

    pub(crate) fn stall(&self, now_ms: u64) {
        self.lock().departures.stall(now_ms);
    }

    /// Everything unacknowledged is written again; returns how many messages that were
    /// written go out again.
    pub(crate) fn rewind(&self) -> u64 {
        self.lock().departures.rewind()
    }

    /// Whether messages wait to be written (held by the window, or for a path).
    pub(crate) fn has_unwritten(&self) -> bool {
        self.lock().departures.has_unwritten()
    }

    /// An acknowledgement from the destination's incarnation `incarnation`.
    pub(crate) fn ack(&self, incarnation: u64, next_expected: u64, now_ms: u64) -> Verdict {
        let mut st = self.lock();
        let before = st.departures.outbox().unacked();
        let (verdict, freed) = st.departures.ack(incarnation, next_expected, now_ms);
        // A restart gives up what was held (a fresh outbox, nothing freed by this ack): a
        // flush waiting on it must hear of it too.
        let settled = st.departures.outbox().unacked() < before;
        let wake = (freed > 0 || settled) && std::mem::take(&mut st.senders_waiting);
        drop(st);
        if wake {
            self.room.notify_waiters();
        }
        verdict
    }

    /// A FAIL about the messages from `seq` on (see `Departures::on_fail`); senders waiting
    /// for room hear of messages given up.
    pub(crate) fn on_fail(
        &self,
        reason: FailReason,
        incarnation: u64,
        seq: u64,
        now_ms: u64,
    ) -> FailOutcome {
        let mut st = self.lock();
        let before = st.departures.outbox().unacked();
        let outcome = st.departures.on_fail(reason, incarnation, seq, now_ms);
        // Given up, or a restart seen with a gap (a fresh outbox): waiters hear of it.
        let settled = st.departures.outbox().unacked() < before;
        drop(st);
        if settled || matches!(outcome, FailOutcome::GaveUp(_)) {
            self.room.notify_waiters();
        }
        outcome
    }

    /// Gives up on every message held; later sends fail until `revive`.
    pub(crate) fn fail_all(&self) -> Range<u64> {
        let lost = self.lock().departures.fail_all();
        self.room.notify_waiters();
        lost
    }

    /// Relay `relay` hints where this destination listens: the addresses to dial now, if that
    /// relay carries our traffic to it (see `HintGate`).
    pub(crate) fn hint(&self, relay: BusId, addrs: Vec<String>) -> Option<Vec<String>> {
        self.lock().hints.on_hint(relay, addrs)
    }

    /// An acknowledgement from this destination came through `route`: a held hint from one of
    /// those relays, to dial now.
    pub(crate) fn acked_through(&self, route: &[BusId]) -> Option<Vec<String>> {
        self.lock().hints.on_ack(route)
    }

    /// The destination's incarnation, once an acknowledgement told it.
    pub(crate) fn incarnation(&self) -> Option<u64> {
        self.lock().departures.incarnation()
    }

    /// A path may exist again: sends are accepted again.
    pub(crate) fn revive(&self) {
        self.lock().departures.revive();
    }

    pub(crate) fn check(&self, now_ms: u64, resend_after_ms: u64, dead_after_ms: u64) -> Check {
        self.lock()
            .departures
            .check(now_ms, resend_after_ms, dead_after_ms)
    }

    /// (unacknowledged messages, bytes held, messages ever sent, destination incarnation).
    pub(crate) fn snapshot(&self) -> (u64, usize, u64, Option<u64>) {
        let st = self.lock();
        let o = st.departures.outbox();
        (
            o.unacked(),
            o.bytes(),
            st.msgs_total,
            st.departures.incarnation(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_superseded_remote_sends_new_messages_elsewhere_and_keeps_what_it_holds() {
        let r = Remote::new(BusId(2), 1 << 20, 0);
        r.push_copies(&[b"a", b"b"]).unwrap();
        assert_eq!(r.supersede(), 2, "both still unacknowledged");
        assert_eq!(
            r.push_shared(&Bytes::from_static(b"c")),
            Err(PushError::Rerouted)
        );
        assert_eq!(r.push_copies(&[b"c"]), Err(PushError::Rerouted));
        assert_eq!(
            r.take_frame_parts(BusId(1), 1, 16, 0).len(),
            1,
            "held ones still go"
        );
        assert!(!r.open_for_send(|| true), "the direct link is in use");
        assert!(r.open_for_send(|| false), "the direct link was given up");
        assert_eq!(r.push_shared(&Bytes::from_static(b"c")), Ok(2));
    }
}
