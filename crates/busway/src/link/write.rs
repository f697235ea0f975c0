//! A link's write side: what the send queue holds goes out in one `writev`, or into the
//! link's shared-memory ring once it switched.

use super::machine::lock;
use crate::limits::{ACK_WAIT_MS_MAX, ACK_WAIT_TURNS, WRITEV_SEGMENTS_MAX, WRITE_BATCH_IDLE_PARTS};
use crate::peer::deferred::Deferred;
use crate::peer::ring_tx::{wait_for_room, Flush, RingWriter};
use crate::peer::shm_link::ShmLink;
use crate::peer::{Peer, Take};
use busway_core::channel::Channel;
use busway_core::control::{ack_frame, Close, CloseCode};
use busway_core::link::Link;
use bytes::{Buf, Bytes};
use std::io::{self, IoSlice};
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// An `async move` block rather than an `async fn`, which would keep every argument twice.
#[allow(clippy::manual_async_fn)] // see the doc line above
pub(super) fn write_loop<'a, W: AsyncWrite + Unpin>(
    w: &'a mut W,
    peer: &'a Peer,
    machine: &'a Mutex<Link>,
    shm: Option<&'a ShmLink>,
    looks: &'a Deferred,
) -> impl std::future::Future<Output = io::Result<()>> + 'a {
    async move {
        // Grows with the first writes (an idle link holds no large list).
        let mut batch: Vec<Bytes> = Vec::new();
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
                flush_ring(w, peer, &mut batch).await?;
                match peer.take_control(&mut batch) {
                    Take::Idle => peer.writer_wake.notified().await,
                    Take::Drained => {
                        if let Some(mut ring) = peer.end_ring() {
                            ring.close();
                        }
                        return write_close(w, peer).await;
                    }
                    // (`take_control` never answers `Control`.)
                    Take::Data | Take::Control => write_batch(w, &mut batch).await?,
                }
                continue;
            }
            match peer.take(&mut batch) {
                Take::Idle => {
                    // Waiting for more: a list grown by a burst goes back (an idle link writes a
                    // PONG now and then, one part).
                    if batch.capacity() > WRITE_BATCH_IDLE_PARTS {
                        batch = Vec::new();
                    }
                    peer.writer_wake.notified().await
                }
                Take::Drained => return write_close(w, peer).await,
                Take::Data => write_batch(w, &mut batch).await?,
                Take::Control => {
                    wait_for_an_answer(peer, looks).await;
                    let after = peer.take(&mut batch);
                    write_batch(w, &mut batch).await?;
                    if matches!(after, Take::Drained) {
                        return write_close(w, peer).await;
                    }
                }
            }
        }
    }
}

/// Only the ACK of a read is taken (`Take::Control`), in the same turn as the read (the link's
/// task reads too), of messages the application was waiting for in its inbox (so it handles
/// them at once). Waits for its next look there first (`ACK_WAIT_TURNS` turns of the runtime,
/// then at most `ACK_WAIT_MS_MAX`, rounded up to the timer's next millisecond), or the next
/// push to this peer: the application looks again once it handled what it got, so an answer
/// to that goes in the same write as the ACK, and an exchange costs each side one write and
/// the peer one wake-up, not two of each. A push ends the wait at once (a caller whose reply
/// came and who calls again has its next call carry the ACK). A busy application (a stream's
/// reader) and a node that reads no inbox (a relay) get their ACKs written at once.
async fn wait_for_an_answer(peer: &Peer, looks: &Deferred) {
    tokio::select! {
        () = looks.next_look(ACK_WAIT_TURNS, Duration::from_millis(ACK_WAIT_MS_MAX)) => {}
        () = peer.writer_wake.notified() => {}
    }
}

/// Ends the link cleanly: the last acknowledgement first (messages read from the peer's ring
/// are acknowledged on a timer, which may not have fired yet: without it the peer would hold
/// what it sent until its deadline), then CLOSE: `Shutdown` when this node shuts down (its
/// peers give up on this incarnation at once), else `Normal` (the answer to the peer's).
async fn write_close<W: AsyncWrite + Unpin>(w: &mut W, peer: &Peer) -> io::Result<()> {
    let mut last = ack_frame(peer.inbound_expected()).to_vec();
    let close = if peer.is_closing() {
        Close::frame(CloseCode::Shutdown, "shutting down")
    } else {
        Close::frame(CloseCode::Normal, "closing")
    };
    last.extend_from_slice(&close);
    w.write_all(&last).await?;
    w.shutdown().await
}

/// Moves the peer's queued messages into its ring, waiting (on a blocking thread, on the
/// ring's futex) while the ring is full. A full ring is backpressure, not a dead link: control
/// frames (heartbeats, acknowledgements) still go out on the socket meanwhile. Gives up on a
/// full ring once the peer closed the link (nobody will free the ring); our own node closing
/// waits on, bounded by its linger time.
async fn flush_ring<W: AsyncWrite + Unpin>(
    w: &mut W,
    peer: &Peer,
    batch: &mut Vec<Bytes>,
) -> io::Result<()> {
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
        let mut room = tokio::task::spawn_blocking(move || wait_for_room(&waiter));
        let closed = loop {
            // Room first: a steady stream of control frames (a relay's) must not keep the
            // ring from being refilled.
            if room.is_finished() {
                break (&mut room).await.unwrap_or(false);
            }
            if peer.take_control_only(batch) {
                write_batch(w, batch).await?;
                continue;
            }
            tokio::select! {
                biased;
                closed = &mut room => break closed.unwrap_or(false),
                () = peer.writer_wake.notified() => {}
            }
        };
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
