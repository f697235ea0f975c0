//! Group publishes and multicasts handed to the application's inbox in the order their
//! streams were decided, with no turn held across the deciding.
//!
//! Links decide about a member's streams on their own I/O threads: each decision that
//! delivers takes a ticket under the lock of the state it changed (`Delivered::take_turn`),
//! so the tickets of one stream follow its decisions. What a link delivers is handed over in
//! ticket order (`busway_core::turns`): a link whose turn comes first hands over its own, and
//! what later tickets left waiting behind it; a link whose turn has not come leaves its
//! deliveries to the one whose turn it is, and goes on reading. The one lock
//! (`Handover::pending`) is held only to pass finished batches to the inbox's channel, never
//! while a link decides. Batches that wait for their turn count in the inbox's group backlog
//! from the moment they wait (`Sink::reserve`), so links stop reading for them as for
//! publishes in the channel.

use crate::message::MessageBatch;
use busway_core::turns::{Decided, Turns};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

/// The tickets given, and the deliveries that wait for an earlier ticket.
#[derive(Default)]
pub(crate) struct Handover {
    /// The next ticket to give.
    tickets: AtomicU64,
    pending: Mutex<Turns<MessageBatch>>,
}

/// Where handed-over batches go: the application's inbox (`InboxSender`).
pub(crate) trait Sink {
    /// Counts `bytes` (batches' `footprint`) as the application's to read from now, handed
    /// over or waiting for their turn: they hold links back alike.
    fn reserve(&self, bytes: usize);
    /// Hands `batch`, its footprint reserved, to the application now; false if it is gone.
    fn deliver_reserved(&self, batch: MessageBatch) -> bool;
}

/// A state of busway-core's behind its lock (`GroupState`, `MulticastState`): each call
/// takes the lock for itself alone, and one that delivers to this node's application takes
/// its turn to hand over under it (see [`Delivered::take_turn`]).
pub(crate) struct InTurn<T> {
    state: Mutex<T>,
}

impl<T> InTurn<T> {
    pub(crate) fn new(state: T) -> Self {
        Self {
            state: Mutex::new(state),
        }
    }

    /// The state, for a call that delivers nothing.
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the state under its lock; if `delivers` holds for its answer, takes the
    /// turn to hand over under it. `after` looks at the state before the lock goes.
    pub(crate) fn with<R>(
        &self,
        delivers: fn(&R) -> bool,
        f: impl FnOnce(&mut T) -> R,
        out: &mut Delivered<'_>,
        after: impl FnOnce(&T),
    ) -> R {
        let mut state = self.lock();
        let got = f(&mut state);
        if delivers(&got) {
            out.take_turn();
        }
        after(&state);
        got
    }
}

/// What one read (or one timer tick) delivers to this node's application, in order (see
/// `busway_core::turns::Decided`). Handed over when it is finished or dropped (so that a
/// ticket taken is never lost, even on a panic).
pub(crate) struct Delivered<'a> {
    handover: &'a Handover,
    inbox: &'a dyn Sink,
    /// The deliveries decided, by ticket.
    pub(crate) decided: Decided<MessageBatch>,
    /// This node was cut off from a group (it left): its peers must be told.
    pub(crate) left: bool,
}

impl<'a> Delivered<'a> {
    /// Nothing yet, to be handed to `inbox` in `group::handover`'s order.
    pub(crate) fn new(handover: &'a Handover, inbox: &'a dyn Sink) -> Self {
        Self {
            handover,
            inbox,
            decided: Decided::default(),
            left: false,
        }
    }

    /// Takes the next ticket: what is added from now on goes to the application after what
    /// was decided under earlier tickets. Called under the lock of the state whose decision
    /// delivers (see the tables' `with`), so one stream's tickets follow its decisions.
    pub(crate) fn take_turn(&mut self) {
        // Relaxed: the state's lock around this call orders the tickets of its decisions
        // (its release and acquire pair with the next decision's); tickets of different
        // states order no stream together.
        self.decided
            .turn(self.handover.tickets.fetch_add(1, Relaxed));
    }

    /// Hands the deliveries over (see `Drop`); returns whether there were any (in the
    /// channel now, or counted there while they wait for an earlier turn), and whether this
    /// node left a group meanwhile (`left`).
    pub(crate) fn finish(self) -> (bool, bool) {
        (self.decided.any(), self.left)
    }
}

impl Drop for Delivered<'_> {
    fn drop(&mut self) {
        if !self.decided.has_turn() {
            return;
        }
        let mut pending = self
            .handover
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for s in self.decided.take() {
            self.inbox
                .reserve(s.batches.iter().map(MessageBatch::footprint).sum());
            pending.ready(s.first, s.last, s.batches, |batch| {
                // False: the application dropped its inbox, nobody is left to read them.
                let _ = self.inbox.deliver_reserved(batch);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inbox::inbox;
    use busway_core::BusId;
    use bytes::Bytes;
    use std::sync::Arc;

    /// The numbers the inbox holds now, in the order it gives them (a payload of other than
    /// 4 bytes read as `u32::MAX`).
    fn numbers(rx: &mut crate::inbox::Inbox) -> Vec<u32> {
        let mut got = Vec::new();
        while let Some(batch) = rx.try_recv_batch() {
            got.extend(
                batch
                    .iter()
                    .map(|p| p.try_into().map_or(u32::MAX, u32::from_le_bytes)),
            );
        }
        got
    }

    #[tokio::test]
    async fn later_tickets_wait_for_an_earlier_one_and_go_with_it() {
        let (tx, mut rx) = inbox(1 << 20, 0, Arc::default());
        let handover = Handover::default();
        let one = |n: u32| vec![Bytes::copy_from_slice(&n.to_le_bytes())];
        let mut first = Delivered::new(&handover, &tx);
        first.take_turn();
        let mut second = Delivered::new(&handover, &tx);
        second.take_turn();
        second.decided.payloads(BusId(1), Some("g"), one(2));
        let (any, _) = second.finish();
        assert!(any);
        // Nothing yet: ticket 0 is still being decided on.
        assert!(numbers(&mut rx).is_empty());
        // What waits counts against the inbox's group backlog, as what is in the channel.
        let mut big = Delivered::new(&handover, &tx);
        big.take_turn();
        let backlog = crate::inbox::GROUP_INBOX_BYTES_MAX + 1;
        big.decided
            .payloads(BusId(1), Some("g"), vec![Bytes::from(vec![0; backlog])]);
        drop(big);
        assert!(tx.group_backlogged(), "a waiting batch holds links back");
        // A turn that delivers nothing still lets the others go.
        let mut empty = Delivered::new(&handover, &tx);
        empty.take_turn();
        drop(empty);
        first.decided.payloads(BusId(1), Some("g"), one(1));
        assert_eq!(first.finish(), (true, false));
        let got = numbers(&mut rx);
        assert_eq!(got, [1, 2, u32::MAX]);
        assert!(!tx.group_backlogged(), "taken, it holds nothing back");
    }

    /// Threads decide about one stream in turn under its lock and hand over on their own:
    /// the inbox gets the stream in the order decided.
    #[tokio::test]
    async fn a_stream_decided_on_many_threads_is_delivered_in_order() {
        const THREADS: u32 = 4;
        const EACH: u32 = 2_000;
        let (tx, mut rx) = inbox(1 << 30, 0, Arc::default());
        let handover = Handover::default();
        let stream = Mutex::new(0u32);
        std::thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    for _ in 0..EACH {
                        let mut out = Delivered::new(&handover, &tx);
                        let n = {
                            let mut next = stream.lock().unwrap();
                            *next += 1;
                            out.take_turn();
                            *next
                        };
                        out.decided.payloads(
                            BusId(1),
                            Some("g"),
                            vec![Bytes::copy_from_slice(&n.to_le_bytes())],
                        );
                    }
                });
            }
        });
        let want: Vec<u32> = (1..=THREADS * EACH).collect();
        assert_eq!(numbers(&mut rx), want);
        assert!(handover.pending.lock().unwrap().is_idle());
    }
}
