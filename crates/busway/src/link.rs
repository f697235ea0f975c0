//! One connection's life, driven by its protocol state machine ([`busway_core::link::Link`]):
//! handshake, then a reader, a writer and the machine's timers, then teardown.
//!
//! A link task runs on one I/O loop and owns both halves of its socket. The reader feeds the
//! machine reads of at least `READ_CHUNK_MIN_BYTES`, acts on what it reports (acknowledgements,
//! relayed frames, ring negotiation) and hands DATA payloads to the inbox a batch per read,
//! cut out of the read without a copy; the writer takes everything the send queue holds and
//! writes it in one `writev`. The machine decides; this file moves bytes and runs timers.

use crate::event::{DownReason, Event};
use crate::inbox::MessageBatch;
use crate::limits::HEARTBEAT_MISSES_MAX;
use crate::limits::{READ_CHUNK_MAX_BYTES, READ_CHUNK_MIN_BYTES, WRITEV_SEGMENTS_MAX};
use crate::node::Shared;
use crate::peer::{Peer, Take};
use crate::ring_tx::{wait_for_room, Flush, RingWriter};
use crate::routing::inner_spans;
use crate::shm_link::ShmLink;
use crate::stats::bump;
use crate::transport::{StdStream, Stream};
use busway_core::channel::Channel;
use busway_core::control::{ack_frame, Close, CloseCode};
use busway_core::handshake::{Established, HandshakeError, Role};
use busway_core::link::{Link, LinkConfig, LinkError, LinkEvent, Spans};
use busway_core::routed::{RoutedHeader, RoutedType};
use busway_core::{BusId, DecodeError};
use busway_shm::ring::RING_CAPACITY_DEFAULT;
use bytes::{Buf, Bytes, BytesMut};
use std::io::{self, IoSlice};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long a refused connection may take to receive the CLOSE that says why, in ms.
const REJECT_WRITE_MS: u64 = 100;

/// How a connection ended, for the dialer's backoff.
#[derive(PartialEq, Eq, Debug)]
pub(crate) enum Outcome {
    /// The handshake never completed.
    NeverUp,
    /// The link was up, then went down.
    WasUp,
}

/// How a connection came to be.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Dial {
    /// Accepted by a listener.
    Accepted,
    /// Dialed to a `connect` address.
    Peer,
    /// Dialed to the `upstream` address: this node registers as its downstream.
    Upstream,
    /// Dialed on a relay's hint to reach this bus id directly.
    Direct(BusId),
}

impl Dial {
    fn role(self) -> Role {
        match self {
            Dial::Accepted => Role::Listener,
            Dial::Peer | Dial::Upstream | Dial::Direct(_) => Role::Dialer,
        }
    }
}

/// Runs an accepted connection from handshake to close on the calling loop.
pub(crate) async fn serve_std(shared: Arc<Shared>, stream: StdStream, remote: String) -> Outcome {
    match stream.register() {
        Ok(s) => serve(shared, s, Dial::Accepted, remote).await,
        Err(e) => {
            tracing::warn!(%remote, error = %e, "could not register an accepted socket");
            Outcome::NeverUp
        }
    }
}

pub(crate) async fn serve(
    shared: Arc<Shared>,
    stream: Stream,
    role: Dial,
    remote: String,
) -> Outcome {
    bump(&shared.counters.connections);
    match stream {
        Stream::Tcp(s) => {
            let (r, w) = s.into_split();
            run(shared, r, w, role, remote).await
        }
        Stream::Unix(s) => {
            let (r, w) = s.into_split();
            run(shared, r, w, role, remote).await
        }
    }
}

/// Relayed messages from one source found in one read, to deliver once the read is cut.
struct RoutedIn {
    src: BusId,
    incarnation: u64,
    /// The number expected from `src` once these are delivered.
    next: u64,
    spans: Vec<(u32, u32)>,
}

/// What ended a link's read side.
enum ReadEnd {
    Eof,
    Close(Close),
}

fn lock(link: &Mutex<Link>) -> MutexGuard<'_, Link> {
    // A panic while holding this lock leaves the machine as it was; keep going.
    link.lock().unwrap_or_else(|p| p.into_inner())
}

/// The state machine's settings for a connection of this node.
fn link_config(shared: &Shared, role: Dial, remote: &str) -> LinkConfig {
    let c = &shared.config;
    LinkConfig {
        role: role.role(),
        secret: c.secret.clone(),
        clock_skew_max_ms: c.clock_skew_max_ms,
        handshake_timeout_ms: c.handshake_timeout_ms,
        frame_body_max: c.frame_body_max,
        heartbeat_interval_ms: c.heartbeat_interval_ms,
        heartbeat_misses_max: HEARTBEAT_MISSES_MAX,
        shm: c.shm_channels,
        ring_required: remote.starts_with("shm://"),
        expect_peer: match role {
            Dial::Direct(id) => Some(id),
            _ => None,
        },
        remote: remote.to_owned(),
    }
}

async fn run<R, W>(shared: Arc<Shared>, mut r: R, mut w: W, role: Dial, remote: String) -> Outcome
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(2 * READ_CHUNK_MIN_BYTES);
    let mut hello = shared.local_hello();
    if role == Dial::Upstream {
        let me = shared.config.id;
        hello.downstream_of_you = Some(shared.config.subtree.unwrap_or((me, me)));
    }
    let config = link_config(&shared, role, &remote);
    let mut machine = Link::new(config, hello, shared.nonces.clone(), shared.now());
    let established = match handshake(&shared, &mut r, &mut w, &mut machine, &mut buf).await {
        Ok(e) => e,
        Err(reason) => {
            reject(&shared, &mut w, &mut machine, &remote, &reason).await;
            return Outcome::NeverUp;
        }
    };
    let id = established.peer.bus_id;
    let link_id = shared.next_link_id();
    let peer = match shared.attach_peer(&established, &remote, link_id, role) {
        Ok(p) => p,
        Err(reason) => {
            machine.reject(CloseCode::Duplicate, &reason);
            reject(&shared, &mut w, &mut machine, &remote, &reason).await;
            return Outcome::NeverUp;
        }
    };
    tracing::debug!(peer = %id, %remote, "link up");
    shared.emit(Event::PeerUp {
        peer: id,
        incarnation: established.peer.incarnation,
        addr: remote,
    });
    // The machine asks for rings (LinkEvent::OfferRing) when both ends share a host.
    let shm = machine
        .uses_rings()
        .then(|| Arc::new(ShmLink::new(shared.clone(), peer.clone(), link_id)));
    let machine = Mutex::new(machine);
    let end_rings = EndRings {
        shm: shm.as_ref(),
        peer: &peer,
    };
    let reason = run_up(
        &shared,
        &peer,
        &mut r,
        &mut w,
        &mut buf,
        &machine,
        shm.as_ref(),
    )
    .await;
    drop(end_rings);
    shared.detach_peer(&peer, link_id, reason);
    Outcome::WasUp
}

/// Ends a link's shared-memory rings when its task ends, however it ends: returned, or dropped
/// with the I/O loop when the node goes (the application's inbox then stops reading the peer's
/// ring, instead of waiting on it for good, and the peer's reader sees ours closed).
struct EndRings<'a> {
    shm: Option<&'a Arc<ShmLink>>,
    peer: &'a Peer,
}

impl Drop for EndRings<'_> {
    fn drop(&mut self) {
        if let Some(shm) = self.shm {
            shm.end();
            if let Some(mut ring) = self.peer.end_ring() {
                ring.close();
            }
        }
    }
}

/// Runs the reader, the writer and the machine's timers of an established link until the link
/// is done; returns why it went down.
async fn run_up<R, W>(
    shared: &Shared,
    peer: &Peer,
    r: &mut R,
    w: &mut W,
    buf: &mut BytesMut,
    machine: &Mutex<Link>,
    shm: Option<&Arc<ShmLink>>,
) -> DownReason
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let linger = Duration::from_millis(shared.config.linger_ms);
    let reader = read_loop(shared, peer, r, buf, machine, shm);
    let writer = write_loop(w, peer, machine, shm.map(|s| &**s));
    let timers = timers(shared, peer, machine);
    // The application reads the peer's ring (see `ring_rx`); the link task sends its
    // acknowledgements and ends the link if the ring turns out bad.
    let ring_fault = async {
        match shm {
            Some(shm) => tokio::select! {
                why = shm.fault() => why,
                never = shm.ack_loop() => match never {},
            },
            None => std::future::pending().await,
        }
    };
    tokio::pin!(reader, writer, timers, ring_fault);
    tokio::select! {
        why = &mut ring_fault => {
            bump(&shared.counters.protocol_errors);
            tracing::warn!(peer = %peer.id, %why, "closing link: bad shared-memory ring");
            DownReason::ProtocolError(why)
        }
        end = &mut reader => {
            let reason = match end {
                Ok(ReadEnd::Close(c)) => DownReason::ClosedByPeer(c.reason),
                Ok(ReadEnd::Eof) => DownReason::ClosedByPeer("connection closed".into()),
                Err(reason) => return reason,
            };
            if let Some(shm) = shm {
                // What the peer put in its ring before closing is delivered first (its
                // acknowledgement goes out with our CLOSE).
                let _ = tokio::time::timeout(linger, shm.wait_drained()).await;
                peer.push_control(ack_frame(peer.inbound_expected()));
            }
            // The peer is going: send it what is already queued, then our CLOSE.
            peer.close_link();
            let _ = tokio::time::timeout(linger, &mut writer).await;
            reason
        }
        done = &mut writer => {
            if let Err(e) = done {
                return DownReason::Io(e.to_string());
            }
            // Our CLOSE is out: read what the peer still sends until it closes too.
            match tokio::time::timeout(linger, &mut reader).await {
                Ok(Err(reason)) => reason,
                _ => DownReason::Shutdown,
            }
        }
        silent = &mut timers => silent,
        _ = peer.cut.notified() => DownReason::Io("link cut by Node::disconnect".into()),
    }
}

/// Runs the machine's timers (a PING each heartbeat interval, the end of a silent peer);
/// returns why the link must end.
async fn timers(shared: &Shared, peer: &Peer, machine: &Mutex<Link>) -> DownReason {
    loop {
        let Some(at_us) = lock(machine).poll_timeout() else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(shared.instant_at(at_us).into()).await;
        let mut m = lock(machine);
        m.handle_timeout(shared.now());
        while let Some(frame) = m.poll_transmit() {
            peer.push_control(frame);
        }
        // The reader takes every other event under the lock it feeds input with: what is
        // left here came from the timeout.
        while let Some(e) = m.poll_event() {
            if let LinkEvent::Lost(error) = e {
                return down_reason(shared, peer.id, error);
            }
        }
    }
}

/// Why a link went down, from what its machine reported; counts it.
fn down_reason(shared: &Shared, peer: BusId, e: LinkError) -> DownReason {
    let c = &shared.counters;
    match e {
        LinkError::Silent { .. } => {
            bump(&c.heartbeat_timeouts);
            DownReason::Timeout(e.to_string())
        }
        LinkError::Frame(d) => {
            bump(&c.protocol_errors);
            match d {
                DecodeError::ChecksumMismatch { .. } => bump(&c.checksum_failures),
                DecodeError::BodyTooLong { .. } => bump(&c.oversize_frames),
                DecodeError::UnknownKind { .. } => {}
            }
            tracing::warn!(%peer, error = %d, "closing link: bad frame");
            DownReason::ProtocolError(d.to_string())
        }
        other => {
            bump(&c.protocol_errors);
            let what = other.to_string();
            tracing::warn!(%peer, %what, "closing link: protocol error");
            DownReason::ProtocolError(what)
        }
    }
}

/// Writes the machine's last frames (a CLOSE that says why) to a refused connection, briefly,
/// and reports the refusal.
async fn reject<W: AsyncWrite + Unpin>(
    shared: &Shared,
    w: &mut W,
    machine: &mut Link,
    remote: &str,
    reason: &str,
) {
    bump(&shared.counters.handshake_failures);
    tracing::warn!(%remote, %reason, "handshake failed");
    let mut out = Vec::new();
    while let Some(frame) = machine.poll_transmit() {
        out.extend_from_slice(&frame);
    }
    let _ = tokio::time::timeout(Duration::from_millis(REJECT_WRITE_MS), w.write_all(&out)).await;
    shared.emit(Event::Rejected {
        addr: remote.to_owned(),
        reason: reason.to_owned(),
    });
}

/// Writes what the machine has to send, straight to the socket (before the link is up).
async fn write_transmits<W: AsyncWrite + Unpin>(w: &mut W, machine: &mut Link) -> io::Result<()> {
    while let Some(frame) = machine.poll_transmit() {
        w.write_all(&frame).await?;
    }
    Ok(())
}

/// Drives the handshake to its end: the peer authenticated, or why not (the machine then
/// holds the CLOSE to send).
async fn handshake<R, W>(
    shared: &Shared,
    r: &mut R,
    w: &mut W,
    machine: &mut Link,
    buf: &mut BytesMut,
) -> Result<Established, String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut spans = Spans::new();
    loop {
        if let Err(e) = write_transmits(w, machine).await {
            machine.fail(LinkError::Refused(format!("sending the handshake: {e}")));
        }
        let n = machine.handle_input(buf, shared.now(), &mut spans);
        buf.advance(n);
        let mut progressed = n > 0;
        while let Some(event) = machine.poll_event() {
            match event {
                LinkEvent::PeerHello(hello) => {
                    let (next_send, next_expected) = shared.resume_point(&hello);
                    machine.send_auth(next_send, next_expected);
                    progressed = true;
                }
                LinkEvent::Established(e) => return Ok(*e),
                LinkEvent::Lost(e) => {
                    if matches!(e, LinkError::Handshake(HandshakeError::BadProof)) {
                        bump(&shared.counters.auth_failures);
                    }
                    return Err(e.to_string());
                }
                // Nothing else comes before the peer is authenticated.
                _ => {}
            }
        }
        if progressed {
            continue;
        }
        let deadline = machine.poll_timeout().unwrap_or_default();
        let read = tokio::time::timeout_at(shared.instant_at(deadline).into(), r.read_buf(buf));
        match read.await {
            Ok(Ok(0)) => {
                machine.fail(LinkError::Refused(
                    "the peer closed the connection during the handshake".into(),
                ));
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                machine.fail(LinkError::Refused(format!("reading the handshake: {e}")));
            }
            Err(_) => machine.handle_timeout(shared.now()),
        }
    }
}

/// What one read asks of the link besides delivering its direct messages.
#[derive(Default)]
struct ReadWork {
    routed: Vec<RoutedIn>,
    forwards: Vec<(RoutedHeader, std::ops::Range<usize>)>,
    switch_seen: bool,
    end: Option<Result<ReadEnd, DownReason>>,
}

/// Acts on one event of the machine (the read's buffer is `buf`).
fn act_on(
    shared: &Shared,
    peer: &Peer,
    machine: &Mutex<Link>,
    shm: Option<&Arc<ShmLink>>,
    buf: &[u8],
    event: LinkEvent,
    work: &mut ReadWork,
) {
    match event {
        LinkEvent::Acked(next) => {
            if let Err(e) = peer.ack(next) {
                let at = lock(machine).offset();
                lock(machine).fail(LinkError::Protocol(format!(
                    "{e} (ACK before stream offset {at})"
                )));
            }
        }
        LinkEvent::Rtt(us) => peer.rtt_us.store(us, std::sync::atomic::Ordering::Relaxed),
        LinkEvent::Routed(body) => {
            let at = lock(machine).offset();
            if let Err(what) = routed_in(shared, buf, body, work) {
                lock(machine).fail(LinkError::Protocol(format!(
                    "{what} (ROUTED frame before stream offset {at})"
                )));
            }
        }
        LinkEvent::OfferRing => match shm.map(|s| s.offer(RING_CAPACITY_DEFAULT)) {
            Some(Ok((pid, fd, inode))) => {
                lock(machine).offer_ring(pid, fd, inode, RING_CAPACITY_DEFAULT as u64)
            }
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
        } => {
            let opened = shm.map_or(Err("no ring on this link".into()), |s| {
                s.open_offered(pid, fd, inode, capacity)
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
        LinkEvent::SwitchIn => work.switch_seen = true,
        LinkEvent::PeerClosed(c) => work.end = Some(Ok(ReadEnd::Close(c))),
        LinkEvent::Lost(e) => work.end = Some(Err(down_reason(shared, peer.id, e))),
        // Handshake events: the link is up already.
        LinkEvent::PeerHello(_) | LinkEvent::Established(_) => {}
    }
}

/// A ROUTED frame whose body is `buf[body]`: queued to be passed on, or to be delivered here
/// (data), or handled now (end-to-end control).
fn routed_in(
    shared: &Shared,
    buf: &[u8],
    body: std::ops::Range<usize>,
    work: &mut ReadWork,
) -> Result<(), String> {
    let base = body.start;
    let body = &buf[body];
    let (h, inner_at) = RoutedHeader::decode(body)?;
    let inner = &body[inner_at..];
    if h.dst != shared.config.id {
        let inner_at = base + inner_at;
        work.forwards.push((h, inner_at..base + body.len()));
        return Ok(());
    }
    if h.kind != RoutedType::Data {
        return shared.routed_control(&h, inner);
    }
    let spans = inner_spans(inner)?;
    let pending = work
        .routed
        .iter()
        .rev()
        .find(|r| r.src == h.src)
        .map(|r| r.next);
    match shared.check_routed(h.src, h.src_incarnation, h.seq, pending) {
        Err(expected) => shared.report_gap(h.src, expected),
        Ok(skip) => {
            let base = base + inner_at;
            let fresh: Vec<(u32, u32)> = spans
                .iter()
                .skip(skip as usize)
                .map(|&(s, n)| ((base + s) as u32, n as u32))
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

async fn read_loop<R: AsyncRead + Unpin>(
    shared: &Shared,
    peer: &Peer,
    r: &mut R,
    buf: &mut BytesMut,
    machine: &Mutex<Link>,
    shm: Option<&Arc<ShmLink>>,
) -> Result<ReadEnd, DownReason> {
    let mut read_size = READ_CHUNK_MIN_BYTES;
    let mut events = Vec::new();
    loop {
        // The machine walks every whole frame in the buffer; the buffer is then cut once: the
        // DATA payloads go to the application as one batch sharing that cut.
        let mut spans = Spans::new();
        let mut work = ReadWork::default();
        let pos = {
            let mut m = lock(machine);
            let pos = m.handle_input(buf, shared.now(), &mut spans);
            events.extend(std::iter::from_fn(|| m.poll_event()));
            pos
        };
        // Acting on an event may make more (a ring that cannot be opened ends a link that
        // must use one).
        while !events.is_empty() {
            for event in events.drain(..) {
                act_on(shared, peer, machine, shm, buf, event, &mut work);
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
        if pos > 0 {
            let chunk = buf.split_to(pos).freeze();
            for (h, inner) in work.forwards {
                bump(&shared.counters.relayed);
                shared.forward(peer.id, h, &chunk[inner]).await;
            }
            for r in work.routed {
                // Even a frame of duplicates is acknowledged: the sender may be waiting for it.
                if !r.spans.is_empty() {
                    let n = r.spans.len() as u64;
                    shared
                        .counters
                        .msgs_in
                        .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                    shared
                        .inbox
                        .deliver(MessageBatch::new(r.src, chunk.clone(), r.spans))
                        .await;
                }
                shared.routed_delivered(r.src, r.incarnation, r.next);
                shared.send_routed_ack(r.src, r.next);
            }
            if !spans.is_empty() {
                let bytes: u64 = spans.iter().map(|&(_, len)| u64::from(len)).sum();
                let c = &shared.counters;
                c.msgs_in
                    .fetch_add(spans.len() as u64, std::sync::atomic::Ordering::Relaxed);
                c.bytes_in
                    .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
                let n = spans.len() as u64;
                shared
                    .inbox
                    .deliver(MessageBatch::new(peer.id, chunk, spans))
                    .await;
                // Acknowledge once the application has them (one ACK per read, not per message).
                let next = peer.delivered(n);
                peer.push_control(ack_frame(next));
            }
        }
        if work.switch_seen {
            // Everything the peer wrote on the socket before its SWITCH is delivered: its ring
            // may be read now.
            if let Some(shm) = shm {
                shm.switch_in();
            }
        }
        if let Some(end) = work.end {
            return end;
        }
        buf.reserve(lock(machine).bytes_needed(buf).max(read_size));
        let n = r
            .read_buf(buf)
            .await
            .map_err(|e| DownReason::Io(e.to_string()))?;
        if n == 0 {
            if buf.is_empty() {
                return Ok(ReadEnd::Eof);
            }
            let at = lock(machine).offset();
            let what = format!(
                "connection closed in the middle of a frame ({} bytes of it received) at stream offset {at}",
                buf.len()
            );
            return Err(down_reason(shared, peer.id, LinkError::Protocol(what)));
        }
        // Grow the read while reads come back full, shrink it when they come back mostly empty.
        if n >= read_size {
            read_size = (read_size * 2).min(READ_CHUNK_MAX_BYTES);
        } else if n < read_size / 4 {
            read_size = (read_size / 2).max(READ_CHUNK_MIN_BYTES);
        }
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    w: &mut W,
    peer: &Peer,
    machine: &Mutex<Link>,
    shm: Option<&ShmLink>,
) -> io::Result<()> {
    let mut batch: Vec<Bytes> = Vec::with_capacity(WRITEV_SEGMENTS_MAX);
    let mut switched = false;
    loop {
        if !switched {
            if let Some(p) = shm.and_then(ShmLink::take_producer) {
                // Everything taken so far is on the socket: from here on, messages go into
                // the ring, and the peer reads it once it read this.
                w.write_all(&Channel::Switch.frame()).await?;
                lock(machine).switched_out();
                peer.start_ring(RingWriter::new(p));
                switched = true;
            }
        }
        if switched {
            flush_ring(peer).await?;
            match peer.take_control(&mut batch) {
                Take::Idle => peer.writer_wake.notified().await,
                Take::Drained => {
                    if let Some(mut ring) = peer.end_ring() {
                        ring.close();
                    }
                    w.write_all(&Close::frame(CloseCode::Normal, "closing"))
                        .await?;
                    w.shutdown().await?;
                    return Ok(());
                }
                Take::Data => write_batch(w, &mut batch).await?,
            }
            continue;
        }
        match peer.take(&mut batch) {
            Take::Idle => peer.writer_wake.notified().await,
            Take::Drained => {
                w.write_all(&Close::frame(CloseCode::Normal, "closing"))
                    .await?;
                w.shutdown().await?;
                return Ok(());
            }
            Take::Data => write_batch(w, &mut batch).await?,
        }
    }
}

/// Moves the peer's queued messages into its ring, waiting (on a blocking thread, on the
/// ring's futex) while the ring is full. Gives up on a full ring once the peer closed the link
/// (nobody will free the ring); our own node closing waits on, bounded by its linger time.
async fn flush_ring(peer: &Peer) -> io::Result<()> {
    loop {
        let waiter = match peer.flush_ring(true) {
            None | Some(Ok(Flush::Done)) => return Ok(()),
            Some(Err(e)) => return Err(io::Error::new(io::ErrorKind::InvalidInput, e)),
            Some(Ok(Flush::Full(waiter))) => waiter,
        };
        if peer.is_closed_by_peer() {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the peer closed the link and its shared-memory ring is full",
            ));
        }
        let closed = tokio::task::spawn_blocking(move || wait_for_room(&waiter))
            .await
            .unwrap_or(false);
        if closed {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the peer closed its end of the shared-memory ring",
            ));
        }
    }
}

/// Writes every buffer of `batch`, in order, with as few `writev` calls as the kernel allows.
async fn write_batch<W: AsyncWrite + Unpin>(w: &mut W, batch: &mut Vec<Bytes>) -> io::Result<()> {
    let mut first = 0;
    while first < batch.len() {
        let n = if batch.len() - first == 1 {
            w.write(&batch[first]).await?
        } else {
            let iov: Vec<IoSlice<'_>> = batch[first..]
                .iter()
                .take(WRITEV_SEGMENTS_MAX)
                .map(|b| IoSlice::new(b))
                .collect();
            w.write_vectored(&iov).await?
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let mut left = n;
        while left > 0 {
            let seg = &mut batch[first];
            if left >= seg.len() {
                left -= seg.len();
                first += 1;
            } else {
                seg.advance(left);
                left = 0;
            }
        }
    }
    batch.clear();
    Ok(())
}
