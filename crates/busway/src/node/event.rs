//! What a node tells the application about its links.

use busway_core::BusId;
use std::fmt;

/// Why a peer's link went down.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DownReason {
    /// This node is shutting down.
    Shutdown,
    /// The peer closed the link (with the reason it gave, if any), or the connection ended
    /// without a CLOSE: it may come back, and what it has not acknowledged is held for it until
    /// `NodeConfig::peer_dead_after_ms`.
    ClosedByPeer(String),
    /// The peer shut down (its CLOSE said so): that incarnation will not come back, so busway
    /// gives up on it at once (`Event::Undeliverable` for what it had not acknowledged, calls
    /// to it fail, its groups' interest is forgotten) rather than hold its messages until
    /// `NodeConfig::peer_dead_after_ms`.
    PeerShutDown,
    /// The peer sent bytes that are not valid protocol; the text names what and where.
    ProtocolError(String),
    /// The socket failed.
    Io(String),
    /// The peer went silent past the heartbeat limit.
    Timeout(String),
}

/// What kind of refusal an [`Event::Rejected`] reports: what a program can act on without
/// reading the text (the text says more).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// The bus id is connected already from another process: refused here, or the peer
    /// refused this node's id. Waiting helps only if the other process is going away.
    IdInUse,
    /// Authentication failed: a wrong or missing shared secret, on either side.
    Authentication,
    /// The TLS handshake failed: a certificate refused, an unknown CA, or TLS on one side only.
    Tls,
    /// Anything else: a malformed or refused handshake, one that timed out, too many at once.
    Other,
}

impl fmt::Display for DownReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Shutdown => write!(f, "this node is shutting down"),
            Self::ClosedByPeer(r) => write!(f, "closed by the peer: {r}"),
            Self::PeerShutDown => write!(f, "the peer shut down"),
            Self::ProtocolError(r) => write!(f, "protocol error: {r}"),
            Self::Io(r) => write!(f, "i/o error: {r}"),
            Self::Timeout(r) => write!(f, "timed out: {r}"),
        }
    }
}

/// Which numbering a message's sequence number belongs to: numbers restart per path and per
/// incarnation of the peer, so a report of numbers names both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Path {
    /// Sent on a link to the peer itself (numbered per link peer).
    Direct,
    /// Sent through relays (numbered end to end).
    Relayed,
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Direct => "direct",
            Self::Relayed => "relayed",
        })
    }
}

/// A change the application may want to know about. Delivered through [`crate::Events`]; when
/// the application lets `EVENT_QUEUE_LEN_MAX` events pile up, newer ones are dropped and counted
/// in `Stats::events_dropped` (the node never waits for its event reader), except
/// `Undeliverable` (see [`Event::Undeliverable`]) and `GroupCutOff` (at most one per
/// `Node::join`), which are never dropped once the stream was taken.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A peer completed the handshake.
    PeerUp {
        /// The peer's bus id.
        peer: BusId,
        /// The peer's incarnation (a new one each time its node starts).
        incarnation: u64,
        /// The peer's address as this node sees it (`mem://`, `unix://`, `tcp://`).
        addr: String,
    },
    /// A peer's link went down. `unacked` messages to it are kept: they are written again
    /// when a link to the same incarnation is back, or reported `Undeliverable` at the
    /// deadline (`peer_dead_after_ms`).
    PeerDown {
        /// The peer's bus id.
        peer: BusId,
        /// Why the link went down.
        reason: DownReason,
        /// Messages sent to the peer and not acknowledged yet, kept for the next link.
        unacked: u64,
    },
    /// busway gave up on messages `seqs` (numbers as returned by `send`) to `peer`: they were
    /// not confirmed (some may have arrived). `path` and `incarnation` say which numbering
    /// `seqs` belong to (`incarnation` is `None` when the peer never acknowledged anything on
    /// a relayed path, so busway never learned it). Never dropped: kept until read, merged
    /// with a waiting report that it continues; a node that shuts down or is dropped reports
    /// what it still held.
    Undeliverable {
        /// The destination's bus id.
        peer: BusId,
        /// The numbers of the messages given up on, as `send` returned them.
        seqs: std::ops::Range<u64>,
        /// Why busway gave up.
        reason: String,
        /// The numbering `seqs` belong to: the direct link's, or the relayed path's.
        path: Path,
        /// The incarnation of the peer they were numbered for, if busway learned it.
        incarnation: Option<u64>,
    },
    /// A connection was refused before or during the handshake (bad handshake, failed
    /// authentication, duplicate id); `addr` is the remote address.
    Rejected {
        /// The remote address.
        addr: String,
        /// Why the connection was refused.
        reason: String,
        /// The kind of refusal, for a program to act on.
        kind: Rejection,
    },
    /// A dial attempt failed; busway keeps retrying with backoff.
    DialFailed {
        /// The address dialed.
        addr: String,
        /// Why the attempt failed.
        reason: String,
    },
    /// Publishes of `publisher` to `group`, a group this node joined, never reached it:
    /// `missed` of them, and `reason` says why: lost on the way (a relay that died or fell
    /// behind, and no repair came within `GROUP_REPAIR_WAIT_MS` or the publisher no longer
    /// holds them) or the end of the publisher's previous life (it restarted before they
    /// came). What came after the gap was delivered first. This node stays in the group: it
    /// kept up, so the loss is not its own (compare [`Event::GroupCutOff`]).
    GroupGap {
        /// The group.
        group: String,
        /// The publisher whose publishes were lost.
        publisher: BusId,
        /// How many publishes were lost.
        missed: u64,
        /// Why they were lost.
        reason: String,
    },
    /// This node was cut off from `group`: its application fell behind (it left
    /// `GROUP_INBOX_BYTES_MAX` of publishes unread within `GROUP_REPAIR_WAIT_MS`), and it
    /// could not get the `missed` publishes of `publisher` it lost meanwhile (`reason`: the
    /// publisher no longer holds them, or no repair came in time), so it left the group
    /// (`Node::join` again to take part from now on). What it got after the gap was
    /// delivered first.
    GroupCutOff {
        /// The group this node left.
        group: String,
        /// The publisher whose publishes it lost.
        publisher: BusId,
        /// How many publishes it lost.
        missed: u64,
        /// Why they could not be had.
        reason: String,
    },
    /// Bus id `by` refused this node's join of `group` (`publish` false: no publishes of it
    /// come through `by`) or its publishes to `group` (`publish` true: `by` passes none on,
    /// nor delivers them), by its group permissions; `reason` says which rule. A refused
    /// publisher hears it at most once a second per group and refusing node.
    GroupRefused {
        /// The group.
        group: String,
        /// The node that refused.
        by: BusId,
        /// True for refused publishes, false for a refused join.
        publish: bool,
        /// The rule that refused.
        reason: String,
    },
    /// `missed` multicasts of `source` to this node never reached it: the source no longer
    /// held them when this node asked (it fell behind further than the source keeps), no
    /// copy came in time, or the source restarted before they came. What came after them was
    /// delivered; `reason` says what happened.
    MulticastGap {
        /// The node that multicast them.
        source: BusId,
        /// How many multicasts were lost.
        missed: u64,
        /// Why they were lost.
        reason: String,
    },
    /// The relay `relay` could not pass this node's multicast `number` on toward `receiver`
    /// (`reason`: no route there, or out of hops), and drops what comes for it until it can;
    /// reported at most once a second per relay, receiver and source.
    MulticastUnreachable {
        /// The receiver the relay could not reach.
        receiver: BusId,
        /// This node's number of the multicast, to that receiver.
        number: u64,
        /// The relay that could not pass it on.
        relay: BusId,
        /// Why not: no route, or out of hops.
        reason: String,
    },
}
