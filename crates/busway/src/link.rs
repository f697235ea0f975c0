//! One connection's life: handshake, then a reader and a writer, then teardown.
//!
//! A link task runs on one I/O loop and owns both halves of its socket. The reader cuts frames
//! out of reads of at least `READ_CHUNK_MIN_BYTES` and hands DATA payloads to the inbox a batch
//! per read; the writer takes everything the send queue holds and writes it in one `writev`.

use crate::event::{DownReason, Event};
use crate::inbox::MessageBatch;
use crate::limits::{READ_CHUNK_MAX_BYTES, READ_CHUNK_MIN_BYTES, WRITEV_SEGMENTS_MAX};
use crate::node::Shared;
use crate::send_queue::{SendQueue, Take};
use crate::stats::bump;
use crate::transport::{StdStream, Stream};
use busway_core::control::{decode_token, ping_frame, Close, CloseCode};
use busway_core::frame::{for_each_batch_entry, HANDSHAKE_BODY_LEN_MAX, HEADER_LEN};
use busway_core::handshake::{Established, Handshake, HandshakeError, Role, Step};
use busway_core::{BusId, DecodeError, FrameDecoder, FrameKind};
use bytes::{Buf, Bytes, BytesMut};
use std::io::{self, IoSlice};
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

/// Runs a connection from handshake to close on the calling loop.
pub(crate) async fn serve_std(
    shared: Arc<Shared>,
    stream: StdStream,
    role: Role,
    remote: String,
) -> Outcome {
    match stream.register() {
        Ok(s) => serve(shared, s, role, remote).await,
        Err(e) => {
            tracing::warn!(%remote, error = %e, "could not register an accepted socket");
            Outcome::NeverUp
        }
    }
}

pub(crate) async fn serve(
    shared: Arc<Shared>,
    stream: Stream,
    role: Role,
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

async fn run<R, W>(shared: Arc<Shared>, mut r: R, mut w: W, role: Role, remote: String) -> Outcome
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
    let peer = established.peer.bus_id;
    let queue = Arc::new(SendQueue::new(shared.config.send_queue_bytes_max));
    let link_id = match shared.register_peer(&established, &remote, queue.clone()) {
        Ok(id) => id,
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
    tracing::debug!(%peer, %remote, "link up");
    shared.emit(Event::PeerUp {
        peer,
        incarnation: established.peer.incarnation,
        addr: remote,
    });
    dec.set_body_len_max(shared.config.frame_body_max);
    let reason = run_up(&shared, peer, &queue, &mut r, &mut w, &mut buf, &mut dec).await;
    let unsent = queue.close();
    shared.unregister_peer(peer, link_id, &queue);
    tracing::debug!(%peer, %reason, unsent, "link down");
    shared.emit(Event::PeerDown {
        peer,
        reason,
        unsent,
    });
    Outcome::WasUp
}

/// Runs the reader and the writer of an established link until both are done; returns why the
/// link went down.
async fn run_up<R, W>(
    shared: &Shared,
    peer: BusId,
    queue: &SendQueue,
    r: &mut R,
    w: &mut W,
    buf: &mut BytesMut,
    dec: &mut FrameDecoder,
) -> DownReason
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let linger = Duration::from_millis(shared.config.linger_ms);
    let reader = read_loop(shared, peer, queue, r, buf, dec);
    let writer = write_loop(w, queue);
    tokio::pin!(reader, writer);
    tokio::select! {
        end = &mut reader => {
            let reason = match end {
                Ok(ReadEnd::Close(c)) => DownReason::ClosedByPeer(c.reason),
                Ok(ReadEnd::Eof) => DownReason::ClosedByPeer("connection closed".into()),
                Err(e) => return link_error(shared, peer, e),
            };
            // The peer is going: send it what is already queued, then our CLOSE.
            queue.close();
            let _ = tokio::time::timeout(linger, &mut writer).await;
            reason
        }
        done = &mut writer => {
            if let Err(e) = done {
                return DownReason::Io(e.to_string());
            }
            // Our CLOSE is out: read what the peer still sends until it closes too.
            match tokio::time::timeout(linger, &mut reader).await {
                Ok(Err(e)) => link_error(shared, peer, e),
                _ => DownReason::Shutdown,
            }
        }
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
    role: Role,
    buf: &mut BytesMut,
    dec: &mut FrameDecoder,
) -> Result<Established, String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut hs = Handshake::new(role, shared.local_hello(), shared.config.secret.clone());
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
            Ok(Step::SendAuth(auth)) => w
                .write_all(&auth)
                .await
                .map_err(|e| format!("sending AUTH: {e}"))?,
            Ok(Step::Established(e)) => return Ok(e),
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
    peer: BusId,
    queue: &SendQueue,
    r: &mut R,
    buf: &mut BytesMut,
    dec: &mut FrameDecoder,
) -> Result<ReadEnd, LinkError> {
    let mut read_size = READ_CHUNK_MIN_BYTES;
    loop {
        // Walk every whole frame in the buffer, then cut the buffer once: the DATA payloads
        // go to the application as one batch sharing that cut.
        let mut spans = Vec::new();
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
                FrameKind::Data => {
                    spans.push(((pos + HEADER_LEN) as u32, body.len() as u32));
                }
                FrameKind::DataBatch => {
                    let base = pos + HEADER_LEN;
                    let before = spans.len();
                    let walked = for_each_batch_entry(body, |start, len| {
                        spans.push(((base + start) as u32, len as u32));
                    });
                    if let Err(what) = walked {
                        spans.truncate(before);
                        end = Some(Err(LinkError::Protocol(format!(
                            "{what} (frame at stream offset {})",
                            dec.offset() - frame_len as u64
                        ))));
                    }
                }
                FrameKind::Ping => match decode_token(body) {
                    Some(t) => {
                        let _ = queue.push_control(ping_frame(FrameKind::Pong, t));
                    }
                    None => {
                        end = Some(Err(LinkError::Protocol(format!(
                            "PING body of {} bytes (expected 8) at stream offset {}",
                            body.len(),
                            dec.offset() - frame_len as u64
                        ))));
                    }
                },
                FrameKind::Pong => {}
                FrameKind::Close => end = Some(Ok(ReadEnd::Close(Close::decode(body)))),
                kind @ (FrameKind::Hello | FrameKind::Auth) => {
                    end = Some(Err(LinkError::Protocol(format!(
                        "{kind:?} frame after the handshake, at stream offset {}",
                        dec.offset() - frame_len as u64
                    ))));
                }
                kind @ (FrameKind::Routed | FrameKind::Ack | FrameKind::Channel) => {
                    end = Some(Err(LinkError::Protocol(format!(
                        "{kind:?} frame, a capability this node did not advertise, at stream offset {}",
                        dec.offset() - frame_len as u64
                    ))));
                }
            }
            pos += frame_len;
        }
        if pos > 0 {
            let chunk = buf.split_to(pos).freeze();
            if !spans.is_empty() {
                let bytes: u64 = spans.iter().map(|&(_, len)| u64::from(len)).sum();
                shared
                    .counters
                    .msgs_in
                    .fetch_add(spans.len() as u64, Relaxed);
                shared.counters.bytes_in.fetch_add(bytes, Relaxed);
                shared
                    .inbox
                    .deliver(MessageBatch::new(peer, chunk, spans))
                    .await;
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

async fn write_loop<W: AsyncWrite + Unpin>(w: &mut W, queue: &SendQueue) -> io::Result<()> {
    let mut batch: Vec<Bytes> = Vec::with_capacity(WRITEV_SEGMENTS_MAX);
    loop {
        match queue.take(&mut batch) {
            Take::Idle => queue.writer_wake.notified().await,
            Take::Drained => {
                w.write_all(&Close::frame(CloseCode::Normal, "closing"))
                    .await?;
                w.shutdown().await?;
                return Ok(());
            }
            Take::Bytes(n) => {
                write_batch(w, &mut batch).await?;
                queue.complete(n);
            }
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
