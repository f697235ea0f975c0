//! The application's reader of a peer's shared-memory ring.
//!
//! Once a link switched, the inbox reads the peer's ring itself, on the application's thread:
//! one copy out of shared memory into the batch the application gets, no thread or task in
//! between. A thread of the ring's own sleeps on the futex only while the inbox sleeps, and
//! wakes it when a record is published. Everything in the ring must be whole DATA, DATA_BATCH,
//! CALL or REPLY frames (their kinds, lengths and batch entries checked); anything else ends
//! the link with a reason (the node and its other links go on).

mod logs;

use crate::group::log_in::{AttachedLog, LogWatches};
use crate::limits::{
    RING_ACK_EVERY_BYTES, RING_READ_RECORDS_MAX, RING_STASH_BYTES_MAX, RING_WAIT_POLL_MS,
};
use crate::node::dispatch::dispatch;
use crate::node::message::MessageBatch;
use crate::node::stats::bump;
use crate::peer::ring_link::RingLink;
use busway_core::body::{message_spans, Span};
use busway_core::control::ack_frame;
use busway_core::frame::HEADER_LEN;
use busway_core::group::LogOffer;
use busway_core::{DecodeError, FrameDecoder};
use busway_shm::ring::{Consumer, ReadWaiter, Wait};
use bytes::BytesMut;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

/// Most message places a batch reserves room for before it walks the bytes read.
const RING_SPANS_PREALLOC_MAX: usize = 4096;

/// What one look at a ring found.
pub(crate) enum Polled {
    /// Messages, and whether an acknowledgement was queued for the link task (the caller
    /// lets it run: on a shared thread it would otherwise wait for the application).
    Batch(MessageBatch, bool),
    /// Nothing whole to deliver now.
    Empty,
    /// Nothing for the inbox in the read itself: replies, which ended their calls (their
    /// callers were woken: they should run before the reader spins on), or publishes, which
    /// went to the inbox's channel.
    Answered,
    /// The ring is done with (its link ended, it was closed and read out, or it is corrupt):
    /// drop it.
    Gone,
}

/// Wakes the application's sleeping inbox (implemented by the inbox).
pub(crate) trait WakeInbox: Clone + Send + 'static {
    /// Wakes it; false once the inbox is gone.
    fn wake(&self) -> bool;
}

/// The application's reader of one peer's ring (see [`InboundRing`]).
pub(crate) struct InboundRing {
    reader: Arc<Mutex<RingReader>>,
    /// Arms the waiter thread (started at the first sleep).
    arm: Option<std_mpsc::SyncSender<()>>,
}

/// What reads the ring: the inbox, or now and then the link task taking the replies out of a
/// ring the application does not read (see [`take_over_replies`]); one at a time.
pub(crate) struct RingReader {
    consumer: Consumer,
    link: Arc<RingLink>,
    /// Bytes read from the ring and not yet cut into a batch (at most a partial frame).
    buf: BytesMut,
    dec: FrameDecoder,
    bytes_since_ack: usize,
    /// `poll` returned `Gone`.
    gone: bool,
    /// Batches the link task read (taking replies out) while the application did not: the
    /// inbox gets them first, in order, before it reads the ring again.
    stash: VecDeque<MessageBatch>,
    stash_bytes: usize,
    /// Looks by the inbox, counted; the link task compares them between its own looks.
    inbox_polls: u64,
    /// A read handed group publishes to the inbox (or to their turn there, `busway_core::turns`) or
    /// left forwards waiting: see whether the node is backlogged before the next read.
    groups_handed: bool,
    /// The peer's logs of groups this node accepted (see `group::log_in`), read after the ring.
    logs: Vec<AttachedLog>,
    /// Whether each of `logs` has something to read, for the waiter thread.
    watches: LogWatches,
    /// Reads of the logs since one had records (see `InboundRing::log_read_within`).
    looks_since_log_records: u32,
}

fn lock(m: &Mutex<RingReader>) -> MutexGuard<'_, RingReader> {
    // A panic while holding this lock leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl InboundRing {
    pub(crate) fn new(consumer: Consumer, link: Arc<RingLink>) -> Self {
        // Frames in a ring are published whole by the peer alone: nothing can tear or alter
        // them in transit, so their checks are neither computed nor verified (see
        // `docs/PROTOCOL.md`); kinds, lengths and batch entries still are.
        let dec = FrameDecoder::new(link.frame_body_max).skip_checks();
        let reader = RingReader {
            consumer,
            link,
            buf: BytesMut::new(),
            dec,
            bytes_since_ack: 0,
            gone: false,
            stash: VecDeque::new(),
            stash_bytes: 0,
            inbox_polls: 0,
            groups_handed: false,
            logs: Vec::new(),
            watches: LogWatches::default(),
            looks_since_log_records: 0,
        };
        Self {
            reader: Arc::new(Mutex::new(reader)),
            arm: None,
        }
    }

    /// A handle for the link task (see [`take_over_replies`]); it does not keep the ring.
    pub(crate) fn handle(&self) -> Weak<Mutex<RingReader>> {
        Arc::downgrade(&self.reader)
    }

    /// Reads what the peer published and returns the whole messages in it as one batch.
    pub(crate) fn poll(&mut self) -> Polled {
        let mut r = lock(&self.reader);
        r.inbox_polls += 1;
        r.poll()
    }

    pub(crate) fn is_gone(&self) -> bool {
        lock(&self.reader).gone
    }

    /// Whether one of the logs read with this ring had records within the last `looks`
    /// looks at it.
    pub(crate) fn log_read_within(&self, looks: u32) -> bool {
        let r = lock(&self.reader);
        !r.logs.is_empty() && r.looks_since_log_records < looks
    }
}

/// Takes the replies out of the ring behind `reader` if the inbox has not looked at it since
/// `last_polls` (the count this returns, for the next call) and it holds unread records:
/// replies end their calls, the other batches wait in the reader's stash for the inbox, up to
/// `RING_STASH_BYTES_MAX`. True if anything was read (the inbox is then woken by the caller).
pub(crate) fn take_over_replies(reader: &Weak<Mutex<RingReader>>, last_polls: &mut u64) -> bool {
    let Some(reader) = reader.upgrade() else {
        return false;
    };
    // Busy: the inbox is reading it right now.
    let Ok(mut r) = reader.try_lock() else {
        return false;
    };
    let polls = std::mem::replace(last_polls, r.inbox_polls);
    if polls != r.inbox_polls || r.gone || r.stash_bytes >= RING_STASH_BYTES_MAX {
        return false;
    }
    if !r.is_readable() {
        return false;
    }
    let mut took = false;
    while r.stash_bytes < RING_STASH_BYTES_MAX {
        match r.read_messages() {
            Polled::Batch(b, _) => {
                r.stash_bytes += b.footprint();
                r.stash.push_back(b);
                took = true;
            }
            Polled::Answered => took = true,
            // Nothing whole yet.
            Polled::Empty if r.is_readable() && !r.backlogged() => took = true,
            Polled::Empty => break,
            Polled::Gone => {
                r.gone = true;
                break;
            }
        }
    }
    took
}

impl RingReader {
    fn fail(&self, why: String) -> Polled {
        self.link.raise_fault(format!(
            "shared-memory ring from bus id {}: {why}",
            self.link.peer.id
        ));
        Polled::Gone
    }

    /// What the link task stashed first, then what the peer published, as one batch.
    fn poll(&mut self) -> Polled {
        if let Some(b) = self.stash.pop_front() {
            self.stash_bytes -= b.footprint();
            return Polled::Batch(b, false);
        }
        if self.gone {
            return Polled::Gone;
        }
        let polled = self.read_messages();
        self.gone = matches!(polled, Polled::Gone);
        if matches!(polled, Polled::Answered) {
            // The stash was empty before this read: what it holds now came from it, in order.
            if let Some(b) = self.stash.pop_front() {
                self.stash_bytes -= b.footprint();
                return Polled::Batch(b, false);
            }
        }
        polled
    }

    /// Whether the node's inbox holds too many group publishes not taken, or publishes of a
    /// group under backpressure wait for room toward a member (tried again here): the ring
    /// waits. Looked at only after a read that handed publishes over or left some waiting
    /// (`groups_handed`), so that a ring without group traffic pays nothing for it.
    fn backlogged(&mut self) -> bool {
        if !self.groups_handed {
            return false;
        }
        let backlogged = self
            .link
            .node
            .upgrade()
            .is_some_and(|n| n.backlogged(self.link.peer.id));
        self.groups_handed = backlogged;
        backlogged
    }

    /// Whether the ring or one of the logs holds something unread.
    fn is_readable(&self) -> bool {
        self.consumer.is_readable() || self.logs.iter().any(|l| l.reader.is_readable())
    }

    /// Reads the ring, then the logs attached to it.
    fn read_messages(&mut self) -> Polled {
        let polled = self.read_ring();
        if self.logs.is_empty() || matches!(polled, Polled::Gone) {
            return polled;
        }
        if self.backlogged() {
            // A look all the same: the inbox must not yield at the logs for ever meanwhile.
            self.looks_since_log_records = self.looks_since_log_records.saturating_add(1);
            return polled;
        }
        let handed = self.read_logs();
        self.groups_handed |= handed;
        match polled {
            // The publishes went to the inbox's channel: the inbox looks there.
            Polled::Empty if handed => Polled::Answered,
            p => p,
        }
    }

    fn read_ring(&mut self) -> Polled {
        if self.backlogged() {
            return Polled::Empty;
        }
        // Held from the read to the count: the link's `wait_drained` must not see the ring
        // read out before what was read is counted (its ACK would miss it).
        let link = self.link.clone();
        let _reading = link.reading();
        if self.link.is_gone() {
            return Polled::Gone;
        }
        if let Some(done) = self.fill() {
            return done;
        }
        let (pos, spans) = match self.whole_frames() {
            Ok(got) => got,
            Err(failed) => return failed,
        };
        if pos == 0 {
            return Polled::Empty;
        }
        let chunk = self.buf.split_to(pos).freeze();
        if spans.is_empty() {
            // Whole frames that carried no message (an empty DATA_BATCH): nothing to hand over.
            return Polled::Empty;
        }
        let Some(ack_now) = self.count_and_ack(chunk.len(), &spans) else {
            return Polled::Gone;
        };
        // The one receive dispatcher, as for a socket's reads (`node::dispatch`), on the
        // application's thread: group messages to the node, the peer's log offers attached to
        // this ring (they live and die with it), replies ending their calls here.
        let node = link.node.upgrade();
        let take_offer = |offer: LogOffer<'_>| self.take_log_offer(offer);
        let (batch, handed) = dispatch(
            node.as_deref(),
            &link.calls,
            link.peer.id,
            chunk,
            spans,
            take_offer,
        );
        self.groups_handed |= handed;
        match batch {
            Some(batch) => Polled::Batch(batch, ack_now),
            // Replies, and publishes now in the inbox's channel (in their order).
            None => Polled::Answered,
        }
    }

    /// Copies what the ring holds into `buf` (one copy out of shared memory, checked for
    /// lengths and kinds in our own memory only). Returns what to report if there is nothing
    /// to parse: the ring empty, read out after its close, or broken.
    fn fill(&mut self) -> Option<Polled> {
        match self
            .consumer
            .read_into(RING_READ_RECORDS_MAX, &mut self.buf)
        {
            Err(e) => Some(self.fail(e.to_string())),
            // Closed (Acquire: everything published before the close is seen) and read out.
            Ok(0) if self.consumer.is_closed() && !self.consumer.is_readable() => {
                if !self.buf.is_empty() {
                    return Some(self.fail(format!(
                        "closed in the middle of a frame ({} bytes of it read)",
                        self.buf.len()
                    )));
                }
                self.link.mark_drained();
                Some(Polled::Gone)
            }
            Ok(0) if self.buf.is_empty() => Some(Polled::Empty),
            Ok(_) => None,
        }
    }

    /// Walks the whole frames at the head of `buf`: how many bytes they take and the messages
    /// they carry, or the link failed on a bad frame.
    fn whole_frames(&mut self) -> Result<(usize, Vec<Span>), Polled> {
        // Room for as many messages as small ones would make (no growth on the common path),
        // bounded for large ones.
        let mut spans =
            Vec::with_capacity((self.buf.len() / 32).clamp(16, RING_SPANS_PREALLOC_MAX));
        let mut pos = 0;
        loop {
            let (kind, frame_len) = match self.dec.peek(&self.buf[pos..]) {
                Ok(Some(f)) => f,
                Ok(None) => return Ok((pos, spans)),
                Err(e) => {
                    // (The link counts the protocol error when it closes.)
                    if let DecodeError::BodyTooLong { .. } = e {
                        bump(&self.link.counters.oversize_frames);
                    }
                    return Err(self.fail(e.to_string()));
                }
            };
            let body = &self.buf[pos + HEADER_LEN..pos + frame_len];
            if let Err(what) = message_spans(kind, body, pos + HEADER_LEN, &mut spans) {
                return Err(self.fail(format!(
                    "{what} (frame at ring stream offset {})",
                    self.dec.offset() - frame_len as u64
                )));
            }
            pos += frame_len;
        }
    }

    /// Counts the messages of a read of `read_len` bytes as delivered and acknowledges them:
    /// at once past `RING_ACK_EVERY_BYTES` (the sender's queue must not fill with delivered
    /// messages; returns true), otherwise a little later from the link task. None if the
    /// link this ring belongs to is gone.
    fn count_and_ack(&mut self, read_len: usize, spans: &[Span]) -> Option<bool> {
        let n = spans.len() as u64;
        let next = self.link.peer.delivered_on(self.link.link_id, n)?;
        let counters = &self.link.counters;
        counters.msgs_in.fetch_add(n, Relaxed);
        let bytes: u64 = spans.iter().map(|s| u64::from(s.len())).sum();
        counters.bytes_in.fetch_add(bytes, Relaxed);
        let peer = &self.link.peer;
        peer.traffic.msgs_in.fetch_add(n, Relaxed);
        peer.traffic.bytes_in.fetch_add(bytes, Relaxed);
        self.bytes_since_ack += read_len;
        let ack_now = self.bytes_since_ack >= RING_ACK_EVERY_BYTES;
        if ack_now {
            self.bytes_since_ack = 0;
            self.link.peer.push_control(ack_frame(next));
        } else {
            self.link.ack_soon();
        }
        Some(ack_now)
    }
}

impl InboundRing {
    /// The inbox is about to sleep: `waker` is called once the ring has something to read (or
    /// was closed). Starts the ring's waiter thread the first time.
    pub(crate) fn arm<W: WakeInbox>(&mut self, waker: &W) {
        if self.arm.is_none() {
            // One arming at most waits: an inbox woken often by other peers while this ring
            // stays idle arms it again and again, and those must not pile up.
            let (tx, rx) = std_mpsc::sync_channel(1);
            let (waiter, watches) = {
                let r = lock(&self.reader);
                (r.consumer.waiter(), r.watches.clone())
            };
            let waker = waker.clone();
            let spawned = std::thread::Builder::new()
                .name("busway-shm-wait".into())
                .spawn(move || wait_for_records(waiter, watches, rx, waker));
            if let Err(e) = spawned {
                // Without it the inbox would not wake for this ring: end the link instead.
                lock(&self.reader)
                    .link
                    .raise_fault(format!("cannot start a shared-memory waiter thread: {e}"));
                return;
            }
            self.arm = Some(tx);
        }
        if let Some(tx) = &self.arm {
            // Full: the waiter is armed already.
            let _ = tx.try_send(());
        }
    }

    /// With no inbox to read it (the application dropped it), reads and discards on a thread
    /// of its own until the link ends, as the socket path discards.
    pub(crate) fn discard_on_a_thread(mut self) {
        // The inbox's waiter thread, if any, ends (its arming channel closes).
        self.arm = None;
        let waiter = lock(&self.reader).consumer.waiter();
        let _ = std::thread::Builder::new()
            .name("busway-shm-discard".into())
            .spawn(move || loop {
                match self.poll() {
                    Polled::Batch(..) | Polled::Answered => {}
                    Polled::Empty => {
                        waiter.wait_readable(Duration::from_millis(RING_WAIT_POLL_MS));
                    }
                    Polled::Gone => return,
                }
            });
    }
}

impl Drop for RingReader {
    fn drop(&mut self) {
        // Nobody reads any more: the peer's writer must not wait for room forever.
        self.consumer.close();
    }
}

/// The waiter thread: each time it is armed, sleeps until the ring is readable or closed, then
/// wakes the inbox. Ends when its ring is dropped.
fn wait_for_records<W: WakeInbox>(
    waiter: ReadWaiter,
    watches: LogWatches,
    arm: std_mpsc::Receiver<()>,
    waker: W,
) {
    // The logs' writer wakes this ring's reader after each publish (`Ring::wake_reader`).
    let logs_readable = || {
        watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|w| w.is_readable())
    };
    while arm.recv().is_ok() {
        loop {
            match waiter.wait_readable_or(Duration::from_millis(RING_WAIT_POLL_MS), logs_readable) {
                Wait::Ready | Wait::Closed => {
                    if !waker.wake() {
                        return;
                    }
                    break;
                }
                Wait::TimedOut => {
                    if let Err(std_mpsc::TryRecvError::Disconnected) = arm.try_recv() {
                        return;
                    }
                }
            }
        }
    }
}
