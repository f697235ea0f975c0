//! What a node keeps about a destination it reaches through relays: the end-to-end outbox.
//!
//! Messages to a remote destination are numbered per (source, destination) like on a direct
//! link, but the numbers travel explicitly in ROUTED frames, so the relays keep no state: the
//! destination drops what it already has and acknowledges end to end, and this outbox writes
//! everything unacknowledged again whenever the path may have lost something (a link to the
//! next hop came back, a relay reported a transient failure, or acknowledgements stopped).

use crate::peer::PushError;
use busway_core::outbox::Outbox;
use busway_core::routed::{RoutedHeader, RoutedType};
use busway_core::BusId;
use bytes::{Bytes, BytesMut};
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};
use tokio::sync::Notify;

struct RemoteState {
    outbox: Outbox,
    /// The destination's incarnation, learned from its acknowledgements.
    incarnation: Option<u64>,
    /// Since when (node clock, ms) no path took or acknowledged what is held; `None` while
    /// things move.
    stalled_since: Option<u64>,
    /// Node clock (ms) of the last acknowledgement that freed something, or of the last write.
    last_progress_ms: u64,
    dead: bool,
    senders_waiting: bool,
    /// New messages wait for the node's pump task.
    pump_pending: bool,
    /// Node clock (ms) of the last retry.
    last_retry_ms: u64,
    msgs_total: u64,
}

pub(crate) struct Remote {
    pub(crate) id: BusId,
    state: Mutex<RemoteState>,
    room: Notify,
    limit_bytes: usize,
}

/// What an acknowledgement or failure report changed.
pub(crate) enum Verdict {
    Nothing,
    /// The destination restarted: these messages to its previous incarnation are lost.
    Restarted(Range<u64>, u64),
}

impl Remote {
    pub(crate) fn new(id: BusId, limit_bytes: usize, now_ms: u64) -> Self {
        Self {
            id,
            state: Mutex::new(RemoteState {
                outbox: Outbox::new(limit_bytes, 0),
                incarnation: None,
                stalled_since: None,
                last_progress_ms: now_ms,
                dead: false,
                senders_waiting: false,
                pump_pending: false,
                last_retry_ms: 0,
                msgs_total: 0,
            }),
            room: Notify::new(),
            limit_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, RemoteState> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn push_shared(&self, payload: &Bytes) -> Result<u64, PushError> {
        let mut st = self.lock();
        if st.dead {
            return Err(PushError::Dead);
        }
        let seq = st.outbox.push_shared(payload).ok_or(PushError::Full)?;
        st.msgs_total += 1;
        Ok(seq)
    }

    pub(crate) fn push_copies<P: AsRef<[u8]>>(
        &self,
        payloads: &[P],
    ) -> Result<Range<u64>, PushError> {
        let mut st = self.lock();
        if st.dead {
            return Err(PushError::Dead);
        }
        let first = st.outbox.next_seq();
        let n = st.outbox.push_copies(payloads);
        st.msgs_total += n as u64;
        Ok(first..first + n as u64)
    }

    pub(crate) async fn wait_for_room(&self, payload_len: usize) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                if st.dead || st.outbox.has_room(payload_len) {
                    return;
                }
                st.senders_waiting = true;
            }
            notified.await;
        }
    }

    /// Marks new messages for the pump task; true if it must be woken (it was not already).
    pub(crate) fn mark_for_pump(&self) -> bool {
        !std::mem::replace(&mut self.lock().pump_pending, true)
    }

    /// Takes the pump mark; true if it was set.
    pub(crate) fn take_pump_mark(&self) -> bool {
        std::mem::take(&mut self.lock().pump_pending)
    }

    /// Wraps every unwritten message into ROUTED DATA frames from `src` (one per chunk).
    pub(crate) fn take_frames(
        &self,
        src: BusId,
        src_incarnation: u64,
        ttl: u8,
        now_ms: u64,
    ) -> Vec<Bytes> {
        let mut st = self.lock();
        let mut frames = Vec::new();
        let dst = self.id;
        let had_in_flight = st.outbox.has_written_unacked();
        st.outbox.take_chunks(|first_seq, inner, payload| {
            let header = RoutedHeader {
                kind: RoutedType::Data,
                ttl,
                src,
                src_incarnation,
                dst,
                seq: first_seq,
                route: Vec::new(),
            };
            let mut body = BytesMut::with_capacity(header.len() + inner.len());
            header.encode(&mut body);
            body.extend_from_slice(inner);
            if let Some(p) = payload {
                body.extend_from_slice(p);
            }
            frames.push(busway_core::frame::frame_bytes(
                busway_core::FrameKind::Routed,
                &body,
            ));
        });
        if !frames.is_empty() && !had_in_flight {
            // Nothing was awaiting acknowledgement: the wait for one starts now.
            st.last_progress_ms = now_ms;
        }
        frames
    }

    /// No path now: remember since when, for the retry and the deadline.
    pub(crate) fn stall(&self, now_ms: u64) {
        let mut st = self.lock();
        st.stalled_since.get_or_insert(now_ms);
    }

    /// Everything unacknowledged becomes unwritten again (from `from`, if the destination
    /// said where it stands).
    pub(crate) fn rewind(&self, from: Option<u64>) {
        let mut st = self.lock();
        let at = from
            .unwrap_or(st.outbox.acked())
            .max(st.outbox.acked())
            .min(st.outbox.next_seq());
        let _ = st.outbox.resume(at);
    }

    /// An acknowledgement from the destination's incarnation `incarnation`.
    pub(crate) fn ack(&self, incarnation: u64, next_expected: u64, now_ms: u64) -> Verdict {
        let mut st = self.lock();
        let verdict = self.check_incarnation(&mut st, incarnation);
        if st.outbox.ack_explicit(next_expected) > 0 {
            st.last_progress_ms = now_ms;
            st.stalled_since = None;
            let wake = std::mem::take(&mut st.senders_waiting);
            drop(st);
            if wake {
                self.room.notify_waiters();
            }
        }
        verdict
    }

    /// The destination reported a gap: it expects `next_expected` next.
    pub(crate) fn gap(&self, incarnation: u64, next_expected: u64) -> Verdict {
        let mut st = self.lock();
        let verdict = self.check_incarnation(&mut st, incarnation);
        st.outbox.ack_explicit(next_expected);
        let at = st.outbox.acked();
        let _ = st.outbox.resume(at);
        verdict
    }

    /// A new incarnation of the destination fails everything held for the previous one and
    /// restarts the numbering at 0 (what the new incarnation expects).
    fn check_incarnation(&self, st: &mut RemoteState, incarnation: u64) -> Verdict {
        match st.incarnation.replace(incarnation) {
            Some(old) if old != incarnation => {
                let lost = st.outbox.fail_all();
                st.outbox = Outbox::new(self.limit_bytes, 0);
                Verdict::Restarted(lost, old)
            }
            _ => Verdict::Nothing,
        }
    }

    /// Gives up on every message held; later sends fail until `revive`.
    pub(crate) fn fail_all(&self) -> Range<u64> {
        let mut st = self.lock();
        st.dead = true;
        st.stalled_since = None;
        let lost = st.outbox.fail_all();
        drop(st);
        self.room.notify_waiters();
        lost
    }

    /// A path may exist again: sends are accepted again.
    pub(crate) fn revive(&self) {
        self.lock().dead = false;
    }

    /// What the retry task should do now (node clock `now_ms`): nothing; write everything
    /// unacknowledged again (at most every `resend_after_ms`); or give up, once nothing moved
    /// for `dead_after_ms`. Only an acknowledgement counts as moving.
    pub(crate) fn check(&self, now_ms: u64, resend_after_ms: u64, dead_after_ms: u64) -> Check {
        let mut st = self.lock();
        if st.dead || st.outbox.unacked() == 0 {
            st.stalled_since = None;
            return Check::Idle;
        }
        if st.stalled_since.is_none()
            && now_ms.saturating_sub(st.last_progress_ms) >= resend_after_ms
        {
            // Silence counts from the last progress.
            st.stalled_since = Some(st.last_progress_ms);
        }
        let Some(since) = st.stalled_since else {
            return Check::Idle;
        };
        if now_ms.saturating_sub(since) >= dead_after_ms {
            return Check::Expire;
        }
        if now_ms.saturating_sub(st.last_retry_ms) >= resend_after_ms.min(dead_after_ms / 4).max(1)
        {
            st.last_retry_ms = now_ms;
            return Check::Retry;
        }
        Check::Idle
    }

    /// (unacknowledged messages, bytes held, messages ever sent, destination incarnation).
    pub(crate) fn snapshot(&self) -> (u64, usize, u64, Option<u64>) {
        let st = self.lock();
        (
            st.outbox.unacked(),
            st.outbox.bytes(),
            st.msgs_total,
            st.incarnation,
        )
    }
}

pub(crate) enum Check {
    Idle,
    Retry,
    Expire,
}
