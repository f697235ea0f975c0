//! What carries a peer's link, and what it brought and what was passed on through this node:
//! the peer's side of `Node::peers`.

use super::Peer;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

/// Messages counted per peer, ever. On a cache line of its own: the link's reader bumps these
/// at every read, and the peer's other fields are written by senders and the writer.
#[derive(Default)]
#[repr(align(64))]
pub(crate) struct Traffic {
    /// Messages and payload bytes received from it for this node (not passed on).
    pub(crate) msgs_in: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    /// Messages this node passed on as a relay that came from it, and that went to it.
    pub(crate) relayed_from: AtomicU64,
    pub(crate) relayed_to: AtomicU64,
}

/// What carries a link's data (see `Peer::carrier`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Carrier {
    /// The link's own socket.
    Socket = 0,
    /// A shared-memory ring (the peer runs on this host).
    Shm = 1,
    /// An in-process ring (the peer runs in this process).
    Mem = 2,
}

impl Peer {
    /// What carries the attached link's incoming data now.
    pub(crate) fn carrier(&self) -> Carrier {
        match self.carrier.load(Relaxed) {
            1 => Carrier::Shm,
            2 => Carrier::Mem,
            _ => Carrier::Socket,
        }
    }

    /// The attached link's data moved (`Shm`, `Mem`), or a new link starts on its socket.
    pub(crate) fn set_carrier(&self, c: Carrier) {
        self.carrier.store(c as u8, Relaxed);
    }
}
