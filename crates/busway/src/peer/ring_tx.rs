//! The sending end of a link whose messages go through a shared-memory ring.
//!
//! Once the link's writer has written SWITCH on the socket, the ring's producer lives in the
//! peer (see `Peer::flush_ring`): the thread that queues a message writes it into the ring at
//! once when nobody else is writing there, so a message crosses no task hand-off on its way
//! out; the link's writer task takes over only when the ring is full.

use crate::limits::{RING_RECORD_BYTES_MAX, RING_RECORD_PARTS_MAX};
use busway_shm::ring::{Producer, RingError, RoomWaiter, Wait};
use bytes::{Buf, Bytes};

/// How far a flush got.
pub(crate) enum Flush {
    /// Everything taken is in the ring and published.
    Done,
    /// The ring is full: wait on this for room, then flush again.
    Full(RoomWaiter),
}

/// A ring's producer and the frames taken from the outbox that are not in the ring yet.
pub(crate) struct RingWriter {
    producer: Producer,
    /// Frames (or pieces of frames) taken from the outbox and not yet in the ring, in order;
    /// `pending[first..]` are left, and `pending[first]` may have been cut at its front.
    pending: Vec<Bytes>,
    first: usize,
}

impl RingWriter {
    /// The ring written into.
    pub(crate) fn ring(&self) -> &std::sync::Arc<busway_shm::Ring> {
        self.producer.ring()
    }

    pub(crate) fn new(producer: Producer) -> Self {
        Self {
            producer,
            pending: Vec::new(),
            first: 0,
        }
    }

    /// Where the outbox appends what it hands over (only while nothing is pending).
    pub(crate) fn pending_mut(&mut self) -> &mut Vec<Bytes> {
        debug_assert!(!self.has_pending());
        self.pending.clear();
        self.first = 0;
        &mut self.pending
    }

    pub(crate) fn has_pending(&self) -> bool {
        self.first < self.pending.len()
    }

    /// Writes pending bytes into the ring in records of at most `RING_RECORD_BYTES_MAX`,
    /// gathering consecutive pieces (a frame header and its payload, small chunks) into one
    /// record, and publishing each record at once (the reader may start on it while the next
    /// is copied).
    pub(crate) fn push_pending(&mut self) -> Result<Flush, RingError> {
        while self.first < self.pending.len() {
            let mut parts: [&[u8]; RING_RECORD_PARTS_MAX] = [&[]; RING_RECORD_PARTS_MAX];
            let (mut n, mut len) = (0, 0);
            for piece in &self.pending[self.first..] {
                if n == RING_RECORD_PARTS_MAX || len == RING_RECORD_BYTES_MAX {
                    break;
                }
                let take = piece.len().min(RING_RECORD_BYTES_MAX - len);
                parts[n] = &piece[..take];
                n += 1;
                len += take;
            }
            if len > 0 {
                if !self.producer.try_push_parts(&parts[..n])? {
                    self.producer.publish();
                    return Ok(Flush::Full(self.producer.room_waiter(len)));
                }
                self.producer.publish();
            }
            // Drop what went into the record (whole pieces and the front of the last one),
            // and empty pieces after it.
            let mut left = len;
            while let Some(piece) = self.pending.get_mut(self.first) {
                let take = piece.len().min(left);
                piece.advance(take);
                left -= take;
                if !piece.is_empty() {
                    break;
                }
                self.first += 1;
            }
        }
        self.pending.clear();
        self.first = 0;
        Ok(Flush::Done)
    }

    /// Nothing more comes: the reader sees the end after what was published.
    pub(crate) fn close(&mut self) {
        self.producer.close();
    }
}

/// Waits on the calling (blocking) thread until `waiter` sees room, the reader closes, or a
/// poll interval passes; returns whether the ring's reader closed.
pub(crate) fn wait_for_room(waiter: &RoomWaiter) -> bool {
    waiter.wait(std::time::Duration::from_millis(
        crate::limits::RING_WAIT_POLL_MS,
    )) == Wait::Closed
}
