//! What waits for the caller (received batches, events, finished calls), and the eventfd that
//! is readable while anything does: the caller's epoll, libuv or asio loop polls it like a
//! socket.
//!
//! Two tasks on the node's runtime move the inbox's batches and the node's events here as
//! they come; each waits while its queue holds its limit, so a caller that reads nothing
//! stops the node's links from reading (the inbox's flow control) rather than growing memory.
//! Finished calls are put here by the task that made the call; there are at most as many as
//! the calls the caller started (the node bounds those, `CALLS_PENDING_MAX`).

use busway::{CallError, Event, Events, Inbox, MessageBatch, Reply};
use rustix::event::{eventfd, EventfdFlags};
use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;

/// Bytes of received batches held for the caller before the inbox is left unread (the node's
/// links then stop reading: its flow control, nothing dropped).
pub const BUSWAY_READY_BATCH_BYTES_MAX: usize = 8 << 20;
/// Events held for the caller before the node's events are left unread (the node then counts
/// the events it drops, `Stats::events_dropped`, except reports of messages given up, which it
/// keeps).
pub const BUSWAY_READY_EVENTS_MAX: usize = 4096;

/// Something for the caller besides messages: a node's event, or the end of a call it started.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReadyEvent {
    /// What the node tells (links, messages given up, groups, refusals).
    Node(Event),
    /// A call started with `Bus::call_start` ended.
    CallDone {
        /// The caller's number for the call.
        token: u64,
        /// The reply, or why the call failed.
        result: Result<Reply, CallError>,
    },
}

/// The queues and whether the descriptor is readable now.
#[derive(Default)]
struct Queues {
    batches: VecDeque<MessageBatch>,
    batch_bytes: usize,
    events: VecDeque<ReadyEvent>,
    /// Whether the eventfd's counter is non-zero (so a push need not write it again).
    signalled: bool,
}

/// Shared by the caller's threads and the node's runtime.
pub(crate) struct Ready {
    queues: Mutex<Queues>,
    fd: OwnedFd,
    /// Wakes the tasks that wait for room (both: either may be the one with room now).
    room: Notify,
}

impl Ready {
    pub(crate) fn new() -> std::io::Result<Arc<Self>> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Arc::new(Self {
            queues: Mutex::default(),
            fd,
            room: Notify::new(),
        }))
    }

    /// The descriptor, readable while anything waits.
    pub(crate) fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    fn lock(&self) -> MutexGuard<'_, Queues> {
        // A panic elsewhere cannot leave the queues half changed: each change is one push or pop.
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the descriptor readable, if it is not already (under the lock: a pop that empties
    /// the queues cannot clear it between our push and this write).
    fn signal(&self, q: &mut Queues) {
        if !q.signalled {
            // An eventfd counter cannot overflow from one write of 1 per empty-to-ready
            // transition; a failed write (impossible for a valid eventfd) leaves it unsignalled.
            q.signalled = rustix::io::write(self.fd.as_fd(), &1u64.to_ne_bytes()).is_ok();
        }
    }

    /// Clears the descriptor once nothing waits (under the lock, see `signal`).
    fn settle(&self, q: &mut Queues) {
        if q.signalled && q.batches.is_empty() && q.events.is_empty() {
            let mut counter = [0u8; 8];
            let _ = rustix::io::read(self.fd.as_fd(), &mut counter);
            q.signalled = false;
        }
    }

    /// The next received batch, if one waits.
    pub(crate) fn pop_batch(&self) -> Option<MessageBatch> {
        let mut q = self.lock();
        let batch = q.batches.pop_front();
        if let Some(b) = &batch {
            let was_full = q.batch_bytes >= BUSWAY_READY_BATCH_BYTES_MAX;
            q.batch_bytes -= b.footprint();
            if was_full && q.batch_bytes < BUSWAY_READY_BATCH_BYTES_MAX {
                self.room.notify_waiters();
            }
        }
        self.settle(&mut q);
        batch
    }

    /// The next event, if one waits.
    pub(crate) fn pop_event(&self) -> Option<ReadyEvent> {
        let mut q = self.lock();
        let ev = q.events.pop_front();
        if ev.is_some() && q.events.len() + 1 == BUSWAY_READY_EVENTS_MAX {
            self.room.notify_waiters();
        }
        self.settle(&mut q);
        ev
    }

    /// Adds a finished call's result (never waits: the caller started it).
    pub(crate) fn push_event(&self, ev: ReadyEvent) {
        let mut q = self.lock();
        q.events.push_back(ev);
        self.signal(&mut q);
    }

    /// Moves the inbox's batches here until the node is gone.
    pub(crate) async fn pump_inbox(self: Arc<Self>, mut inbox: Inbox) {
        loop {
            self.wait_for(|q| q.batch_bytes < BUSWAY_READY_BATCH_BYTES_MAX)
                .await;
            let Some(batch) = inbox.recv_batch().await else {
                return;
            };
            let mut q = self.lock();
            q.batch_bytes += batch.footprint();
            q.batches.push_back(batch);
            self.signal(&mut q);
        }
    }

    /// Moves the node's events here until the node is gone.
    pub(crate) async fn pump_events(self: Arc<Self>, mut events: Events) {
        loop {
            self.wait_for(|q| q.events.len() < BUSWAY_READY_EVENTS_MAX)
                .await;
            let Some(ev) = events.recv().await else {
                return;
            };
            self.push_event(ReadyEvent::Node(ev));
        }
    }

    /// Waits until `has_room` holds for the queues.
    async fn wait_for(&self, has_room: impl Fn(&Queues) -> bool) {
        loop {
            // Registered before the check: a pop between the check and the wait still wakes us.
            let mut notified = std::pin::pin!(self.room.notified());
            notified.as_mut().enable();
            if has_room(&self.lock()) {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use busway::BusId;

    /// Whether the eventfd is readable now (a poll that does not wait).
    fn readable(r: &Ready) -> bool {
        let mut fds = [rustix::event::PollFd::new(
            &r.fd,
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        rustix::event::poll(&mut fds, Some(&zero)).unwrap_or(0) > 0
    }

    fn gap(n: u64) -> ReadyEvent {
        ReadyEvent::Node(busway::Event::MulticastGap {
            source: BusId(n),
            missed: n,
            reason: String::new(),
        })
    }

    #[test]
    fn the_descriptor_is_readable_exactly_while_something_waits() {
        let r = Ready::new().unwrap();
        assert!(!readable(&r));
        r.push_event(gap(1));
        r.push_event(gap(2));
        assert!(readable(&r));
        assert!(r.pop_event().is_some());
        assert!(readable(&r), "one still waits");
        assert!(r.pop_event().is_some());
        assert!(!readable(&r), "nothing waits");
        assert!(r.pop_event().is_none() && r.pop_batch().is_none());
        assert!(!readable(&r));
        r.push_event(gap(3));
        assert!(readable(&r), "readable again after it was cleared");
    }
}
