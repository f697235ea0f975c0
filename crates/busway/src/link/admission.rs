//! How many connections a node keeps and how many strangers may be in a handshake at once:
//! past either limit an accepted connection is refused at once with a CLOSE that says why, so
//! that a flood of connections costs the node a counter, not its memory or its honest peers.

use crate::limits::HANDSHAKES_IN_FLIGHT_MAX;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The node's counts of open connections and of accepted ones still in their handshake.
/// Shared by every link task; each count is held by a guard for exactly as long as it lasts.
pub(crate) struct Admission {
    open: AtomicUsize,
    handshaking: AtomicUsize,
    connections_max: usize,
}

/// One open connection; counted until dropped.
pub(crate) struct Open<'a>(&'a AtomicUsize);

/// One accepted connection in its handshake; counted until dropped (at the handshake's end).
pub(crate) struct Handshaking<'a>(&'a AtomicUsize);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl Drop for Handshaking<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Takes one unit of `count` if it stays within `max`.
fn take(count: &AtomicUsize, max: usize) -> bool {
    count
        .fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1))
        .is_ok()
}

impl Admission {
    pub(crate) fn new(connections_max: usize) -> Self {
        Self {
            open: AtomicUsize::new(0),
            handshaking: AtomicUsize::new(0),
            connections_max,
        }
    }

    /// A connection this node dialed: always counted (the node chose it), never refused.
    pub(crate) fn dialed(&self) -> Open<'_> {
        self.open.fetch_add(1, Relaxed);
        Open(&self.open)
    }

    /// A connection a listener accepted: counted, or refused with why (past
    /// `NodeConfig::connections_max` open connections, or `HANDSHAKES_IN_FLIGHT_MAX` accepted
    /// ones still in their handshake).
    pub(crate) fn accepted(&self) -> Result<(Open<'_>, Handshaking<'_>), String> {
        if !take(&self.open, self.connections_max) {
            return Err(format!(
                "this node has {} connections open, its limit (connections_max)",
                self.connections_max
            ));
        }
        let open = Open(&self.open);
        if !take(&self.handshaking, HANDSHAKES_IN_FLIGHT_MAX) {
            return Err(format!(
                "this node has {HANDSHAKES_IN_FLIGHT_MAX} handshakes in progress, its limit"
            ));
        }
        Ok((open, Handshaking(&self.handshaking)))
    }

    /// Open connections now.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_connections_past_a_limit_are_refused_and_freed_ones_count_again() {
        let a = Admission::new(3);
        let dialed = a.dialed();
        let first = a.accepted().unwrap();
        let second = a.accepted().unwrap();
        let refused = a.accepted().map(|_| ()).unwrap_err();
        assert!(refused.contains("3 connections open"), "{refused}");
        assert_eq!(a.open(), 3);
        drop(first);
        drop(dialed);
        let (_open, handshaking) = a.accepted().unwrap();
        // The handshake ended; the connection stays counted.
        drop(handshaking);
        assert_eq!(a.open(), 2);
        drop(second);
        assert_eq!(a.open(), 1);
    }

    #[test]
    fn handshakes_in_flight_are_bounded_apart_from_connections() {
        let a = Admission::new(usize::MAX);
        let held: Vec<_> = (0..HANDSHAKES_IN_FLIGHT_MAX)
            .map(|_| a.accepted().unwrap())
            .collect();
        let refused = a.accepted().map(|_| ()).unwrap_err();
        assert!(refused.contains("handshakes in progress"), "{refused}");
        assert_eq!(
            a.open(),
            HANDSHAKES_IN_FLIGHT_MAX,
            "the refused one is not counted"
        );
        drop(held);
        assert!(a.accepted().is_ok());
    }
}
