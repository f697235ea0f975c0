//! How a node is set up.

use crate::addr::Addr;
use crate::limits::*;
use busway_core::frame::{BODY_LEN_CEILING, DEFAULT_BODY_LEN_MAX, HEADER_LEN};
use busway_core::handshake::{Secret, DEFAULT_CLOCK_SKEW_MAX_MS};
use busway_core::BusId;

/// Which threads run a node's links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoThreads {
    /// This many threads of the node's own, each a single-threaded event loop (muduo's model:
    /// a link lives on one loop for its whole life).
    Dedicated(usize),
    /// The tokio runtime that calls [`crate::Node::start`]: one loop, shared with the
    /// application (fewest threads, best for one busy link on a small machine). The node's
    /// tasks end when it is dropped or shut down, as on its own threads. On a runtime whose
    /// time is paused (a test's `#[tokio::test(start_paused = true)]`), the node lives in that
    /// virtual time: its heartbeats, deadlines and group timers run at their full lengths in
    /// no real time (busway's own timer tests do).
    Current,
}

/// A node's configuration. Start from [`NodeConfig::new`] and change what you need.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// This node's bus id: unique on the bus.
    pub id: BusId,
    /// Addresses to listen on (port 0 picks a free port; see `Node::listen_addrs`).
    pub listen: Vec<Addr>,
    /// Addresses to dial and keep dialing (with backoff) whenever the link is down.
    pub connect: Vec<Addr>,
    /// This node's parent: dialed and kept up like `connect`, and told that this node (and
    /// `subtree`) is reached through it. Messages to ids with no other route go to it.
    pub upstream: Option<Addr>,
    /// The bus ids this node serves for its upstream (itself and its own downstreams), first
    /// and last; default: its own id only.
    pub subtree: Option<(BusId, BusId)>,
    /// Relays a message may pass before it is dropped and reported.
    pub ttl: u8,
    /// For this long after it starts, a relay answers a message for an id it does not know
    /// with a transient failure (the sender retries) instead of "unknown id": its downstreams
    /// may not have registered again yet. In milliseconds.
    pub relay_grace_ms: u64,
    /// Whether this node takes direct links to nodes it reaches through relays: it dials a
    /// destination whose addresses a relay hints, and advertises that it accepts such links.
    /// `false` keeps all its traffic on configured links (e.g. only through the upstream).
    pub direct_links: bool,
    /// Whether a link to a node on the same host moves its data to shared-memory rings (both
    /// ends must allow it); the socket stays as the control link.
    pub shm_channels: bool,
    /// Whether a link to a node of this same process (with `shm_channels` on both) takes the
    /// peer's ring straight from this process's memory, an in-process channel, rather than
    /// opening it through `/proc` as between processes. Counted in `Stats::mem_channels`.
    pub mem_channels: bool,
    /// Whether a publisher writes each publish to a group once into a log in shared memory
    /// that its peers on this host read themselves (one copy for all of them), rather than
    /// one PUBLISH per link, where the peer's link moved to a ring and accepted the log; and
    /// whether this node accepts a peer's log. Groups under `GroupPolicy::Backpressure` are
    /// never logged. Each log holds `shm_ring_bytes` of data.
    pub group_logs: bool,
    /// Spins a link's shared-memory reader makes on an empty ring before it sleeps on the futex:
    /// 0 sleeps at once (least CPU, a wake-up costs a few microseconds more), larger trades CPU
    /// for latency. Default `busway_shm::ring::SPINS_BEFORE_SLEEP_DEFAULT`.
    pub shm_spins: u32,
    /// Bytes of data in each shared-memory ring this node makes (a power of two), and the
    /// largest ring it accepts from a peer: a peer's ring holds messages on their way to this
    /// node's application, so a peer cannot make it map more than this. Default
    /// `busway_shm::ring::RING_CAPACITY_DEFAULT`.
    pub shm_ring_bytes: usize,
    /// Shared secret every peer must prove; `None` admits any busway peer.
    pub secret: Option<Secret>,
    /// Which threads run the links' I/O (see [`IoThreads`]).
    pub io_threads: IoThreads,
    /// Largest frame body accepted or sent, in bytes.
    pub frame_body_max: usize,
    /// Bytes one peer's send queue may hold.
    pub send_queue_bytes_max: usize,
    /// Bytes of received messages waiting for the application.
    pub inbox_bytes_max: usize,
    /// Most connections open at once (accepted and dialed); past it, accepted connections are
    /// refused with a CLOSE that says why (`Event::Rejected`, `Stats::connections_refused`).
    pub connections_max: usize,
    /// Time a new connection has to complete the handshake, in milliseconds.
    pub handshake_timeout_ms: u64,
    /// Time a closing link waits for the peer to read everything and close, in milliseconds.
    pub linger_ms: u64,
    /// Interval between PINGs; a peer silent for 3 intervals is declared down.
    pub heartbeat_interval_ms: u64,
    /// How long a peer may stay down before its unacknowledged messages are reported
    /// undeliverable (and sends to it fail at once until it is back). A peer that shut down
    /// (`DownReason::PeerShutDown`) is not waited for.
    pub peer_dead_after_ms: u64,
    /// How long a node keeps what it knows of a peer dead past its deadline, and of a source
    /// of relayed messages it has not heard from, before it forgets them (and twice this for a
    /// relayed destination that holds nothing and is not sent to), in milliseconds: every
    /// table shrinks. Must be the same on every node of a cluster and at least twice
    /// `peer_dead_after_ms`: a destination forgets a source only once that source has settled
    /// (acknowledged or given up) everything it held for it, and a source renumbers a
    /// destination only once that destination has forgotten it.
    pub forget_after_ms: u64,
    /// First delay before redialing a link that dropped (doubling up to
    /// `DIAL_BACKOFF_MAX_MS`), in milliseconds.
    pub dial_backoff_min_ms: u64,
    /// Largest accepted clock difference in an authenticated handshake, in milliseconds.
    pub clock_skew_max_ms: u64,
    /// TLS for `tls://` addresses (listened on, dialed, or hinted): this node's certificate,
    /// which must name its bus id (and its `subtree`), its key, and the authorities peers'
    /// certificates must come from. `None`: no `tls://` address may be configured, and hinted
    /// ones are not dialed.
    pub tls: Option<crate::link::tls::TlsConfig>,
    /// Bytes of its recent publishes a publisher keeps per group (payloads, plus 64 bytes
    /// each), to send copies to a member that lost some (a relay died with them); a member
    /// that asks for older ones is told they are lost (`Event::GroupGap`). Default
    /// `DEFAULT_GROUP_RETAIN_BYTES`.
    pub group_retain_bytes: usize,
    /// Discovery through etcd: this node registers there and finds the nodes it has no link
    /// or route to there (see `EtcdConfig`). `None` (the default): static addresses only.
    pub etcd: Option<crate::discovery::etcd_config::EtcdConfig>,
    /// Who may join and publish to which groups at this node (see `GroupPermissions`):
    /// `None`, the default, lets everyone (as before); with rules, a join or publish no rule
    /// allows is refused with the reason, which the sender's application gets as
    /// `Event::GroupRefused`.
    pub group_permissions: Option<crate::GroupPermissions>,
}

impl NodeConfig {
    /// A node with id `id`, no listeners, no dials, no secret, one I/O loop per core.
    pub fn new(id: BusId) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            id,
            listen: Vec::new(),
            connect: Vec::new(),
            upstream: None,
            subtree: None,
            ttl: busway_core::routed::DEFAULT_TTL,
            relay_grace_ms: DEFAULT_RELAY_GRACE_MS,
            direct_links: true,
            shm_channels: true,
            mem_channels: true,
            group_logs: true,
            shm_spins: busway_shm::ring::SPINS_BEFORE_SLEEP_DEFAULT,
            shm_ring_bytes: busway_shm::ring::RING_CAPACITY_DEFAULT,
            secret: None,
            io_threads: IoThreads::Dedicated(cores),
            frame_body_max: DEFAULT_BODY_LEN_MAX,
            send_queue_bytes_max: DEFAULT_SEND_QUEUE_BYTES_MAX,
            inbox_bytes_max: DEFAULT_INBOX_BYTES_MAX,
            connections_max: DEFAULT_CONNECTIONS_MAX,
            handshake_timeout_ms: DEFAULT_HANDSHAKE_TIMEOUT_MS,
            linger_ms: DEFAULT_LINGER_MS,
            clock_skew_max_ms: DEFAULT_CLOCK_SKEW_MAX_MS,
            tls: None,
            heartbeat_interval_ms: DEFAULT_HEARTBEAT_INTERVAL_MS,
            dial_backoff_min_ms: DIAL_BACKOFF_MIN_MS,
            peer_dead_after_ms: DEFAULT_PEER_DEAD_AFTER_MS,
            forget_after_ms: DEFAULT_FORGET_AFTER_MS,
            group_retain_bytes: DEFAULT_GROUP_RETAIN_BYTES,
            etcd: None,
            group_permissions: None,
        }
    }

    /// Adds an address to listen on ([`NodeConfig::listen`]).
    pub fn listen(mut self, addr: Addr) -> Self {
        self.listen.push(addr);
        self
    }

    /// Adds an address to dial and keep dialing ([`NodeConfig::connect`]).
    pub fn connect(mut self, addr: Addr) -> Self {
        self.connect.push(addr);
        self
    }

    /// Sets [`NodeConfig::upstream`].
    pub fn upstream(mut self, addr: Addr) -> Self {
        self.upstream = Some(addr);
        self
    }

    /// Sets [`NodeConfig::secret`].
    pub fn secret(mut self, secret: Secret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// Sets [`NodeConfig::tls`].
    pub fn tls(mut self, tls: crate::link::tls::TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sets [`NodeConfig::io_threads`].
    pub fn io_threads(mut self, io: IoThreads) -> Self {
        self.io_threads = io;
        self
    }

    /// Checks that the limits fit together; the error names the setting.
    pub fn validate(&self) -> Result<(), crate::node::config_error::ConfigError> {
        self.check()
            .map_err(crate::node::config_error::ConfigError::of_setting)
    }

    /// [`NodeConfig::validate`], its error as text that starts with the setting's name.
    fn check(&self) -> Result<(), String> {
        if let Some(p) = &self.group_permissions {
            p.validate()?;
        }
        if let Some(etcd) = &self.etcd {
            etcd.validate()?;
        }
        if self.frame_body_max == 0 || self.frame_body_max > BODY_LEN_CEILING {
            return Err(format!(
                "frame_body_max is {} bytes; it must be 1..={BODY_LEN_CEILING}",
                self.frame_body_max
            ));
        }
        if self.send_queue_bytes_max < self.frame_body_max + HEADER_LEN {
            return Err(format!(
                "send_queue_bytes_max ({}) must hold at least one largest frame ({} bytes)",
                self.send_queue_bytes_max,
                self.frame_body_max + HEADER_LEN
            ));
        }
        if self.inbox_bytes_max < self.frame_body_max {
            return Err(format!(
                "inbox_bytes_max ({}) must hold at least one largest message (frame_body_max, {} bytes)",
                self.inbox_bytes_max, self.frame_body_max
            ));
        }
        if self.frame_body_max < FRAME_BODY_MIN_BYTES {
            return Err(format!(
                "frame_body_max ({}) must be at least {FRAME_BODY_MIN_BYTES} bytes: a relayed chunk of small messages (and its {ROUTED_OVERHEAD_BYTES_MAX}-byte ROUTED header) travels as one frame",
                self.frame_body_max
            ));
        }
        {
            use busway_shm::ring::{RING_CAPACITY_MAX, RING_CAPACITY_MIN};
            let n = self.shm_ring_bytes;
            if !n.is_power_of_two() || !(RING_CAPACITY_MIN..=RING_CAPACITY_MAX).contains(&n) {
                return Err(format!(
                    "shm_ring_bytes is {n}; it must be a power of two in {RING_CAPACITY_MIN}..={RING_CAPACITY_MAX}"
                ));
            }
        }
        if self.io_threads == IoThreads::Dedicated(0) {
            return Err("io_threads must be at least 1".into());
        }
        if self.dial_backoff_min_ms > DIAL_BACKOFF_MAX_MS {
            return Err(format!(
                "dial_backoff_min_ms ({}) must be at most {DIAL_BACKOFF_MAX_MS}",
                self.dial_backoff_min_ms
            ));
        }
        if self.forget_after_ms < self.peer_dead_after_ms.saturating_mul(2) {
            return Err(format!(
                "forget_after_ms ({}) must be at least twice peer_dead_after_ms ({}): a source may hold a relayed message that long",
                self.forget_after_ms, self.peer_dead_after_ms
            ));
        }
        if self.heartbeat_interval_ms == 0 {
            return Err("heartbeat_interval_ms must be above 0".into());
        }
        if self.handshake_timeout_ms == 0 {
            return Err("handshake_timeout_ms must be above 0".into());
        }
        self.validate_tls()
    }

    /// A `tls://` address needs a TLS configuration, and a certificate must name the node (a
    /// peer would refuse it otherwise).
    fn validate_tls(&self) -> Result<(), String> {
        let tls_addr = self
            .listen
            .iter()
            .chain(&self.connect)
            .chain(&self.upstream)
            .find(|a| matches!(a, Addr::Tls(_) | Addr::TlsHost(_)));
        let Some(tls) = &self.tls else {
            return match tls_addr {
                Some(a) => Err(format!(
                    "{a} needs TLS: give this node a certificate, its key and the authorities (NodeConfig::tls)"
                )),
                None => Ok(()),
            };
        };
        if !tls.names(self.id) {
            return Err(format!(
                "this node's TLS certificate names bus ids {} but not its own id {}: every peer \
                 would refuse it; make one for it with `busway cert node --id {}`",
                tls.own_ids(),
                self.id,
                self.id
            ));
        }
        if let Some((first, last)) = self.subtree.filter(|_| self.upstream.is_some()) {
            if !tls.own_ids().covers(first, last) {
                return Err(format!(
                    "this node serves bus ids {first}..={last} for its upstream, but its TLS \
                     certificate names {}: make one naming them with `busway cert relay --ids \
                     {first}-{last}`",
                    tls.own_ids()
                ));
            }
        }
        Ok(())
    }
}

/// A builder method per field not set by the ones above: `NodeConfig::new(id).ttl(4).linger_ms(0)`.
impl NodeConfig {
    /// Sets [`NodeConfig::id`].
    pub fn id(mut self, value: BusId) -> Self {
        self.id = value;
        self
    }

    /// Sets [`NodeConfig::subtree`] (to `Some`).
    pub fn subtree(mut self, value: (BusId, BusId)) -> Self {
        self.subtree = Some(value);
        self
    }

    /// Sets [`NodeConfig::ttl`].
    pub fn ttl(mut self, value: u8) -> Self {
        self.ttl = value;
        self
    }

    /// Sets [`NodeConfig::relay_grace_ms`].
    pub fn relay_grace_ms(mut self, value: u64) -> Self {
        self.relay_grace_ms = value;
        self
    }

    /// Sets [`NodeConfig::direct_links`].
    pub fn direct_links(mut self, value: bool) -> Self {
        self.direct_links = value;
        self
    }

    /// Sets [`NodeConfig::shm_channels`].
    pub fn shm_channels(mut self, value: bool) -> Self {
        self.shm_channels = value;
        self
    }

    /// Sets [`NodeConfig::mem_channels`].
    pub fn mem_channels(mut self, value: bool) -> Self {
        self.mem_channels = value;
        self
    }

    /// Sets [`NodeConfig::group_logs`].
    pub fn group_logs(mut self, value: bool) -> Self {
        self.group_logs = value;
        self
    }

    /// Sets [`NodeConfig::shm_spins`].
    pub fn shm_spins(mut self, value: u32) -> Self {
        self.shm_spins = value;
        self
    }

    /// Sets [`NodeConfig::shm_ring_bytes`].
    pub fn shm_ring_bytes(mut self, value: usize) -> Self {
        self.shm_ring_bytes = value;
        self
    }

    /// Sets [`NodeConfig::frame_body_max`].
    pub fn frame_body_max(mut self, value: usize) -> Self {
        self.frame_body_max = value;
        self
    }

    /// Sets [`NodeConfig::send_queue_bytes_max`].
    pub fn send_queue_bytes_max(mut self, value: usize) -> Self {
        self.send_queue_bytes_max = value;
        self
    }

    /// Sets [`NodeConfig::inbox_bytes_max`].
    pub fn inbox_bytes_max(mut self, value: usize) -> Self {
        self.inbox_bytes_max = value;
        self
    }

    /// Sets [`NodeConfig::connections_max`].
    pub fn connections_max(mut self, value: usize) -> Self {
        self.connections_max = value;
        self
    }

    /// Sets [`NodeConfig::handshake_timeout_ms`].
    pub fn handshake_timeout_ms(mut self, value: u64) -> Self {
        self.handshake_timeout_ms = value;
        self
    }

    /// Sets [`NodeConfig::linger_ms`].
    pub fn linger_ms(mut self, value: u64) -> Self {
        self.linger_ms = value;
        self
    }

    /// Sets [`NodeConfig::heartbeat_interval_ms`].
    pub fn heartbeat_interval_ms(mut self, value: u64) -> Self {
        self.heartbeat_interval_ms = value;
        self
    }

    /// Sets [`NodeConfig::peer_dead_after_ms`].
    pub fn peer_dead_after_ms(mut self, value: u64) -> Self {
        self.peer_dead_after_ms = value;
        self
    }

    /// Sets [`NodeConfig::forget_after_ms`].
    pub fn forget_after_ms(mut self, value: u64) -> Self {
        self.forget_after_ms = value;
        self
    }

    /// Sets [`NodeConfig::dial_backoff_min_ms`].
    pub fn dial_backoff_min_ms(mut self, value: u64) -> Self {
        self.dial_backoff_min_ms = value;
        self
    }

    /// Sets [`NodeConfig::clock_skew_max_ms`].
    pub fn clock_skew_max_ms(mut self, value: u64) -> Self {
        self.clock_skew_max_ms = value;
        self
    }

    /// Sets [`NodeConfig::group_retain_bytes`].
    pub fn group_retain_bytes(mut self, value: usize) -> Self {
        self.group_retain_bytes = value;
        self
    }

    /// Sets [`NodeConfig::etcd`] (to `Some`).
    pub fn etcd(mut self, value: crate::discovery::etcd_config::EtcdConfig) -> Self {
        self.etcd = Some(value);
        self
    }

    /// Sets [`NodeConfig::group_permissions`] (to `Some`).
    pub fn group_permissions(mut self, value: crate::GroupPermissions) -> Self {
        self.group_permissions = Some(value);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_limits_are_named() {
        NodeConfig::new(BusId(1)).validate().unwrap();
        let mut c = NodeConfig::new(BusId(1));
        c.send_queue_bytes_max = 10;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("send_queue_bytes_max"));
        let mut c = NodeConfig::new(BusId(1));
        c.frame_body_max = BODY_LEN_CEILING + 1;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("frame_body_max"));
    }

    #[test]
    fn every_field_has_a_builder_that_sets_it() {
        let c = NodeConfig::new(BusId(1))
            .id(BusId(2))
            .subtree((BusId(10), BusId(19)))
            .ttl(3)
            .relay_grace_ms(11)
            .direct_links(false)
            .shm_channels(false)
            .mem_channels(false)
            .group_logs(false)
            .shm_spins(12)
            .shm_ring_bytes(1 << 16)
            .frame_body_max(1 << 17)
            .send_queue_bytes_max(1 << 18)
            .inbox_bytes_max(1 << 19)
            .connections_max(13)
            .handshake_timeout_ms(14)
            .linger_ms(15)
            .heartbeat_interval_ms(16)
            .peer_dead_after_ms(17)
            .forget_after_ms(18)
            .dial_backoff_min_ms(19)
            .clock_skew_max_ms(20)
            .group_retain_bytes(21)
            .etcd(crate::EtcdConfig::new(vec!["http://127.0.0.1:2379".into()]))
            .group_permissions(crate::GroupPermissions::default());
        assert_eq!(c.id, BusId(2));
        assert_eq!(c.subtree, Some((BusId(10), BusId(19))));
        assert_eq!((c.ttl, c.relay_grace_ms), (3, 11));
        assert!(!(c.direct_links || c.shm_channels || c.mem_channels || c.group_logs));
        assert_eq!((c.shm_spins, c.shm_ring_bytes), (12, 1 << 16));
        assert_eq!(
            (c.frame_body_max, c.send_queue_bytes_max, c.inbox_bytes_max),
            (1 << 17, 1 << 18, 1 << 19)
        );
        assert_eq!(
            (c.connections_max, c.handshake_timeout_ms, c.linger_ms),
            (13, 14, 15)
        );
        assert_eq!(
            (
                c.heartbeat_interval_ms,
                c.peer_dead_after_ms,
                c.forget_after_ms
            ),
            (16, 17, 18)
        );
        assert_eq!((c.dial_backoff_min_ms, c.clock_skew_max_ms), (19, 20));
        assert_eq!(c.group_retain_bytes, 21);
        assert!(c.etcd.is_some() && c.group_permissions.is_some());
    }
}
