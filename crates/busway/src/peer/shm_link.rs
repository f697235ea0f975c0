//! A link's data through shared memory. When both ends of a link run on one host (same host
//! identity in HELLO) and advertise `shm`, each offers the ring it will write (CHANNEL OFFER);
//! the other opens it through `/proc/PID/fd/FD` and accepts. The offerer then writes SWITCH on
//! the socket and its messages go into the ring from there on (see `ring_tx`); the socket stays
//! the control link (acknowledgements, heartbeats, relayed frames). The receiver hands the ring
//! to the application's inbox only after it delivered everything read before SWITCH, so order
//! holds, and the application reads the ring itself (see `ring_rx`). A ring lives and dies with
//! its link: what it held unacknowledged is written again on the next link, like anything else.

use crate::limits::{RING_IDLE_WATCH_MS, RING_REPLY_WATCH_MS};
use crate::node::stats::bump;
use crate::peer::ring_link::RingLink;
use crate::peer::ring_rx::{take_over_replies, RingReader};
use crate::peer::{Carrier, Peer};
use crate::shared::Shared;
use busway_shm::announce::{Announced, InProcess};
use busway_shm::ring::{Binding, Consumer, Producer, Ring};
use busway_shm::Segment;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// This host's identity for HELLO: the kernel's boot id (the same for every process of one
/// boot of one machine, and container-independent); empty if it cannot be read.
pub(crate) fn host_identity() -> Vec<u8> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().as_bytes().to_vec())
        .unwrap_or_default()
}

/// One link's shared-memory state, shared by the link task and the application's reader of
/// the peer's ring.
pub(crate) struct ShmLink {
    shared: Arc<Shared>,
    /// What the application's reader of the peer's ring shares with the link.
    pub(crate) ring: Arc<RingLink>,
    /// Our ring toward the peer, from the OFFER until the writer takes it.
    outbound: Mutex<Option<Producer>>,
    /// The peer accepted our ring: the writer switches.
    accepted: AtomicBool,
    /// The peer's ring, opened at its OFFER, handed to the inbox once its SWITCH was read.
    inbound: Mutex<Option<Consumer>>,
    /// The peer runs in this process: its ring was taken from `IN_PROCESS_RINGS` (an
    /// in-process channel, counted in `Stats::mem_channels`).
    in_process: AtomicBool,
    /// The reader of the peer's ring once it went to the inbox (see `watch_replies`).
    reader: Mutex<Option<Weak<Mutex<RingReader>>>>,
}

/// Rings this process offered: a peer in the same process takes its ring from here instead
/// of opening `/proc/self/fd` (no second mapping, no file system: an in-process queue). Weak,
/// so that an offer nobody took frees its ring with its link.
static IN_PROCESS_RINGS: InProcess<Ring> = InProcess::new();

/// What an OFFER of our ring names.
pub(crate) struct Offer {
    pub(crate) pid: u32,
    pub(crate) fd: u32,
    pub(crate) inode: u64,
    pub(crate) capacity: u64,
    pub(crate) token: u64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ShmLink {
    pub(crate) fn new(shared: Arc<Shared>, peer: Arc<Peer>, link_id: u64) -> Self {
        let ring = RingLink::new(
            peer,
            link_id,
            shared.counters.clone(),
            shared.calls.clone(),
            shared.config().frame_body_max,
            Arc::downgrade(shared.group.reads()),
        );
        Self {
            shared,
            ring: Arc::new(ring),
            outbound: Mutex::default(),
            accepted: AtomicBool::new(false),
            inbound: Mutex::default(),
            in_process: AtomicBool::new(false),
            reader: Mutex::default(),
        }
    }

    /// Creates our ring toward the peer, bound to it (a random token, our id as writer, the
    /// peer's as reader), and returns what the OFFER names, or why not.
    pub(crate) fn offer(&self) -> Result<Offer, String> {
        let capacity = self.shared.config().shm_ring_bytes;
        let binding = Binding {
            token: u64::from_le_bytes(crate::shared::random_bytes()),
            writer: self.shared.config().id.0,
            reader: self.ring.peer.id.0,
        };
        let ring =
            Ring::create_bound("busway-link", capacity, binding).map_err(|e| e.to_string())?;
        let at = IN_PROCESS_RINGS
            .announce(ring.segment(), &ring)
            .map_err(|e| e.to_string())?;
        let offer = Offer {
            pid: at.pid,
            fd: at.fd,
            inode: at.inode,
            capacity: capacity as u64,
            token: binding.token,
        };
        *lock(&self.outbound) = Some(ring.producer());
        Ok(offer)
    }

    /// The peer offered its ring (CHANNEL OFFER): opens it, from this process's own offers
    /// when the peer runs here (an in-process channel), else through `/proc/PID/fd/FD`, and
    /// keeps it for `switch_in`. The ring must be the one offered: its header carries the
    /// offer's token, the peer's id as writer and ours as reader (so a peer cannot make us
    /// read our own ring, or one meant for another node, by naming its descriptor), and it
    /// holds at most `NodeConfig::shm_ring_bytes`. An error says why it cannot be read (the
    /// link's state machine answers REFUSE).
    pub(crate) fn open_offered(
        &self,
        pid: u32,
        fd: u32,
        inode: u64,
        capacity: u64,
        token: u64,
    ) -> Result<(), String> {
        let limit = self.shared.config().shm_ring_bytes;
        if capacity > limit as u64 {
            return Err(format!(
                "ring of {capacity} bytes offered, over the {limit} bytes this node accepts (shm_ring_bytes)"
            ));
        }
        let expected = Binding {
            token,
            writer: self.ring.peer.id.0,
            reader: self.shared.config().id.0,
        };
        // A ring meant for another reader stays for it.
        let at = Announced { pid, fd, inode };
        let local = self
            .shared
            .config()
            .mem_channels
            .then(|| IN_PROCESS_RINGS.find(&at, |r| r.binding() == expected, true))
            .flatten();
        self.in_process.store(local.is_some(), Relaxed);
        let opened = match local {
            Some(ring) => Ok(ring),
            None => Segment::open_from_process(pid, fd, inode)
                .map_err(|e| e.to_string())
                .and_then(|s| Ring::open(s, &expected, limit).map_err(|e| e.to_string())),
        };
        let ring = opened
            .and_then(|r| {
                if r.capacity() as u64 == capacity {
                    Ok(r)
                } else {
                    Err(format!(
                        "ring of {} bytes, {capacity} announced",
                        r.capacity()
                    ))
                }
            })
            .inspect_err(|why| tracing::warn!(%why, "cannot open the peer's shared-memory ring"))?;
        let consumer = ring.consumer().map_err(|e| e.to_string())?;
        *lock(&self.inbound) = Some(consumer);
        Ok(())
    }

    /// The peer mapped our ring (CHANNEL ACCEPT): the writer switches.
    pub(crate) fn accepted(&self) {
        self.accepted.store(true, Relaxed);
    }

    /// The peer could not map our ring (CHANNEL REFUSE): our data stays on the socket.
    pub(crate) fn refused(&self, why: &str) {
        lock(&self.outbound).take();
        tracing::warn!(%why, "the peer refused our shared-memory ring; staying on the socket");
    }

    /// Whether the writer should switch now; if so, the producer it writes with from now on.
    pub(crate) fn take_producer(&self) -> Option<Producer> {
        if !self.accepted.load(Relaxed) {
            return None;
        }
        lock(&self.outbound).take()
    }

    /// Everything the peer wrote on the socket before its SWITCH is delivered: returns its
    /// ring, for the application's inbox (after those messages, so order holds).
    pub(crate) fn switch_in(&self) -> Option<Consumer> {
        let c = lock(&self.inbound).take()?;
        self.ring.hand_over(c.waiter());
        Some(c)
    }

    /// The peer's SWITCH was read: counts the channel (as soon as it is read, before the
    /// messages that came with it are delivered, so that an application that has them sees
    /// the count).
    pub(crate) fn count_switch(&self) {
        if lock(&self.inbound).is_none() {
            return;
        }
        let counters = &self.shared.counters;
        let in_process = self.in_process.load(Relaxed);
        bump(if in_process {
            &counters.mem_channels
        } else {
            &counters.shm_channels
        });
        self.ring.peer.set_carrier(if in_process {
            Carrier::Mem
        } else {
            Carrier::Shm
        });
    }

    /// The link ended: the application stops reading its ring.
    /// The peer's ring went to the inbox, read through `reader`.
    pub(crate) fn set_reader(&self, reader: Weak<Mutex<RingReader>>) {
        *lock(&self.reader) = Some(reader);
    }

    /// Looks whether the application left the peer's ring unread, and then takes out itself
    /// what the node must act on (replies end their calls; group messages are recorded and
    /// passed on; the rest waits for the application, in order): a call over shared memory,
    /// or a relay's part in a group, does not depend on its application reading the inbox.
    /// Looks every `RING_REPLY_WATCH_MS` while calls are pending or the node takes part in a
    /// group, every `RING_IDLE_WATCH_MS` otherwise (a peer may start a group's traffic).
    /// Never returns.
    pub(crate) async fn watch_replies(&self) -> std::convert::Infallible {
        let mut last_polls = 0;
        loop {
            let calls = &self.shared.calls;
            if calls.len() == 0 && self.shared.group.is_idle() {
                let idle = Duration::from_millis(RING_IDLE_WATCH_MS);
                let active = self.shared.group.became_active();
                tokio::pin!(active);
                active.as_mut().enable();
                if !self.shared.group.is_idle() {
                    continue;
                }
                // Woken early by a call, or by the node's first part in a group (an accept of
                // its log must not wait for the next look); else a look now and then.
                let woken = tokio::select! {
                    r = tokio::time::timeout(idle, calls.wait_pending()) => r.is_ok(),
                    () = active => true,
                };
                if woken {
                    continue;
                }
            } else {
                tokio::time::sleep(Duration::from_millis(RING_REPLY_WATCH_MS)).await;
            }
            let reader = lock(&self.reader).clone();
            if let Some(reader) = reader {
                if take_over_replies(&reader, &mut last_polls) {
                    // What it left for the application must not wait for the ring's next
                    // record to be seen.
                    self.shared.app.inbox().wake();
                }
            }
        }
    }

    pub(crate) fn end(&self) {
        self.ring.set_gone();
        // A sleeping inbox drops the ring at once (and with it this link's state).
        self.shared.app.inbox().wake();
    }
}
