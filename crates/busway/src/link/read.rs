//! A link's read side: feeds the link's state machine what the socket gives, acts on what it
//! reports, and hands the messages of each read to the inbox as one batch cut out of the read.

use super::machine::{down_reason, lock};
use crate::group::relay;
use crate::group::{host, reads};
use crate::limits::{
    IDLE_READ_BYTES, READ_CHUNK_FIRST_BYTES, READ_CHUNK_MAX_BYTES, READ_CHUNK_MIN_BYTES,
};
use crate::node::dispatch::dispatch;
use crate::node::event::DownReason;
use crate::node::message::MessageBatch;
use crate::node::stats::bump;
use crate::peer::ring_rx::InboundRing;
use crate::peer::shm_link::ShmLink;
use crate::peer::Peer;
use crate::route;
use crate::route::inner_spans;
use crate::route::registrations;
use crate::shared::Shared;
use busway_core::body::Span;
use busway_core::control::{ack_frame, Close};
use busway_core::group::LogOffer;
use busway_core::link::{Link, LinkError, LinkEvent, Spans};
use busway_core::relay::Sources;
use busway_core::routed::{RoutedHeader, RoutedType};
use busway_core::BusId;
use bytes::BytesMut;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt};

/// A relayed frame's inner part is passed on as a slice of the read it came in when it is at
/// least this fraction (1/N) of the read; smaller parts are copied (see `read_loop`).
const FORWARD_SHARE_MIN_FRACTION: usize = 8;

/// Relayed messages from one source found in one read, to deliver once the read is cut.
struct RoutedIn {
    src: BusId,
    incarnation: u64,
    /// The number expected from `src` once these are delivered.
    next: u64,
    spans: Vec<Span>,
}

/// What ended a link's read side.
pub(super) enum ReadEnd {
    Eof,
    Close(Close),
}

/// What one read asks of the link besides delivering its direct messages.
#[derive(Default)]
struct ReadWork {
    routed: Vec<RoutedIn>,
    forwards: Vec<(RoutedHeader, std::ops::Range<usize>)>,
    switch_seen: bool,
    end: Option<Result<ReadEnd, DownReason>>,
    /// A frame of this read was refused after the machine took it (see `read_loop`).
    refused_mid_read: bool,
}

/// What acting on an event needs of the link.
struct Parts<'a> {
    shared: &'a Shared,
    peer: &'a Peer,
    sources: Sources,
    machine: &'a Mutex<Link>,
    shm: Option<&'a Arc<ShmLink>>,
}

/// Acts on one event of the machine (the read's buffer is `buf`).
fn act_on(parts: &Parts<'_>, buf: &[u8], event: LinkEvent, work: &mut ReadWork) {
    let Parts {
        shared,
        peer,
        ref sources,
        machine,
        shm,
    } = *parts;
    match event {
        LinkEvent::Acked(next) => {
            if let Err(e) = peer.ack(next) {
                work.refused_mid_read = true;
                let at = lock(machine).offset();
                lock(machine).fail(LinkError::Protocol(format!(
                    "{e} (ACK before stream offset {at})"
                )));
            }
        }
        LinkEvent::Rtt(us) => peer.rtt_us.store(us, Relaxed),
        LinkEvent::Register(op) => registrations::register_received(shared, peer, op),
        LinkEvent::Routed(body) => {
            if let Err(what) = routed_in(shared, sources, buf, body, work) {
                work.refused_mid_read = true;
                let at = lock(machine).offset();
                lock(machine).fail(LinkError::Protocol(format!(
                    "{what} (ROUTED frame before stream offset {at})"
                )));
            }
        }
        LinkEvent::OfferRing => match shm.map(|s| s.offer()) {
            Some(Ok(o)) => lock(machine).offer_ring(o.pid, o.fd, o.inode, o.capacity, o.token),
            Some(Err(why)) => {
                tracing::warn!(%why, "no shared-memory ring; staying on the socket");
                lock(machine).ring_unavailable(&why);
            }
            None => lock(machine).ring_unavailable("no ring on this link"),
        },
        LinkEvent::OpenRing {
            pid,
            fd,
            inode,
            capacity,
            token,
        } => {
            let opened = shm.map_or(Err("no ring on this link".into()), |s| {
                s.open_offered(pid, fd, inode, capacity, token)
            });
            lock(machine).ring_opened(opened);
        }
        LinkEvent::RingAccepted => {
            if let Some(shm) = shm {
                shm.accepted();
            }
            // The writer switches at its next turn.
            peer.writer_wake.notify_one();
        }
        LinkEvent::RingRefused(why) => {
            if let Some(shm) = shm {
                shm.refused(&why);
            }
        }
        LinkEvent::SwitchIn => {
            if let Some(shm) = shm {
                shm.count_switch();
            }
            work.switch_seen = true;
        }
        LinkEvent::PeerClosed(c) => work.end = Some(Ok(ReadEnd::Close(c))),
        LinkEvent::Lost(e) => work.end = Some(Err(down_reason(shared, peer.id, e))),
        // Handshake events: the link is up already.
        LinkEvent::PeerHello(_) | LinkEvent::Established(_) => {}
    }
}

/// A ROUTED frame whose body is `buf[body]`: queued to be passed on, or to be delivered here
/// (data), or handled now (end-to-end control). Its source must be one this link may carry.
fn routed_in(
    shared: &Shared,
    sources: &Sources,
    buf: &[u8],
    body: std::ops::Range<usize>,
    work: &mut ReadWork,
) -> Result<(), String> {
    let base = body.start;
    let body = &buf[body];
    let (h, inner_at) = RoutedHeader::decode(body)?;
    sources.check(h.src, |id| shared.routes.registered_by(id))?;
    let inner = &body[inner_at..];
    if h.dst != shared.config().id {
        work.forwards.push((h, base..base + body.len()));
        return Ok(());
    }
    if h.kind != RoutedType::Data {
        return route::routed_control(shared, &h, inner);
    }
    let spans = inner_spans(inner)?;
    let pending = work
        .routed
        .iter()
        .rev()
        .find(|r| r.src == h.src)
        .map(|r| r.next);
    match route::check_routed(shared, &h, pending) {
        Err(expected) => route::report_gap(shared, h.src, expected),
        Ok(skip) => {
            let base = base + inner_at;
            let fresh: Vec<Span> = spans
                .iter()
                .skip(skip as usize)
                .map(|s| s.shifted(base as u32))
                .collect();
            work.routed.push(RoutedIn {
                src: h.src,
                incarnation: h.src_incarnation,
                next: h.seq + spans.len() as u64,
                spans: fresh,
            });
        }
    }
    Ok(())
}

/// Hands messages from `src` to the application ([`hand_over_sorted`]), then waits while
/// the application or a group's members are behind ([`wait_for_group_room`]).
async fn deliver(
    shared: &Shared,
    machine: &Mutex<Link>,
    src: BusId,
    chunk: bytes::Bytes,
    spans: Vec<Span>,
) {
    hand_over_sorted(shared, machine, src, chunk, spans).await;
    wait_for_group_room(shared, machine, src).await;
}

/// Hands messages from `src` to the application through the one receive dispatcher
/// (`node::dispatch`): group messages are sorted out (interest recorded, publishes passed on
/// and delivered in their streams' order), log offers declined (a socket carries no ring to
/// read them beside), replies end their calls here, the rest (requests with a handle to
/// answer them) go to the inbox, waiting for room if need be. Once this returns, the
/// messages are the application's.
async fn hand_over_sorted(
    shared: &Shared,
    machine: &Mutex<Link>,
    src: BusId,
    chunk: bytes::Bytes,
    spans: Vec<Span>,
) {
    let decline = |offer: LogOffer<'_>| reads::decline_log_offer(shared, src, offer);
    let (batch, _) = dispatch(
        Some(&**shared.group.reads()),
        &shared.calls,
        src,
        chunk,
        spans,
        decline,
    );
    if let Some(batch) = batch {
        hand_over(shared, machine, batch).await;
    }
}

/// Past the inbox's group bound, or while a publish waits for room toward a member (as long
/// as it takes under backpressure, a bounded time under cut-off), this link waits before it
/// reads on: the wait goes back to the publisher.
async fn wait_for_group_room(shared: &Shared, machine: &Mutex<Link>, peer: BusId) {
    let inbox = shared.app.inbox();
    if inbox.group_backlogged() {
        host::note_app_behind(shared);
        blocked_while(shared, machine, inbox.wait_group_room()).await;
        // Noted again as the wait ends: an application that stopped reading for longer
        // than `GROUP_REPAIR_WAIT_MS` fell behind until now, not only when it began.
        host::note_app_behind(shared);
    }
    if shared.group.forwards_waiting() {
        // Publishes wait here for room toward a member.
        blocked_while(shared, machine, relay::wait_blocked_forwards(shared, peer)).await;
    }
}

/// Hands one batch to the inbox, waiting for room if need be.
async fn hand_over(shared: &Shared, machine: &Mutex<Link>, batch: MessageBatch) {
    if let Err(batch) = shared.app.inbox().deliver_now(batch) {
        wait_to_deliver(shared, machine, batch).await;
    }
}

/// Waits for room in the application's inbox to hand it a batch (`deliver_now` found none),
/// the machine knowing that this side stopped reading (backpressure, not a silent peer).
/// Returns a box: waiting is rare, and its future would otherwise take room in every link's
/// task.
fn wait_to_deliver<'a>(
    shared: &'a Shared,
    machine: &'a Mutex<Link>,
    batch: MessageBatch,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
    Box::pin(async move {
        // Whether the application still had an inbox: without one, as on the fast path, the
        // messages are dropped (it stopped receiving).
        let _ = blocked_while(shared, machine, shared.app.inbox().deliver(batch)).await;
    })
}

/// Runs `wait`, a wait for room on this node's side during which nothing of the peer is read,
/// telling the machine so: the peer's silence meanwhile is ours, not its own.
async fn blocked_while<T>(
    shared: &Shared,
    machine: &Mutex<Link>,
    wait: impl std::future::Future<Output = T>,
) -> T {
    lock(machine).input_blocked();
    let out = wait.await;
    lock(machine).input_unblocked(shared.now());
    out
}

/// A read half that can wait for bytes without a buffer to put them in (an idle link holds
/// none while it waits).
pub(crate) trait WaitReadable {
    /// Completes when a read would find bytes, the end or an error; at once where the
    /// transport cannot tell without reading (TLS: such a link keeps its buffer).
    fn wait_readable(&self) -> impl std::future::Future<Output = std::io::Result<()>> + Send;
}

impl WaitReadable for tokio::net::tcp::OwnedReadHalf {
    fn wait_readable(&self) -> impl std::future::Future<Output = std::io::Result<()>> + Send {
        self.readable()
    }
}

impl WaitReadable for tokio::net::unix::OwnedReadHalf {
    fn wait_readable(&self) -> impl std::future::Future<Output = std::io::Result<()>> + Send {
        self.readable()
    }
}

impl<S: Send> WaitReadable for tokio::io::ReadHalf<S> {
    fn wait_readable(&self) -> impl std::future::Future<Output = std::io::Result<()>> + Send {
        std::future::ready(Ok(()))
    }
}

/// An `async move` block rather than an `async fn`, which would keep every argument twice.
#[allow(clippy::manual_async_fn)] // see the doc line above
pub(super) fn read_loop<'a, R: AsyncRead + WaitReadable + Unpin>(
    shared: &'a Shared,
    peer: &'a Peer,
    r: &'a mut R,
    buf: &'a mut BytesMut,
    machine: &'a Mutex<Link>,
    shm: Option<&'a Arc<ShmLink>>,
    link_id: u64,
) -> impl std::future::Future<Output = Result<ReadEnd, DownReason>> + 'a {
    async move {
        let mut sizing = ReadSizing {
            // Small until reads come back full (an idle link holds no large buffer).
            read_size: READ_CHUNK_FIRST_BYTES,
            last_read: 0,
        };
        let mut events = Vec::new();
        // Who this link may carry ROUTED frames from (fixed for its life: the registration came
        // with its handshake, and it became the upstream, or not, before it went up).
        let parts = Parts {
            shared,
            peer,
            sources: Sources {
                peer: peer.id,
                serves: peer.neighbor().serves,
                upstream: shared.upstream_id() == Some(peer.id),
            },
            machine,
            shm,
        };
        loop {
            #[cfg(test)]
            super::tests::panic_if_told(peer.id);
            // The machine walks every whole frame in the buffer; the buffer is then cut once: the
            // DATA payloads go to the application as one batch sharing that cut.
            let mut spans = Spans::new();
            let mut work = ReadWork::default();
            let pos = step_machine(&parts, buf, &mut events, &mut spans, &mut work);
            if pos > 0 {
                let chunk = buf.split_to(pos).freeze();
                let forwards = std::mem::take(&mut work.forwards);
                if !forwards.is_empty() {
                    pass_on(&parts, &chunk, forwards).await;
                }
                for routed in std::mem::take(&mut work.routed) {
                    hand_over_routed(&parts, link_id, &chunk, routed).await;
                }
                if !spans.is_empty() {
                    deliver_direct(&parts, chunk, spans).await;
                }
            }
            if work.switch_seen {
                start_ring_reader(&parts);
            }
            if let Some(end) = work.end {
                return end;
            }
            if let Some(end) = read_more(&parts, r, buf, &mut events, &mut sizing).await? {
                return Ok(end);
            }
        }
    }
}

/// How much the next read asks for, and what the last one returned.
struct ReadSizing {
    /// Doubles while reads come back full, up to `READ_CHUNK_MAX_BYTES`; halves while they
    /// come back mostly empty, down to `READ_CHUNK_MIN_BYTES`.
    read_size: usize,
    /// Bytes the last read returned: under `IDLE_READ_BYTES` with nothing left over, the link
    /// waits for its next bytes without a buffer.
    last_read: usize,
}

/// Feeds the machine the whole frames in `buf`, acts on the events it reports and queues the
/// control frames it writes. Returns how much of `buf` the machine took; the direct messages
/// among it are in `spans`, the rest of the read's work in `work`.
fn step_machine(
    parts: &Parts<'_>,
    buf: &[u8],
    events: &mut Vec<LinkEvent>,
    spans: &mut Spans,
    work: &mut ReadWork,
) -> usize {
    let Parts {
        shared,
        peer,
        machine,
        ..
    } = *parts;
    let pos = {
        let mut m = lock(machine);
        let pos = m.handle_input(buf, shared.now(), spans);
        events.extend(std::iter::from_fn(|| m.poll_event()));
        pos
    };
    // Acting on an event may make more (a ring that cannot be opened ends a link that must use
    // one).
    while !events.is_empty() {
        for event in events.drain(..) {
            // Nothing after the end counts (the rest of the read included).
            if work.end.is_none() {
                act_on(parts, buf, event, work);
            }
        }
        let mut m = lock(machine);
        events.extend(std::iter::from_fn(|| m.poll_event()));
    }
    {
        let mut m = lock(machine);
        while let Some(frame) = m.poll_transmit() {
            peer.push_control(frame);
        }
    }
    if work.refused_mid_read {
        // A frame the machine took was refused here (a bad ACK, a bad ROUTED body): where it
        // stood in the read is not known, so nothing of this read is delivered or passed on.
        // Nothing of it was counted either: the peer writes it again.
        spans.clear();
        work.forwards.clear();
        work.routed.clear();
    }
    pos
}

/// Passes on the relayed frames of one read that are not for this node.
async fn pass_on(
    parts: &Parts<'_>,
    chunk: &bytes::Bytes,
    forwards: Vec<(RoutedHeader, std::ops::Range<usize>)>,
) {
    let Parts {
        shared,
        peer,
        machine,
        ..
    } = *parts;
    // A relay may wait for room toward a next hop (`FORWARD_WAIT_MS` per frame): that is this
    // side not reading, not the peer being silent. Told once per read.
    let forwards = async {
        for (h, body) in forwards {
            bump(&shared.counters.relayed);
            let msgs = h.data_messages(&chunk[body.clone()]);
            // Shared with the read when it is a good part of it; a small body is copied, so that
            // a queue of relayed frames (bounded by their own bytes) does not hold whole reads.
            let body = if body.len() * FORWARD_SHARE_MIN_FRACTION >= chunk.len() {
                chunk.slice(body)
            } else {
                bytes::Bytes::copy_from_slice(&chunk[body])
            };
            route::forward(shared, peer, h, body, msgs).await;
        }
    };
    // Boxed: only a relay's reads have forwards, and the wait is large; an idle link's task
    // does not carry its room.
    blocked_while(shared, machine, Box::pin(forwards)).await;
}

/// Hands relayed messages from one source to the application, under the source's claim, and
/// acknowledges them end to end.
async fn hand_over_routed(parts: &Parts<'_>, link_id: u64, chunk: &bytes::Bytes, mut r: RoutedIn) {
    let Parts {
        shared,
        peer,
        machine,
        ..
    } = *parts;
    // A source's messages may come by two links at once (a relay and a direct link after a
    // switch): one link at a time hands them over, and what is fresh is counted again under
    // its claim. The claim covers the hand-over alone (no wait for a group's members under it:
    // their acknowledgements may come by the link that waits for the claim).
    let first = (r.incarnation, r.next - r.spans.len() as u64);
    let sources = shared.routes.relayed_sources();
    let (claim, done) = match sources.try_claim(r.src, link_id, first) {
        Some(got) => got,
        None => {
            let wait = sources.claim(r.src, link_id, first);
            blocked_while(shared, machine, wait).await
        }
    };
    r.spans.drain(..(done as usize).min(r.spans.len()));
    // Even a frame of duplicates is acknowledged: the sender may be waiting for it.
    let fresh = !r.spans.is_empty();
    if fresh {
        let n = r.spans.len() as u64;
        shared.counters.msgs_in.fetch_add(n, Relaxed);
        hand_over_sorted(shared, machine, r.src, chunk.clone(), r.spans).await;
    }
    claim.finish(r.incarnation, r.next, shared.clock_ms());
    route::send_routed_ack(shared, r.src, r.next);
    if fresh {
        wait_for_group_room(shared, machine, peer.id).await;
    }
}

/// Hands the peer's own messages of one read to the application, counts them, and
/// acknowledges them (one ACK per read, not per message) once the application has them.
async fn deliver_direct(parts: &Parts<'_>, chunk: bytes::Bytes, spans: Spans) {
    let Parts {
        shared,
        peer,
        machine,
        ..
    } = *parts;
    let bytes: u64 = spans.iter().map(|s| u64::from(s.len())).sum();
    let c = &shared.counters;
    c.msgs_in.fetch_add(spans.len() as u64, Relaxed);
    c.bytes_in.fetch_add(bytes, Relaxed);
    peer.traffic.msgs_in.fetch_add(spans.len() as u64, Relaxed);
    peer.traffic.bytes_in.fetch_add(bytes, Relaxed);
    let n = spans.len() as u64;
    // Looked at before the delivery wakes it.
    let answerable = shared.peers.deferred().app_waits();
    deliver(shared, machine, peer.id, chunk, spans).await;
    let next = peer.delivered(n);
    peer.push_ack(ack_frame(next), answerable);
}

/// Everything the peer wrote on the socket before its SWITCH is delivered: its ring may be
/// read now. With no inbox left (the application dropped it), a thread reads and discards, as
/// the socket path does.
fn start_ring_reader(parts: &Parts<'_>) {
    if let Some((shm, c)) = parts.shm.and_then(|s| Some((s, s.switch_in()?))) {
        let ring = InboundRing::new(c, shm.ring.clone());
        shm.set_reader(ring.handle());
        if let Err(ring) = parts.shared.app.inbox().add_ring(ring) {
            ring.discard_on_a_thread();
        }
    }
}

/// Reads the socket's next bytes into `buf`, first giving back an idle link's buffer. Returns
/// the end of the stream if the peer closed it between frames.
async fn read_more<R: AsyncRead + WaitReadable + Unpin>(
    parts: &Parts<'_>,
    r: &mut R,
    buf: &mut BytesMut,
    events: &mut Vec<LinkEvent>,
    sizing: &mut ReadSizing,
) -> Result<Option<ReadEnd>, DownReason> {
    let Parts {
        shared,
        peer,
        machine,
        ..
    } = *parts;
    if buf.is_empty() && sizing.last_read < IDLE_READ_BYTES {
        // The last read drained the socket and left nothing: the link is idle (a PING now and
        // then) or trades small messages. Its buffer goes back while it waits for bytes, and a
        // fresh one takes them (one allocation, no extra read).
        *buf = BytesMut::new();
        *events = Vec::new();
        lock(machine).release_idle_memory();
        r.wait_readable()
            .await
            .map_err(|e| DownReason::Io(e.to_string()))?;
    }
    buf.reserve(lock(machine).bytes_needed(buf).max(sizing.read_size));
    let n = r
        .read_buf(buf)
        .await
        .map_err(|e| DownReason::Io(e.to_string()))?;
    sizing.last_read = n;
    if n == 0 {
        if buf.is_empty() {
            return Ok(Some(ReadEnd::Eof));
        }
        let at = lock(machine).offset();
        let what = format!(
            "connection closed in the middle of a frame ({} bytes of it received) at stream offset {at}",
            buf.len()
        );
        return Err(down_reason(shared, peer.id, LinkError::Protocol(what)));
    }
    // Grow the read while reads come back full, shrink it when they come back mostly empty.
    let size = &mut sizing.read_size;
    if n >= *size {
        *size = (*size * 2).min(READ_CHUNK_MAX_BYTES);
    } else if n < *size / 4 && *size > READ_CHUNK_MIN_BYTES {
        *size = (*size / 2).max(READ_CHUNK_MIN_BYTES);
    }
    Ok(None)
}
