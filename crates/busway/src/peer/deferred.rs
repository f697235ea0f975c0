//! The application's looks at its inbox, and what waits for them. Single sends into a
//! shared-memory ring wait, unpublished, for the sender's next look at its inbox, a flush, or
//! the link's writer: one ring publication per burst instead of one per message (see
//! `Peer::push_single`). This is the list of peers holding such messages, which the inbox
//! publishes before it looks for its own messages or waits; and the wake-up of link writers
//! that hold an acknowledgement for the application's answer (see `next_look`).

use crate::peer::Peer;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// Peers whose rings have single sends waiting to be published.
#[derive(Default)]
pub(crate) struct Deferred {
    peers: Mutex<Vec<Arc<Peer>>>,
    /// Whether `peers` may be non-empty: a look that costs no lock when nothing waits.
    any: AtomicBool,
    /// Looks of the inbox, counted: a single send that is the first since the last look is
    /// published at once (a lone message, e.g. a request or an answer, never waits).
    looks: AtomicU64,
    /// Link writers waiting in `next_look`: a look wakes them only if there are any.
    looking_out: AtomicUsize,
    /// Wakes the writers waiting in `next_look`.
    looked: Notify,
    /// Whether the application waits in its inbox for messages (`app_waiting`): what is
    /// delivered now, it handles at once.
    app_waits: AtomicBool,
}

/// The application waits in its inbox while this lives (see `Deferred::app_waiting`); dropped
/// when the wait ends, or its future is dropped.
pub(crate) struct AppWaiting<'a>(&'a Deferred);

impl Drop for AppWaiting<'_> {
    fn drop(&mut self) {
        // Relaxed: a hint (see `app_waits`).
        self.0.app_waits.store(false, Ordering::Relaxed);
    }
}

/// A writer counted in `Deferred::looking_out` while this lives: the count goes down however
/// the wait ends, also when its future is dropped (a push ended the wait first).
struct LookingOut<'a>(&'a AtomicUsize);

impl<'a> LookingOut<'a> {
    fn count(waiting: &'a AtomicUsize) -> Self {
        // SeqCst: see `Deferred::next_look`.
        waiting.fetch_add(1, Ordering::SeqCst);
        LookingOut(waiting)
    }
}

impl Drop for LookingOut<'_> {
    fn drop(&mut self) {
        // SeqCst: see `Deferred::next_look`.
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
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

    /// The application waits in its inbox for messages until the result is dropped.
    pub(crate) fn app_waiting(&self) -> AppWaiting<'_> {
        // Relaxed: a hint; a link reader that reads it stale has its ACK written at once, or
        // held for the bounded time of `next_look`.
        self.app_waits.store(true, Ordering::Relaxed);
        AppWaiting(self)
    }

    /// Whether the application waits in its inbox for messages (and so handles what a link
    /// delivers now at once, and looks again after).
    pub(crate) fn app_waits(&self) -> bool {
        // Relaxed: see `app_waiting`.
        self.app_waits.load(Ordering::Relaxed)
    }

    /// Waits for the application's next look at its inbox, at most `turns` yields and then
    /// `max` (rounded up to the runtime timer's next millisecond: up to about twice `max`). A look comes after the application handled what it
    /// took before, so a link writer holding the acknowledgement of a read sends the
    /// application's answer with it. The first `turns` turns of the runtime are only
    /// yielded (an application on this thread looks in one, and no timer is armed); then
    /// the wait sleeps until the look wakes it, or `max`.
    pub(crate) async fn next_look(&self, turns: usize, max: Duration) {
        let before = self.looks();
        for _ in 0..turns {
            tokio::task::yield_now().await;
            if self.looks() != before {
                return;
            }
        }
        // Made before the count goes up: a `notify_waiters` after this point wakes it, even
        // one that comes before it is polled.
        let looked = self.looked.notified();
        // SeqCst, with the increment of `looks` and the load of `looking_out` in
        // `publish_all`: either this side sees the look in the second load of `looks`, or
        // that side sees this waiter counted and wakes `looked`.
        let _counted = LookingOut::count(&self.looking_out);
        if self.looks.load(Ordering::SeqCst) == before {
            let _ = tokio::time::timeout(max, looked).await;
        }
    }

    /// The inbox looks for messages: publishes what every listed peer holds (a peer whose
    /// writer is at its ring already publishes it itself), and wakes the writers that wait
    /// for this look (`next_look`).
    pub(crate) fn publish_all(&self) {
        // SeqCst: see `next_look` (a count compared for equality otherwise).
        self.looks.fetch_add(1, Ordering::SeqCst);
        if self.looking_out.load(Ordering::SeqCst) > 0 {
            self.looked.notify_waiters();
        }
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
