//! The public face of busway: a node with a bus id that sends to and receives from peers.

use crate::addr::Addr;
use crate::config::NodeConfig;
use crate::event::Event;
use crate::inbox::{inbox, Inbox, InboxSender, MessageBatch};
use crate::io_loops::IoLoops;
use crate::limits::{DIAL_BACKOFF_MAX_MS, DIAL_BACKOFF_MIN_MS, EVENT_QUEUE_LEN_MAX};
use crate::link::{self, Outcome};
use crate::send_queue::{PushError, SendQueue};
use crate::stats::{bump, Counters, Stats};
use crate::transport::{self, StdListener};
use busway_core::frame::HEADER_LEN;
use busway_core::handshake::{local_hello, Established, Hello, NonceCache, Role, NONCE_LEN};
use busway_core::BusId;
use bytes::Bytes;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, watch, Notify};

/// Why a send failed. Nothing was queued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SendError {
    /// No link to this id is up.
    NoRoute(BusId),
    /// The peer's send queue holds its byte limit (`try_send` only).
    Full(BusId),
    /// The payload is over the node's `frame_body_max`.
    TooLarge { len: usize, max: usize },
    /// The link went down or the node is shutting down.
    Closed(BusId),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoRoute(id) => write!(f, "no route to bus id {id}: no link to it is up"),
            Self::Full(id) => write!(f, "the send queue to bus id {id} is full"),
            Self::TooLarge { len, max } => {
                write!(
                    f,
                    "payload of {len} bytes is over the {max}-byte frame limit"
                )
            }
            Self::Closed(id) => write!(f, "the link to bus id {id} closed"),
        }
    }
}

impl std::error::Error for SendError {}

/// Why a node could not start.
#[derive(Debug)]
pub enum StartError {
    Config(String),
    Bind { addr: Addr, source: std::io::Error },
    Io(std::io::Error),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(what) => write!(f, "invalid node configuration: {what}"),
            Self::Bind { addr, source } => write!(f, "cannot listen on {addr}: {source}"),
            Self::Io(e) => write!(f, "cannot start the node: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

/// What a node knows about one connected peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    pub id: BusId,
    pub incarnation: u64,
    /// The remote address of the link.
    pub addr: String,
    /// The addresses the peer listens on, as it announced them.
    pub listen_addrs: Vec<String>,
    /// Messages waiting in the send queue, and bytes queued or being written.
    pub queued_msgs: u64,
    pub queued_bytes: usize,
}

struct PeerEntry {
    link_id: u64,
    hello: Hello,
    addr: String,
    queue: Arc<SendQueue>,
}

/// State shared by the node's handle, its listeners, dialers and links.
pub(crate) struct Shared {
    pub(crate) config: NodeConfig,
    incarnation: u64,
    listen_addrs: Vec<Addr>,
    peers: RwLock<HashMap<BusId, PeerEntry>>,
    peers_changed: Notify,
    nonces: Mutex<NonceCache>,
    events: mpsc::Sender<Event>,
    pub(crate) inbox: InboxSender,
    pub(crate) counters: Counters,
    loops: IoLoops,
    next_link_id: AtomicU64,
    shutting_down: AtomicBool,
    shutdown_tx: watch::Sender<bool>,
}

/// Milliseconds since the Unix epoch (the handshake's clock).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    // The OS random source failing is not recoverable in any useful way; mix in the clock so
    // the value still differs between processes.
    if getrandom::getrandom(&mut b).is_err() {
        let t = now_ms().to_le_bytes();
        for (i, x) in b.iter_mut().enumerate() {
            *x = t[i % 8] ^ (std::process::id() >> (i % 4)) as u8;
        }
    }
    b
}

impl Shared {
    pub(crate) fn local_hello(&self) -> Hello {
        local_hello(
            self.config.id,
            self.incarnation,
            now_ms(),
            random_bytes::<NONCE_LEN>(),
            self.listen_addrs.iter().map(ToString::to_string).collect(),
        )
    }

    pub(crate) fn nonces(&self) -> MutexGuard<'_, NonceCache> {
        self.nonces.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn emit(&self, event: Event) {
        if self.events.try_send(event).is_err() {
            bump(&self.counters.events_dropped);
        }
    }

    /// Adds an authenticated peer; refuses a second link to an id that is already up (from the
    /// same incarnation or another one), naming both.
    pub(crate) fn register_peer(
        &self,
        est: &Established,
        addr: &str,
        queue: Arc<SendQueue>,
    ) -> Result<u64, String> {
        if self.shutting_down.load(Relaxed) {
            return Err("this node is shutting down".into());
        }
        let id = est.peer.bus_id;
        let mut peers = self.peers.write().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = peers.get(&id) {
            return Err(if old.hello.incarnation == est.peer.incarnation {
                format!("bus id {id} is already connected (via {})", old.addr)
            } else {
                format!(
                    "bus id {id} is already connected from another incarnation ({:#x} via {}; this one is {:#x})",
                    old.hello.incarnation, old.addr, est.peer.incarnation
                )
            });
        }
        let link_id = self.next_link_id.fetch_add(1, Relaxed);
        peers.insert(
            id,
            PeerEntry {
                link_id,
                hello: est.peer.clone(),
                addr: addr.to_owned(),
                queue,
            },
        );
        drop(peers);
        self.peers_changed.notify_waiters();
        Ok(link_id)
    }

    pub(crate) fn unregister_peer(&self, id: BusId, link_id: u64, queue: &SendQueue) {
        let mut peers = self.peers.write().unwrap_or_else(|p| p.into_inner());
        if peers.get(&id).is_some_and(|p| p.link_id == link_id) {
            peers.remove(&id);
        }
        drop(peers);
        let (frames, bytes) = queue.totals();
        self.counters
            .msgs_out_closed_links
            .fetch_add(frames, Relaxed);
        self.counters
            .bytes_out_closed_links
            .fetch_add(bytes, Relaxed);
        self.peers_changed.notify_waiters();
    }

    fn with_queue<T>(
        &self,
        dst: BusId,
        f: impl FnOnce(&Arc<SendQueue>) -> T,
    ) -> Result<T, SendError> {
        let peers = self.peers.read().unwrap_or_else(|p| p.into_inner());
        peers
            .get(&dst)
            .map(|p| f(&p.queue))
            .ok_or(SendError::NoRoute(dst))
    }
}

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
        self.shared.shutting_down.store(true, Relaxed);
        let _ = self.shared.shutdown_tx.send(true);
        self.shared.loops.stop();
    }
}

/// The node's event stream (see [`Event`]).
pub struct Events {
    rx: mpsc::Receiver<Event>,
}

impl Events {
    /// The next event; `None` after the node is gone.
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
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
        let (events_tx, events_rx) = mpsc::channel(EVENT_QUEUE_LEN_MAX);
        let (inbox_tx, inbox_rx) = inbox(config.inbox_bytes_max);
        let (shutdown_tx, _) = watch::channel(false);
        let connect = config.connect.clone();
        let shared = Arc::new(Shared {
            incarnation: u64::from_le_bytes(random_bytes::<8>()),
            config,
            listen_addrs,
            peers: RwLock::new(HashMap::new()),
            peers_changed: Notify::new(),
            nonces: Mutex::new(NonceCache::default()),
            events: events_tx,
            inbox: inbox_tx,
            counters: Counters::default(),
            loops,
            next_link_id: AtomicU64::new(1),
            shutting_down: AtomicBool::new(false),
            shutdown_tx,
        });
        for l in listeners {
            let shared2 = shared.clone();
            shared.loops.pick().spawn(accept_loop(shared2, l));
        }
        for addr in connect {
            let shared2 = shared.clone();
            shared.loops.pick().spawn(dial_loop(shared2, addr));
        }
        Ok(Node {
            owner: Arc::new(Owner {
                shared,
                inbox: Mutex::new(Some(inbox_rx)),
                events: Mutex::new(Some(Events { rx: events_rx })),
            }),
        })
    }

    fn shared(&self) -> &Shared {
        &self.owner.shared
    }

    pub fn id(&self) -> BusId {
        self.shared().config.id
    }

    /// This process's incarnation: random per start.
    pub fn incarnation(&self) -> u64 {
        self.shared().incarnation
    }

    /// The addresses actually bound (port 0 resolved), in the order configured.
    pub fn listen_addrs(&self) -> Vec<Addr> {
        self.shared().listen_addrs.clone()
    }

    /// The receive side; `None` if it was taken already.
    pub fn take_inbox(&self) -> Option<Inbox> {
        self.owner.inbox.lock().ok()?.take()
    }

    /// The event stream; `None` if it was taken already.
    pub fn take_events(&self) -> Option<Events> {
        self.owner.events.lock().ok()?.take()
    }

    fn check_size(&self, payload: &Bytes) -> Result<(), SendError> {
        let max = self.shared().config.frame_body_max;
        if payload.len() > max {
            return Err(SendError::TooLarge {
                len: payload.len(),
                max,
            });
        }
        Ok(())
    }

    /// Queues `payload` for `dst` without waiting: `Full` if its queue has no room.
    pub fn try_send(&self, dst: BusId, payload: Bytes) -> Result<(), SendError> {
        self.check_size(&payload)?;
        if dst == self.id() {
            return self.deliver_local(payload);
        }
        match self.shared().with_queue(dst, |q| q.push_data(&payload))? {
            Ok(()) => Ok(()),
            Err(PushError::Full) => Err(SendError::Full(dst)),
            Err(PushError::Closed) => Err(SendError::Closed(dst)),
        }
    }

    /// Queues `payload` for `dst`, waiting while its queue is full.
    pub async fn send(&self, dst: BusId, payload: Bytes) -> Result<(), SendError> {
        self.check_size(&payload)?;
        if dst == self.id() {
            let batch = MessageBatch::single(dst, payload);
            self.shared().inbox.deliver(batch).await;
            return Ok(());
        }
        loop {
            let full = self
                .shared()
                .with_queue(dst, |q| match q.push_data(&payload) {
                    Ok(()) => Ok(None),
                    Err(PushError::Full) => Ok(Some(q.clone())),
                    Err(PushError::Closed) => Err(SendError::Closed(dst)),
                })??;
            match full {
                None => return Ok(()),
                Some(q) => q.wait_for_room(HEADER_LEN + payload.len()).await,
            }
        }
    }

    /// Queues one message per payload for `dst`, in order, copying each into the link's write
    /// buffer under one lock: the cheapest way to send many small messages. Waits for room as
    /// needed; on an error, the messages before the failing one are queued.
    pub async fn send_batch<P: AsRef<[u8]>>(
        &self,
        dst: BusId,
        payloads: &[P],
    ) -> Result<(), SendError> {
        let max = self.shared().config.frame_body_max;
        if let Some(p) = payloads.iter().find(|p| p.as_ref().len() > max) {
            return Err(SendError::TooLarge {
                len: p.as_ref().len(),
                max,
            });
        }
        if dst == self.id() {
            for p in payloads {
                self.send(dst, Bytes::copy_from_slice(p.as_ref())).await?;
            }
            return Ok(());
        }
        let mut rest = payloads;
        while !rest.is_empty() {
            let (queued, queue) = self
                .shared()
                .with_queue(dst, |q| (q.push_copies(rest), q.clone()))?;
            match queued {
                Ok(n) => rest = &rest[n..],
                Err(_) => return Err(SendError::Closed(dst)),
            }
            if let Some(next) = rest.first() {
                queue.wait_for_room(HEADER_LEN + next.as_ref().len()).await;
            }
        }
        Ok(())
    }

    fn deliver_local(&self, payload: Bytes) -> Result<(), SendError> {
        if self
            .shared()
            .inbox
            .try_deliver(MessageBatch::single(self.id(), payload))
        {
            Ok(())
        } else {
            Err(SendError::Full(self.id()))
        }
    }

    /// The peers whose links are up.
    pub fn peers(&self) -> Vec<PeerInfo> {
        let peers = self
            .shared()
            .peers
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<PeerInfo> = peers
            .iter()
            .map(|(id, p)| {
                let (queued_msgs, queued_bytes) = p.queue.queued();
                PeerInfo {
                    id: *id,
                    incarnation: p.hello.incarnation,
                    addr: p.addr.clone(),
                    listen_addrs: p.hello.listen_addrs.clone(),
                    queued_msgs,
                    queued_bytes,
                }
            })
            .collect();
        out.sort_by_key(|p| p.id);
        out
    }

    /// Waits until a link to `id` is up, at most `timeout`; true if it is.
    pub async fn wait_for_peer(&self, id: BusId, timeout: Duration) -> bool {
        let shared = self.shared();
        let wait = async {
            loop {
                let changed = shared.peers_changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if shared.peers.read().is_ok_and(|p| p.contains_key(&id)) {
                    return;
                }
                changed.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }

    /// A snapshot of the node's counters.
    pub fn stats(&self) -> Stats {
        let shared = self.shared();
        let mut s = shared.counters.snapshot();
        let peers = shared.peers.read().unwrap_or_else(|p| p.into_inner());
        s.peers_up = peers.len() as u64;
        for p in peers.values() {
            let (frames, bytes) = p.queue.totals();
            s.frames_out += frames;
            s.bytes_out += bytes;
        }
        s
    }

    /// Closes every link cleanly: queued messages are written, each peer is sent CLOSE and
    /// given `linger_ms` to read everything and close its side. Then the loops stop.
    pub async fn shutdown(self) {
        let shared = self.owner.shared.clone();
        shared.shutting_down.store(true, Relaxed);
        let _ = shared.shutdown_tx.send(true);
        let queues: Vec<Arc<SendQueue>> = shared
            .peers
            .read()
            .map(|p| p.values().map(|e| e.queue.clone()).collect())
            .unwrap_or_default();
        for q in &queues {
            q.close();
        }
        let linger = Duration::from_millis(shared.config.linger_ms + 1_000);
        let all_down = async {
            loop {
                let changed = shared.peers_changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if shared.peers.read().map_or(true, |p| p.is_empty()) {
                    return;
                }
                changed.await;
            }
        };
        let _ = tokio::time::timeout(linger, all_down).await;
        for addr in &shared.listen_addrs {
            if let Addr::Unix(path) = addr {
                let _ = std::fs::remove_file(path);
            }
        }
        drop(self);
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: StdListener) {
    let listener = match listener.register() {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot register a listener");
            return;
        }
    };
    let mut shutdown = shared.shutdown_tx.subscribe();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => {
                    let shared2 = shared.clone();
                    shared
                        .loops
                        .pick()
                        .spawn(link::serve_std(shared2, stream, Role::Listener, remote));
                }
                Err(e) => {
                    // Out of descriptors or a connection reset before accept: wait a little so
                    // a persistent error does not spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = stopped(&mut shutdown) => return,
        }
    }
}

/// Keeps a link to `addr` up: dials, runs the link, and dials again after it goes down, with an
/// exponential backoff (jittered from the node id so that many nodes do not dial in step).
async fn dial_loop(shared: Arc<Shared>, addr: Addr) {
    let mut shutdown = shared.shutdown_tx.subscribe();
    let mut backoff_ms = DIAL_BACKOFF_MIN_MS;
    let mut jitter = shared.config.id.0 ^ shared.incarnation | 1;
    let mut reported = false;
    while !shared.shutting_down.load(Relaxed) {
        let outcome = match transport::dial(&addr).await {
            Ok(stream) => {
                reported = false;
                link::serve(shared.clone(), stream, Role::Dialer, addr.to_string()).await
            }
            Err(e) => {
                if !reported {
                    shared.emit(Event::DialFailed {
                        addr: addr.to_string(),
                        reason: e.to_string(),
                    });
                    reported = true;
                }
                Outcome::NeverUp
            }
        };
        if outcome == Outcome::WasUp {
            backoff_ms = DIAL_BACKOFF_MIN_MS;
        }
        // xorshift64: cheap jitter of up to a quarter of the delay.
        jitter ^= jitter << 13;
        jitter ^= jitter >> 7;
        jitter ^= jitter << 17;
        let delay = backoff_ms + jitter % (backoff_ms / 4 + 1);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(delay)) => {}
            _ = stopped(&mut shutdown) => return,
        }
        backoff_ms = (backoff_ms * 2).min(DIAL_BACKOFF_MAX_MS);
    }
}

/// Resolves once the node is shutting down.
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}
