//! What a node tells of its peers: those it has a link to, and those it reaches through relays.

use crate::node::Node;
use busway_core::BusId;
use std::sync::atomic::Ordering::Relaxed;

/// What a node knows about one connected peer.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerInfo {
    /// The peer's bus id.
    pub id: BusId,
    /// The peer's incarnation (a new one each time its node starts).
    pub incarnation: u64,
    /// The remote address of the link.
    pub addr: String,
    /// The addresses the peer listens on, as it announced them.
    pub listen_addrs: Vec<String>,
    /// Whether a link to it is up now.
    pub up: bool,
    /// Messages sent and not yet acknowledged.
    pub unacked_msgs: u64,
    /// The bytes those messages hold.
    pub unacked_bytes: usize,
    /// Messages ever sent to it (link messages: a PUBLISH batch counts once).
    pub msgs_sent: u64,
    /// Bytes of frames ever queued for it, headers included: its messages at their framing
    /// (DATA, DATA_BATCH entries, CALL, REPLY, INTEREST, PUBLISH) and the control frames for
    /// its link (ACK, PING, relayed ROUTED frames), each counted once when queued, whether the
    /// link is a socket or a ring (a resend after a reconnect is not counted again). What
    /// this node put on the link to it: `busway bench --broadcast` reads it per publish.
    pub bytes_sent: u64,
    /// Last measured round trip in microseconds (0: none yet).
    pub rtt_us: u64,
    /// Messages received from it over its direct link, ever.
    pub msgs_received: u64,
    /// Payload bytes received from it over its direct link, ever.
    pub bytes_received: u64,
    /// Times a link to it came back after the first (same incarnation).
    pub reconnects: u64,
    /// What this node passed on as a relay from it and to it.
    pub relayed: Relaying,
    /// What carries the messages of the two nodes themselves on the link: `tcp`, `tcp6`,
    /// `tls`, `unix` (its socket), `shm` (moved to a shared-memory ring: the peer is on this
    /// host) or `mem` (an in-process ring); the last link's when it is down. Relayed frames
    /// and control frames always go over the socket.
    pub transport: &'static str,
}

/// Messages a relay passed on, per peer (not counted in `PeerInfo::msgs_received` and
/// `msgs_sent`, which are this node's own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Relaying {
    /// Messages that came from the peer, passed on toward others.
    pub msgs_from: u64,
    /// Messages passed on to the peer.
    pub msgs_to: u64,
}

/// What carries the link to `peer`, as `PeerInfo::transport` names it.
fn transport(peer: &crate::peer::Peer, addr: &str) -> &'static str {
    use crate::peer::Carrier;
    match peer.carrier() {
        Carrier::Shm => "shm",
        Carrier::Mem => "mem",
        Carrier::Socket if addr.starts_with("tcp://[") => "tcp6",
        Carrier::Socket if addr.starts_with("tcp://") => "tcp",
        Carrier::Socket if addr.starts_with("tls://") => "tls",
        Carrier::Socket => "unix",
    }
}

/// What a node knows about a destination it reaches through relays.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayedInfo {
    /// The destination's bus id.
    pub id: BusId,
    /// The destination's incarnation, once it acknowledged something.
    pub incarnation: Option<u64>,
    /// Messages sent to it and not acknowledged end to end yet.
    pub unacked_msgs: u64,
    /// The bytes those messages hold.
    pub unacked_bytes: usize,
    /// Messages ever sent to it through relays.
    pub msgs_sent: u64,
}

impl Node {
    /// Every peer this node knows: up, or down with messages held for it.
    pub fn peers(&self) -> Vec<PeerInfo> {
        let peers = self.shared().peers.snapshot();
        let mut out: Vec<PeerInfo> = peers
            .iter()
            .map(|p| {
                let s = p.snapshot();
                let transport = transport(p, &s.addr);
                PeerInfo {
                    id: p.id,
                    incarnation: s.intro.incarnation,
                    addr: s.addr,
                    listen_addrs: s.intro.listen_addrs,
                    up: s.up,
                    unacked_msgs: s.unacked,
                    unacked_bytes: s.bytes,
                    msgs_sent: s.msgs_total,
                    bytes_sent: s.bytes_sent,
                    rtt_us: p.rtt_us.load(Relaxed),
                    msgs_received: p.traffic.msgs_in.load(Relaxed),
                    bytes_received: p.traffic.bytes_in.load(Relaxed),
                    reconnects: p.links.load(Relaxed).saturating_sub(1),
                    relayed: Relaying {
                        msgs_from: p.traffic.relayed_from.load(Relaxed),
                        msgs_to: p.traffic.relayed_to.load(Relaxed),
                    },
                    transport,
                }
            })
            .collect();
        out.sort_by_key(|p| p.id);
        out
    }

    /// Every destination this node reaches through relays, with what it holds for each.
    pub fn relayed_peers(&self) -> Vec<RelayedInfo> {
        let remotes = crate::route::remotes_snapshot(self.shared());
        let mut out: Vec<RelayedInfo> = remotes
            .iter()
            .map(|r| {
                let (unacked_msgs, unacked_bytes, msgs_sent, incarnation) = r.snapshot();
                RelayedInfo {
                    id: r.id,
                    incarnation,
                    unacked_msgs,
                    unacked_bytes,
                    msgs_sent,
                }
            })
            .collect();
        out.sort_by_key(|r| r.id);
        out
    }
}
