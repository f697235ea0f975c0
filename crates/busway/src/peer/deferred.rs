//! Single sends into a shared-memory ring wait, unpublished, for the sender's next look at its
//! inbox, a flush, or the link's writer: one ring publication per burst instead of one per
//! message (see `Peer::push_single`). This is the list of peers holding such messages, which
//! the inbox publishes before it looks for its own messages or waits.

use crate::peer::Peer;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Peers whose rings have single sends waiting to be published.
#[derive(Default)]
pub(crate) struct Deferred {
    peers: Mutex<Vec<Arc<Peer>>>,
    /// Whether `peers` may be non-empty: a look that costs no lock when nothing waits.
    any: AtomicBool,
    /// Looks of the inbox, counted: a single send that is the first since the last look is
    /// published at once (a lone message, e.g. a request or an answer, never waits).
    looks: AtomicU64,
}

impl Deferred {
    /// `peer` holds single sends its ring has not published (told once per burst).
    pub(crate) fn note(&self, peer: &Arc<Peer>) {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        peers.push(peer.clone());
        // Relaxed: a hint; the list itself is read under its lock.
        self.any.store(true, Ordering::Relaxed);
    }

    /// How many looks the inbox made (see `looks`).
    pub(crate) fn looks(&self) -> u64 {
        // Relaxed: a count compared for equality; nothing is published through it.
        self.looks.load(Ordering::Relaxed)
    }

    /// The inbox looks for messages: publishes what every listed peer holds (a peer whose
    /// writer is at its ring already publishes it itself).
    pub(crate) fn publish_all(&self) {
        // Relaxed: see `looks`.
        self.looks.fetch_add(1, Ordering::Relaxed);
        // Relaxed: see `note`; a note racing this look is published by the writer it woke.
        if !self.any.load(Ordering::Relaxed) {
            return;
        }
        let peers = {
            let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
            self.any.store(false, Ordering::Relaxed);
            std::mem::take(&mut *peers)
        };
        for p in peers {
            p.publish_deferred();
        }
    }
}
