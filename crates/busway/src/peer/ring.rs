//! A peer's shared-memory ring writer: set when its link switched its messages to a ring,
//! filled from the outbox by whoever sends (or by the link's writer), taken back when the
//! link ends; and the single sends whose publication into the ring waits for the burst's end.

use super::{Peer, PeerIntro, PushError};
use crate::limits::{COPY_PAYLOAD_BYTES_MAX, RING_DEFER_BYTES_MAX};
use crate::peer::ring_tx::{Flush, RingWriter};
use busway_core::handshake::caps;
use busway_core::outbox::Outbox;
use busway_shm::Ring;
use busway_shm::RingError;
use bytes::Bytes;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, MutexGuard};

impl Peer {
    /// Queues one message sent on its own (`Node::send`); returns its sequence number, and
    /// whether the peer must go on the node's `Deferred` list. Over a ring, a small message
    /// that follows another single send with no look at the inbox in between (`looks`, the
    /// inbox's count) is not published at once while less than `RING_DEFER_BYTES_MAX` wait:
    /// the sender's next look at its inbox, a flush or the link's writer (woken now) publishes
    /// the burst with one publication. The first send after a look (a lone request or
    /// answer) is published at once; elsewhere a message is written or handed to the writer
    /// at once.
    #[inline]
    pub(crate) fn push_single(
        &self,
        payload: &Bytes,
        looks: u64,
    ) -> Result<(u64, bool), PushError> {
        self.push_deferring(looks, payload.len(), |o, _| o.push_shared(payload))
    }

    /// Queues one PUBLISH (`head`, then `payload`) the way [`Peer::push_single`] queues a
    /// single send: over a ring, one that follows another with no look at the inbox in
    /// between waits unpublished (a publisher's loop writes each member's ring once per
    /// burst, not once per publish).
    pub(crate) fn push_publish(
        &self,
        head: &[u8],
        payload: &Bytes,
        looks: u64,
    ) -> Result<(u64, bool), PushError> {
        self.push_deferring(looks, head.len() + payload.len(), |o, intro| {
            o.push_publish(head, payload, intro.capabilities & caps::PUBLISH_BATCH != 0)
        })
    }

    /// Queues one message with `push`, deferring its publication into the ring as
    /// [`Peer::push_single`] says; `len` is its size.
    fn push_deferring(
        &self,
        looks: u64,
        len: usize,
        push: impl FnOnce(&mut Outbox, &PeerIntro) -> Option<u64>,
    ) -> Result<(u64, bool), PushError> {
        let mut st = self.lock();
        Self::check_open(&st)?;
        let st_ = &mut *st;
        let numbered = st_.outbox.next_seq();
        let seq = push(&mut st_.outbox, &st_.intro).ok_or(PushError::Full)?;
        // Link messages, as the peer counts them: a publish that joined a batch is not one.
        if st.outbox.next_seq() != numbered {
            st.msgs_total += 1;
        }
        let follows_a_send = std::mem::replace(&mut st.single_look, looks) == looks;
        if follows_a_send
            && st.slot.over_ring()
            && !st.held
            && len <= COPY_PAYLOAD_BYTES_MAX
            && st.outbox.tail_bytes() < RING_DEFER_BYTES_MAX
        {
            let first = !std::mem::replace(&mut st.deferred, true);
            self.wake_writer(st);
            return Ok((seq, first));
        }
        self.pushed(st);
        Ok((seq, false))
    }

    /// Publishes into the ring what single sends left waiting (see `push_single`).
    pub(crate) fn publish_deferred(&self) {
        self.lock().deferred = false;
        if !matches!(self.flush_ring(false), Some(Ok(Flush::Done))) {
            // Busy, full or broken: the writer task carries on (and reports a broken ring).
            self.writer_wake.notify_one();
        }
    }

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
        st.slot.switch_to_ring();
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
        st.slot.back_to_socket();
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
