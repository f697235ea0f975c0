//! The link part: connections, from the socket to the protocol machine and back.
//!
//! **Owns**: the transports (TCP, TLS, Unix; `transport`, `tls`), the listeners' accept loops
//! and the dial loops with their backoff (`connector`, `backoff`, `dial`), the limits on
//! connections and handshakes (`admission`), the held-back warnings about them
//! (`warn_limit`), the I/O loops every link runs on (`io_loops`), and each connection's task
//! (this module, `read`, `write`, `machine`).
//!
//! **Runs on**: the node's I/O loops (threads each running a single-threaded tokio runtime);
//! one task per connection owns both halves of its socket.
//!
//! **May call**: the peer part (attach a link to its `Peer`, take its queued frames, ring
//! negotiation), the route part (relayed frames, registrations, hints), the inbox's sender and
//! the node's events and counters, as functions that take the node (`Shared`). It decides nothing of the protocol:
//! busway-core's `link::Link` does.
//!
//! # One connection
//!
//! One connection's life, driven by its protocol state machine ([`busway_core::link::Link`]):
//! handshake, then a reader, a writer and the machine's timers, then teardown.
//!
//! A link task runs on one I/O loop and owns both halves of its socket. The reader feeds the
//! machine reads of at least `READ_CHUNK_MIN_BYTES`, acts on what it reports (acknowledgements,
//! relayed frames, ring negotiation) and hands DATA payloads to the inbox a batch per read,
//! cut out of the read without a copy; the writer takes everything the send queue holds and
//! writes it in one `writev`. The machine decides; this file moves bytes and runs timers.
//!
//! The task's functions return `async move` blocks rather than being `async fn`s: an
//! `async fn` keeps each argument twice in its future (as passed, and moved into its body),
//! and an idle connection's memory is mostly these nested futures.

pub(crate) mod admission;
pub(crate) mod backoff;
pub(crate) mod connector;
pub(crate) mod dial;
pub(crate) mod io_loops;
pub(crate) mod state;
pub(crate) mod tls;
pub(crate) mod transport;
pub(crate) mod warn_limit;

mod handshake;
mod machine;
mod read;
#[cfg(test)]
mod tests;
mod write;

use crate::limits::{HEARTBEAT_MISSES_MAX, READ_CHUNK_FIRST_BYTES};
use crate::link::admission::Handshaking;
use crate::link::dial::{Dial, Outcome};
use crate::link::transport::{StdStream, Stream};
use crate::node::event::{DownReason, Event, Rejection};
use crate::node::stats::bump;
use crate::peer::lifecycle;
use crate::peer::shm_link::ShmLink;
use crate::peer::Peer;
use crate::route::direct;
use crate::route::registrations;
use crate::route::tasks;
use crate::shared::Shared;
use busway_core::cert_ids::CertIds;
use busway_core::control::{ack_frame, Close, CloseCode};
use busway_core::link::{Link, LinkConfig, LinkError};
use bytes::BytesMut;
use handshake::{reject, REJECT_WRITE_MS};
use machine::{down_reason, timers};
use read::{read_loop, ReadEnd};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use write::write_loop;

/// Runs an accepted connection from handshake to close on the calling loop; refuses it at
/// once, with a CLOSE that says why, past the node's connection or handshake limits.
#[allow(clippy::manual_async_fn)] // not an `async fn` on purpose (see the module's note)
pub(crate) fn serve_std(
    shared: Arc<Shared>,
    stream: StdStream,
    remote: String,
) -> impl Future<Output = Outcome> {
    async move {
        let stream = match stream.register() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%remote, error = %e, "could not register an accepted socket");
                return Outcome::NeverUp;
            }
        };
        let admitted = shared.links.admission.accepted();
        let (_open, handshaking) = match admitted {
            Ok(counted) => counted,
            Err(why) => {
                refuse(&shared, stream, &remote, &why).await;
                return Outcome::NeverUp;
            }
        };
        serve_counted(&shared, stream, Dial::Accepted, remote, Some(handshaking)).await
    }
}

/// Runs a dialed connection from handshake to close.
#[allow(clippy::manual_async_fn)] // not an `async fn` on purpose (see the module's note)
pub(crate) fn serve(
    shared: Arc<Shared>,
    stream: Stream,
    role: Dial,
    remote: String,
) -> impl Future<Output = Outcome> {
    async move {
        let _open = shared.links.admission.dialed();
        serve_counted(&shared, stream, role, remote, None).await
    }
}

#[allow(clippy::manual_async_fn)] // not an `async fn` on purpose (see the module's note)
fn serve_counted<'a>(
    shared: &'a Arc<Shared>,
    stream: Stream,
    role: Dial,
    remote: String,
    handshaking: Option<Handshaking<'a>>,
) -> impl Future<Output = Outcome> + 'a {
    async move {
        bump(&shared.counters.connections);
        match stream {
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                run(shared.clone(), r, w, role, remote, handshaking, None).await
            }
            Stream::Unix(s) => {
                let (r, w) = s.into_split();
                run(shared.clone(), r, w, role, remote, handshaking, None).await
            }
            Stream::TlsAccepted(s) | Stream::TlsDialed(s) => {
                let Some(tls) = shared.config().tls.as_ref() else {
                    // Refused when the node starts (`NodeConfig::validate`); a hinted tls://
                    // address is not dialed without it.
                    return Outcome::NeverUp;
                };
                let wait = Duration::from_millis(shared.config().handshake_timeout_ms);
                let handshake = async {
                    if role == Dial::Accepted {
                        tls.accept(s).await
                    } else {
                        tls.connect(s).await
                    }
                };
                let (s, ids) = match tokio::time::timeout(wait, handshake).await {
                    Ok(Ok(done)) => done,
                    Ok(Err(why)) => return tls_failed(shared, &remote, &why),
                    Err(_) => {
                        let why = format!("TLS handshake took more than {} ms", wait.as_millis());
                        return tls_failed(shared, &remote, &why);
                    }
                };
                let (r, w) = tokio::io::split(s);
                run(shared.clone(), r, w, role, remote, handshaking, Some(ids)).await
            }
        }
    }
}

/// A TLS handshake that failed: reported (`Event::Rejected`) and counted like a refused
/// busway handshake; there is no channel to tell the peer more than TLS did.
fn tls_failed(shared: &Shared, remote: &str, why: &str) -> Outcome {
    bump(&shared.counters.handshake_failures);
    shared.warn_repeated("TLS handshake failed", remote, why);
    shared.emit(Event::Rejected {
        addr: remote.to_owned(),
        reason: why.to_owned(),
        kind: Rejection::Tls,
    });
    Outcome::NeverUp
}

/// Refuses an accepted connection before its handshake: a CLOSE naming why, briefly, then it
/// is dropped; reported and counted.
async fn refuse(shared: &Shared, stream: Stream, remote: &str, why: &str) {
    bump(&shared.counters.connections_refused);
    shared.warn_repeated("connection refused", remote, why);
    let close = Close::frame(CloseCode::ProtocolError, why);
    let write = async {
        match stream {
            Stream::Tcp(mut s) => s.write_all(&close).await,
            Stream::Unix(mut s) => s.write_all(&close).await,
            // Before its TLS handshake a busway CLOSE could not be read: dropped.
            Stream::TlsAccepted(_) | Stream::TlsDialed(_) => Ok(()),
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(REJECT_WRITE_MS), write).await;
    shared.emit(Event::Rejected {
        addr: remote.to_owned(),
        reason: why.to_owned(),
        kind: Rejection::Other,
    });
}

/// The state machine's settings for a connection of this node.
fn link_config(
    shared: &Shared,
    role: Dial,
    remote: &str,
    peer_cert_ids: Option<CertIds>,
) -> LinkConfig {
    let c = &shared.config();
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
        peer_cert_ids,
        remote: remote.to_owned(),
    }
}

#[allow(clippy::manual_async_fn)] // not an `async fn` on purpose (see the module's note)
fn run<'h, R, W>(
    shared: Arc<Shared>,
    mut r: R,
    mut w: W,
    role: Dial,
    remote: String,
    handshaking: Option<Handshaking<'h>>,
    peer_cert_ids: Option<CertIds>,
) -> impl Future<Output = Outcome> + 'h
where
    R: AsyncRead + read::WaitReadable + Unpin + 'h,
    W: AsyncWrite + Unpin + 'h,
{
    async move {
        let mut buf = BytesMut::with_capacity(READ_CHUNK_FIRST_BYTES);
        let mut hello = shared.local_hello();
        if role == Dial::Upstream {
            let me = shared.config().id;
            hello.downstream_of_you = Some(shared.config().subtree.unwrap_or((me, me)));
        }
        let config = link_config(&shared, role, &remote, peer_cert_ids);
        // In its mutex from the start (taken without locking until the link is up): one place
        // for the machine in the task, not one before the handshake and one after.
        let mut machine = Mutex::new(Link::new(
            config,
            hello,
            shared.links.nonces.clone(),
            shared.now(),
        ));
        let m = machine.get_mut().unwrap_or_else(|p| p.into_inner());
        // Boxed, and freed once the link is up: the handshake's state and result are not kept in
        // the task for the link's life (an idle link's memory is mostly its task).
        let up = Box::pin(come_up(
            &shared,
            &mut r,
            &mut w,
            m,
            &mut buf,
            role,
            remote,
            handshaking,
        ));
        let Some((peer, link_id)) = up.await else {
            return Outcome::NeverUp;
        };
        // The machine asks for rings (LinkEvent::OfferRing) when both ends share a host.
        let shm = m
            .uses_rings()
            .then(|| Arc::new(ShmLink::new(shared.clone(), peer.clone(), link_id)));
        let attachment = Attachment {
            shared: &shared,
            peer: &peer,
            link_id,
            detached: false,
        };
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
            link_id,
        )
        .await;
        drop(end_rings);
        attachment.detach(reason);
        Outcome::WasUp
    }
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

/// A link attached to its peer: detached when the task says why (`detach`), or else when it
/// is dropped, so that a link task that panics (there should be none) or is stopped mid-way
/// still lets its peer go down, be dialed again and have its messages resent or reported,
/// rather than stay "up" on a link nobody drives.
struct Attachment<'a> {
    shared: &'a Arc<Shared>,
    peer: &'a Arc<Peer>,
    link_id: u64,
    detached: bool,
}

impl Attachment<'_> {
    fn detach(mut self, reason: DownReason) {
        self.detached = true;
        lifecycle::detach_peer(self.shared, self.peer, self.link_id, reason);
    }
}

impl Drop for Attachment<'_> {
    fn drop(&mut self) {
        if self.detached {
            return;
        }
        let why = if std::thread::panicking() {
            "the link's task panicked"
        } else {
            "the link's task was stopped"
        };
        tracing::error!(peer = %self.peer.id, why, "link ended abnormally");
        lifecycle::detach_peer(
            self.shared,
            self.peer,
            self.link_id,
            DownReason::Io(why.into()),
        );
    }
}

/// The handshake, then the link attached to its peer and announced; `None` if it was refused
/// (the peer told why).
#[allow(clippy::too_many_arguments)]
async fn come_up<R, W>(
    shared: &Arc<Shared>,
    r: &mut R,
    w: &mut W,
    m: &mut Link,
    buf: &mut BytesMut,
    role: Dial,
    remote: String,
    handshaking: Option<Handshaking<'_>>,
) -> Option<(Arc<Peer>, u64)>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let established = match handshake::handshake(shared, r, w, m, buf).await {
        Ok(e) => e,
        Err((kind, reason)) => {
            reject(shared, w, m, &remote, (kind, &reason)).await;
            return None;
        }
    };
    // Authenticated: no longer a stranger's handshake.
    drop(handshaking);
    let id = established.peer.bus_id;
    let link_id = shared.next_link_id();
    let peer = match lifecycle::attach_peer(shared, &established, &remote, link_id, role) {
        Ok(p) => p,
        Err(reason) => {
            m.reject(CloseCode::Duplicate, &reason);
            reject(shared, w, m, &remote, (Rejection::IdInUse, &reason)).await;
            return None;
        }
    };
    // Before anyone hears of the link: what went to this id through relays first must be
    // acknowledged before the link carries messages (order across the switch).
    direct::switch_to_direct(shared, &peer);
    lifecycle::peer_ready(shared, &peer, role);
    // A downstream's range goes to our upstream before the downstream is read: what it sends
    // first can go up.
    registrations::downstream_came(shared, &peer).await;
    // Relayed messages held for want of a path may have one now.
    tasks::relink_remotes(shared);
    tracing::debug!(peer = %id, %remote, "link up");
    shared.emit(Event::PeerUp {
        peer: id,
        incarnation: established.peer.incarnation,
        addr: remote,
    });
    Some((peer, link_id))
}

/// Runs the reader, the writer and the machine's timers of an established link until the link
/// is done; returns why it went down.
#[allow(clippy::manual_async_fn)] // not an `async fn` on purpose (see the module's note)
#[allow(clippy::too_many_arguments)]
fn run_up<'a, R, W>(
    shared: &'a Shared,
    peer: &'a Peer,
    r: &'a mut R,
    w: &'a mut W,
    buf: &'a mut BytesMut,
    machine: &'a Mutex<Link>,
    shm: Option<&'a Arc<ShmLink>>,
    link_id: u64,
) -> impl Future<Output = DownReason> + 'a
where
    R: AsyncRead + read::WaitReadable + Unpin,
    W: AsyncWrite + Unpin,
{
    async move {
        let linger = Duration::from_millis(shared.config().linger_ms);
        let reader = read_loop(shared, peer, r, buf, machine, shm, link_id);
        let looks = shared.peers.deferred();
        let writer = write_loop(w, peer, machine, shm.map(|s| &**s), looks);
        let timers = timers(shared, peer, machine);
        // The application reads the peer's ring (see `ring_rx`); the link task sends its
        // acknowledgements and ends the link if the ring turns out bad.
        let ring_fault = async {
            match shm {
                // Boxed: only a link with a ring has this wait; the others keep no room for it.
                Some(shm) => {
                    Box::pin(async {
                        tokio::select! {
                            why = shm.ring.fault() => why,
                            never = shm.ring.ack_loop() => match never {},
                            never = shm.watch_replies() => match never {},
                        }
                    })
                    .await
                }
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
                    Ok(ReadEnd::Close(c)) if c.code == CloseCode::Shutdown => {
                        DownReason::PeerShutDown
                    }
                    Ok(ReadEnd::Close(c)) => DownReason::ClosedByPeer(c.reason),
                    Ok(ReadEnd::Eof) => DownReason::ClosedByPeer("connection closed".into()),
                    Err(reason) => return reason,
                };
                if let Some(shm) = shm {
                    // What the peer put in its ring before closing is delivered first (its
                    // acknowledgement goes out with our CLOSE).
                    // Boxed: only a link with a ring, at its end, has this wait.
                    // The ring's watch goes on meanwhile: an application that does not read
                    // its inbox (a relay) leaves the ring to it.
                    let drained = Box::pin(tokio::time::timeout(linger, async {
                        tokio::select! {
                            _ = shm.ring.wait_drained() => {}
                            _ = &mut ring_fault => {}
                        }
                    }));
                    let _ = drained.await;
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
            lie = peer.cut_requested(link_id) => match lie {
                Some(why) => down_reason(shared, peer.id, LinkError::Protocol(why)),
                None => DownReason::Io("link cut by Node::disconnect".into()),
            },
        }
    }
}
