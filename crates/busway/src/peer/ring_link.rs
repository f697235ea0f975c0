//! What a link and the application's reader of the peer's ring share (see `ring_rx`): whether
//! the link still stands, why the ring could not be read, acknowledgements due, and whether
//! the ring was read out. Knows nothing of the node: the reader needs no more than this.

use crate::limits::{RING_ACK_DELAY_MS, RING_DRAIN_POLL_MS};
use crate::node::stats::Counters;
use crate::peer::Peer;
use crate::rpc::call_table::CallTable;
use busway_core::body::Span;
use busway_core::control::ack_frame;
use busway_core::group::GroupLog;
use busway_core::BusId;
use busway_shm::ring::ReadWaiter;
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One link's side of the peer's ring, shared by the link task and the application's reader.
/// What a ring's reader hands the group messages it reads to: the node (see `groups`).
pub(crate) trait GroupMessages: Send + Sync {
    /// Acts on a read's group messages (`spans`, each of a kind that `BodyKind::is_group`;
    /// from the direct peer `from`, in `chunk`); the publishes for this node go to its inbox,
    /// in order. True if any went there.
    fn read(&self, from: BusId, chunk: &Bytes, spans: &[Span]) -> bool;

    /// The direct peer `from` answered an offer of this node's log of a group
    /// (`GroupLog::Answer`; see `group::log_out`).
    fn log_answered(&self, from: BusId, answer: GroupLog<'_>);

    /// Whether the inbox holds too many publishes not taken, or a publish waits for room
    /// toward a peer other than `ring_peer`: leave the ring unread.
    fn backlogged(&self, ring_peer: BusId) -> bool;

    /// Opens the log of a group the direct peer `from` offered on its ring (see
    /// `group::log_in`), or says why not.
    fn open_log(
        &self,
        from: BusId,
        offer: &busway_core::group::LogOffer<'_>,
    ) -> Result<crate::group::log_in::AttachedLog, String>;

    /// Whether this node still wants the group's publishes (else its log is let go).
    fn wants_group(&self, name: &str) -> bool;

    /// Takes the records read from `from`'s log of `group` (publish bodies at `spans` of
    /// `chunk`); true if publishes went to the inbox. An error says what in them is false.
    fn sort_out_log(
        &self,
        from: BusId,
        group: &busway_core::group::state::GroupName,
        chunk: &Bytes,
        spans: &[(u32, u32)],
    ) -> Result<bool, String>;
}

pub(crate) struct RingLink {
    pub(crate) peer: Arc<Peer>,
    pub(crate) link_id: u64,
    pub(crate) counters: Arc<Counters>,
    /// The node's calls: replies read from the ring end them.
    pub(crate) calls: Arc<CallTable>,
    /// Largest frame body the ring may hold, in bytes (the node's limit).
    pub(crate) frame_body_max: usize,
    /// The node, for the group messages read from the ring (interest to record, publishes to
    /// pass on). Weak: the node owns its links, not the other way round.
    pub(crate) node: Weak<dyn GroupMessages>,
    /// The link ended: its ring is not read any more (what was not acknowledged is written
    /// again on the next link).
    gone: AtomicBool,
    /// Why the peer's ring cannot be read; the link ends with it.
    fault: Mutex<Option<String>>,
    fault_raised: Notify,
    /// Messages read from the ring wait for an acknowledgement, which the link task sends
    /// `RING_ACK_DELAY_MS` later (one per delay, not one per read).
    ack_due: AtomicBool,
    ack_wake: Notify,
    /// The peer's ring went to the application's inbox: whether it holds unread records.
    handed_over: Mutex<Option<ReadWaiter>>,
    /// Held by the reader from a read of the ring to the count of what it read.
    reading: Mutex<()>,
    /// The peer closed its ring and everything in it was read.
    drained: AtomicBool,
    drained_wake: Notify,
}

impl RingLink {
    pub(crate) fn new(
        peer: Arc<Peer>,
        link_id: u64,
        counters: Arc<Counters>,
        calls: Arc<CallTable>,
        frame_body_max: usize,
        node: Weak<dyn GroupMessages>,
    ) -> Self {
        Self {
            peer,
            link_id,
            counters,
            calls,
            frame_body_max,
            node,
            gone: AtomicBool::new(false),
            fault: Mutex::default(),
            fault_raised: Notify::new(),
            ack_due: AtomicBool::new(false),
            ack_wake: Notify::new(),
            handed_over: Mutex::default(),
            reading: Mutex::default(),
            drained: AtomicBool::new(false),
            drained_wake: Notify::new(),
        }
    }

    /// The peer's ring goes to the application now; `waiter` tells whether it holds unread
    /// records.
    pub(crate) fn hand_over(&self, waiter: ReadWaiter) {
        *lock(&self.handed_over) = Some(waiter);
    }

    /// The link ended: the reader drops the ring at its next look.
    pub(crate) fn set_gone(&self) {
        self.gone.store(true, Relaxed);
    }

    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(Relaxed)
    }

    /// The application could not read the ring: the link ends with `why`.
    pub(crate) fn raise_fault(&self, why: String) {
        lock(&self.fault).get_or_insert(why);
        self.fault_raised.notify_one();
    }

    /// Waits until the reader raises a fault; returns it.
    pub(crate) async fn fault(&self) -> String {
        loop {
            if let Some(why) = lock(&self.fault).clone() {
                return why;
            }
            self.fault_raised.notified().await;
        }
    }

    /// Messages were read from the ring: an acknowledgement is due soon.
    pub(crate) fn ack_soon(&self) {
        if !self.ack_due.swap(true, Relaxed) {
            self.ack_wake.notify_one();
        }
    }

    /// Sends the acknowledgements that `ack_soon` asked for, `RING_ACK_DELAY_MS` after the
    /// first read since the last one. Never returns.
    pub(crate) async fn ack_loop(&self) -> std::convert::Infallible {
        loop {
            self.ack_wake.notified().await;
            tokio::time::sleep(Duration::from_millis(RING_ACK_DELAY_MS)).await;
            self.ack_due.store(false, Relaxed);
            self.peer
                .push_control(ack_frame(self.peer.inbound_expected()));
        }
    }

    /// Held by the application's reader from a read of the ring to the count of what it read.
    pub(crate) fn reading(&self) -> std::sync::MutexGuard<'_, ()> {
        lock(&self.reading)
    }

    /// The reader read everything up to the peer's close of the ring.
    pub(crate) fn mark_drained(&self) {
        self.drained.store(true, Relaxed);
        self.drained_wake.notify_one();
    }

    /// Waits until the application read everything the peer put in its ring (the peer wrote
    /// it all before its CLOSE); at once if there is no ring or nothing unread.
    pub(crate) async fn wait_drained(&self) {
        loop {
            let unread = {
                // No read in progress: whatever was read is counted.
                let _reading = self.reading();
                lock(&self.handed_over)
                    .as_ref()
                    .is_some_and(ReadWaiter::is_readable)
            };
            if !unread || self.drained.load(Relaxed) {
                return;
            }
            // The application may read the last record and not look again: poll as well.
            let _ = tokio::time::timeout(
                Duration::from_millis(RING_DRAIN_POLL_MS),
                self.drained_wake.notified(),
            )
            .await;
        }
    }
}
