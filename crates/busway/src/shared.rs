//! What a node's handle, listeners, dialers and links share: the node's parts, one field
//! each, and the few things every part asks of the node as a whole (its config and identity,
//! its HELLO, its clock, events, held-back warnings, what it gave up on). A link's attach and
//! detach live in `peer::lifecycle`.

use crate::clock::Clock;
use crate::group::state::GroupPart;
use crate::link::state::Links;
use crate::node::app_side::AppSide;
use crate::node::config::NodeConfig;
use crate::node::event::{Event, Path};
use crate::node::own::Own;
use crate::node::stats::{bump, Counters};
use crate::peer::table::PeerTable;
use crate::peer::Peer;
use crate::route::state::RouteTables;
use crate::rpc::call_table::CallTable;
use busway_core::handshake::{caps, local_hello, Hello, NONCE_LEN};
use busway_core::link::Now;
use busway_core::BusId;
use std::sync::Arc;
use tokio::time::Instant;

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

    /// Logs a warning `what` about a connection from `remote`, at most once per
    /// `WARN_WINDOW_MS` per host and kind, with how many were held back since
    /// (`warn_limit`); counters and events see every one.
    pub(crate) fn warn_repeated(&self, what: &'static str, remote: &str, why: &str) {
        let key = format!("{what} {}", crate::link::warn_limit::host_of(remote));
        if let Some(held_back) = self.links.admit_warning(&key, self.clock_ms()) {
            tracing::warn!(%remote, %why, held_back, "{what}");
        }
    }

    pub(crate) fn emit(&self, event: Event) {
        if !self.app.emit(event) {
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
}
