//! One peer's bounded send queue: application threads append frames, the link's writer takes
//! everything queued at once and writes it with one `writev`.
//!
//! Shared by the application (any thread, via `push`) and exactly one writer task (via `take`
//! and `complete`). Small payloads are copied into one growing buffer, so a burst of tiny
//! messages becomes one contiguous write; large payloads keep their own buffer (no copy).
//! Full: `push` returns [`PushError::Full`] and nothing is queued; `wait_for_room` lets a sender
//! wait instead.

use crate::limits::{BATCH_BODY_BYTES_MAX, COPY_PAYLOAD_BYTES_MAX};
use busway_core::frame::{
    encode_header, seal_in_place, FrameKind, BATCH_ENTRY_HEADER_LEN, HEADER_LEN,
};
use bytes::{Bytes, BytesMut};
use std::sync::{Mutex, MutexGuard};
use tokio::sync::Notify;

/// Initial capacity of the copy buffer, in bytes.
const TAIL_INITIAL_BYTES: usize = 64 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PushError {
    /// The queue holds its byte limit; the frame was not queued.
    Full,
    /// The link is closing or gone; the frame was not queued.
    Closed,
}

/// What the writer finds when it looks at the queue.
pub(crate) enum Take {
    /// Frames were moved into the caller's batch: this many bytes.
    Bytes(usize),
    /// Nothing queued; wait on [`SendQueue::writer_wake`].
    Idle,
    /// The queue is closed and empty: write the CLOSE frame and finish.
    Drained,
}

struct State {
    /// Frames (or parts of frames) in send order, all ahead of `tail`.
    segments: Vec<Bytes>,
    /// Small frames copied in, after `segments`.
    tail: BytesMut,
    /// Offset in `tail` of the DATA_BATCH frame still open for more messages (its header is a
    /// placeholder until it is sealed).
    open_batch: Option<usize>,
    /// Bytes queued or being written; bounded by `limit_bytes`.
    queued_bytes: usize,
    /// Frames queued and not yet handed to the writer (for the unsent count on failure).
    queued_frames: u64,
    frames_total: u64,
    bytes_total: u64,
    writer_idle: bool,
    senders_waiting: bool,
    closed: bool,
}

pub(crate) struct SendQueue {
    state: Mutex<State>,
    /// The writer waits here while idle; `notify_one` keeps a permit, so a push between the
    /// writer's `take` returning `Idle` and its wait is not lost.
    pub(crate) writer_wake: Notify,
    /// Senders waiting for room wait here; woken after each completed write.
    room: Notify,
    limit_bytes: usize,
}

impl SendQueue {
    pub(crate) fn new(limit_bytes: usize) -> Self {
        Self {
            state: Mutex::new(State {
                segments: Vec::new(),
                tail: BytesMut::with_capacity(TAIL_INITIAL_BYTES),
                open_batch: None,
                queued_bytes: 0,
                queued_frames: 0,
                frames_total: 0,
                bytes_total: 0,
                writer_idle: false,
                senders_waiting: false,
                closed: false,
            }),
            writer_wake: Notify::new(),
            room: Notify::new(),
            limit_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues one message. A small payload is copied into the open DATA_BATCH frame (two
    /// bytes of framing); a large one goes out as its own DATA frame, without a copy.
    pub(crate) fn push_data(&self, payload: &Bytes) -> Result<(), PushError> {
        if payload.len() <= COPY_PAYLOAD_BYTES_MAX {
            return match self.push_copies(std::slice::from_ref(payload))? {
                0 => Err(PushError::Full),
                _ => Ok(()),
            };
        }
        let header = encode_header(FrameKind::Data, payload);
        let frame_len = HEADER_LEN + payload.len();
        let mut st = self.lock();
        if st.closed {
            return Err(PushError::Closed);
        }
        if st.queued_bytes + frame_len > self.limit_bytes {
            return Err(PushError::Full);
        }
        seal_open_batch(&mut st);
        st.tail.extend_from_slice(&header);
        let head = st.tail.split().freeze();
        st.segments.push(head);
        st.segments.push(payload.clone());
        self.account(st, frame_len, 1);
        Ok(())
    }

    /// Queues one message per payload, copying each into DATA_BATCH frames, under one lock;
    /// stops at the first that does not fit. Returns how many were queued. Payloads over
    /// `COPY_PAYLOAD_BYTES_MAX` are copied into DATA frames of their own.
    pub(crate) fn push_copies<P: AsRef<[u8]>>(&self, payloads: &[P]) -> Result<usize, PushError> {
        let mut st = self.lock();
        if st.closed {
            return Err(PushError::Closed);
        }
        let st_ref = &mut *st;
        let mut queued = 0;
        let mut bytes = 0;
        for p in payloads {
            let p = p.as_ref();
            if p.len() > COPY_PAYLOAD_BYTES_MAX {
                // Too big to batch: its own DATA frame, still copied (the caller lent a slice).
                let frame_len = HEADER_LEN + p.len();
                if st_ref.queued_bytes + bytes + frame_len > self.limit_bytes {
                    break;
                }
                seal_open_batch(st_ref);
                st_ref
                    .tail
                    .extend_from_slice(&encode_header(FrameKind::Data, p));
                st_ref.tail.extend_from_slice(p);
                queued += 1;
                bytes += frame_len;
                continue;
            }
            let entry = BATCH_ENTRY_HEADER_LEN + p.len();
            let fits_open = st_ref.open_batch.is_some_and(|start| {
                st_ref.tail.len() - start - HEADER_LEN + entry <= BATCH_BODY_BYTES_MAX
            });
            let cost = entry + if fits_open { 0 } else { HEADER_LEN };
            if st_ref.queued_bytes + bytes + cost > self.limit_bytes {
                break;
            }
            if !fits_open {
                seal_open_batch(st_ref);
                st_ref.open_batch = Some(st_ref.tail.len());
                st_ref.tail.extend_from_slice(&[0; HEADER_LEN]);
            }
            st_ref
                .tail
                .extend_from_slice(&(p.len() as u16).to_le_bytes());
            st_ref.tail.extend_from_slice(p);
            queued += 1;
            bytes += cost;
        }
        if queued > 0 {
            self.account(st, bytes, queued as u64);
        }
        Ok(queued)
    }

    /// Queues a whole control frame. Control frames are small and rare and are not refused for
    /// lack of room (they keep the link alive while data is backed up).
    pub(crate) fn push_control(&self, frame: Bytes) -> Result<(), PushError> {
        let mut st = self.lock();
        if st.closed {
            return Err(PushError::Closed);
        }
        let len = frame.len();
        seal_open_batch(&mut st);
        let head = st.tail.split().freeze();
        if !head.is_empty() {
            st.segments.push(head);
        }
        st.segments.push(frame);
        self.account(st, len, 1);
        Ok(())
    }

    fn account(&self, mut st: MutexGuard<'_, State>, len: usize, msgs: u64) {
        st.queued_bytes += len;
        st.queued_frames += msgs;
        st.frames_total += msgs;
        st.bytes_total += len as u64;
        let wake = std::mem::take(&mut st.writer_idle);
        drop(st);
        if wake {
            self.writer_wake.notify_one();
        }
    }

    /// Moves everything queued into `batch` (for the writer).
    pub(crate) fn take(&self, batch: &mut Vec<Bytes>) -> Take {
        let mut st = self.lock();
        if st.segments.is_empty() && st.tail.is_empty() {
            if st.closed {
                return Take::Drained;
            }
            st.writer_idle = true;
            return Take::Idle;
        }
        let mut n = 0;
        for seg in st.segments.drain(..) {
            n += seg.len();
            batch.push(seg);
        }
        let open = st.open_batch.take();
        let mut tail = st.tail.split();
        st.queued_frames = 0;
        drop(st);
        // Sealing hashes the open batch: done outside the lock so senders are not held up.
        if let Some(start) = open {
            seal_in_place(FrameKind::DataBatch, &mut tail[start..]);
        }
        if !tail.is_empty() {
            n += tail.len();
            batch.push(tail.freeze());
        }
        Take::Bytes(n)
    }

    /// The writer wrote `bytes` taken earlier: frees their room.
    pub(crate) fn complete(&self, bytes: usize) {
        let mut st = self.lock();
        st.queued_bytes -= bytes;
        let wake = std::mem::take(&mut st.senders_waiting);
        drop(st);
        if wake {
            self.room.notify_waiters();
        }
    }

    /// Waits until a frame of `frame_len` bytes would fit or the queue closes.
    pub(crate) async fn wait_for_room(&self, frame_len: usize) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                if st.closed || st.queued_bytes + frame_len <= self.limit_bytes {
                    return;
                }
                st.senders_waiting = true;
            }
            notified.await;
        }
    }

    /// No more frames are accepted; the writer drains what is queued, then finishes. Returns
    /// the number of frames that were still waiting.
    pub(crate) fn close(&self) -> u64 {
        let mut st = self.lock();
        st.closed = true;
        let waiting = st.queued_frames;
        drop(st);
        self.writer_wake.notify_one();
        self.room.notify_waiters();
        waiting
    }

    /// Frames and bytes ever queued.
    pub(crate) fn totals(&self) -> (u64, u64) {
        let st = self.lock();
        (st.frames_total, st.bytes_total)
    }

    /// Frames and bytes queued now (bytes include those being written).
    pub(crate) fn queued(&self) -> (u64, usize) {
        let st = self.lock();
        (st.queued_frames, st.queued_bytes)
    }
}

/// Closes the open DATA_BATCH frame, if any, so that whatever follows starts a new frame.
fn seal_open_batch(st: &mut State) {
    if let Some(start) = st.open_batch.take() {
        seal_in_place(FrameKind::DataBatch, &mut st.tail[start..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use busway_core::FrameDecoder;

    fn drain(q: &SendQueue) -> BytesMut {
        let mut batch = Vec::new();
        let mut out = BytesMut::new();
        if let Take::Bytes(n) = q.take(&mut batch) {
            for b in &batch {
                out.extend_from_slice(b);
            }
            q.complete(n);
        }
        out
    }

    /// Every message in the wire bytes, batch entries expanded, with the kind that carried it.
    fn messages(mut wire: BytesMut) -> Vec<(FrameKind, Vec<u8>)> {
        let mut dec = FrameDecoder::new(1 << 20);
        let mut out = Vec::new();
        while let Some(f) = dec.decode(&mut wire).unwrap() {
            if f.kind == FrameKind::DataBatch {
                busway_core::frame::for_each_batch_entry(&f.body, |start, len| {
                    out.push((f.kind, f.body[start..start + len].to_vec()));
                })
                .unwrap();
            } else {
                out.push((f.kind, f.body.to_vec()));
            }
        }
        assert!(wire.is_empty());
        out
    }

    #[test]
    fn keeps_order_across_small_large_and_control_frames() {
        let q = SendQueue::new(1 << 20);
        let big = Bytes::from(vec![7u8; COPY_PAYLOAD_BYTES_MAX + 1]);
        q.push_data(&Bytes::from_static(b"a")).unwrap();
        q.push_data(&Bytes::from_static(b"bb")).unwrap();
        q.push_data(&big).unwrap();
        q.push_control(busway_core::control::ping_frame(FrameKind::Ping, 5))
            .unwrap();
        q.push_copies(&[&b"c"[..], &big[..]]).unwrap();
        let kinds: Vec<(FrameKind, usize)> = messages(drain(&q))
            .into_iter()
            .map(|(k, b)| (k, b.len()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (FrameKind::DataBatch, 1),
                (FrameKind::DataBatch, 2),
                (FrameKind::Data, big.len()),
                (FrameKind::Ping, 8),
                (FrameKind::DataBatch, 1),
                (FrameKind::Data, big.len()),
            ]
        );
        assert_eq!(q.queued(), (0, 0));
    }

    #[test]
    fn batches_are_cut_at_their_size_limit() {
        let q = SendQueue::new(1 << 22);
        let p = vec![3u8; 1000];
        let n = 3 * BATCH_BODY_BYTES_MAX / 1002 + 5;
        assert_eq!(q.push_copies(&vec![&p[..]; n]), Ok(n));
        let mut wire = drain(&q);
        let mut dec = FrameDecoder::new(1 << 20);
        let mut frames = 0;
        while let Some(f) = dec.decode(&mut wire).unwrap() {
            assert!(f.body.len() <= BATCH_BODY_BYTES_MAX);
            frames += 1;
        }
        assert_eq!(frames, 4);
    }

    #[test]
    fn copies_stop_at_the_limit_and_count_messages() {
        let per = BATCH_ENTRY_HEADER_LEN + 10;
        let q = SendQueue::new(HEADER_LEN + 3 * per);
        let payloads = vec![[1u8; 10]; 5];
        assert_eq!(q.push_copies(&payloads), Ok(3));
        assert_eq!(q.queued(), (3, HEADER_LEN + 3 * per));
        assert_eq!(q.push_copies(&payloads), Ok(0));
        let got = messages(drain(&q));
        assert_eq!(got, vec![(FrameKind::DataBatch, vec![1u8; 10]); 3]);
    }

    #[test]
    fn full_is_refused_until_the_writer_completes() {
        let q = SendQueue::new(100);
        let p = Bytes::from(vec![0u8; 38]);
        q.push_data(&p).unwrap();
        q.push_data(&p).unwrap();
        assert_eq!(q.push_data(&p), Err(PushError::Full));
        drain(&q);
        q.push_data(&p).unwrap();
    }

    #[test]
    fn close_refuses_new_frames_and_drains_old_ones() {
        let q = SendQueue::new(100);
        q.push_data(&Bytes::from_static(b"x")).unwrap();
        assert_eq!(q.close(), 1);
        assert_eq!(
            q.push_data(&Bytes::from_static(b"y")),
            Err(PushError::Closed)
        );
        assert!(!drain(&q).is_empty());
        assert!(matches!(q.take(&mut Vec::new()), Take::Drained));
    }
}
