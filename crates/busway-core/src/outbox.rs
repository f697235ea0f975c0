//! The messages to one peer, from the moment they are queued until the peer acknowledges them.
//!
//! Sans-IO: the runtime pushes payloads, takes what is unwritten to write it, and feeds back the
//! peer's acknowledgements. Messages are numbered per peer (the implicit sequence numbers of
//! `docs/PROTOCOL.md`). A written message stays here until acknowledged, so that after a
//! reconnect everything the peer did not get is written again, in order, and nothing twice.
//!
//! Small payloads are copied into DATA_BATCH frames (two bytes of framing each); large ones go
//! out as DATA frames that share the caller's buffer. All bytes held, written or not, count
//! against one limit: a full outbox refuses new messages until acknowledgements free room.

use crate::frame::{
    encode_header, encode_header_unchecked, seal_frames_in_place, seal_in_place_unchecked,
    FrameDecoder, FrameKind, BATCH_ENTRY_HEADER_LEN, BODY_LEN_CEILING, HEADER_LEN,
};
use crate::group::{PUBLISH_BATCH_BIT, PUBLISH_BATCH_COUNT_MAX, PUBLISH_FIXED_BYTES};
use crate::group::{PUBLISH_BATCH_BODY_BYTES_MAX, PUBLISH_MARK_BIT};
use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;

/// Largest body of one DATA_BATCH frame a sender builds, in bytes: big enough that its header
/// and check cost nothing per message, small enough to be checked while still in cache.
pub const BATCH_BODY_BYTES_MAX: usize = 64 << 10;
/// Payloads up to this many bytes are copied into DATA_BATCH frames; larger ones are sent as
/// DATA frames from their own buffer (no copy) when given as `Bytes`.
pub const COPY_PAYLOAD_BYTES_MAX: usize = 2 << 10;
/// Initial capacity of the copy buffer, in bytes.
const TAIL_INITIAL_BYTES: usize = 64 << 10;
/// Largest chunk of copied messages, in bytes: the copy buffer is sealed into a chunk when it
/// reaches this, so that a chunk fits one ROUTED frame and acknowledgements free memory early.
pub const CHUNK_BYTES_MAX: usize = 1 << 20;
/// Capacity of a fresh copy buffer on a busy link, in bytes: a whole chunk and the one message
/// that may pass its end, so that a chunk never grows by copying. One fixed size, so that the
/// allocator hands back the buffers of acknowledged chunks instead of mapping new pages.
const TAIL_BUSY_BYTES: usize =
    CHUNK_BYTES_MAX + HEADER_LEN + BATCH_ENTRY_HEADER_LEN + COPY_PAYLOAD_BYTES_MAX;
/// Largest chunk of copied (small) messages, in bytes: a chunk is sealed once it has no room
/// for the next message, and its buffer holds at most this. A chunk of one large message is
/// as large as that message's frame.
pub const CHUNK_OF_COPIES_BYTES_MAX: usize = TAIL_BUSY_BYTES;

/// Room left in the copy buffer below which a new one is taken after sealing a small chunk,
/// in bytes: one copied message in a new DATA_BATCH frame.
const TAIL_ROOM_MIN: usize = HEADER_LEN + BATCH_ENTRY_HEADER_LEN + COPY_PAYLOAD_BYTES_MAX;
/// A chunk sealed with at least this many bytes marks a busy link: the next copy buffer is
/// one of `TAIL_BUSY_BYTES` (a smaller chunk sealed later goes back to `TAIL_INITIAL_BYTES`).
const BUSY_CHUNK_BYTES: usize = TAIL_INITIAL_BYTES / 2;
/// Size of the buffer the headers of large DATA frames (payload kept apart) are cut from, in
/// bytes: one allocation per `HEADER_ARENA_BYTES / HEADER_LEN` such messages, not one each
/// (and their clones for the writer share it without allocating).
const HEADER_ARENA_BYTES: usize = 4 << 10;

const _: () = assert!(COPY_PAYLOAD_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(BATCH_ENTRY_HEADER_LEN + COPY_PAYLOAD_BYTES_MAX <= BATCH_BODY_BYTES_MAX);
const _: () = assert!(BATCH_BODY_BYTES_MAX <= BODY_LEN_CEILING);
const _: () = assert!(PUBLISH_BATCH_BODY_BYTES_MAX <= BODY_LEN_CEILING);

/// A peer's acknowledgement that cannot be right.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckError {
    /// The number the peer says it expects next (it claims every message below it).
    pub acked: u64,
    /// One past the last message written to the link.
    pub written_end: u64,
}

impl fmt::Display for AckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the peer acknowledges messages up to {} but only {} were sent",
            self.acked, self.written_end
        )
    }
}

impl std::error::Error for AckError {}

/// Whole frames carrying messages `first_seq .. first_seq + msgs`.
#[derive(Debug)]
struct Chunk {
    frames: Bytes,
    /// The payload of a single DATA frame whose header is `frames`, kept in its own buffer.
    payload: Option<Bytes>,
    first_seq: u64,
    msgs: u64,
    /// Every frame carries its check (a chunk sealed while checks were off has zeros).
    checked: bool,
}

impl Chunk {
    fn len(&self) -> usize {
        self.frames.len() + self.payload.as_ref().map_or(0, Bytes::len)
    }
    fn end(&self) -> u64 {
        self.first_seq + self.msgs
    }

    /// Computes the checks the chunk was sealed without (it goes to a link that verifies them
    /// after all, e.g. a socket after a shared-memory ring's link dropped).
    fn ensure_checked(&mut self) {
        if self.checked {
            return;
        }
        match &self.payload {
            Some(p) => {
                // One frame: its header, the start of its body (a CALL's, REPLY's or
                // PUBLISH's head; nothing for DATA), then the payload kept apart.
                let kind = FrameKind::from_u8(self.frames[0]).unwrap_or(FrameKind::Data);
                let head = &self.frames[HEADER_LEN..];
                let mut frames = BytesMut::with_capacity(self.frames.len());
                frames.extend_from_slice(&crate::frame::encode_header_gathered(kind, &[head, p]));
                frames.extend_from_slice(head);
                self.frames = frames.freeze();
            }
            None => {
                let frames = std::mem::take(&mut self.frames);
                let mut m = frames
                    .try_into_mut()
                    .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
                seal_frames_in_place(&mut m);
                self.frames = m.freeze();
            }
        }
        self.checked = true;
    }
}

/// A PUBLISH batch being filled at the end of the tail (see [`Outbox::push_publish`]).
#[derive(Clone, Copy, Debug)]
struct OpenPublish {
    /// Where its frame starts in the tail.
    start: usize,
    /// Bytes of its head (publisher, incarnation, number, name length, name).
    head_len: usize,
    /// Publishes in it.
    count: u64,
    /// The number word (with its flags, but for the batch bit) of the stream's next publish.
    next: u64,
}

/// One peer's outgoing messages (see the module doc).
#[derive(Debug)]
pub struct Outbox {
    /// Sealed chunks in sequence order; `chunks[..unwritten]` were handed to the current link.
    chunks: VecDeque<Chunk>,
    unwritten: usize,
    /// Messages copied in and not yet sealed into a chunk; they follow every chunk.
    tail: BytesMut,
    /// Where the DATA_BATCH being filled at the end of `tail` starts, if one is.
    open_batch: Option<usize>,
    /// The PUBLISH batch being filled at the end of `tail`, if one is (never with
    /// `open_batch`: opening either seals the other).
    open_publish: Option<OpenPublish>,
    tail_first_seq: u64,
    tail_msgs: u64,
    /// Control frames for the current link; written before data, never kept for a resend.
    control: Vec<Bytes>,
    /// Bytes of `control` (kept, not summed: a relay asks at every frame it queues).
    control_bytes: usize,
    /// Where the queued PING, PONG and ACK are in `control`, if any: only the newest of each
    /// matters (an ACK is cumulative, a PING or PONG measures the link now), so a newer one
    /// takes the older one's place and a peer that PINGs a writer that cannot write does not
    /// grow its queue.
    newest: [Option<usize>; 3],
    /// A busy-size buffer recovered from an acknowledged chunk, for the next tail: reusing it
    /// saves the allocator a fresh mapping (and the kernel the page faults) per chunk.
    spare: Option<BytesMut>,
    /// Where headers of large DATA frames are cut from (see `HEADER_ARENA_BYTES`).
    headers: BytesMut,
    next_seq: u64,
    acked: u64,
    bytes: usize,
    /// Bytes of frames ever queued here (see [`Outbox::bytes_pushed`]).
    bytes_pushed: u64,
    limit_bytes: usize,
    /// Whether frames get their checks (off while the link's messages go through a
    /// shared-memory ring, which does not verify them: one hash pass less per byte).
    checks: bool,
}

impl Outbox {
    /// An empty outbox whose first message will be number `first_seq`, holding at most
    /// `limit_bytes` of frames.
    pub fn new(limit_bytes: usize, first_seq: u64) -> Self {
        Self {
            chunks: VecDeque::new(),
            unwritten: 0,
            // Taken at the first message (an idle peer holds no buffer).
            tail: BytesMut::new(),
            open_batch: None,
            open_publish: None,
            tail_first_seq: first_seq,
            tail_msgs: 0,
            control: Vec::new(),
            control_bytes: 0,
            newest: [None; 3],
            spare: None,
            headers: BytesMut::new(),
            next_seq: first_seq,
            acked: first_seq,
            bytes: 0,
            bytes_pushed: 0,
            limit_bytes,
            checks: true,
        }
    }

    /// Turns checks off (the current link's messages go through a shared-memory ring) or back
    /// on. Chunks sealed without checks get them when a link that verifies takes them.
    pub fn set_checks(&mut self, on: bool) {
        self.checks = on;
    }

    /// The number the next message will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Every message below this number was acknowledged (or given up).
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// Messages queued or written and not yet acknowledged.
    pub fn unacked(&self) -> u64 {
        self.next_seq - self.acked
    }

    /// Bytes held (messages not yet acknowledged, with their framing).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes of frames ever queued here, headers included: each message at its framing when
    /// it is pushed (a copied message its batch entry, and the batch's header with the first
    /// one), each control frame (ACK, PING, ROUTED...) when it is pushed, whether or not a
    /// newer one later takes its place. A message written again after a reconnect is not
    /// counted again. Wraps past `u64::MAX`.
    pub fn bytes_pushed(&self) -> u64 {
        self.bytes_pushed
    }

    /// Bytes of small messages copied and not yet sealed into a chunk.
    pub fn tail_bytes(&self) -> usize {
        self.tail.len()
    }

    /// Whether a message of `payload_len` bytes would fit now (at its largest framing).
    pub fn has_room(&self, payload_len: usize) -> bool {
        self.bytes + HEADER_LEN + BATCH_ENTRY_HEADER_LEN + payload_len <= self.limit_bytes
            || self.bytes == 0
    }

    /// Queues one message per payload, in order, copying each; stops at the first that does
    /// not fit. Returns how many were queued (their numbers follow `next_seq()` before the call).
    pub fn push_copies<P: AsRef<[u8]>>(&mut self, payloads: &[P]) -> usize {
        let mut queued = 0;
        for p in payloads {
            let p = p.as_ref();
            // Fast path, the common case: a small message into the open batch.
            if let Some(start) = self.open_batch {
                let entry = BATCH_ENTRY_HEADER_LEN + p.len();
                if p.len() <= COPY_PAYLOAD_BYTES_MAX
                    && self.tail.len() - start - HEADER_LEN + entry <= BATCH_BODY_BYTES_MAX
                    && self.tail.len() < CHUNK_BYTES_MAX
                    && self.tail.len() + entry <= self.tail.capacity()
                {
                    if self.bytes + entry > self.limit_bytes {
                        break;
                    }
                    self.bytes += entry;
                    self.bytes_pushed = self.bytes_pushed.wrapping_add(entry as u64);
                    self.tail.extend_from_slice(&(p.len() as u16).to_le_bytes());
                    self.tail.extend_from_slice(p);
                    self.tail_msgs += 1;
                    self.next_seq += 1;
                    queued += 1;
                    continue;
                }
            }
            self.seal_if_full(p.len());
            let cost = self.copy_cost(p.len());
            if self.bytes + cost > self.limit_bytes && self.bytes > 0 {
                break;
            }
            self.bytes += cost;
            self.bytes_pushed = self.bytes_pushed.wrapping_add(cost as u64);
            self.append_copy(p);
            queued += 1;
        }
        queued
    }

    /// Queues one message; a large payload is kept by reference (no copy). Returns its number,
    /// or `None` if it does not fit.
    pub fn push_shared(&mut self, payload: &Bytes) -> Option<u64> {
        if payload.len() <= COPY_PAYLOAD_BYTES_MAX {
            return (self.push_copies(std::slice::from_ref(payload)) == 1)
                .then_some(self.next_seq - 1);
        }
        let cost = HEADER_LEN + payload.len();
        if self.bytes + cost > self.limit_bytes && self.bytes > 0 {
            return None;
        }
        self.seal_tail();
        let header = if self.checks {
            encode_header(FrameKind::Data, payload)
        } else {
            encode_header_unchecked(FrameKind::Data, payload.len())
        };
        let frames = self.header_bytes(&header);
        Some(self.push_referenced(frames, payload, cost))
    }

    /// Queues one message as a chunk of its own after the sealed tail: `frames` (its header,
    /// and the start of its body if any), then `payload` kept by reference. Returns its number.
    fn push_referenced(&mut self, frames: Bytes, payload: &Bytes, cost: usize) -> u64 {
        let seq = self.next_seq;
        self.chunks.push_back(Chunk {
            frames,
            payload: Some(payload.clone()),
            first_seq: seq,
            msgs: 1,
            checked: self.checks,
        });
        self.bytes += cost;
        self.bytes_pushed = self.bytes_pushed.wrapping_add(cost as u64);
        self.next_seq += 1;
        self.tail_first_seq = self.next_seq;
        seq
    }

    /// Queues one message that travels as its own frame of `kind` (CALL or REPLY), its body
    /// `head` then `payload`: numbered, held and resent like any message. A large payload is
    /// kept by reference (no copy). Returns its number, or `None` if it does not fit.
    pub fn push_framed(&mut self, kind: FrameKind, head: &[u8], payload: &Bytes) -> Option<u64> {
        let body_len = head.len() + payload.len();
        let cost = HEADER_LEN + body_len;
        if self.bytes + cost > self.limit_bytes && self.bytes > 0 {
            return None;
        }
        let seq = self.next_seq;
        if payload.len() <= COPY_PAYLOAD_BYTES_MAX {
            self.seal_if_full(body_len);
            self.bytes += cost;
            self.bytes_pushed = self.bytes_pushed.wrapping_add(cost as u64);
            self.append_frame(kind, head, payload);
            return Some(seq);
        }
        self.seal_tail();
        let mut frames = BytesMut::with_capacity(HEADER_LEN + head.len());
        frames.extend_from_slice(&if self.checks {
            crate::frame::encode_header_gathered(kind, &[head, payload])
        } else {
            encode_header_unchecked(kind, body_len)
        });
        frames.extend_from_slice(head);
        Some(self.push_referenced(frames.freeze(), payload, cost))
    }

    /// Queues one publish, its PUBLISH body `head` (as `group::encode_publish_head` makes it)
    /// then `payload`. With `batch` (the peer takes batches, `caps::PUBLISH_BATCH`) a small
    /// one joins the PUBLISH batch at the end of the queue when it is the next of that stream
    /// (same publisher, incarnation, flags and group, the number after), or starts one: one
    /// head and one message for publishes in a row. Otherwise it is a frame of its own (see
    /// [`Outbox::push_framed`]). Returns its message number (a batch's), or `None` if it does
    /// not fit.
    pub fn push_publish(&mut self, head: &[u8], payload: &Bytes, batch: bool) -> Option<u64> {
        let word = match head.get(16..24) {
            Some(w) if batch && head.len() >= PUBLISH_FIXED_BYTES => {
                u64::from_le_bytes(w.try_into().unwrap_or_default())
            }
            _ => return self.push_framed(FrameKind::Publish, head, payload),
        };
        if payload.len() > COPY_PAYLOAD_BYTES_MAX
            || word & (PUBLISH_MARK_BIT | PUBLISH_BATCH_BIT) != 0
        {
            return self.push_framed(FrameKind::Publish, head, payload);
        }
        let entry = BATCH_ENTRY_HEADER_LEN + payload.len();
        if let Some(open) = self.open_publish {
            let at = open.start + HEADER_LEN;
            let body_len = self.tail.len() - at;
            if open.next == word
                && open.head_len == head.len()
                && self.tail[at..at + 16] == head[..16]
                && self.tail[at + 24..at + open.head_len] == head[24..]
                && body_len + entry <= PUBLISH_BATCH_BODY_BYTES_MAX
                && open.count < PUBLISH_BATCH_COUNT_MAX
                && self.tail.len() < CHUNK_BYTES_MAX
                && self.tail.len() + entry <= self.tail.capacity()
            {
                if self.bytes + entry > self.limit_bytes {
                    return None;
                }
                self.bytes += entry;
                self.bytes_pushed = self.bytes_pushed.wrapping_add(entry as u64);
                self.tail
                    .extend_from_slice(&(payload.len() as u16).to_le_bytes());
                self.tail.extend_from_slice(payload);
                self.open_publish = Some(OpenPublish {
                    next: word + 1,
                    count: open.count + 1,
                    ..open
                });
                return Some(self.next_seq - 1);
            }
        }
        let cost = HEADER_LEN + head.len() + entry;
        if self.bytes + cost > self.limit_bytes && self.bytes > 0 {
            return None;
        }
        self.seal_if_full(head.len() + entry);
        self.start_frame();
        let start = self.tail.len();
        // Sealed (header and check) with the chunk, see `seal_batch`.
        self.tail.extend_from_slice(&[0; HEADER_LEN]);
        self.tail.extend_from_slice(&head[..16]);
        self.tail
            .extend_from_slice(&(word | PUBLISH_BATCH_BIT).to_le_bytes());
        self.tail.extend_from_slice(&head[24..]);
        self.tail
            .extend_from_slice(&(payload.len() as u16).to_le_bytes());
        self.tail.extend_from_slice(payload);
        self.open_publish = Some(OpenPublish {
            start,
            head_len: head.len(),
            count: 1,
            next: word + 1,
        });
        self.bytes += cost;
        self.bytes_pushed = self.bytes_pushed.wrapping_add(cost as u64);
        self.tail_msgs += 1;
        self.next_seq += 1;
        Some(self.next_seq - 1)
    }

    /// Queues a control frame, or a part of one, for the current link, ahead of any data not
    /// yet written (a ROUTED frame may be queued as its parts, one call each).
    pub fn push_control(&mut self, frame: Bytes) {
        self.bytes_pushed = self.bytes_pushed.wrapping_add(frame.len() as u64);
        self.control_bytes += frame.len();
        self.control.push(frame);
    }

    /// Like [`Outbox::push_control`] for one whole frame: a PING, PONG or ACK replaces one of
    /// its kind still queued (see `Outbox::newest`), so those take at most three places however
    /// long the writer waits. Only for whole frames: a part of a frame is not a kind.
    pub fn push_control_frame(&mut self, frame: Bytes) {
        let slot = match frame.first().copied().and_then(FrameKind::from_u8) {
            Some(FrameKind::Ping) => Some(0),
            Some(FrameKind::Pong) => Some(1),
            Some(FrameKind::Ack) => Some(2),
            _ => None,
        };
        if let Some(at) = slot.and_then(|k| self.newest[k]) {
            self.bytes_pushed = self.bytes_pushed.wrapping_add(frame.len() as u64);
            self.control_bytes = self.control_bytes - self.control[at].len() + frame.len();
            self.control[at] = frame;
            return;
        }
        if let Some(k) = slot {
            self.newest[k] = Some(self.control.len());
        }
        self.push_control(frame);
    }

    /// Whether the control queue holds one ACK and nothing else (no message waits either,
    /// or not: see `has_unwritten_messages`): what a link's writer may hold back a moment for
    /// the answer that would go with it.
    pub fn only_an_ack_waits(&self) -> bool {
        self.control.len() == 1 && self.newest[2] == Some(0)
    }

    /// Empties the control queue.
    fn clear_control(&mut self) {
        self.control.clear();
        self.control_bytes = 0;
        self.newest = [None; 3];
    }

    /// Whether anything waits to be written.
    pub fn has_unwritten(&self) -> bool {
        !self.control.is_empty() || self.has_unwritten_messages()
    }

    /// Whether messages (not control frames) wait to be written.
    pub fn has_unwritten_messages(&self) -> bool {
        self.unwritten < self.chunks.len() || !self.tail.is_empty()
    }

    /// Appends every control frame, then every unwritten message's frames, to `out`, in the
    /// order they must be written; returns how many bytes that is. The messages stay held
    /// until acknowledged.
    pub fn take_unwritten(&mut self, out: &mut Vec<Bytes>) -> usize {
        self.take_control(out) + self.take_messages(out)
    }

    /// Appends only the control frames to `out` (messages wait); returns how many bytes.
    pub fn take_control(&mut self, out: &mut Vec<Bytes>) -> usize {
        let mut n = 0;
        self.control_bytes = 0;
        self.newest = [None; 3];
        for c in self.control.drain(..) {
            n += c.len();
            out.push(c);
        }
        n
    }

    /// Appends only the unwritten messages' frames to `out` (control frames wait); returns how
    /// many bytes. The messages stay held until acknowledged.
    pub fn take_messages(&mut self, out: &mut Vec<Bytes>) -> usize {
        let mut n = 0;
        self.seal_tail();
        let checks = self.checks;
        for chunk in self.chunks.range_mut(self.unwritten..) {
            if checks {
                chunk.ensure_checked();
            }
            n += chunk.len();
            out.push(chunk.frames.clone());
            if let Some(p) = &chunk.payload {
                out.push(p.clone());
            }
        }
        self.unwritten = self.chunks.len();
        n
    }

    /// Whether control frames wait to be written.
    pub fn has_control(&self) -> bool {
        !self.control.is_empty()
    }

    /// Like [`Outbox::take_unwritten`], chunk by chunk: `f(first_seq, frames, payload)` for each
    /// unwritten chunk, where the chunk's messages are `frames` followed by `payload` (the body
    /// of its DATA frame, if it was kept apart). Control frames are not included.
    pub fn take_chunks(&mut self, f: impl FnMut(u64, &Bytes, Option<&Bytes>)) {
        self.take_chunks_within(usize::MAX, f);
    }

    /// Like [`Outbox::take_chunks`], while the bytes written and not yet acknowledged stay
    /// within `window` (at least one chunk goes when none is in flight); the rest stays
    /// unwritten for a later call, once acknowledgements freed the window.
    pub fn take_chunks_within(
        &mut self,
        window: usize,
        mut f: impl FnMut(u64, &Bytes, Option<&Bytes>),
    ) {
        self.seal_tail();
        let checks = self.checks;
        let mut in_flight: usize = self.chunks.range(..self.unwritten).map(Chunk::len).sum();
        let mut taken = self.unwritten;
        for chunk in self.chunks.range_mut(self.unwritten..) {
            if in_flight > 0 && in_flight.saturating_add(chunk.len()) > window {
                break;
            }
            if checks {
                chunk.ensure_checked();
            }
            f(chunk.first_seq, &chunk.frames, chunk.payload.as_ref());
            in_flight += chunk.len();
            taken += 1;
        }
        self.unwritten = taken;
    }

    /// Bytes of control frames waiting.
    pub fn control_bytes(&self) -> usize {
        self.control_bytes
    }

    /// Whether messages handed to a link still await acknowledgement.
    pub fn has_written_unacked(&self) -> bool {
        self.written_end() > self.acked
    }

    /// One past the last message handed to the current link.
    pub fn written_end(&self) -> u64 {
        match self.unwritten {
            0 => self.acked,
            i => self.chunks[i - 1].end(),
        }
    }

    /// The peer has every message below `next_expected`: frees what they held. Returns the
    /// bytes freed.
    pub fn ack(&mut self, next_expected: u64) -> Result<usize, AckError> {
        if next_expected > self.written_end() {
            return Err(AckError {
                acked: next_expected,
                written_end: self.written_end(),
            });
        }
        Ok(self.drop_below(next_expected))
    }

    /// Like [`Outbox::ack`], for explicitly numbered (routed) messages, whose
    /// acknowledgements may arrive after a rewind: any number up to `next_seq` is taken.
    /// Returns the bytes freed.
    pub fn ack_explicit(&mut self, next_expected: u64) -> usize {
        self.drop_below(next_expected.min(self.next_seq))
    }

    fn drop_below(&mut self, seq: u64) -> usize {
        if seq <= self.acked {
            return 0;
        }
        let mut freed = 0;
        while self.chunks.front().is_some_and(|c| c.end() <= seq) {
            let c = self.chunks.pop_front().expect("checked above");
            freed += c.len();
            self.unwritten = self.unwritten.saturating_sub(1);
            if self.spare.is_none() {
                // Succeeds only if nothing else holds the buffer (the writer let go of it).
                if let Ok(mut buf) = c.frames.try_into_mut() {
                    buf.clear();
                    if buf.capacity() >= TAIL_BUSY_BYTES {
                        self.spare = Some(buf);
                    }
                }
            }
        }
        self.bytes -= freed;
        self.acked = seq.min(self.next_seq);
        freed
    }

    /// A new link to the same peer is up and the peer expects `peer_next_expected` next. Drops
    /// what it already has, makes everything else unwritten again (re-framing a chunk the
    /// peer has only part of), and drops control frames meant for the old link. Returns the
    /// number of the first message the new link carries.
    pub fn resume(&mut self, peer_next_expected: u64) -> Result<u64, AckError> {
        if peer_next_expected > self.next_seq {
            return Err(AckError {
                acked: peer_next_expected,
                written_end: self.next_seq,
            });
        }
        self.clear_control();
        self.drop_below(peer_next_expected);
        let start = self.acked;
        if let Some(front) = self.chunks.front() {
            if front.first_seq < start {
                let skip = start - front.first_seq;
                let old = self.chunks.pop_front().expect("checked above");
                let reframed = reframe(&old.frames, skip);
                self.bytes = self.bytes - old.len() + reframed.len();
                self.chunks.push_front(Chunk {
                    frames: reframed,
                    payload: None,
                    first_seq: start,
                    msgs: old.msgs - skip,
                    checked: true,
                });
            }
        }
        self.unwritten = 0;
        Ok(start)
    }

    /// Gives up on every message held: returns their numbers and frees everything. The
    /// numbering goes on from where it was.
    pub fn fail_all(&mut self) -> Range<u64> {
        let range = self.acked..self.next_seq;
        self.chunks.clear();
        self.unwritten = 0;
        self.tail.clear();
        self.open_batch = None;
        self.open_publish = None;
        self.tail_msgs = 0;
        self.tail_first_seq = self.next_seq;
        self.clear_control();
        self.acked = self.next_seq;
        self.bytes = 0;
        range
    }

    fn copy_cost(&self, len: usize) -> usize {
        if len > COPY_PAYLOAD_BYTES_MAX {
            HEADER_LEN + len
        } else if self.batch_has_room(len) {
            BATCH_ENTRY_HEADER_LEN + len
        } else {
            HEADER_LEN + BATCH_ENTRY_HEADER_LEN + len
        }
    }

    fn batch_has_room(&self, len: usize) -> bool {
        // A full chunk is sealed before the next message (see `append_copy`).
        self.tail.len() < CHUNK_BYTES_MAX
            && self.open_batch.is_some_and(|start| {
                self.tail.len() - start - HEADER_LEN + BATCH_ENTRY_HEADER_LEN + len
                    <= BATCH_BODY_BYTES_MAX
            })
    }

    /// Seals the copy buffer if a message of `len` bytes might not fit in what is left of it:
    /// growing it would copy what it holds. Called before the message's cost is counted.
    fn seal_if_full(&mut self, len: usize) {
        let room = self.tail.capacity() - self.tail.len();
        if !self.tail.is_empty() && room < HEADER_LEN + BATCH_ENTRY_HEADER_LEN + len {
            self.seal_tail();
        }
    }

    fn append_copy(&mut self, p: &[u8]) {
        if self.tail.capacity() == 0 {
            self.tail.reserve(TAIL_INITIAL_BYTES);
        }
        if self.tail.len() >= CHUNK_BYTES_MAX {
            self.seal_tail();
        }
        if self.tail.is_empty() {
            self.tail_first_seq = self.next_seq;
        }
        if p.len() > COPY_PAYLOAD_BYTES_MAX {
            self.seal_batch();
            // Checked with the whole chunk at `seal_tail`.
            self.tail
                .extend_from_slice(&encode_header_unchecked(FrameKind::Data, p.len()));
            self.tail.extend_from_slice(p);
        } else {
            if !self.batch_has_room(p.len()) {
                self.seal_batch();
                self.open_batch = Some(self.tail.len());
                self.tail.extend_from_slice(&[0; HEADER_LEN]);
            }
            self.tail.extend_from_slice(&(p.len() as u16).to_le_bytes());
            self.tail.extend_from_slice(p);
        }
        self.tail_msgs += 1;
        self.next_seq += 1;
    }

    /// Makes the tail ready for a frame of its own: a buffer, a chunk sealed if full, the
    /// chunk's first number if it starts here, any open batch sealed.
    fn start_frame(&mut self) {
        if self.tail.capacity() == 0 {
            self.tail.reserve(TAIL_INITIAL_BYTES);
        }
        if self.tail.len() >= CHUNK_BYTES_MAX {
            self.seal_tail();
        }
        if self.tail.is_empty() {
            self.tail_first_seq = self.next_seq;
        }
        self.seal_batch();
    }

    /// Copies one message framed on its own (`kind`: CALL or REPLY) into the tail.
    fn append_frame(&mut self, kind: FrameKind, head: &[u8], payload: &[u8]) {
        self.start_frame();
        // Checked with the whole chunk at `seal_tail`.
        self.tail
            .extend_from_slice(&encode_header_unchecked(kind, head.len() + payload.len()));
        self.tail.extend_from_slice(head);
        self.tail.extend_from_slice(payload);
        self.tail_msgs += 1;
        self.next_seq += 1;
    }

    /// The bytes counted equal the bytes held (for tests).
    #[cfg(test)]
    fn check_accounting(&self) {
        let held: usize = self.chunks.iter().map(Chunk::len).sum::<usize>() + self.tail.len();
        assert_eq!(self.bytes, held, "bytes counted vs held");
    }

    /// `header` in a buffer shared with other headers.
    fn header_bytes(&mut self, header: &[u8]) -> Bytes {
        if self.headers.capacity() - self.headers.len() < header.len() {
            self.headers = BytesMut::with_capacity(HEADER_ARENA_BYTES);
        }
        self.headers.extend_from_slice(header);
        self.headers.split().freeze()
    }

    fn seal_batch(&mut self) {
        if let Some(start) = self.open_batch.take() {
            seal_in_place_unchecked(FrameKind::DataBatch, &mut self.tail[start..]);
        }
        if let Some(open) = self.open_publish.take() {
            seal_in_place_unchecked(FrameKind::Publish, &mut self.tail[open.start..]);
        }
    }

    fn seal_tail(&mut self) {
        self.seal_batch();
        if self.tail.is_empty() {
            return;
        }
        // One pass over the chunk for every frame's check, while it is still in cache.
        if self.checks {
            seal_frames_in_place(&mut self.tail);
        }
        let frames = self.tail.split().freeze();
        // The sealed bytes stay referenced until acknowledged, so the next messages need a
        // new buffer once this one is used up: size it now rather than grow it by copying. A
        // small chunk (a few messages before a large one) leaves the rest of its buffer to
        // the next messages while a whole copied message still fits there: one allocation
        // per buffer, not one per chunk.
        let busy = frames.len() >= BUSY_CHUNK_BYTES;
        if busy && self.tail.capacity() < TAIL_BUSY_BYTES {
            match self.spare.take() {
                Some(spare) => self.tail = spare,
                None => self.tail.reserve(TAIL_BUSY_BYTES),
            }
        } else if !busy && self.tail.capacity() < TAIL_ROOM_MIN {
            self.tail.reserve(TAIL_INITIAL_BYTES);
        }
        self.chunks.push_back(Chunk {
            frames,
            payload: None,
            first_seq: self.tail_first_seq,
            msgs: self.tail_msgs,
            checked: self.checks,
        });
        self.tail_msgs = 0;
        self.tail_first_seq = self.next_seq;
    }
}

/// The messages of `frames` (DATA and DATA_BATCH frames this module built) after the first
/// `skip`, framed anew.
fn reframe(frames: &Bytes, skip: u64) -> Bytes {
    let mut out = Outbox::new(usize::MAX, 0);
    // Frames this module built, perhaps without checks.
    let mut dec = FrameDecoder::new(BODY_LEN_CEILING).skip_checks();
    let mut rest: &[u8] = frames;
    let mut index = 0u64;
    while let Ok(Some((kind, len))) = dec.peek(rest) {
        let body = &rest[HEADER_LEN..len];
        match kind {
            FrameKind::DataBatch => {
                let _ = crate::frame::for_each_batch_entry(body, |start, n| {
                    if index >= skip {
                        out.append_copy(&body[start..start + n]);
                    }
                    index += 1;
                });
            }
            FrameKind::Call
            | FrameKind::Reply
            | FrameKind::Interest
            | FrameKind::Publish
            | FrameKind::Repair
            | FrameKind::Multicast
            | FrameKind::GroupLog => {
                if index >= skip {
                    out.append_frame(kind, &[], body);
                }
                index += 1;
            }
            _ => {
                if index >= skip {
                    out.append_copy(body);
                }
                index += 1;
            }
        }
        rest = &rest[len..];
    }
    out.seal_tail();
    out.chunks.pop_front().map_or_else(Bytes::new, |c| c.frames)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The payloads carried by written bytes, in order.
    fn payloads(parts: &[Bytes]) -> Vec<Vec<u8>> {
        let mut wire = BytesMut::new();
        for p in parts {
            wire.extend_from_slice(p);
        }
        let mut dec = FrameDecoder::new(BODY_LEN_CEILING);
        let mut out = Vec::new();
        while let Some(f) = dec.decode(&mut wire).unwrap() {
            match f.kind {
                FrameKind::DataBatch => crate::frame::for_each_batch_entry(&f.body, |s, n| {
                    out.push(f.body[s..s + n].to_vec())
                })
                .unwrap(),
                FrameKind::Data => out.push(f.body.to_vec()),
                _ => {}
            }
        }
        assert!(wire.is_empty());
        out
    }

    fn msg(i: u64, len: usize) -> Vec<u8> {
        let mut v = i.to_le_bytes().to_vec();
        v.resize(len.max(8), i as u8);
        v
    }

    #[test]
    fn numbers_messages_and_frees_them_when_acknowledged() {
        let mut o = Outbox::new(1 << 20, 10);
        assert_eq!(o.push_copies(&[msg(10, 8), msg(11, 8)]), 2);
        assert_eq!(o.push_shared(&Bytes::from(msg(12, 5000))), Some(12));
        assert_eq!((o.next_seq(), o.acked(), o.unacked()), (13, 10, 3));
        let mut out = Vec::new();
        o.take_unwritten(&mut out);
        assert_eq!(payloads(&out), vec![msg(10, 8), msg(11, 8), msg(12, 5000)]);
        assert!(!o.has_unwritten());
        assert!(o.ack(14).is_err(), "cannot acknowledge what was not sent");
        o.ack(11).unwrap();
        assert_eq!(o.unacked(), 2);
        o.ack(13).unwrap();
        assert_eq!((o.unacked(), o.bytes()), (0, 0));
    }

    #[test]
    fn bytes_pushed_counts_every_frame_byte_queued_once() {
        let mut o = Outbox::new(1 << 20, 0);
        let small: Vec<Vec<u8>> = (0..300).map(|i| msg(i, 8 + i as usize % 100)).collect();
        o.push_copies(&small);
        o.push_shared(&Bytes::from(vec![1u8; 5000])).unwrap();
        o.push_shared(&Bytes::from(vec![2u8; 30])).unwrap();
        o.push_framed(FrameKind::Publish, b"head", &Bytes::from(vec![3u8; 40]))
            .unwrap();
        o.push_framed(FrameKind::Publish, b"head", &Bytes::from(vec![4u8; 4000]))
            .unwrap();
        o.push_control_frame(crate::control::ack_frame(7));
        o.push_control(Bytes::from(vec![5u8; 33]));
        let mut out = Vec::new();
        let written = o.take_unwritten(&mut out);
        assert_eq!(
            o.bytes_pushed(),
            written as u64,
            "what was queued is what was written"
        );
        // A newer ACK takes the queued one's place: both were queued, both count.
        o.push_control_frame(crate::control::ack_frame(8));
        o.push_control_frame(crate::control::ack_frame(9));
        let ack_len = crate::control::ack_frame(9).len() as u64;
        assert_eq!(o.bytes_pushed(), written as u64 + 2 * ack_len);
        // Written again after a reconnect: not counted again.
        let before = o.bytes_pushed();
        o.resume(0).unwrap();
        o.take_unwritten(&mut Vec::new());
        assert_eq!(o.bytes_pushed(), before);
        o.check_accounting();
    }

    #[test]
    fn frames_sealed_without_checks_get_them_when_a_checking_link_takes_them() {
        let mut o = Outbox::new(1 << 20, 0);
        o.set_checks(false);
        let all: Vec<Vec<u8>> = (0..50)
            .map(|i| msg(i, 20 + (i as usize % 3) * 2000))
            .collect();
        o.push_copies(&all[..40]);
        o.push_shared(&Bytes::from(vec![7u8; 5000])).unwrap();
        let mut ring = Vec::new();
        o.take_messages(&mut ring);
        let mut wire = BytesMut::new();
        ring.iter().for_each(|b| wire.extend_from_slice(b));
        let mut strict = FrameDecoder::new(BODY_LEN_CEILING);
        assert!(
            matches!(
                strict.decode(&mut wire.clone()),
                Err(crate::DecodeError::ChecksumMismatch { .. })
            ),
            "no checks while they are off"
        );
        let mut lenient = FrameDecoder::new(BODY_LEN_CEILING).skip_checks();
        while lenient.decode(&mut wire).unwrap().is_some() {}
        // The ring's link drops; the next link verifies checks.
        o.set_checks(true);
        o.resume(10).unwrap();
        o.push_copies(&all[40..]);
        let mut out = Vec::new();
        o.take_unwritten(&mut out);
        let mut want: Vec<Vec<u8>> = all[10..40].to_vec();
        want.push(vec![7u8; 5000]);
        want.extend_from_slice(&all[40..]);
        assert_eq!(payloads(&out), want, "every frame checked and in order");
        o.check_accounting();
    }

    #[test]
    fn small_chunks_and_large_headers_share_buffers() {
        let mut o = Outbox::new(1 << 20, 0);
        let big = Bytes::from(vec![9u8; 5000]);
        // Small, large, small, large: each large message seals the small one before it.
        o.push_copies(&[msg(0, 10)]);
        o.push_shared(&big).unwrap();
        o.push_copies(&[msg(2, 10)]);
        o.push_shared(&big).unwrap();
        o.push_copies(&[msg(4, 10)]);
        let mut out = Vec::new();
        o.take_messages(&mut out);
        let c = &o.chunks;
        let end = |b: &Bytes| b.as_ptr() as usize + b.len();
        // The second small chunk was copied right after the first, in the same buffer.
        assert_eq!(end(&c[0].frames), c[2].frames.as_ptr() as usize);
        // The two headers of large messages were cut from one buffer.
        assert_eq!(end(&c[1].frames), c[3].frames.as_ptr() as usize);
        assert_eq!(
            payloads(&out),
            vec![
                msg(0, 10),
                vec![9; 5000],
                msg(2, 10),
                vec![9; 5000],
                msg(4, 10)
            ]
        );
        o.check_accounting();
    }

    /// Every message frame in written bytes, in order: (kind, body) with DATA_BATCH entries as
    /// DATA.
    fn messages(parts: &[Bytes]) -> Vec<(FrameKind, Vec<u8>)> {
        let mut wire = BytesMut::new();
        parts.iter().for_each(|p| wire.extend_from_slice(p));
        let mut dec = FrameDecoder::new(BODY_LEN_CEILING);
        let mut out = Vec::new();
        while let Some(f) = dec.decode(&mut wire).unwrap() {
            match f.kind {
                FrameKind::DataBatch => crate::frame::for_each_batch_entry(&f.body, |s, n| {
                    out.push((FrameKind::Data, f.body[s..s + n].to_vec()))
                })
                .unwrap(),
                k => out.push((k, f.body.to_vec())),
            }
        }
        out
    }

    #[test]
    fn a_large_framed_message_sealed_without_checks_keeps_its_kind_and_head_when_checked_later() {
        let mut o = Outbox::new(1 << 20, 0);
        o.set_checks(false);
        let payload = Bytes::from(vec![5u8; 5000]);
        o.push_framed(FrameKind::Call, &[9; 8], &payload).unwrap();
        o.push_framed(FrameKind::Publish, &[3; 30], &payload)
            .unwrap();
        // The ring's link drops before it took them; the next link verifies checks.
        o.set_checks(true);
        let mut out = Vec::new();
        o.take_unwritten(&mut out);
        let body = |head: &[u8]| [head, &payload[..]].concat();
        assert_eq!(
            messages(&out),
            vec![
                (FrameKind::Call, body(&[9; 8])),
                (FrameKind::Publish, body(&[3; 30]))
            ]
        );
    }

    /// The PUBLISH head of publish `number` of publisher 7 to `name`.
    fn publish_head(number: u64, name: &str) -> Vec<u8> {
        crate::group::encode_publish_head(crate::BusId(7), 1, number, name)
    }

    #[test]
    fn publishes_in_a_row_share_one_frame_and_one_number_and_others_start_a_new_one() {
        let mut o = Outbox::new(1 << 20, 0);
        let p = |i: u64| Bytes::from(msg(i, 40));
        // 1..=100 of "g" in a row: one batch (one message, number 0).
        for n in 1..=100 {
            assert_eq!(o.push_publish(&publish_head(n, "g"), &p(n), true), Some(0));
        }
        // Another group, then a number out of row, then a DATA: each starts anew.
        assert_eq!(o.push_publish(&publish_head(1, "h"), &p(0), true), Some(1));
        assert_eq!(
            o.push_publish(&publish_head(105, "g"), &p(105), true),
            Some(2)
        );
        assert_eq!(o.push_copies(&[msg(9, 10)]), 1);
        assert_eq!(
            o.push_publish(&publish_head(106, "g"), &p(106), true),
            Some(4)
        );
        // Without batches (the peer does not take them): a frame each.
        assert_eq!(
            o.push_publish(&publish_head(107, "g"), &p(107), false),
            Some(5)
        );
        assert_eq!(
            o.push_publish(&publish_head(108, "g"), &p(108), false),
            Some(6)
        );
        o.check_accounting();
        let mut out = Vec::new();
        o.take_unwritten(&mut out);
        let frames = messages(&out);
        assert_eq!(frames.len(), 7, "one frame per message");
        let publishes: Vec<(u64, u64, String, Vec<Vec<u8>>)> = frames
            .iter()
            .filter(|(k, _)| *k == FrameKind::Publish)
            .map(|(_, body)| {
                let head = crate::group::decode_publish(body).unwrap();
                let mut payloads = Vec::new();
                crate::group::for_each_publish(body, &head, |_, at, len| {
                    payloads.push(body[at..at + len].to_vec())
                });
                (head.number, head.count, head.name.to_string(), payloads)
            })
            .collect();
        let want = |n: std::ops::RangeInclusive<u64>| n.map(|i| p(i).to_vec()).collect::<Vec<_>>();
        assert_eq!(
            publishes,
            vec![
                (1, 100, "g".into(), want(1..=100)),
                (1, 1, "h".into(), want(0..=0)),
                (105, 1, "g".into(), want(105..=105)),
                (106, 1, "g".into(), want(106..=106)),
                (107, 1, "g".into(), want(107..=107)),
                (108, 1, "g".into(), want(108..=108)),
            ]
        );
        // The peer has the first two: the rest is written again, each whole.
        o.resume(2).unwrap();
        let mut again = Vec::new();
        o.take_unwritten(&mut again);
        assert_eq!(messages(&again), frames[2..].to_vec());
        o.check_accounting();
    }

    #[test]
    fn a_batch_stops_at_its_size_bound_and_a_full_outbox_refuses_the_next_publish() {
        let mut o = Outbox::new(200 << 10, 0);
        let payload = Bytes::from(vec![1u8; 1000]);
        let mut n = 1;
        while o
            .push_publish(&publish_head(n, "g"), &payload, true)
            .is_some()
        {
            n += 1;
        }
        o.check_accounting();
        let mut out = Vec::new();
        o.take_unwritten(&mut out);
        let frames = messages(&out);
        let mut next = 1;
        for (kind, body) in &frames {
            assert_eq!(*kind, FrameKind::Publish);
            assert!(body.len() <= PUBLISH_BATCH_BODY_BYTES_MAX, "{}", body.len());
            let head = crate::group::decode_publish(body).unwrap();
            assert_eq!(head.number, next, "numbers run on from frame to frame");
            next += head.count;
        }
        assert_eq!(next, n, "every publish queued is in a frame, once");
        assert!(
            frames.len() >= 3,
            "{} frames for {} publishes",
            frames.len(),
            n - 1
        );
        // Empty payloads: the count bound, not the size, ends a batch.
        let mut o = Outbox::new(1 << 20, 0);
        for n in 1..=3000 {
            assert!(o
                .push_publish(&publish_head(n, "g"), &Bytes::new(), true)
                .is_some());
        }
        let mut out = Vec::new();
        o.take_unwritten(&mut out);
        let counts: Vec<u64> = messages(&out)
            .iter()
            .map(|(_, body)| crate::group::decode_publish(body).unwrap().count)
            .collect();
        assert_eq!(counts, vec![1024, 1024, 952]);
    }

    #[test]
    fn calls_and_replies_are_numbered_among_messages_and_keep_their_kind_on_a_resend() {
        let mut o = Outbox::new(1 << 20, 0);
        let big = Bytes::from(vec![5u8; 5000]);
        assert_eq!(o.push_copies(&[msg(0, 10)]), 1);
        assert_eq!(
            o.push_framed(
                FrameKind::Call,
                &7u64.to_le_bytes(),
                &Bytes::from_static(b"req")
            ),
            Some(1)
        );
        assert_eq!(o.push_copies(&[msg(2, 10)]), 1);
        assert_eq!(o.push_framed(FrameKind::Reply, &[9; 9], &big), Some(3));
        assert_eq!(o.push_copies(&[msg(4, 10)]), 1);
        let mut call = 7u64.to_le_bytes().to_vec();
        call.extend_from_slice(b"req");
        let mut reply = vec![9u8; 9];
        reply.extend_from_slice(&big);
        let expected = vec![
            (FrameKind::Data, msg(0, 10)),
            (FrameKind::Call, call),
            (FrameKind::Data, msg(2, 10)),
            (FrameKind::Reply, reply),
            (FrameKind::Data, msg(4, 10)),
        ];
        let mut out = Vec::new();
        o.take_unwritten(&mut out);
        assert_eq!(messages(&out), expected);
        o.check_accounting();
        // The link drops; the peer had the first message only: the rest is written again, the
        // CALL still a CALL (its chunk is cut and framed anew).
        assert_eq!(o.resume(1), Ok(1));
        let mut again = Vec::new();
        o.take_unwritten(&mut again);
        assert_eq!(messages(&again), expected[1..].to_vec());
        o.ack(5).unwrap();
        assert_eq!(o.bytes(), 0);
    }

    #[test]
    fn resume_rewrites_exactly_what_the_peer_lacks() {
        let mut o = Outbox::new(1 << 20, 0);
        let all: Vec<Vec<u8>> = (0..100).map(|i| msg(i, 20)).collect();
        o.push_copies(&all[..60]);
        let mut out = Vec::new();
        o.take_unwritten(&mut out);
        o.push_copies(&all[60..]);
        // The link drops; the peer had received 37 of them.
        assert_eq!(o.resume(37), Ok(37));
        let mut again = Vec::new();
        o.take_unwritten(&mut again);
        assert_eq!(payloads(&again), all[37..].to_vec());
    }

    #[test]
    fn a_full_outbox_refuses_and_control_frames_go_first() {
        let mut o = Outbox::new(100, 0);
        assert_eq!(o.push_copies(&[[0u8; 30]; 5]), 2);
        assert_eq!(o.push_shared(&Bytes::from(vec![1u8; 40])), None);
        o.push_control(Bytes::from_static(b"ctl"));
        let mut out = Vec::new();
        o.take_unwritten(&mut out);
        assert_eq!(out[0].as_ref(), b"ctl");
        let range = o.fail_all();
        assert_eq!(range, 0..2);
        assert_eq!((o.bytes(), o.next_seq(), o.acked()), (0, 2, 2));
    }

    proptest! {
        /// Whatever is pushed, acknowledged and resumed, a peer that applies what it is sent
        /// sees every message exactly once, in order.
        #[test]
        fn resumes_never_lose_or_repeat(
            ops in prop::collection::vec((0usize..7, 0usize..3000, 0u64..50), 1..60),
        ) {
            let mut o = Outbox::new(1 << 24, 0);
            let mut received: Vec<Vec<u8>> = Vec::new();
            // Messages written on the current link and not yet arrived, in order (a FIFO link).
            let mut in_flight: Vec<Vec<u8>> = Vec::new();
            for (op, len, n) in ops {
                match op {
                    0 | 1 => {
                        let batch: Vec<Vec<u8>> = (0..n).map(|i| msg(o.next_seq() + i, len)).collect();
                        o.push_copies(&batch);
                    }
                    2 => {
                        let seq = o.next_seq();
                        o.push_shared(&Bytes::from(msg(seq, len)));
                    }
                    3 => {
                        let mut out = Vec::new();
                        o.take_unwritten(&mut out);
                        in_flight.extend(payloads(&out));
                    }
                    4 => {
                        // A prefix of what is in flight arrives, and the peer acknowledges it.
                        let keep = (n as usize).min(in_flight.len());
                        received.extend(in_flight.drain(..keep));
                        o.ack(received.len() as u64).unwrap();
                    }
                    5 => {
                        // A burst big enough to fill whole chunks before the writer runs.
                        let batch: Vec<Vec<u8>> = (0..n * 400).map(|i| msg(o.next_seq() + i, 60)).collect();
                        o.push_copies(&batch);
                    }
                    _ => {
                        // The link drops after a prefix arrived; a new link resumes.
                        let keep = (n as usize).min(in_flight.len());
                        received.extend(in_flight.drain(..keep));
                        in_flight.clear();
                        prop_assert_eq!(o.resume(received.len() as u64).unwrap(), received.len() as u64);
                    }
                }
                o.check_accounting();
            }
            let mut out = Vec::new();
            o.take_unwritten(&mut out);
            in_flight.extend(payloads(&out));
            received.extend(in_flight);
            prop_assert_eq!(received.len() as u64, o.next_seq());
            for (i, m) in received.iter().enumerate() {
                prop_assert_eq!(&m[..8], &(i as u64).to_le_bytes()[..]);
            }
        }
    }

    #[test]
    fn pings_pongs_and_acks_keep_one_place_each_however_long_the_writer_waits() {
        use crate::control::{ack_frame, ping_frame, Close, CloseCode};
        let mut o = Outbox::new(1 << 20, 0);
        let close = Close::frame(CloseCode::Normal, "x");
        o.push_control_frame(close.clone());
        // A ROUTED frame queued as its parts: the second part starts with a byte that is also
        // the kind of a PING (a FAIL's reason, a payload): it is no PING, and stays whole.
        let parts = [
            Bytes::from_static(b"\x10routed header"),
            Bytes::from_static(b"\x04inner part"),
        ];
        for p in &parts {
            o.push_control(p.clone());
        }
        for i in 0..10_000u64 {
            o.push_control_frame(ping_frame(FrameKind::Ping, i));
            o.push_control_frame(ping_frame(FrameKind::Pong, i));
            o.push_control_frame(ack_frame(i));
        }
        let mut out = Vec::new();
        let bytes = o.take_control(&mut out);
        assert_eq!(
            out,
            vec![
                close,
                parts[0].clone(),
                parts[1].clone(),
                ping_frame(FrameKind::Ping, 9_999),
                ping_frame(FrameKind::Pong, 9_999),
                ack_frame(9_999),
            ]
        );
        assert_eq!(bytes, out.iter().map(Bytes::len).sum::<usize>());
        // After a take, a new one queues again (its old place is gone).
        o.push_control_frame(ack_frame(10_000));
        assert_eq!(o.control_bytes(), ack_frame(10_000).len());
    }
}
