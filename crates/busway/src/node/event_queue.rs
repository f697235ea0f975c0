//! The node's events on their way to the application: bounded for what may be lost, never
//! dropping a report of messages given up.
//!
//! Ordinary events (links up and down, refused connections, failed dials) wait in order up to
//! `EVENT_QUEUE_LEN_MAX`; past it, newer ones are dropped and counted (the node never waits
//! for its event reader). Once the application took the stream (`Node::take_events`),
//! [`Event::Undeliverable`] is never dropped: it takes its place in the same order, and a
//! report that continues one still waiting (same peer, path, incarnation and reason, numbers
//! that follow on) is merged into it, so an application that reads late holds about one report
//! per burst of failures rather than one per message. [`Event::GroupCutOff`] is never dropped
//! either (an application that fell behind, the one that gets it, must learn that its group
//! stopped): one ends a membership, so there is at most one per `Node::join` the application
//! made. Before the stream is taken, nobody is there to read them: they count as ordinary
//! events.
//!
//! Shared by the node (any thread pushes) and the application's [`crate::Events`] (one reader).

use crate::limits::EVENT_QUEUE_LEN_MAX;
use crate::node::event::Event;
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use tokio::sync::Notify;

pub(crate) struct EventQueue {
    state: Mutex<State>,
    /// The reader waits here; `notify_one` keeps a permit, so a push between its look and its
    /// wait is not lost.
    ready: Notify,
}

#[derive(Default)]
struct State {
    /// Each with whether it counts as ordinary (droppable).
    events: VecDeque<(Event, bool)>,
    /// Ordinary (droppable) events in `events`.
    ordinary: usize,
    /// The application took the stream: failure reports are kept for it.
    taken: bool,
    /// Nothing more comes: the reader gets what is queued, then `None`.
    closed: bool,
}

impl EventQueue {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::default(),
            ready: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The application took the stream: from now on failure reports are never dropped.
    pub(crate) fn taken(&self) {
        self.lock().taken = true;
    }

    /// Queues `event`. False if it was dropped: an ordinary event with `EVENT_QUEUE_LEN_MAX`
    /// of them waiting, or any event once the queue is closed (nobody reads any more).
    pub(crate) fn push(&self, event: Event) -> bool {
        let mut st = self.lock();
        if st.closed {
            return false;
        }
        let kept = matches!(
            event,
            Event::Undeliverable { .. } | Event::GroupCutOff { .. }
        );
        if st.taken && kept {
            if !merge_into_waiting(&mut st.events, &event) {
                st.events.push_back((event, false));
            }
        } else {
            if st.ordinary >= EVENT_QUEUE_LEN_MAX {
                return false;
            }
            st.ordinary += 1;
            st.events.push_back((event, true));
        }
        drop(st);
        self.ready.notify_one();
        true
    }

    /// No more events: the reader gets what is queued, then `None`.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_one();
    }

    /// The next event if one is waiting.
    pub(crate) fn try_recv(&self) -> Option<Event> {
        let mut st = self.lock();
        let (event, ordinary) = st.events.pop_front()?;
        if ordinary {
            st.ordinary -= 1;
        }
        Some(event)
    }

    /// The next event, waiting for one; `None` once closed and read out.
    pub(crate) async fn recv(&self) -> Option<Event> {
        loop {
            if let Some(event) = self.try_recv() {
                return Some(event);
            }
            if self.lock().closed {
                return self.try_recv();
            }
            self.ready.notified().await;
        }
    }
}

/// Waiting events a failure report is compared with for a merge, newest first: a report
/// continues a recent one, and the look stays short however many wait.
const MERGE_LOOK_BACK: usize = 64;

/// Merges `report` into a recent waiting report of the same peer, path, incarnation and reason
/// whose numbers it continues (or overlaps); false if there is none.
fn merge_into_waiting(events: &mut VecDeque<(Event, bool)>, report: &Event) -> bool {
    let Event::Undeliverable {
        peer,
        seqs,
        reason,
        path,
        incarnation,
    } = report
    else {
        return false;
    };
    for (waiting, _) in events.iter_mut().rev().take(MERGE_LOOK_BACK) {
        let Event::Undeliverable {
            peer: p,
            seqs: s,
            reason: r,
            path: pa,
            incarnation: i,
        } = waiting
        else {
            continue;
        };
        if (&*p, &*pa, &*i, r.as_str()) == (peer, path, incarnation, reason.as_str())
            && s.start <= seqs.end
            && seqs.start <= s.end
        {
            *s = s.start.min(seqs.start)..s.end.max(seqs.end);
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::event::Path;
    use busway_core::BusId;

    fn lost(peer: u64, seqs: std::ops::Range<u64>, reason: &str) -> Event {
        Event::Undeliverable {
            peer: BusId(peer),
            seqs,
            reason: reason.into(),
            path: Path::Direct,
            incarnation: Some(7),
        }
    }

    fn dial_failed(n: usize) -> Event {
        Event::DialFailed {
            addr: format!("tcp://127.0.0.1:{n}"),
            reason: "refused".into(),
        }
    }

    #[test]
    fn a_cut_off_is_kept_past_the_bound_of_ordinary_events() {
        let q = EventQueue::new();
        q.taken();
        for n in 0..EVENT_QUEUE_LEN_MAX {
            assert!(q.push(dial_failed(n)));
        }
        let cut_off = Event::GroupCutOff {
            group: "g".into(),
            publisher: crate::BusId(9),
            missed: 3,
            reason: "its application fell behind".into(),
        };
        assert!(q.push(cut_off.clone()), "kept though the queue is full");
        let last = std::iter::from_fn(|| q.try_recv()).last();
        assert_eq!(last, Some(cut_off));
    }

    #[test]
    fn ordinary_events_are_bounded_and_failure_reports_are_never_dropped() {
        let q = EventQueue::new();
        q.taken();
        for n in 0..EVENT_QUEUE_LEN_MAX {
            assert!(q.push(dial_failed(n)));
        }
        assert!(
            !q.push(dial_failed(0)),
            "past the limit an ordinary event is dropped"
        );
        for k in 0..10_000u64 {
            // Far apart: none merges with another.
            assert!(q.push(lost(k % 3, k * 10..k * 10 + 1, "gone")));
        }
        let mut reports = 0;
        let mut ordinary = 0;
        while let Some(e) = q.try_recv() {
            match e {
                Event::Undeliverable { .. } => reports += 1,
                _ => ordinary += 1,
            }
        }
        assert_eq!((ordinary, reports), (EVENT_QUEUE_LEN_MAX, 10_000));
        assert!(q.push(dial_failed(1)), "room again once read");
    }

    #[test]
    fn a_report_that_continues_a_waiting_one_is_merged_into_it() {
        let q = EventQueue::new();
        q.taken();
        q.push(lost(1, 0..5, "gone"));
        q.push(dial_failed(1));
        q.push(lost(1, 5..9, "gone"));
        q.push(lost(2, 9..12, "gone"));
        q.push(lost(1, 9..12, "another reason"));
        q.push(lost(1, 20..22, "gone"));
        let got: Vec<Event> = std::iter::from_fn(|| q.try_recv()).collect();
        assert_eq!(
            got,
            vec![
                lost(1, 0..9, "gone"),
                dial_failed(1),
                lost(2, 9..12, "gone"),
                lost(1, 9..12, "another reason"),
                lost(1, 20..22, "gone"),
            ]
        );
    }

    #[tokio::test]
    async fn a_closed_queue_yields_what_waits_then_none() {
        let q = std::sync::Arc::new(EventQueue::new());
        q.taken();
        let reader = {
            let q = q.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(e) = q.recv().await {
                    got.push(e);
                }
                got
            })
        };
        q.push(lost(1, 0..1, "gone"));
        q.close();
        assert!(!q.push(lost(1, 1..2, "gone")), "nothing after the close");
        assert_eq!(reader.await.unwrap(), vec![lost(1, 0..1, "gone")]);
    }

    #[test]
    fn before_the_stream_is_taken_failure_reports_are_bounded_like_the_rest() {
        let q = EventQueue::new();
        for k in 0..(EVENT_QUEUE_LEN_MAX as u64 + 10) {
            q.push(lost(1, k * 10..k * 10 + 1, "gone"));
        }
        assert!(!q.push(dial_failed(0)));
        let n = std::iter::from_fn(|| q.try_recv()).count();
        assert_eq!(n, EVENT_QUEUE_LEN_MAX);
        assert!(q.push(dial_failed(0)), "room again once read");
    }
}
