//! The peer part: the node's direct neighbors and what it keeps for each.
//!
//! **Owns**: the table of peers (`table`: one [`Peer`] per bus id, which is the upstream, the
//! wake-up on a change), each peer's outbox and its ring writer (this module, `ring`,
//! `ring_tx`), the rings' negotiation and the state a link shares with the reader of its
//! peer's ring (`shm_link`, `ring_link`), that reader (`ring_rx`), and the peers whose rings
//! hold sends not yet published (`deferred`).
//!
//! **Runs on**: the application's threads (pushes, waits for room, the ring reader inside the
//! inbox) and the I/O loop of the one link attached to a peer at a time (its writer takes,
//! its reader acknowledges). Every peer has its own lock; none is held across peers.
//!
//! **May call**: the inbox's sender and the node's counters; the ring reader hands what it
//! reads to the group and rpc parts' sorting, as a socket's reader does.
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

pub(crate) mod deferred;
pub(crate) mod ring_link;
pub(crate) mod ring_rx;
pub(crate) mod ring_tx;
pub(crate) mod shm_link;
pub(crate) mod table;

use crate::limits::{COPY_PAYLOAD_BYTES_MAX, RING_DEFER_BYTES_MAX};
use crate::peer::ring_tx::{Flush, RingWriter};
use busway_core::frame::FrameKind;
use busway_core::group::forwards::CAUGHT_UP_ROOM_BYTES;
use busway_core::handshake::{caps, Established, Hello};
use busway_core::outbox::{AckError, Outbox};
use busway_core::relay::Neighbor;
use busway_core::BusId;
use bytes::Bytes;
use std::ops::Range;
use std::sync::atomic::AtomicU64;
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
    /// The link attached now, if any.
    link: Option<u64>,
    /// `Node::disconnect` asked to cut this link (see `request_cut`), or a lie it carried
    /// closes it (see `refuse_link`); 0: none (link ids start at 1).
    cut_link: u64,
    /// Why the link is cut, when a lie it carried is the reason.
    cut_reason: Option<String>,
    /// Bumped at every detach, so a deadline set at one detach does not fire after a later one.
    detach_epoch: u64,
    /// Down past its deadline since this time (the node's clock, ms), if it is.
    dead_since_ms: Option<u64>,
    /// The node is shutting down: no more messages.
    closing: bool,
    /// The attached link is closing: its writer drains and sends CLOSE; messages still queue.
    link_closing: bool,
    writer_idle: bool,
    senders_waiting: bool,
    /// Messages wait (control frames still flow) until what was sent to this peer through
    /// relays before its link came up is acknowledged: order holds across the switch.
    held: bool,
    /// The attached link's messages go through its shared-memory ring (`Peer::ring`).
    ring_mode: bool,
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
    /// Messages and payload bytes received from it directly (not relayed through it), ever.
    pub(crate) msgs_in: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    /// Links attached to it, ever (the first, then each reconnect).
    pub(crate) links: AtomicU64,
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
                link: None,
                cut_link: 0,
                cut_reason: None,
                detach_epoch: 0,
                dead_since_ms: None,
                closing: false,
                link_closing: false,
                writer_idle: false,
                senders_waiting: false,
                held: false,
                ring_mode: false,
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
            msgs_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            links: AtomicU64::new(0),
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
        } else if st.dead_since_ms.is_some() {
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
            up: st.link.is_some(),
            // A downstream given up (down past its deadline) no longer claims its subtree:
            // its ids may be reached another way.
            serves: st
                .intro
                .downstream_of_you
                .filter(|_| st.dead_since_ms.is_none()),
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
        self.lock().dead_since_ms.is_some()
    }

    /// Queues a ROUTED frame, given as the buffers it is written from, for the attached link
    /// (relayed, or this node's own end-to-end traffic), within `limit` bytes of such frames if
    /// given. False if it was not queued (no link, or the limit): the frame is dropped, and
    /// end-to-end resending covers it.
    pub(crate) fn push_forward(&self, parts: Vec<Bytes>, limit: Option<usize>) -> bool {
        let len: usize = parts.iter().map(Bytes::len).sum();
        let mut st = self.lock();
        if st.link.is_none() || limit.is_some_and(|l| st.outbox.control_bytes() + len > l) {
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
                if st.link.is_none() {
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
        if !st.ring_mode || st.held {
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
            if st.closing || st.link_closing {
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

    /// Queues one message sent on its own (`Node::send`); returns its sequence number, and
    /// whether the peer must go on the node's `Deferred` list. Over a ring, a small message
    /// that follows another single send with no look at the inbox in between (`looks`, the
    /// inbox's count) is not published at once while less than `RING_DEFER_BYTES_MAX` wait:
    /// the sender's next look at its inbox, a flush or the link's writer (woken now) publishes
    /// the burst with one publication. The first send after a look (a lone request or
    /// answer) is published at once; elsewhere a message is written or handed to the writer
    /// at once.
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
            && st.ring_mode
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
        if st.link.is_some() {
            st.outbox.push_control_frame(frame);
            self.wake_writer(st);
        }
    }

    /// Moves everything unwritten into `batch` (for the writer of link `link`).
    pub(crate) fn take(&self, batch: &mut Vec<Bytes>) -> Take {
        let mut st = self.lock();
        if st.held {
            if !st.outbox.has_control() {
                if st.closing || st.link_closing {
                    return Take::Drained;
                }
                st.writer_idle = true;
                return Take::Idle;
            }
            st.outbox.take_control(batch);
            drop(st);
            self.forward_room.notify_waiters();
            return Take::Data;
        }
        if !st.outbox.has_unwritten() {
            if st.closing || st.link_closing {
                return Take::Drained;
            }
            st.writer_idle = true;
            return Take::Idle;
        }
        let had_control = st.outbox.control_bytes() > 0;
        st.outbox.take_unwritten(batch);
        drop(st);
        if had_control {
            self.forward_room.notify_waiters();
        }
        Take::Data
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
        if st.link != Some(link) {
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
                if st.closing || st.dead_since_ms.is_some() || st.outbox.has_room(payload_len) {
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

    /// Attaches the authenticated link `link`: everything the peer lacks becomes unwritten again.
    /// Errors if a link is attached already (the text names it) or the handshake's numbers no
    /// longer hold. Returns how many messages written on an earlier link go out again.
    pub(crate) fn attach(&self, link: u64, est: &Established, addr: &str) -> Result<u64, String> {
        let mut st = self.lock();
        if st.link.is_some() {
            return Err(format!(
                "bus id {} is already connected (via {})",
                self.id, st.addr
            ));
        }
        if est.own_auth.next_send_seq != st.outbox.acked()
            || est.own_auth.next_expected_seq != st.inbound_expected
        {
            return Err("the peer's state changed during the handshake; retry".into());
        }
        let written_before = st.outbox.written_end();
        let first = st
            .outbox
            .resume(est.peer_auth.next_expected_seq)
            .map_err(|e| format!("cannot resume: {e}"))?;
        let resent = written_before.saturating_sub(first);
        // Counted here, past the checks: a refused attach is no reconnect.
        self.links
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The peer resumes where it says; past what we expect only if it gave up on messages.
        st.inbound_expected = st.inbound_expected.max(est.peer_auth.next_send_seq);
        st.intro = PeerIntro::from(&est.peer);
        st.addr = addr.to_owned();
        st.link = Some(link);
        st.dead_since_ms = None;
        st.link_closing = false;
        st.writer_idle = false;
        // The peer's AUTH acknowledged messages (those it got before the last link dropped,
        // and whose ACK was lost with it): senders waiting for that room must hear of it, as
        // no ACK frame will come for them.
        let wake = std::mem::take(&mut st.senders_waiting);
        drop(st);
        if wake {
            self.room.notify_waiters();
        }
        Ok(resent)
    }

    /// Detaches link `link` if it is the one attached; returns the detach epoch (for the
    /// deadline) and the messages still unacknowledged.
    pub(crate) fn detach(&self, link: u64) -> Option<(u64, u64)> {
        let mut st = self.lock();
        if st.link != Some(link) {
            return None;
        }
        st.link = None;
        st.detach_epoch += 1;
        Some((st.detach_epoch, st.outbox.unacked()))
    }

    /// If no link came back since detach `epoch`, gives up on every unacknowledged message:
    /// returns their numbers. Later sends fail at once until a link is up again.
    pub(crate) fn expire(&self, epoch: u64, now_ms: u64) -> Option<Range<u64>> {
        let mut st = self.lock();
        if st.link.is_some() || st.detach_epoch != epoch {
            return None;
        }
        st.dead_since_ms = Some(now_ms);
        let range = st.outbox.fail_all();
        drop(st);
        self.room.notify_waiters();
        Some(range)
    }

    /// Whether the peer has been dead (down past its deadline, nothing held) for `idle_ms` or
    /// more: the node may forget it. A link of the same incarnation coming back later starts
    /// from the numbers both sides state in the handshake; by then the peer has settled what
    /// it held for this node (see `NodeConfig::forget_after_ms`).
    pub(crate) fn dead_for(&self, now_ms: u64, idle_ms: u64) -> bool {
        let st = self.lock();
        st.link.is_none()
            && st
                .dead_since_ms
                .is_some_and(|t| now_ms.saturating_sub(t) >= idle_ms)
    }

    /// Gives up on every message (the peer came back as a new incarnation).
    pub(crate) fn fail_all(&self) -> Range<u64> {
        let range = self.lock().outbox.fail_all();
        self.room.notify_waiters();
        range
    }

    pub(crate) fn is_up(&self) -> bool {
        self.lock().link.is_some()
    }

    /// Asks the attached link to drop at once; false if none is attached. The request names
    /// the link and leaves a permit (`notify_one`): a link task that was not waiting yet (just
    /// up) still sees it, and a later link ignores a request meant for an earlier one.
    pub(crate) fn request_cut(&self) -> bool {
        self.cut_attached(None)
    }

    /// Closes the attached link for a lie it carried (`why` names it): the link ends as for a
    /// protocol error. False if no link is attached.
    pub(crate) fn refuse_link(&self, why: String) -> bool {
        self.cut_attached(Some(why))
    }

    fn cut_attached(&self, why: Option<String>) -> bool {
        let mut st = self.lock();
        let Some(link) = st.link else {
            return false;
        };
        // The first reason for this link stays: later lies on it are the same liar's.
        if st.cut_link != link || st.cut_reason.is_none() {
            st.cut_reason = why;
        }
        st.cut_link = link;
        drop(st);
        self.cut.notify_one();
        true
    }

    /// Completes once a cut of link `link` was asked for (see `request_cut`): the lie that
    /// closes it, if that is why.
    pub(crate) async fn cut_requested(&self, link: u64) -> Option<String> {
        loop {
            self.cut.notified().await;
            let mut st = self.lock();
            if st.cut_link == link {
                st.cut_link = 0;
                return st.cut_reason.take();
            }
        }
    }

    /// No more messages; the writer drains what is queued and closes the link.
    pub(crate) fn close(&self) {
        let mut st = self.lock();
        st.closing = true;
        drop(st);
        self.writer_wake.notify_one();
        self.room.notify_waiters();
    }

    /// Whether this node closes the link because it shuts down (see `close`).
    pub(crate) fn is_closing(&self) -> bool {
        self.lock().closing
    }

    /// Whether the attached link is closing because its peer closed (see `close_link`): its
    /// reader will not free room in a ring any more. (Our own node closing is not that: the
    /// peer still reads, and what is queued goes out within the linger time.)
    pub(crate) fn is_closed_by_peer(&self) -> bool {
        self.lock().link_closing
    }

    /// The attached link's writer drains what is queued, sends CLOSE and finishes.
    pub(crate) fn close_link(&self) {
        self.lock().link_closing = true;
        self.writer_wake.notify_one();
    }

    pub(crate) fn snapshot(&self) -> PeerSnapshot {
        let st = self.lock();
        PeerSnapshot {
            intro: st.intro.clone(),
            addr: st.addr.clone(),
            up: st.link.is_some(),
            unacked: st.outbox.unacked(),
            bytes: st.outbox.bytes(),
            msgs_total: st.msgs_total,
            bytes_sent: st.outbox.bytes_pushed(),
        }
    }
}

mod ring;
#[cfg(test)]
mod tests;
