//! The node's side toward the application: where messages and events are handed over, and
//! whether the node is stopping.

use crate::node::event_queue::EventQueue;
use crate::node::inbox::InboxSender;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tokio::sync::watch;

/// What the runtime hands the application, and the node's stop.
pub(crate) struct AppSide {
    /// Events (peer up and down, undeliverable, ...) for `Node::events`.
    pub(in crate::node) events: Arc<EventQueue>,
    /// The inbox's sending half: every message for this node's application goes through it.
    inbox: InboxSender,
    /// The sequence number of this node's next message to itself: its own numbering, from 0,
    /// as a link's to a peer.
    pub(in crate::node) next_seq_to_self: AtomicU64,
    /// Set once the node starts shutting down: nothing new is attached or sent.
    shutting_down: AtomicBool,
    /// Tells the node's tasks to stop (true) when the node shuts down.
    shutdown_tx: watch::Sender<bool>,
}

impl AppSide {
    /// The application's side of a node, handing over through `events` and `inbox`.
    pub(crate) fn new(events: Arc<EventQueue>, inbox: InboxSender) -> Self {
        AppSide {
            events,
            inbox,
            next_seq_to_self: AtomicU64::new(0),
            shutting_down: AtomicBool::new(false),
            shutdown_tx: watch::channel(false).0,
        }
    }

    /// The inbox's sending half: where every message for the application is handed over.
    pub(crate) fn inbox(&self) -> &InboxSender {
        &self.inbox
    }

    /// Queues `event` for `Node::events`; false if an ordinary event was dropped for a full
    /// queue (see `EventQueue::push`).
    pub(crate) fn emit(&self, event: crate::node::event::Event) -> bool {
        self.events.push(event)
    }

    /// Whether the node is shutting down.
    pub(crate) fn is_shutting_down(&self) -> bool {
        // Relaxed: a flag read on its own; what shutdown publishes travels by `shutdown_tx`.
        self.shutting_down.load(Relaxed)
    }

    /// Marks the node as shutting down and tells its tasks to stop.
    pub(crate) fn shut_down(&self) {
        // Relaxed: pairs with nothing; see `is_shutting_down`.
        self.shutting_down.store(true, Relaxed);
        let _ = self.shutdown_tx.send(true);
    }

    /// A receiver that sees `true` once the node shuts down.
    pub(crate) fn stop_signal(&self) -> watch::Receiver<bool> {
        self.shutdown_tx.subscribe()
    }
}
