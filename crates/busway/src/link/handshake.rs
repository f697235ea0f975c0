//! A link's handshake, before it is up: the machine's frames written straight to the socket,
//! the peer's read until it is authenticated or refused, and a refused connection told why.

use crate::node::event::{Event, Rejection};
use crate::node::stats::bump;
use crate::peer::lifecycle;
use crate::shared::Shared;
use busway_core::control::CloseCode;
use busway_core::handshake::{Established, HandshakeError};
use busway_core::link::{Link, LinkError, LinkEvent, Spans};
use bytes::{Buf, BytesMut};
use std::io;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long a refused connection may take to receive the CLOSE that says why, in ms.
pub(super) const REJECT_WRITE_MS: u64 = 100;

/// Writes the machine's last frames (a CLOSE that says why) to a refused connection, briefly,
/// and reports the refusal.
pub(super) async fn reject<W: AsyncWrite + Unpin>(
    shared: &Shared,
    w: &mut W,
    machine: &mut Link,
    remote: &str,
    (kind, reason): (Rejection, &str),
) {
    bump(&shared.counters.handshake_failures);
    shared.warn_repeated("handshake failed", remote, reason);
    let mut out = Vec::new();
    while let Some(frame) = machine.poll_transmit() {
        out.extend_from_slice(&frame);
    }
    let _ = tokio::time::timeout(Duration::from_millis(REJECT_WRITE_MS), w.write_all(&out)).await;
    shared.emit(Event::Rejected {
        addr: remote.to_owned(),
        reason: reason.to_owned(),
        kind,
    });
}

/// The kind of a handshake that failed, read from the error (and the peer's CLOSE code).
fn rejection(e: &LinkError) -> Rejection {
    match e {
        LinkError::Handshake(
            HandshakeError::BadProof
            | HandshakeError::PeerRequiresSecret
            | HandshakeError::PeerHasNoSecret,
        ) => Rejection::Authentication,
        LinkError::Handshake(HandshakeError::ClosedByPeer(close)) => match close.code {
            CloseCode::Duplicate => Rejection::IdInUse,
            CloseCode::AuthFailed => Rejection::Authentication,
            _ => Rejection::Other,
        },
        _ => Rejection::Other,
    }
}

/// Writes what the machine has to send, straight to the socket (before the link is up).
pub(super) async fn write_transmits<W: AsyncWrite + Unpin>(
    w: &mut W,
    machine: &mut Link,
) -> io::Result<()> {
    while let Some(frame) = machine.poll_transmit() {
        w.write_all(&frame).await?;
    }
    Ok(())
}

/// Drives the handshake to its end: the peer authenticated, or why not (the machine then
/// holds the CLOSE to send).
pub(super) async fn handshake<R, W>(
    shared: &Shared,
    r: &mut R,
    w: &mut W,
    machine: &mut Link,
    buf: &mut BytesMut,
) -> Result<Established, (Rejection, String)>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut spans = Spans::new();
    // A TLS alert read during the busway handshake (TLS 1.3 ends the dialer's handshake before
    // the listener checked its certificate) makes the refusal TLS's.
    let mut tls_failed = false;
    loop {
        // Bounded by the handshake's deadline too: a peer that reads nothing cannot hold it.
        let deadline = shared.instant_at(machine.poll_timeout().unwrap_or_default());
        match tokio::time::timeout_at(deadline, write_transmits(w, machine)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => machine.fail(LinkError::Refused(format!("sending the handshake: {e}"))),
            Err(_) => machine.handle_timeout(shared.now()),
        }
        let n = machine.handle_input(buf, shared.now(), &mut spans);
        buf.advance(n);
        let mut progressed = n > 0;
        while let Some(event) = machine.poll_event() {
            match event {
                LinkEvent::PeerHello(hello) => {
                    if let Some((told, here)) = lifecycle::id_in_use(shared, &hello) {
                        machine.reject(CloseCode::Duplicate, &told);
                        return Err((Rejection::IdInUse, here));
                    }
                    let (next_send, next_expected) = lifecycle::resume_point(shared, &hello);
                    machine.send_auth(next_send, next_expected);
                    progressed = true;
                }
                LinkEvent::Established(e) => return Ok(*e),
                LinkEvent::Lost(e) => {
                    if matches!(e, LinkError::Handshake(HandshakeError::BadProof)) {
                        bump(&shared.counters.auth_failures);
                    }
                    let kind = if tls_failed {
                        Rejection::Tls
                    } else {
                        rejection(&e)
                    };
                    return Err((kind, e.to_string()));
                }
                // Nothing else comes before the peer is authenticated.
                _ => {}
            }
        }
        if progressed {
            continue;
        }
        let deadline = machine.poll_timeout().unwrap_or_default();
        let read = tokio::time::timeout_at(shared.instant_at(deadline), r.read_buf(buf));
        match read.await {
            Ok(Ok(0)) => {
                machine.fail(LinkError::Refused(
                    "the peer closed the connection during the handshake".into(),
                ));
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                // On TLS, the peer's alert refusing this node's certificate may come here:
                // TLS 1.3 ends the dialer's handshake before the listener checked it.
                tls_failed |= crate::link::tls::why::is_tls(&e);
                let e = crate::link::tls::why::io(&e);
                machine.fail(LinkError::Refused(format!("reading the handshake: {e}")));
            }
            Err(_) => machine.handle_timeout(shared.now()),
        }
    }
}
