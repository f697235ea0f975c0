//! What a node's handle, listeners, dialers and links share: the node's parts, one field
//! each. This module also attaches and detaches links and reports what that costs.

use crate::clock::Clock;
use crate::group::state::GroupPart;
use crate::link::dial::Dial;
use crate::link::state::Links;
use crate::node::app_side::AppSide;
use crate::node::config::NodeConfig;
use crate::node::event::{DownReason, Event, Path};
use crate::node::own::Own;
use crate::node::stats::{bump, Counters};
use crate::peer::table::{Attached, PeerTable};
use crate::peer::Peer;
use crate::route::state::RouteTables;
use crate::rpc::call_table::CallTable;
use busway_core::handshake::{caps, local_hello, Established, Hello, NONCE_LEN};
use busway_core::link::Now;
use busway_core::BusId;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The node's parts, shared by its handle, listeners, dialers and links: each part owns its
/// state (see the part's module doc); `Shared` holds them and nothing else.
pub(crate) struct Shared {
    /// What the node is: configuration and identity.
    pub(crate) own: Own,
    /// The node's monotonic clock.
    pub(crate) clock: Clock,
    /// Direct neighbors, the upstream among them (the peer part).
    pub(crate) peers: PeerTable,
    /// Destinations behind relays, direct links on hints, registrations (the route part).
    pub(crate) routes: RouteTables,
    /// Admission, I/O loops, the handshakes' replay cache (the link part).
    pub(crate) links: Links,
    /// Groups, multicasts and group logs (the group part).
    pub(crate) group: GroupPart,
    /// The calls this node made and waits on (the rpc part).
    pub(crate) calls: Arc<CallTable>,
    /// What etcd says of the other nodes (`NodeConfig::etcd`), and this node's session there.
    pub(crate) directory: crate::discovery::directory::Directory,
    /// The inbox, the events and the node's stop (the node part's side toward the
    /// application).
    pub(crate) app: AppSide,
    /// What the node counts (`Node::stats`).
    pub(crate) counters: Arc<Counters>,
}

pub(crate) use crate::clock::now_ms;

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
            self.config().id,
            self.incarnation(),
            now_ms(),
            random_bytes::<NONCE_LEN>(),
            self.advertised_addrs(),
        );
        h.capabilities = caps::RELIABLE
            | caps::RELAY
            | caps::GROUP_LOGS
            | caps::REGISTER
            | caps::PUBLISH_BATCH
            | caps::GAP_MARKS;
        if self.config().direct_links {
            h.capabilities |= caps::DIRECT;
        }
        if self.config().shm_channels {
            h.capabilities |= caps::SHM_BOUND;
        }
        h.host_id = self.own.host_id.clone();
        h.frame_body_max = Some(self.config().frame_body_max as u64);
        h
    }

    /// The node's configuration.
    pub(crate) fn config(&self) -> &NodeConfig {
        &self.own.config
    }

    /// The addresses this node tells others to dial it at (HELLO, etcd).
    pub(crate) fn advertised_addrs(&self) -> Vec<String> {
        self.own
            .listen_addrs
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// This run of the node.
    pub(crate) fn incarnation(&self) -> u64 {
        self.own.incarnation
    }

    /// Milliseconds of the node's monotonic clock.
    pub(crate) fn clock_ms(&self) -> u64 {
        self.clock.ms()
    }

    /// Now, as the link state machines see it.
    pub(crate) fn now(&self) -> Now {
        self.clock.now()
    }

    /// The instant of the node's monotonic clock at `mono_us` (a state machine's timeout).
    pub(crate) fn instant_at(&self, mono_us: u64) -> Instant {
        self.clock.instant_at(mono_us)
    }

    pub(crate) fn next_link_id(&self) -> u64 {
        self.peers.next_link_id()
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
        if let Some(held_back) = self.links.warnings.admit(&key, self.clock_ms()) {
            tracing::warn!(%remote, %why, held_back, "{what}");
        }
    }

    pub(crate) fn emit(&self, event: Event) {
        if !self.app.events.push(event) {
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
        self.app.is_shutting_down()
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
        if self.is_shutting_down() {
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
                self.config().send_queue_bytes_max,
                matches!(dial, Dial::Direct(_)),
            )
        };
        let registers = est.peer.downstream_of_you;
        let Attached { peer, replaced } = self.peers.attach(
            self.config().id,
            id,
            est.peer.incarnation,
            registers,
            || self.routes.registrations.below(),
            make,
        )?;
        if let Some(old) = replaced {
            self.routes.registrations.forget(id);
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
        self.group.table.lock().peer_came(peer.id);
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
            let after = self.config().peer_dead_after_ms;
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
