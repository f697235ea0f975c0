//! A link's data through shared memory. When both ends of a link run on one host (same host
//! identity in HELLO) and advertise `shm`, each offers the ring it will write (CHANNEL OFFER);
//! the other opens it through `/proc/PID/fd/FD` and accepts. The offerer then writes SWITCH on
//! the socket and its messages go into the ring from there on; the socket stays the control
//! link (acknowledgements, heartbeats, relayed frames). The receiver reads the ring only after
//! it read SWITCH, so order holds. A ring lives and dies with its link: what it held
//! unacknowledged is written again on the next link, like anything else.

use crate::limits::{RING_FULL_RETRY_MS, RING_READ_BATCH_RECORDS, RING_RECORD_BYTES_MAX};
use crate::node::Shared;
use crate::stats::bump;
use busway_core::channel::Channel;
use busway_shm::ring::{Consumer, Producer, Ring, Wait};
use busway_shm::Segment;
use bytes::{Buf, Bytes, BytesMut};
use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::{mpsc, Notify};

/// This host's identity for HELLO: the kernel's boot id (the same for every process of one
/// boot of one machine, and container-independent); empty if it cannot be read.
pub(crate) fn host_identity() -> Vec<u8> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().as_bytes().to_vec())
        .unwrap_or_default()
}

/// One link's shared-memory state, shared by its reader and writer.
#[derive(Default)]
pub(crate) struct ShmLink {
    /// Our ring toward the peer, from the OFFER until the writer takes it.
    outbound: Mutex<Option<Producer>>,
    /// The peer accepted our ring: the writer switches.
    accepted: AtomicBool,
    /// The peer's ring, opened at its OFFER, read once its SWITCH was read.
    inbound: Mutex<Option<Consumer>>,
    /// The SWITCH was read and everything before it delivered.
    switched_in: Notify,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ShmLink {
    /// Creates our ring toward the peer and returns the OFFER to send, or why not.
    pub(crate) fn offer(&self, capacity: usize) -> Result<Bytes, String> {
        let ring = Ring::create_unchecked("busway-link", capacity).map_err(|e| e.to_string())?;
        let seg = ring.segment();
        let inode = seg.inode().map_err(|e| e.to_string())?;
        let frame = Channel::Offer {
            pid: std::process::id(),
            fd: seg.fd().as_raw_fd() as u32,
            inode,
            capacity: capacity as u64,
        }
        .frame();
        *lock(&self.outbound) = Some(ring.producer());
        Ok(frame)
    }

    /// A CHANNEL frame from the peer: what to answer on the socket, if anything.
    pub(crate) fn on_channel(&self, shared: &Shared, msg: Channel) -> Option<Bytes> {
        match msg {
            Channel::Offer {
                pid,
                fd,
                inode,
                capacity,
            } => {
                let opened = Segment::open_from_process(pid, fd, inode)
                    .map_err(|e| e.to_string())
                    .and_then(|s| Ring::open(s).map_err(|e| e.to_string()))
                    .and_then(|r| {
                        if r.capacity() as u64 == capacity {
                            Ok(r)
                        } else {
                            Err(format!(
                                "ring of {} bytes, {capacity} announced",
                                r.capacity()
                            ))
                        }
                    });
                Some(match opened {
                    Ok(ring) => {
                        *lock(&self.inbound) = Some(ring.consumer());
                        Channel::Accept.frame()
                    }
                    Err(why) => {
                        tracing::warn!(%why, "cannot open the peer's shared-memory ring");
                        Channel::Refuse(why).frame()
                    }
                })
            }
            Channel::Accept => {
                self.accepted.store(true, Relaxed);
                None
            }
            Channel::Refuse(why) => {
                tracing::warn!(%why, "the peer refused our shared-memory ring; staying on the socket");
                lock(&self.outbound).take();
                None
            }
            Channel::Switch => {
                if lock(&self.inbound).is_some() {
                    bump(&shared.counters.shm_channels);
                }
                None
            }
        }
    }

    /// Everything before the peer's SWITCH was delivered: the ring reader may start.
    pub(crate) fn switch_in(&self) {
        self.switched_in.notify_one();
    }

    /// Whether the writer should switch now; if so, the producer it writes with from now on.
    pub(crate) fn take_producer(&self) -> Option<Producer> {
        if !self.accepted.load(Relaxed) {
            return None;
        }
        lock(&self.outbound).take()
    }

    /// Waits for the peer's SWITCH, then returns a reader of its ring (a byte stream of the
    /// frames it writes there). Pends forever on a link that never switches.
    pub(crate) async fn inbound_reader(&self, spins: u32) -> RingReader {
        loop {
            self.switched_in.notified().await;
            if let Some(c) = lock(&self.inbound).take() {
                return RingReader::start(c, spins);
            }
        }
    }
}

/// Writes `messages` (frames, as the socket would get them) into the ring, waiting while it is
/// full, then publishes them. Gives up on a full ring once `closing()` says the link is going
/// (its reader saw the peer close: nobody will free the ring).
pub(crate) async fn write_ring(
    p: &mut Producer,
    messages: &mut Vec<Bytes>,
    closing: impl Fn() -> bool,
) -> io::Result<()> {
    for b in messages.drain(..) {
        let mut rest = &b[..];
        while !rest.is_empty() {
            let n = rest.len().min(RING_RECORD_BYTES_MAX);
            let pushed = p
                .try_push(&rest[..n])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            if pushed {
                rest = &rest[n..];
                continue;
            }
            p.publish();
            // Full: the reader frees it in large steps; give it a moment.
            if p.wait_for_room(n, Duration::ZERO) == Wait::Closed {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the peer closed its end of the shared-memory ring",
                ));
            }
            if closing() {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the link is closing and its shared-memory ring is full",
                ));
            }
            tokio::task::yield_now().await;
            if p.wait_for_room(n, Duration::ZERO) != Wait::Ready {
                tokio::time::sleep(Duration::from_millis(RING_FULL_RETRY_MS)).await;
            }
        }
    }
    p.publish();
    Ok(())
}

/// The peer's ring as an `AsyncRead`: a thread of its own waits on the ring (futex) and hands
/// batches of records over a bounded channel (when it is full, the thread waits: the ring
/// fills, and the peer's writer waits for room).
pub(crate) struct RingReader {
    rx: mpsc::Receiver<Result<Bytes, String>>,
    pending: Bytes,
}

impl RingReader {
    /// Starts the thread; it spins `spins` times on an empty ring before it sleeps.
    fn start(mut c: Consumer, spins: u32) -> Self {
        let (tx, rx) = mpsc::channel(crate::limits::RING_READ_QUEUE_LEN);
        let spawned = std::thread::Builder::new()
            .name("busway-shm-rx".into())
            .spawn(move || {
                let mut chunk = BytesMut::new();
                loop {
                    if tx.is_closed() {
                        return;
                    }
                    let read = c.read(RING_READ_BATCH_RECORDS, |m| chunk.extend_from_slice(m));
                    if let Err(e) = read {
                        let _ = tx.blocking_send(Err(e.to_string()));
                        return;
                    }
                    if !chunk.is_empty() {
                        if tx.blocking_send(Ok(chunk.split().freeze())).is_err() {
                            return;
                        }
                        continue;
                    }
                    if c.wait_readable(spins, Duration::from_millis(100)) == Wait::Closed
                        && !c.is_readable()
                    {
                        return;
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a shared-memory reader thread");
        }
        Self {
            rx,
            pending: Bytes::new(),
        }
    }
}

impl Drop for RingReader {
    fn drop(&mut self) {
        // The thread sees the closed channel within its wait's timeout and ends.
        self.rx.close();
    }
}

impl AsyncRead for RingReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pending.is_empty() {
            match self.rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(b))) => self.pending = b,
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)))
                }
                Poll::Ready(None) => return Poll::Ready(Ok(())),
            }
        }
        let n = buf.remaining().min(self.pending.len());
        buf.put_slice(&self.pending[..n]);
        self.pending.advance(n);
        Poll::Ready(Ok(()))
    }
}
