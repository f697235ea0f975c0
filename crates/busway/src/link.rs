//! One connection's life: handshake, then a reader and a writer, then teardown.
//!
//! A link task runs on one I/O loop and owns both halves of its socket. The reader cuts frames
//! out of reads of at least `READ_CHUNK_MIN_BYTES` and hands DATA payloads to the inbox a batch
//! per read; the writer takes everything the send queue holds and writes it in one `writev`.

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
use busway_core::control::{ack_frame, decode_token, ping_frame, Close, CloseCode};
use busway_core::frame::{message_spans, HANDSHAKE_BODY_LEN_MAX, HEADER_LEN};
use busway_core::handshake::{caps, Established, Handshake, HandshakeError, Role, Step};
use busway_core::routed::{RoutedHeader, RoutedType};
use busway_core::{BusId, DecodeError, FrameDecoder, FrameKind};
use busway_shm::ring::RING_CAPACITY_DEFAULT;
use bytes::{Buf, Bytes, BytesMut};
use std::io::{self, IoSlice};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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

enum LinkError {
    Decode(DecodeError),
    Protocol(String),
    Io(io::Error),
}

impl From<io::Error> for LinkError {
    fn from(e: io::Error) -> Self {
        LinkError::Io(e)
    }
}

async fn run<R, W>(shared: Arc<Shared>, mut r: R, mut w: W, role: Dial, remote: String) -> Outcome
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(2 * READ_CHUNK_MIN_BYTES);
    let mut dec = FrameDecoder::new(HANDSHAKE_BODY_LEN_MAX);
    let timeout = Duration::from_millis(shared.config.handshake_timeout_ms);
    let established = match tokio::time::timeout(
        timeout,
        handshake(&shared, &mut r, &mut w, role, &mut buf, &mut dec),
    )
    .await
    {
        Ok(Ok(e)) => e,
        Ok(Err(reason)) => {
            reject(&shared, &mut w, &remote, &reason).await;
            return Outcome::NeverUp;
        }
        Err(_) => {
            let reason = format!("handshake not complete within {} ms", timeout.as_millis());
            reject(&shared, &mut w, &remote, &reason).await;
            return Outcome::NeverUp;
        }
    };
    let id = established.peer.bus_id;
    if let Dial::Direct(expected) = role {
        if id != expected {
            let reason = format!("dialed {remote} to reach bus id {expected}, found bus id {id}");
            reject(&shared, &mut w, &remote, &reason).await;
            return Outcome::NeverUp;
        }
    }
    let same_host = shared.config.shm_channels
        && established.peer.capabilities & caps::SHM != 0
        && !shared.host_id.is_empty()
        && established.peer.host_id == shared.host_id;
    let shm_only = remote.starts_with("shm://");
    if shm_only && !same_host {
        let why = if !shared.config.shm_channels {
            "this node has shared memory turned off"
        } else if established.peer.capabilities & caps::SHM == 0 {
            "the peer does not allow shared memory"
        } else {
            "the peer runs on another host"
        };
        let reason = format!(
            "{remote} carries its data only through shared memory, and {why} (bus id {id})"
        );
        reject(&shared, &mut w, &remote, &reason).await;
        return Outcome::NeverUp;
    }
    let link_id = shared.next_link_id();
    let peer = match shared.attach_peer(&established, &remote, link_id, role) {
        Ok(p) => p,
        Err(reason) => {
            bump(&shared.counters.handshake_failures);
            let _ = w
                .write_all(&Close::frame(CloseCode::Duplicate, &reason))
                .await;
            shared.emit(Event::Rejected {
                addr: remote,
                reason,
            });
            return Outcome::NeverUp;
        }
    };
    tracing::debug!(peer = %id, %remote, "link up");
    shared.emit(Event::PeerUp {
        peer: id,
        incarnation: established.peer.incarnation,
        addr: remote,
    });
    dec.set_body_len_max(shared.config.frame_body_max);
    let shm = same_host.then(|| {
        Arc::new(ShmLink::new(
            shared.clone(),
            peer.clone(),
            link_id,
            shm_only,
        ))
    });
    if let Some(shm) = &shm {
        match shm.offer(RING_CAPACITY_DEFAULT) {
            Ok(offer) => peer.push_control(offer),
            Err(why) if shm_only => shm.raise_fault(format!("cannot make a ring: {why}")),
            Err(why) => tracing::warn!(%why, "no shared-memory ring; staying on the socket"),
        }
    }
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
        &mut dec,
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

/// Runs the reader, the writer and the heartbeat of an established link until the link is
/// done; returns why it went down.
async fn run_up<R, W>(
    shared: &Shared,
    peer: &Peer,
    r: &mut R,
    w: &mut W,
    buf: &mut BytesMut,
    dec: &mut FrameDecoder,
    shm: Option<&Arc<ShmLink>>,
) -> DownReason
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let linger = Duration::from_millis(shared.config.linger_ms);
    let last_rx_ms = AtomicU64::new(shared.clock_ms());
    let reader = read_loop(shared, peer, r, buf, dec, &last_rx_ms, shm);
    let writer = write_loop(w, peer, shm.map(|s| &**s));
    let heartbeat = heartbeat(shared, peer, &last_rx_ms);
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
    tokio::pin!(reader, writer, heartbeat, ring_fault);
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
                Err(e) => return link_error(shared, peer.id, e),
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
                Ok(Err(e)) => link_error(shared, peer.id, e),
                _ => DownReason::Shutdown,
            }
        }
        silent = &mut heartbeat => silent,
        _ = peer.cut.notified() => DownReason::Io("link cut by Node::disconnect".into()),
    }
}

/// Sends a PING every heartbeat interval; returns when the peer has been silent for
/// `HEARTBEAT_MISSES_MAX` intervals.
async fn heartbeat(shared: &Shared, peer: &Peer, last_rx_ms: &AtomicU64) -> DownReason {
    let interval_ms = shared.config.heartbeat_interval_ms;
    let mut tick = tokio::time::interval(Duration::from_millis(interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let now = shared.clock_ms();
        let silent_ms = now.saturating_sub(last_rx_ms.load(Relaxed));
        if silent_ms >= HEARTBEAT_MISSES_MAX * interval_ms {
            bump(&shared.counters.heartbeat_timeouts);
            return DownReason::Timeout(format!(
                "nothing received for {silent_ms} ms ({HEARTBEAT_MISSES_MAX} heartbeat intervals of {interval_ms} ms)"
            ));
        }
        peer.push_control(ping_frame(FrameKind::Ping, shared.clock_us()));
    }
}

fn link_error(shared: &Shared, peer: BusId, e: LinkError) -> DownReason {
    match e {
        LinkError::Io(e) => DownReason::Io(e.to_string()),
        LinkError::Protocol(what) => {
            bump(&shared.counters.protocol_errors);
            tracing::warn!(%peer, %what, "closing link: protocol error");
            DownReason::ProtocolError(what)
        }
        LinkError::Decode(d) => {
            bump(&shared.counters.protocol_errors);
            match d {
                DecodeError::ChecksumMismatch { .. } => bump(&shared.counters.checksum_failures),
                DecodeError::BodyTooLong { .. } => bump(&shared.counters.oversize_frames),
                DecodeError::UnknownKind { .. } => {}
            }
            tracing::warn!(%peer, error = %d, "closing link: bad frame");
            DownReason::ProtocolError(d.to_string())
        }
    }
}

async fn reject<W: AsyncWrite + Unpin>(shared: &Shared, w: &mut W, remote: &str, reason: &str) {
    bump(&shared.counters.handshake_failures);
    tracing::warn!(%remote, %reason, "handshake failed");
    let _ = tokio::time::timeout(
        Duration::from_millis(100),
        w.write_all(&Close::frame(CloseCode::ProtocolError, reason)),
    )
    .await;
    shared.emit(Event::Rejected {
        addr: remote.to_owned(),
        reason: reason.to_owned(),
    });
}

async fn handshake<R, W>(
    shared: &Shared,
    r: &mut R,
    w: &mut W,
    role: Dial,
    buf: &mut BytesMut,
    dec: &mut FrameDecoder,
) -> Result<Established, String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut hello = shared.local_hello();
    if role == Dial::Upstream {
        let me = shared.config.id;
        hello.downstream_of_you = Some(shared.config.subtree.unwrap_or((me, me)));
    }
    let mut hs = Handshake::new(role.role(), hello, shared.config.secret.clone());
    hs.set_clock_skew_max_ms(shared.config.clock_skew_max_ms);
    w.write_all(&hs.hello_frame())
        .await
        .map_err(|e| format!("sending HELLO: {e}"))?;
    loop {
        let frame = match dec.decode(buf) {
            Ok(Some(f)) => f,
            Ok(None) => {
                let n = r
                    .read_buf(buf)
                    .await
                    .map_err(|e| format!("reading the handshake: {e}"))?;
                if n == 0 {
                    return Err("the peer closed the connection during the handshake".into());
                }
                continue;
            }
            Err(e) => return Err(format!("bad frame in the handshake: {e}")),
        };
        let step = hs.handle_frame(&frame, crate::node::now_ms(), &mut shared.nonces());
        match step {
            Ok(Step::PeerHello(hello)) => {
                let (next_send, next_expected) = shared.resume_point(&hello);
                w.write_all(&hs.auth_frame(next_send, next_expected))
                    .await
                    .map_err(|e| format!("sending AUTH: {e}"))?
            }
            Ok(Step::Established(e)) => return Ok(*e),
            Err(e) => {
                if matches!(e, HandshakeError::BadProof) {
                    bump(&shared.counters.auth_failures);
                }
                return Err(e.to_string());
            }
        }
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    shared: &Shared,
    peer: &Peer,
    r: &mut R,
    buf: &mut BytesMut,
    dec: &mut FrameDecoder,
    last_rx_ms: &AtomicU64,
    shm: Option<&Arc<ShmLink>>,
) -> Result<ReadEnd, LinkError> {
    let mut read_size = READ_CHUNK_MIN_BYTES;
    loop {
        let mut switch_seen = false;
        // Walk every whole frame in the buffer, then cut the buffer once: the DATA payloads
        // go to the application as one batch sharing that cut.
        let mut spans = Vec::new();
        let mut routed: Vec<RoutedIn> = Vec::new();
        let mut forwards: Vec<(RoutedHeader, std::ops::Range<usize>)> = Vec::new();
        let mut pos = 0usize;
        let mut end = None;
        while end.is_none() {
            let (kind, frame_len) = match dec.peek(&buf[pos..]) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    end = Some(Err(LinkError::Decode(e)));
                    break;
                }
            };
            let body = &buf[pos + HEADER_LEN..pos + frame_len];
            match kind {
                FrameKind::Data | FrameKind::DataBatch => {
                    if let Err(what) = message_spans(kind, body, pos + HEADER_LEN, &mut spans) {
                        end = Some(Err(LinkError::Protocol(format!(
                            "{what} (frame at stream offset {})",
                            dec.offset() - frame_len as u64
                        ))));
                    }
                }
                FrameKind::Ping | FrameKind::Pong | FrameKind::Ack => {
                    let at = dec.offset() - frame_len as u64;
                    let Some(value) = decode_token(body) else {
                        end = Some(Err(LinkError::Protocol(format!(
                            "{kind:?} body of {} bytes (expected 8) at stream offset {at}",
                            body.len()
                        ))));
                        continue;
                    };
                    match kind {
                        FrameKind::Ping => peer.push_control(ping_frame(FrameKind::Pong, value)),
                        FrameKind::Pong => {
                            let rtt = shared.clock_us().saturating_sub(value);
                            peer.rtt_us.store(rtt.max(1), Relaxed);
                        }
                        _ => {
                            if let Err(e) = peer.ack(value) {
                                end = Some(Err(LinkError::Protocol(format!(
                                    "{e} (ACK at stream offset {at})"
                                ))));
                            }
                        }
                    }
                }
                FrameKind::Close => end = Some(Ok(ReadEnd::Close(Close::decode(body)))),
                kind @ (FrameKind::Hello | FrameKind::Auth) => {
                    end = Some(Err(LinkError::Protocol(format!(
                        "{kind:?} frame after the handshake, at stream offset {}",
                        dec.offset() - frame_len as u64
                    ))));
                }
                FrameKind::Routed => {
                    let at = dec.offset() - frame_len as u64;
                    let handled = RoutedHeader::decode(body).and_then(|(h, inner_at)| {
                        let inner = &body[inner_at..];
                        if h.dst != shared.config.id {
                            let inner_at = pos + HEADER_LEN + inner_at;
                            forwards.push((h, inner_at..pos + frame_len));
                            return Ok(());
                        }
                        if h.kind != RoutedType::Data {
                            return shared.routed_control(&h, inner);
                        }
                        let spans = inner_spans(inner)?;
                        let pending = routed.iter().rev().find(|r| r.src == h.src).map(|r| r.next);
                        match shared.check_routed(h.src, h.src_incarnation, h.seq, pending) {
                            Err(expected) => shared.report_gap(h.src, expected),
                            Ok(skip) => {
                                let base = pos + HEADER_LEN + inner_at;
                                let fresh: Vec<(u32, u32)> = spans
                                    .iter()
                                    .skip(skip as usize)
                                    .map(|&(s, n)| ((base + s) as u32, n as u32))
                                    .collect();
                                routed.push(RoutedIn {
                                    src: h.src,
                                    incarnation: h.src_incarnation,
                                    next: h.seq + spans.len() as u64,
                                    spans: fresh,
                                });
                            }
                        }
                        Ok(())
                    });
                    if let Err(what) = handled {
                        end = Some(Err(LinkError::Protocol(format!(
                            "{what} (ROUTED frame at stream offset {at})"
                        ))));
                    }
                }
                kind @ FrameKind::Channel => {
                    let at = dec.offset() - frame_len as u64;
                    let Some(shm) = shm else {
                        end = Some(Err(LinkError::Protocol(format!(
                            "{kind:?} frame, a capability this node did not advertise or not on this stream, at stream offset {at}"
                        ))));
                        continue;
                    };
                    match Channel::decode(body) {
                        Ok(msg) => {
                            switch_seen |= msg == Channel::Switch;
                            if let Some(answer) = shm.on_channel(msg) {
                                peer.push_control(answer);
                            }
                            // An ACCEPT lets the writer switch.
                            peer.writer_wake.notify_one();
                        }
                        Err(what) => {
                            end = Some(Err(LinkError::Protocol(format!(
                                "{what} (at stream offset {at})"
                            ))))
                        }
                    }
                }
            }
            pos += frame_len;
        }
        last_rx_ms.store(shared.clock_ms(), Relaxed);
        if pos > 0 {
            let chunk = buf.split_to(pos).freeze();
            for (h, inner) in forwards {
                bump(&shared.counters.relayed);
                shared.forward(peer.id, h, &chunk[inner]).await;
            }
            for r in routed {
                // Even a frame of duplicates is acknowledged: the sender may be waiting for it.
                if !r.spans.is_empty() {
                    let n = r.spans.len() as u64;
                    shared.counters.msgs_in.fetch_add(n, Relaxed);
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
                shared
                    .counters
                    .msgs_in
                    .fetch_add(spans.len() as u64, Relaxed);
                shared.counters.bytes_in.fetch_add(bytes, Relaxed);
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
        if switch_seen {
            // Everything the peer wrote on the socket before its SWITCH is delivered: its ring
            // may be read now.
            if let Some(shm) = shm {
                shm.switch_in();
            }
        }
        if let Some(end) = end {
            return end;
        }
        buf.reserve(dec.bytes_needed(buf).max(read_size));
        let n = r.read_buf(buf).await?;
        if n == 0 {
            if buf.is_empty() {
                return Ok(ReadEnd::Eof);
            }
            return Err(LinkError::Protocol(format!(
                "connection closed in the middle of a frame ({} bytes of it received) at stream offset {}",
                buf.len(),
                dec.offset()
            )));
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
