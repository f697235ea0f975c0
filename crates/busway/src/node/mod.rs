//! The node part: the public handle and what the application sees of a node.
//!
//! **Owns**: [`Node`] (start, send, receive, call, join, flush, drain, shutdown; `drain`), its
//! configuration and the config file (`config`, `config_file`), the inbox and the messages it
//! yields (`inbox`, `message`), the events and their queue (`event`, `event_queue`), and the
//! counters (`stats`).
//!
//! **Runs on**: the application's threads and tasks; the inbox also reads peers' rings there.
//! At start it builds `Shared` and spawns the other parts' tasks on the I/O loops.
//!
//! **May call**: every other part: it is the top of the runtime. Its timer (`timer`) runs
//! the periodic work each part registers at start.
//!
//! # The handle
//!
//! The public face of busway: a node with a bus id that sends to and receives from peers.

pub(crate) mod app_side;
pub(crate) mod config;
pub(crate) mod config_env;
pub(crate) mod config_error;
pub(crate) mod config_file;
pub(crate) mod dispatch;
pub(crate) mod drain;
pub(crate) mod errors;
pub(crate) mod event;
pub(crate) mod event_queue;
pub(crate) mod inbox;
pub(crate) mod info;
pub(crate) mod message;
pub(crate) mod own;
pub(crate) mod stats;
pub(crate) mod timer;

pub use errors::{SendError, StartError};
pub use info::{PeerInfo, RelayedInfo, Relaying};

use crate::addr::Addr;
use crate::clock::Clock;
use crate::group::reads::NodeGroups;
use crate::group::state::GroupPart;
use crate::limits::{CALLS_PENDING_MAX, FORGET_SWEEP_INTERVAL_MS};
use crate::link::connector::{accept_loop, dial_loop, direct_dial_loop};
use crate::link::io_loops::IoLoops;
use crate::link::state::Links;
use crate::link::transport;
use crate::node::app_side::AppSide;
use crate::node::config::{IoThreads, NodeConfig};
use crate::node::event::{Event, Path};
use crate::node::event_queue::EventQueue;
use crate::node::inbox::{inbox, Inbox};
use crate::node::message::MessageBatch;
use crate::node::own::Own;
use crate::node::stats::{Counters, Stats};
use crate::node::timer::Periodic;
use crate::peer::deferred::Deferred;
use crate::peer::table::PeerTable;
use crate::route;
use crate::route::outgoing;
use crate::route::outgoing::{Blocked, Outgoing};
use crate::route::registrations;
use crate::route::state::RouteTables;
use crate::route::tasks;
use crate::rpc::call_table::CallTable;
use crate::shared::{random_bytes, Shared};
use busway_core::BusId;
use bytes::Bytes;
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A running node. Cheap to clone; every clone is the same node. Safe to use from any thread
/// and any tokio runtime. Dropping the last clone stops the node abruptly; call
/// [`Node::shutdown`] to close links cleanly.
#[derive(Clone)]
pub struct Node {
    owner: Arc<Owner>,
}

struct Owner {
    shared: Arc<Shared>,
    inbox: Mutex<Option<Inbox>>,
    events: Mutex<Option<Events>>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.shared.app.shut_down();
        self.shared.links.stop();
        report_held(&self.shared);
        self.shared.calls.fail_all();
        self.shared.app.events.close();
    }
}

/// The node is going: every message it still holds unacknowledged is reported undeliverable
/// (its sender must not wait for a confirmation that cannot come any more).
fn report_held(shared: &Shared) {
    let me = shared.config().id;
    let reason = |id: BusId| format!("bus id {me} shut down before bus id {id} acknowledged them");
    for p in shared.peers_snapshot() {
        let seqs = p.fail_all();
        shared.report_undeliverable(
            p.id,
            seqs,
            reason(p.id),
            Path::Direct,
            Some(p.incarnation()),
        );
    }
    for r in route::remotes_snapshot(shared) {
        let seqs = r.fail_all();
        shared.report_undeliverable(r.id, seqs, reason(r.id), Path::Relayed, r.incarnation());
    }
}

/// The node's event stream (see [`Event`]). Owned by one reader; dropping it tells the node
/// that nobody reads events any more (they are no longer kept).
pub struct Events {
    queue: Arc<EventQueue>,
}

impl Events {
    /// The next event; `None` after the node is gone and every event was read.
    pub async fn recv(&mut self) -> Option<Event> {
        self.queue.recv().await
    }

    /// The next event if one is waiting now (no wait).
    pub fn try_recv(&mut self) -> Option<Event> {
        self.queue.try_recv()
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        self.queue.close();
    }
}

impl Node {
    /// Binds every listen address (errors name the address), then starts the I/O loops, the
    /// listeners and the dialers. Must be called within a tokio runtime.
    pub async fn start(config: NodeConfig) -> Result<Node, StartError> {
        config.validate().map_err(StartError::Config)?;
        let mut listeners = Vec::new();
        let mut listen_addrs = Vec::new();
        for addr in &config.listen {
            let (l, bound) = transport::bind(addr).map_err(|source| StartError::Bind {
                addr: addr.clone(),
                source,
            })?;
            listeners.push(l);
            listen_addrs.push(bound);
        }
        let loops = IoLoops::start(config.io_threads, &format!("busway-{}", config.id))
            .map_err(StartError::Io)?;
        let events = Arc::new(EventQueue::new());
        let deferred = Arc::<Deferred>::default();
        let (inbox_tx, inbox_rx) =
            inbox(config.inbox_bytes_max, config.shm_spins, deferred.clone());
        let connect = config.connect.clone();
        let counters = Arc::<Counters>::default();
        // Logs are read through the links' rings: none without them.
        let group_log_bytes = if config.group_logs && config.shm_channels {
            config.shm_ring_bytes
        } else {
            0
        };
        let on_callers_runtime = config.io_threads == IoThreads::Current;
        let shared = Arc::new_cyclic(|node| Shared {
            group: GroupPart::new(
                config.id,
                config.group_retain_bytes,
                group_log_bytes,
                Arc::new(NodeGroups(node.clone())),
            ),
            links: Links::new(config.connections_max, loops),
            own: Own {
                incarnation: u64::from_le_bytes(random_bytes::<8>()),
                host_id: crate::peer::shm_link::host_identity(),
                config,
                listen_addrs,
            },
            clock: Clock::start(on_callers_runtime),
            peers: PeerTable::new(deferred),
            routes: RouteTables::default(),
            app: AppSide::new(events.clone(), inbox_tx),
            calls: Arc::new(CallTable::new(counters.clone(), CALLS_PENDING_MAX)),
            directory: Default::default(),
            counters,
        });
        let replier = crate::rpc::replier::NodeReplier(Arc::downgrade(&shared));
        shared.calls.set_replier(Arc::new(replier));
        spawn_tasks(&shared, listeners, connect);
        Ok(Node {
            owner: Arc::new(Owner {
                shared,
                inbox: Mutex::new(Some(inbox_rx)),
                events: Mutex::new(Some(Events { queue: events })),
            }),
        })
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.owner.shared
    }

    /// This node's bus id.
    pub fn id(&self) -> BusId {
        self.shared().config().id
    }

    /// This process's incarnation: random per start.
    pub fn incarnation(&self) -> u64 {
        self.shared().incarnation()
    }

    /// The addresses actually bound (port 0 resolved), in the order configured.
    pub fn listen_addrs(&self) -> Vec<Addr> {
        self.shared().own.listen_addrs.clone()
    }

    /// The receive side; `None` if it was taken already. Messages for this node wait in it
    /// until the application reads them; a node that reads none (a pure relay) should take it
    /// and drop it, so that messages sent to it are counted, acknowledged and discarded:
    /// messages that came through a shared-memory ring are acknowledged only once read, and
    /// their senders' `flush` would wait on an inbox nobody reads.
    pub fn take_inbox(&self) -> Option<Inbox> {
        self.owner.inbox.lock().ok()?.take()
    }

    /// The event stream; `None` if it was taken already.
    pub fn take_events(&self) -> Option<Events> {
        let events = self.owner.events.lock().ok()?.take()?;
        events.queue.taken();
        Some(events)
    }

    /// Queues `payload` for `dst` without waiting: `Full` if its queue has no room. Returns the
    /// message's sequence number to `dst` (what `Event::Undeliverable` names).
    pub fn try_send(&self, dst: BusId, payload: Bytes) -> Result<u64, SendError> {
        let shared = self.shared();
        if dst == self.id() {
            outgoing::check_size(shared, payload.len())?;
            return self.deliver_local(payload);
        }
        // (Its size checked there.)
        match outgoing::try_enqueue_single(shared, dst, &payload) {
            Ok(seq) => Ok(seq),
            Err(Blocked::Full(_)) => Err(SendError::Full(dst)),
            Err(Blocked::Failed(e)) => Err(e),
        }
    }

    /// Queues `payload` for `dst`, waiting while its queue is full. Returns the message's
    /// sequence number to `dst` (this node's own id: its inbox gets it, numbered in its own
    /// sequence from 0, as a peer's messages are).
    pub async fn send(&self, dst: BusId, payload: Bytes) -> Result<u64, SendError> {
        if dst == self.id() {
            outgoing::check_size(self.shared(), payload.len())?;
            let batch = MessageBatch::single(dst, payload);
            self.shared().app.inbox().deliver(batch).await;
            return Ok(self.seqs_to_self(1).start);
        }
        // The common case (a route, and room) in a plain call: nothing of it is kept in this
        // future's state, which a send in a loop would write and read back per message.
        match outgoing::try_enqueue_single(self.shared(), dst, &payload) {
            Ok(seq) => return Ok(seq),
            Err(Blocked::Failed(e)) if !matches!(e, SendError::NoRoute(_)) => return Err(e),
            // Full, or perhaps etcd knows it: on the way that waits.
            Err(_) => {}
        }
        let waiting = outgoing::enqueue(self.shared(), dst, Outgoing::single(&payload));
        Ok(Box::pin(waiting).await?.seqs.start)
    }

    /// Queues one message per payload for `dst`, in order, copying each into the link's write
    /// buffer under one lock: the cheapest way to send many small messages. Waits for room as
    /// needed; returns the sequence numbers given. On an error, the messages before the failing
    /// one are queued.
    pub async fn send_batch<P: AsRef<[u8]>>(
        &self,
        dst: BusId,
        payloads: &[P],
    ) -> Result<Range<u64>, SendError> {
        let max = self.shared().config().frame_body_max;
        if let Some(p) = payloads.iter().find(|p| p.as_ref().len() > max) {
            return Err(SendError::TooLarge {
                len: p.as_ref().len(),
                max,
            });
        }
        if dst == self.id() {
            for p in payloads {
                let batch = MessageBatch::single(dst, Bytes::copy_from_slice(p.as_ref()));
                self.shared().app.inbox().deliver(batch).await;
            }
            return Ok(self.seqs_to_self(payloads.len() as u64));
        }
        if payloads.is_empty() {
            // Nothing to queue, but an id with no route is still an error (as with one).
            outgoing::route_or_discover(self.shared(), dst, 0).await?;
            return Ok(0..0);
        }
        let queued = outgoing::enqueue(self.shared(), dst, Outgoing::Copies(payloads)).await?;
        Ok(queued.seqs)
    }

    /// Queues a copy of each of `payloads` for `dst`, in order, without waiting: as many as fit
    /// now, copied into the link's write buffer under one lock with no allocation per message
    /// (the cheapest way to hand over bytes that are not already `Bytes`, e.g. a C caller's).
    /// Returns the numbers given: fewer than `payloads.len()` when the queue filled on the way;
    /// `Full` when not even the first fit.
    pub fn try_send_batch<P: AsRef<[u8]>>(
        &self,
        dst: BusId,
        payloads: &[P],
    ) -> Result<Range<u64>, SendError> {
        let shared = self.shared();
        for p in payloads {
            outgoing::check_size(shared, p.as_ref().len())?;
        }
        if dst == self.id() {
            let mut queued: Option<Range<u64>> = None;
            for p in payloads {
                match self.deliver_local(Bytes::copy_from_slice(p.as_ref())) {
                    Ok(seq) => queued = Some(queued.map_or(seq, |q| q.start)..seq + 1),
                    Err(e) => return queued.ok_or(e),
                }
            }
            return Ok(queued.unwrap_or(0..0));
        }
        match outgoing::try_enqueue(shared, dst, None, &Outgoing::Copies(payloads)) {
            Ok(q) => Ok(q.seqs),
            Err(Blocked::Full(_)) => Err(SendError::Full(dst)),
            Err(Blocked::Failed(e)) => Err(e),
        }
    }

    /// The sequence numbers of `n` messages this node just delivered to itself.
    fn seqs_to_self(&self, n: u64) -> Range<u64> {
        // Relaxed: a counter of its own; the messages' order is the inbox's.
        let first = self.shared().app.next_seq_to_self.fetch_add(n, Relaxed);
        first..first + n
    }

    /// A message to this node itself, without waiting: `InboxFull` if its inbox has no room.
    /// An inbox the application dropped discards it, as it discards a peer's messages.
    fn deliver_local(&self, payload: Bytes) -> Result<u64, SendError> {
        let batch = MessageBatch::single(self.id(), payload);
        match self.shared().app.inbox().deliver_now(batch) {
            Ok(_) => Ok(self.seqs_to_self(1).start),
            Err(_) => Err(SendError::InboxFull(self.id())),
        }
    }

    /// The bus id of this node's upstream (the peer its `NodeConfig::upstream` link reached
    /// last), kept while that link is down; `None` before it first came up, or without one.
    pub fn upstream_id(&self) -> Option<BusId> {
        self.shared().upstream_id()
    }

    /// Drops the link to `id` at once, as a network failure would (no CLOSE): messages in
    /// flight are written again when a link is back. For tests and for operators who need to
    /// force a reconnect. Returns whether a link was up.
    pub fn disconnect(&self, id: BusId) -> bool {
        self.shared().peer(id).is_some_and(|p| p.request_cut())
    }

    /// Waits until a link to `id` is up, at most `timeout`; true if it is.
    pub async fn wait_for_peer(&self, id: BusId, timeout: Duration) -> bool {
        outgoing::wait_for_peer(self.shared(), id, timeout).await
    }

    /// What this node knows from etcd (`NodeConfig::etcd`): whether its session is up, how
    /// often it registered, the last error, and the nodes registered there; `None` without
    /// etcd.
    pub fn discovery(&self) -> Option<crate::discovery::directory::DiscoveryInfo> {
        let shared = self.shared();
        shared.config().etcd.as_ref()?;
        Some(shared.directory.info())
    }

    /// Waits until at least one link is up, at most `timeout`; true if one is.
    pub async fn wait_for_any_link(&self, timeout: Duration) -> bool {
        let shared = self.shared();
        let wait = async {
            loop {
                let changed = shared.peers.changed();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if shared.peers_snapshot().iter().any(|p| p.is_up()) {
                    return;
                }
                changed.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }

    /// Waits until every message sent so far, direct or relayed, is acknowledged by its
    /// destination (or reported undeliverable), at most `timeout`; true if so.
    pub async fn flush(&self, timeout: Duration) -> bool {
        let shared = self.shared();
        shared.peers.deferred().publish_all();
        shared.group.logs().wake_due();
        // One unsettled peer or destination waited on at a time, each woken by what settles
        // it: all of them must settle, so waiting on any one is never too early to look again.
        let wait = async {
            loop {
                if let Some(p) = shared
                    .peers_snapshot()
                    .into_iter()
                    .find(|p| p.unacked() > 0)
                {
                    p.wait_all_acked().await;
                } else if let Some(r) = route::remotes_snapshot(shared)
                    .into_iter()
                    .find(|r| r.unacked() > 0)
                {
                    r.wait_all_acked().await;
                } else {
                    return;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }

    /// A snapshot of the node's counters.
    pub fn stats(&self) -> Stats {
        let mut s = self.shared().counters.snapshot();
        s.connections_open = self.shared().links.connections_open() as u64;
        s.calls_pending = self.shared().calls.len() as u64;
        for p in self.peers() {
            s.peers_up += u64::from(p.up);
            s.msgs_out += p.msgs_sent;
        }
        s
    }

    /// Closes every link cleanly: queued messages are written, each peer is sent CLOSE and
    /// given `linger_ms` to read everything and close its side. Then the loops stop.
    pub async fn shutdown(self) {
        let shared = self.owner.shared.clone();
        shared.app.shut_down();
        crate::discovery::etcd::deregister(&shared).await;
        let peers = shared.peers.snapshot();
        for p in &peers {
            p.close();
        }
        let linger = Duration::from_millis(shared.config().linger_ms + 1_000);
        let all_down = async {
            loop {
                let changed = shared.peers.changed();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if peers.iter().all(|p| !p.is_up()) {
                    return;
                }
                changed.await;
            }
        };
        let _ = tokio::time::timeout(linger, all_down).await;
        for addr in &shared.own.listen_addrs {
            if let Addr::Unix(path) = addr {
                let _ = std::fs::remove_file(path);
            }
        }
        drop(self);
    }
}

/// The parts' periodic work, in the order the node's timer runs it each tick.
fn periodic_work() -> Vec<Periodic> {
    vec![
        Periodic {
            name: "forget idle state",
            every_ms: FORGET_SWEEP_INTERVAL_MS,
            run: tasks::forget_idle,
        },
        Periodic {
            name: "registrations",
            every_ms: 0,
            run: |node, _| registrations::registrations_tick(node),
        },
        Periodic {
            name: "groups and multicasts",
            every_ms: 0,
            run: crate::group::tick::tick,
        },
        Periodic {
            name: "relayed destinations",
            every_ms: 0,
            run: tasks::retry_remotes,
        },
    ]
}

/// Starts a new node's tasks on its I/O loops: the listeners' accept loops, the dial loops of
/// its configured addresses and upstream, the node's timer and the pump task, the group logs'
/// wake-ups and discovery. Each holds the node's state and ends with its shutdown.
fn spawn_tasks(shared: &Arc<Shared>, listeners: Vec<transport::StdListener>, connect: Vec<Addr>) {
    for l in listeners {
        let shared2 = shared.clone();
        shared.links.spawn(accept_loop(shared2, l));
    }
    for addr in connect {
        let shared2 = shared.clone();
        shared.links.spawn(dial_loop(shared2, addr, false));
    }
    if let Some(addr) = shared.config().upstream.clone() {
        let shared2 = shared.clone();
        shared.links.spawn(dial_loop(shared2, addr, true));
    }
    shared
        .links
        .spawn(timer::run(shared.clone(), periodic_work()));
    shared.links.spawn(tasks::pump_loop(shared.clone()));
    // Holds the logs alone (not the node), and ends with the node.
    let (logs, mut down) = (shared.group.logs().clone(), shared.app.stop_signal());
    shared.links.spawn(async move {
        tokio::select! {
            () = logs.wake_loop() => {}
            _ = down.wait_for(|&d| d) => {}
        }
    });
    shared.links.spawn(direct_dial_loop(shared.clone()));
    if let Some(etcd) = shared.config().etcd.clone() {
        shared
            .links
            .spawn(crate::discovery::etcd::etcd_loop(shared.clone(), etcd));
    }
}
