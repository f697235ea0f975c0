//! What a node's handle, listeners, dialers and links share: its configuration and identity,
//! its tables (peers in `peer_table`, relayed traffic in `relayed_table`, each owning its data),
//! the event queue, the inbox's sending half and the counters. Other modules add what they do
//! with it (`routing`, `direct`); this one attaches and detaches links and reports what that
//! costs.

use crate::addr::Addr;
use crate::link::admission::Admission;
use crate::link::dial::Dial;
use crate::link::io_loops::IoLoops;
use crate::node::config::NodeConfig;
use crate::node::event::{DownReason, Event, Path};
use crate::node::event_queue::EventQueue;
use crate::node::inbox::InboxSender;
use crate::node::stats::{bump, Counters};
use crate::peer::deferred::Deferred;
use crate::peer::table::{Attached, PeerTable};
use crate::peer::Peer;
use crate::route::hints::Hints;
use crate::route::relayed_table::RelayedTable;
use crate::rpc::call_table::CallTable;
use busway_core::group::locked::GroupTable;
use busway_core::handshake::{caps, local_hello, Established, Hello, NonceCache, NONCE_LEN};
use busway_core::link::Now;
use busway_core::BusId;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// State shared by the node's handle, its listeners, dialers and links.
pub(crate) struct Shared {
    pub(crate) config: NodeConfig,
    pub(crate) incarnation: u64,
    /// This host's identity (HELLO tag 2): equal on both ends of a link within one host.
    pub(crate) host_id: Vec<u8>,
    pub(crate) listen_addrs: Vec<Addr>,
    /// Direct neighbors, the upstream among them.
    pub(crate) peers: PeerTable,
    /// Destinations reached through relays, and sources of relayed messages.
    pub(crate) relayed: RelayedTable,
    /// On-demand direct links: hints given and taken, dials running.
    pub(crate) direct: Hints,
    /// The replay cache of handshakes, shared by every link's state machine.
    pub(crate) nonces: Arc<Mutex<NonceCache>>,
    pub(crate) events: Arc<EventQueue>,
    /// Open connections and handshakes in progress, within their limits.
    pub(crate) admission: Admission,
    pub(crate) inbox: InboxSender,
    /// The calls this node made and waits on.
    pub(crate) calls: Arc<CallTable>,
    /// The groups this node joined and the groups its peers asked for.
    pub(crate) groups: GroupTable,
    /// Hands what links decide for the application's group streams to the inbox in the
    /// order decided.
    pub(crate) handover: busway_core::turns::Handover<crate::node::message::MessageBatch>,
    /// Notified when this node starts taking part in groups (it joins, or a peer asks for a
    /// group): links with rings stop looking at them only every `RING_IDLE_WATCH_MS`.
    pub(crate) groups_active: tokio::sync::Notify,
    /// This node's logs of the groups it publishes to, for peers on its host.
    pub(crate) group_logs: Arc<crate::group::log_out::GroupLogs>,
    /// This node's multicasts (numbers, what it keeps for repairs) and the streams of
    /// multicasts to it.
    pub(crate) multicasts:
        busway_core::turns::InTurn<busway_core::multicast::state::MulticastState>,
    /// What etcd says of the other nodes (`NodeConfig::etcd`), and this node's session there.
    pub(crate) directory: crate::discovery::directory::Directory,
    /// Repeated warnings about connections, held back per host (`warn_limit`).
    pub(crate) warnings: crate::link::warn_limit::WarnLimiter,
    /// What downstreams registered here, and what this node registered upstream.
    pub(crate) registrations: crate::route::registration_table::Registrations,
    /// Peers whose rings hold single sends not yet published.
    pub(crate) deferred: Arc<Deferred>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) loops: IoLoops,
    pub(crate) next_link_id: AtomicU64,
    /// Start of the node's monotonic clock (heartbeats, round trips).
    pub(crate) epoch: Instant,
    /// The node's clock in ms as of the retry task's last tick (every
    /// `ROUTED_RETRY_INTERVAL_MS`): for stamps on a hot path that need no more precision (when
    /// a relayed destination was last sent to). Relaxed: a time stamp, publishing nothing.
    pub(crate) coarse_ms: AtomicU64,
    pub(crate) shutting_down: AtomicBool,
    /// The sequence number of this node's next message to itself: its own numbering, from 0,
    /// as a link's to a peer.
    pub(crate) next_seq_to_self: std::sync::atomic::AtomicU64,
    pub(crate) shutdown_tx: watch::Sender<bool>,
}

/// Milliseconds since the Unix epoch (the handshake's clock).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
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
        let mut h = local_hello(
            self.config.id,
            self.incarnation,
            now_ms(),
            random_bytes::<NONCE_LEN>(),
            self.listen_addrs.iter().map(ToString::to_string).collect(),
        );
        h.capabilities = caps::RELIABLE
            | caps::RELAY
            | caps::GROUP_LOGS
            | caps::REGISTER
            | caps::PUBLISH_BATCH
            | caps::GAP_MARKS;
        if self.config.direct_links {
            h.capabilities |= caps::DIRECT;
        }
        if self.config.shm_channels {
            h.capabilities |= caps::SHM_BOUND;
        }
        h.host_id = self.host_id.clone();
        h.frame_body_max = Some(self.config.frame_body_max as u64);
        h
    }

    /// Milliseconds and microseconds of the node's monotonic clock.
    pub(crate) fn clock_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Now, as the link state machines see it.
    pub(crate) fn now(&self) -> Now {
        Now {
            mono_us: self.epoch.elapsed().as_micros() as u64,
            wall_ms: now_ms(),
        }
    }

    /// The instant of the node's monotonic clock at `mono_us` (a state machine's timeout).
    pub(crate) fn instant_at(&self, mono_us: u64) -> Instant {
        self.epoch + Duration::from_micros(mono_us)
    }

    pub(crate) fn next_link_id(&self) -> u64 {
        self.next_link_id.fetch_add(1, Relaxed)
    }

    /// Reports that busway gave up on messages `seqs` to `peer` (nothing when there are none).
    pub(crate) fn report_undeliverable(
        &self,
        peer: BusId,
        seqs: std::ops::Range<u64>,
        reason: String,
        path: Path,
        incarnation: Option<u64>,
    ) {
        self.calls.fail_requests(peer, path, &seqs, &reason);
        if !seqs.is_empty() {
            self.emit(Event::Undeliverable {
                peer,
                seqs,
                reason,
                path,
                incarnation,
            });
        }
    }

    /// busway gave up on `peer` itself (down past its deadline, or restarted): the messages
    /// `seqs` held for it are reported, and every call to it fails with `reason` (a reply
    /// cannot come, even to a request it had received).
    pub(crate) fn give_up_on_peer(
        &self,
        peer: BusId,
        seqs: std::ops::Range<u64>,
        reason: String,
        path: Path,
        incarnation: Option<u64>,
    ) {
        self.calls.fail_peer(peer, &reason);
        self.group_peer_gone(peer, path);
        if path == Path::Direct {
            self.downstream_gone(peer);
        }
        self.report_undeliverable(peer, seqs, reason, path, incarnation);
    }

    /// Logs a warning `what` about a connection from `remote`, at most once per
    /// `WARN_WINDOW_MS` per host and kind, with how many were held back since
    /// (`warn_limit`); counters and events see every one.
    pub(crate) fn warn_repeated(&self, what: &'static str, remote: &str, why: &str) {
        let key = format!("{what} {}", crate::link::warn_limit::host_of(remote));
        if let Some(held_back) = self.warnings.admit(&key, self.clock_ms()) {
            tracing::warn!(%remote, %why, held_back, "{what}");
        }
    }

    pub(crate) fn emit(&self, event: Event) {
        if !self.events.push(event) {
            bump(&self.counters.events_dropped);
        }
    }

    pub(crate) fn peers_snapshot(&self) -> Vec<Arc<Peer>> {
        self.peers.snapshot()
    }

    pub(crate) fn upstream_id(&self) -> Option<BusId> {
        self.peers.upstream()
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Relaxed)
    }

    pub(crate) fn peer(&self, id: BusId) -> Option<Arc<Peer>> {
        self.peers.get(id)
    }

    /// Where sequence numbers resume with this (not yet authenticated) peer: read only, so an
    /// unauthenticated HELLO changes nothing.
    pub(crate) fn resume_point(&self, hello: &Hello) -> (u64, u64) {
        match self.peer(hello.bus_id) {
            Some(p) if p.incarnation() == hello.incarnation => p.resume_point(),
            _ => (0, 0),
        }
    }

    /// Attaches an authenticated link to its peer, creating the peer or replacing a previous
    /// incarnation (whose unacknowledged messages are then reported undeliverable). Refuses a
    /// second link to an id that is up, naming both incarnations.
    pub(crate) fn attach_peer(
        &self,
        est: &Established,
        addr: &str,
        link: u64,
        dial: Dial,
    ) -> Result<Arc<Peer>, String> {
        if self.shutting_down.load(Relaxed) {
            return Err("this node is shutting down".into());
        }
        let id = est.peer.bus_id;
        if let Some(max) = est
            .peer
            .frame_body_max
            .filter(|&m| m < crate::limits::FRAME_BODY_MIN_BYTES as u64)
        {
            // Every node takes a relayed chunk of small messages; one that says it cannot would
            // make every relayed stream toward it fail.
            return Err(format!(
                "bus id {id} states a frame body limit of {max} bytes, under the {} bytes every node must accept",
                crate::limits::FRAME_BODY_MIN_BYTES
            ));
        }
        let make = || {
            Peer::new(
                est.peer.clone(),
                addr.to_owned(),
                self.config.send_queue_bytes_max,
                matches!(dial, Dial::Direct(_)),
            )
        };
        let registers = est.peer.downstream_of_you;
        let Attached { peer, replaced } = self.peers.attach(
            self.config.id,
            id,
            est.peer.incarnation,
            registers,
            || self.registrations.below(),
            make,
        )?;
        if let Some(old) = replaced {
            self.registrations.forget(id);
            if self.upstream_id() == Some(id) {
                self.upstream_replaced();
            }
            let seqs = old.fail_all();
            self.give_up_on_peer(
                id,
                seqs,
                format!(
                    "bus id {id} restarted (incarnation {:#x} replaced by {:#x})",
                    old.incarnation(),
                    est.peer.incarnation
                ),
                Path::Direct,
                Some(old.incarnation()),
            );
        }
        let resent = peer.attach(link, est, addr)?;
        self.counters.msgs_resent.fetch_add(resent, Relaxed);
        Ok(peer)
    }

    /// A link attached by `attach_peer` is ready for traffic (see `link::run`): it becomes
    /// the upstream if dialed so, and waiters for peers hear of it.
    pub(crate) fn peer_ready(&self, peer: &Peer, dial: Dial) {
        if dial == Dial::Upstream {
            self.peers.set_upstream(peer.id);
            self.upstream_came(peer);
        }
        // A new peer (or a new incarnation) learns what this node wants through it, and the
        // receivers of this node's multicasts behind it where their streams stand.
        self.groups.lock().peer_came(peer.id);
        self.sync_group_adverts();
        self.multicast_link_up(peer.id);
        self.peers.notify_changed();
    }

    /// Detaches a link that went down, reports it, and arms the peer's deadline.
    pub(crate) fn detach_peer(self: &Arc<Self>, peer: &Arc<Peer>, link: u64, reason: DownReason) {
        let Some((epoch, unacked)) = peer.detach(link) else {
            return;
        };
        // A peer that shut down will not come back as this incarnation: nothing to wait for.
        let (deadline, why) = if reason == DownReason::PeerShutDown {
            (Duration::ZERO, format!("bus id {} shut down", peer.id))
        } else {
            let after = self.config.peer_dead_after_ms;
            let why = format!("bus id {} stayed down for {after} ms", peer.id);
            (Duration::from_millis(after), why)
        };
        tracing::debug!(peer = %peer.id, %reason, unacked, "link down");
        self.emit(Event::PeerDown {
            peer: peer.id,
            reason,
            unacked,
        });
        self.peers.notify_changed();
        let shared = self.clone();
        let peer = peer.clone();
        // A link task dropped with its runtime (the node going away) has no runtime to arm a
        // timer on, and needs none: nothing will be sent any more.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            tokio::time::sleep(deadline).await;
            if let Some(seqs) = peer.expire(epoch, shared.clock_ms()) {
                shared.give_up_on_peer(peer.id, seqs, why, Path::Direct, Some(peer.incarnation()));
            }
        });
    }
}
