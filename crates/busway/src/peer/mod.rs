//! The peer part: the node's direct neighbors and what it keeps for each.
//!
//! **Owns**: the table of peers (`table`: one [`Peer`] per bus id, which is the upstream, the
//! wake-up on a change), each peer's outbox and its ring writer (this module, `ring`,
//! `ring_tx`), the rings' negotiation and the state a link shares with the reader of its
//! peer's ring (`shm_link`, `ring_link`), that reader (`ring_rx`), and the peers whose rings
//! hold sends not yet published (`deferred`); a peer's life as its links come and go
//! (`lifecycle`).
//!
//! **Runs on**: the application's threads (pushes, waits for room, the ring reader inside the
//! inbox) and the I/O loop of the one link attached to a peer at a time (its writer takes,
//! its reader acknowledges). Every peer has its own lock; none is held across peers.
//!
//! **May call**: the inbox's sender and the node's counters; the ring reader hands what it
//! reads to the group and rpc parts' sorting, as a socket's reader does. `lifecycle` tells
//! the route, group and rpc parts of a peer that came, went or was given up on.
//!
//! # One peer
//!
//! What a node keeps about one peer: its outbox (messages queued, written and not yet
//! acknowledged), where its incoming numbering stands, and the link it is reached by, if any.
//!
//! A `Peer` outlives its links: when a link drops, the outbox keeps every unacknowledged
//! message, and the next link to the same incarnation writes again exactly what the peer lacks.
//! Shared by the application (any thread: `push_*`, `wait_for_room`) and the one link attached
//! at a time (its writer: `take`; its reader: `delivered`, `ack`).

mod carrier;
pub(crate) mod deferred;
pub(crate) mod lifecycle;
pub(crate) mod ring_link;
pub(crate) mod ring_rx;
pub(crate) mod ring_tx;
pub(crate) mod shm_link;
pub(crate) mod table;

use crate::peer::ring_tx::{Flush, RingWriter};
use busway_core::frame::FrameKind;
use busway_core::group::forwards::CAUGHT_UP_ROOM_BYTES;
use busway_core::handshake::{caps, Hello};
use busway_core::outbox::{AckError, Outbox};
use busway_core::relay::Neighbor;
use busway_core::BusId;
use bytes::Bytes;
pub(crate) use carrier::{Carrier, Traffic};
use slot::Slot;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicU8};
use std::sync::{Mutex, MutexGuard};
use tokio::sync::Notify;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PushError {
    /// The outbox holds its byte limit; nothing was queued.
    Full,
    /// The node is shutting down; nothing was queued.
    Closed,
    /// The destination is now reached another way (a direct link came up): route again.
    Rerouted,
    /// The peer stayed down past its deadline; nothing was queued.
    Dead,
}

/// What a link's writer finds when it looks at the outbox.
pub(crate) enum Take {
    /// Frames were moved into the caller's batch.
    Data,
    /// Only an ACK was moved into the caller's batch (on a link without a ring), of messages
    /// the application was waiting for (`Peer::push_ack`): no message, no other control frame
    /// (relayed frames, PINGs and PONGs go at once), no close. The writer counts as idle
    /// again: the next push wakes it (`writer_wake`).
    Control,
    /// Nothing to write; wait on [`Peer::writer_wake`].
    Idle,
    /// The node is shutting down and everything was written: send CLOSE and finish.
    Drained,
}

/// What a node keeps of a peer's HELLO for the peer's life: what routing, hints and status
/// read (the nonce, clock, versions and host id served the handshake only, and an idle
/// connection's memory is mostly what is kept per peer and link).
#[derive(Clone, Debug)]
pub(crate) struct PeerIntro {
    pub(crate) incarnation: u64,
    pub(crate) listen_addrs: Vec<String>,
    pub(crate) capabilities: u64,
    pub(crate) downstream_of_you: Option<(BusId, BusId)>,
}

impl From<&Hello> for PeerIntro {
    fn from(h: &Hello) -> Self {
        Self {
            incarnation: h.incarnation,
            listen_addrs: h.listen_addrs.clone(),
            capabilities: h.capabilities,
            downstream_of_you: h.downstream_of_you,
        }
    }
}

pub(crate) struct PeerState {
    pub(crate) intro: PeerIntro,
    pub(crate) addr: String,
    outbox: Outbox,
    /// The number of the next message expected from the peer.
    inbound_expected: u64,
    /// Where its link stands (`slot`: every transition is there).
    slot: Slot,
    /// Links detached from it, ever: the epoch of the last detach (see `Slot::Down`).
    detaches: u64,
    /// This node is shutting down (`Peer::close`): no more messages; the link, while one is
    /// attached, drains what is queued and closes. The node's state, kept under the peer's
    /// lock for the checks that take it.
    closing: bool,
    writer_idle: bool,
    /// The ACK queued last is of messages the application was waiting for in its inbox
    /// (`push_ack`): it may answer at once, so the writer may hold the ACK for the answer.
    ack_answerable: bool,
    senders_waiting: bool,
    /// Messages wait (control frames still flow) until what was sent to this peer through
    /// relays before its link came up is acknowledged: order holds across the switch.
    held: bool,
    /// The peer is on the node's list of peers whose single sends may wait in the outbox for
    /// the ring (`Deferred`; see `push_single`); taken off when the list is published.
    deferred: bool,
    /// The inbox's look count at the last single send (see `push_single`).
    single_look: u64,
    msgs_total: u64,
}

pub(crate) struct Peer {
    pub(crate) id: BusId,
    /// Dialed on a relay's hint rather than configured: after its deadline passes, traffic to
    /// it goes back through relays.
    pub(crate) discovered: bool,
    /// The largest frame body the peer stated it accepts. Fixed for the peer's life (one
    /// incarnation, one configuration), so read on every send and forward without a lock.
    frame_body_max: Option<usize>,
    state: Mutex<PeerState>,
    /// The ring the attached link's messages go through, once it switched. Taken before
    /// `state` when both are held.
    ring: Mutex<Option<RingWriter>>,
    /// The writer waits here while idle; `notify_one` keeps a permit, so a push between the
    /// writer's `take` returning `Idle` and its wait is not lost.
    pub(crate) writer_wake: Notify,
    /// Senders waiting for room wait here; woken when acknowledgements free bytes.
    room: Notify,
    /// Relays waiting for room in the queue of ROUTED frames wait here; woken at each take.
    forward_room: Notify,
    /// Wakes the attached link when a cut was asked for (see `request_cut`).
    cut: Notify,
    /// Last measured round trip, in microseconds (0: none yet).
    pub(crate) rtt_us: AtomicU64,
    /// What came from it and what this node passed on as a relay, ever.
    pub(crate) traffic: Traffic,
    /// Links attached to it, ever (the first, then each reconnect).
    pub(crate) links: AtomicU64,
    /// What carries the attached link's data: a `Carrier` as u8 (the link's socket until the
    /// peer's SWITCH to a ring is read).
    carrier: AtomicU8,
    /// Odd while the attached link writes into a ring, even otherwise; moves on at every
    /// start and end of a ring, so that a group log's reader accepted on one ring is known
    /// gone with it (see `Peer::ring_epoch`).
    ring_epoch: AtomicU64,
}

/// A snapshot for `Node::peers`.
pub(crate) struct PeerSnapshot {
    pub(crate) intro: PeerIntro,
    pub(crate) addr: String,
    pub(crate) up: bool,
    pub(crate) unacked: u64,
    pub(crate) bytes: usize,
    pub(crate) msgs_total: u64,
    /// Bytes of frames ever queued for the peer (`Outbox::bytes_pushed`).
    pub(crate) bytes_sent: u64,
}

impl Peer {
    pub(crate) fn new(hello: Hello, addr: String, limit_bytes: usize, discovered: bool) -> Self {
        Self {
            id: hello.bus_id,
            discovered,
            frame_body_max: hello
                .frame_body_max
                .map(|m| usize::try_from(m).unwrap_or(usize::MAX)),
            state: Mutex::new(PeerState {
                intro: PeerIntro::from(&hello),
                addr,
                outbox: Outbox::new(limit_bytes, 0),
                inbound_expected: 0,
                slot: Slot::new(),
                detaches: 0,
                closing: false,
                writer_idle: false,
                ack_answerable: false,
                senders_waiting: false,
                held: false,
                deferred: false,
                single_look: u64::MAX,
                msgs_total: 0,
            }),
            ring: Mutex::new(None),
            writer_wake: Notify::new(),
            room: Notify::new(),
            cut: Notify::new(),
            forward_room: Notify::new(),
            rtt_us: AtomicU64::new(0),
            traffic: Traffic::default(),
            links: AtomicU64::new(0),
            carrier: AtomicU8::new(Carrier::Socket as u8),
            ring_epoch: AtomicU64::new(0),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, PeerState> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_open(st: &PeerState) -> Result<(), PushError> {
        if st.closing {
            Err(PushError::Closed)
        } else if st.slot.dead_since_ms().is_some() {
            Err(PushError::Dead)
        } else {
            Ok(())
        }
    }

    /// What routing needs to know about this peer.
    pub(crate) fn neighbor(&self) -> Neighbor {
        let st = self.lock();
        Neighbor {
            id: self.id,
            up: st.slot.is_up(),
            // A downstream given up (down past its deadline) no longer claims its subtree:
            // its ids may be reached another way.
            serves: st
                .intro
                .downstream_of_you
                .filter(|_| st.slot.dead_since_ms().is_none()),
        }
    }

    /// The largest frame body the peer accepts, if it stated one in its HELLO.
    pub(crate) fn frame_body_max(&self) -> Option<usize> {
        self.frame_body_max
    }

    /// Whether the peer accepts direct links from nodes that learned its address from a relay.
    pub(crate) fn accepts_direct(&self) -> bool {
        let st = self.lock();
        st.intro.capabilities & caps::DIRECT != 0 && !st.intro.listen_addrs.is_empty()
    }

    /// Whether the peer answers GROUP_LOG offers (`caps::GROUP_LOGS`).
    pub(crate) fn answers_group_logs(&self) -> bool {
        self.lock().intro.capabilities & caps::GROUP_LOGS != 0
    }

    /// Whether the peer advertised the capability `cap` (one of `caps`).
    pub(crate) fn has_cap(&self, cap: u64) -> bool {
        self.lock().intro.capabilities & cap != 0
    }

    /// Holds messages back (see `PeerState::held`).
    pub(crate) fn hold(&self) {
        self.lock().held = true;
    }

    /// Lets held messages go.
    pub(crate) fn release(&self) {
        let mut st = self.lock();
        if std::mem::take(&mut st.held) {
            self.wake_writer(st);
        }
    }

    /// Whether the peer stayed down past its deadline (sends to it fail).
    pub(crate) fn is_dead(&self) -> bool {
        self.lock().slot.dead_since_ms().is_some()
    }

    /// Queues a ROUTED frame, given as the buffers it is written from, for the attached link
    /// (relayed, or this node's own end-to-end traffic), within `limit` bytes of such frames if
    /// given. False if it was not queued (no link, or the limit): the frame is dropped, and
    /// end-to-end resending covers it.
    pub(crate) fn push_forward(&self, parts: Vec<Bytes>, limit: Option<usize>) -> bool {
        let len: usize = parts.iter().map(Bytes::len).sum();
        let mut st = self.lock();
        if !st.slot.is_up() || limit.is_some_and(|l| st.outbox.control_bytes() + len > l) {
            return false;
        }
        for p in parts {
            st.outbox.push_control(p);
        }
        self.wake_writer(st);
        true
    }

    /// Like `push_forward` with a limit, waiting up to `wait` for room: a relay slows the link
    /// it reads from rather than drop what it relays. False if there was no room in time.
    pub(crate) async fn push_forward_wait(
        &self,
        parts: Vec<Bytes>,
        limit: usize,
        wait: std::time::Duration,
    ) -> bool {
        let len: usize = parts.iter().map(Bytes::len).sum();
        let mut parts = Some(parts);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.forward_room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                if !st.slot.is_up() {
                    return false;
                }
                if st.outbox.control_bytes() + len <= limit {
                    for p in parts.take().into_iter().flatten() {
                        st.outbox.push_control(p);
                    }
                    self.wake_writer(st);
                    return true;
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return false;
            }
        }
    }

    /// Wakes the writer if it sleeps; call after queueing anything.
    fn wake_writer(&self, mut st: MutexGuard<'_, PeerState>) {
        let wake = std::mem::take(&mut st.writer_idle);
        drop(st);
        if wake {
            self.writer_wake.notify_one();
        }
    }

    /// Messages were queued: on a link that switched to shared memory, the calling thread
    /// writes them into the ring itself unless someone else is writing there (no hand-off to
    /// the writer task on the way out); otherwise the writer is woken.
    fn pushed(&self, st: MutexGuard<'_, PeerState>) {
        if !st.slot.over_ring() || st.held {
            return self.wake_writer(st);
        }
        drop(st);
        if !matches!(self.flush_ring(false), Some(Ok(Flush::Done))) {
            // Busy, full or broken: the writer task carries on (and reports a broken ring).
            self.writer_wake.notify_one();
        }
    }

    /// For the writer of a link whose messages go through a ring: moves the control frames
    /// into `batch`. `Data` also when messages wait (the caller flushes the ring again).
    pub(crate) fn take_control(&self, batch: &mut Vec<Bytes>) -> Take {
        // The ring first (the lock order), held while the queue is looked at: frames an
        // application thread took from the queue and could not fit in the ring wait in the
        // writer's pending list, and count as messages waiting.
        let slot = self.ring_slot();
        let mut st = self.lock();
        let messages_wait = (!st.held && st.outbox.has_unwritten_messages())
            || slot.as_ref().is_some_and(RingWriter::has_pending);
        drop(slot);
        let had_control = st.outbox.take_control(batch) > 0;
        if !had_control && !messages_wait {
            if st.closing || st.slot.closed_by_peer() {
                return Take::Drained;
            }
            st.writer_idle = true;
            return Take::Idle;
        }
        drop(st);
        if had_control {
            self.forward_room.notify_waiters();
        }
        Take::Data
    }

    /// For the writer of a link whose ring is full: moves the control frames (heartbeats,
    /// acknowledgements) into `batch`, so that they go out while messages wait for room.
    /// False if there were none; the writer is then woken by the next one queued.
    pub(crate) fn take_control_only(&self, batch: &mut Vec<Bytes>) -> bool {
        let mut st = self.lock();
        if st.outbox.take_control(batch) == 0 {
            st.writer_idle = true;
            return false;
        }
        drop(st);
        self.forward_room.notify_waiters();
        true
    }

    /// Queues one message framed on its own (a CALL, REPLY, INTEREST or PUBLISH); returns its
    /// sequence number.
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
        let seq = push(&mut st.outbox).ok_or(PushError::Full)?;
        st.msgs_total += 1;
        self.pushed(st);
        Ok(seq)
    }

    /// Queues as many of `payloads` as fit (copied); returns their sequence numbers.
    pub(crate) fn push_copies<P: AsRef<[u8]>>(
        &self,
        payloads: &[P],
    ) -> Result<Range<u64>, PushError> {
        let mut st = self.lock();
        Self::check_open(&st)?;
        let first = st.outbox.next_seq();
        let n = st.outbox.push_copies(payloads);
        st.msgs_total += n as u64;
        if n > 0 {
            self.pushed(st);
        }
        Ok(first..first + n as u64)
    }

    /// Queues a whole control frame for the attached link (dropped if none is attached); a
    /// PING, PONG or ACK takes the place of one still queued.
    pub(crate) fn push_control(&self, frame: Bytes) {
        let mut st = self.lock();
        if st.slot.is_up() {
            st.outbox.push_control_frame(frame);
            self.wake_writer(st);
        }
    }

    /// The peer acknowledged every message below `next_expected`.
    pub(crate) fn ack(&self, next_expected: u64) -> Result<(), AckError> {
        let mut st = self.lock();
        let freed = st.outbox.ack(next_expected)?;
        let wake = freed > 0 && std::mem::take(&mut st.senders_waiting);
        drop(st);
        if wake {
            self.room.notify_waiters();
        }
        Ok(())
    }

    /// `n` messages from the peer were delivered; returns the number expected next.
    pub(crate) fn delivered(&self, n: u64) -> u64 {
        let mut st = self.lock();
        st.inbound_expected += n;
        st.inbound_expected
    }

    /// Like `delivered`, for messages read from link `link`'s ring by the application: `None`
    /// (and nothing counted) if that link is no longer attached, so the messages must not be
    /// delivered (the next link resumes from the number counted so far).
    pub(crate) fn delivered_on(&self, link: u64, n: u64) -> Option<u64> {
        let mut st = self.lock();
        if st.slot.link() != Some(link) {
            return None;
        }
        st.inbound_expected += n;
        Some(st.inbound_expected)
    }

    /// The number of the next message expected from the peer.
    pub(crate) fn inbound_expected(&self) -> u64 {
        self.lock().inbound_expected
    }

    /// Whether a link that lagged (skipped for a group past its wait) is caught up: its
    /// queue has room for a whole batch again (`CAUGHT_UP_ROOM_BYTES`), not only for a small
    /// frame now and then. The one rule for a relay's forwards and a publisher's publishes.
    pub(crate) fn has_caught_up(&self) -> bool {
        self.lock().outbox.has_room(CAUGHT_UP_ROOM_BYTES)
    }

    /// Waits until a message of `payload_len` bytes would fit, or the peer cannot take more.
    pub(crate) async fn wait_for_room(&self, payload_len: usize) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                if st.closing
                    || st.slot.dead_since_ms().is_some()
                    || st.outbox.has_room(payload_len)
                {
                    return;
                }
                st.senders_waiting = true;
            }
            notified.await;
        }
    }

    /// Messages queued for the peer and not yet acknowledged (nor given up).
    pub(crate) fn unacked(&self) -> u64 {
        self.lock().outbox.unacked()
    }

    /// Waits until every message queued for the peer is acknowledged or given up. Woken by
    /// what frees room (acknowledgements, a resume, giving up), as a sender waiting for room
    /// is: no polling.
    pub(crate) async fn wait_all_acked(&self) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                if st.outbox.unacked() == 0 {
                    return;
                }
                st.senders_waiting = true;
            }
            notified.await;
        }
    }

    /// (messages the peer acknowledged: every one below this number, the number of the next
    /// message queued).
    pub(crate) fn sent_point(&self) -> (u64, u64) {
        let st = self.lock();
        (st.outbox.acked(), st.outbox.next_seq())
    }

    /// (next_send_seq, next_expected_seq) to announce in AUTH to this incarnation.
    pub(crate) fn resume_point(&self) -> (u64, u64) {
        let st = self.lock();
        (st.outbox.acked(), st.inbound_expected)
    }

    pub(crate) fn incarnation(&self) -> u64 {
        self.lock().intro.incarnation
    }
}

mod attached;
mod ring;
pub(crate) mod slot;
mod take;
#[cfg(test)]
mod tests;
