//! Counters of a node, readable at any time.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Live counters. Each is a plain event count; `Relaxed` because no other memory is published
/// through them.
#[derive(Default, Debug)]
pub(crate) struct Counters {
    pub(crate) connections: AtomicU64,
    pub(crate) connections_refused: AtomicU64,
    pub(crate) handshake_failures: AtomicU64,
    pub(crate) auth_failures: AtomicU64,
    pub(crate) protocol_errors: AtomicU64,
    pub(crate) checksum_failures: AtomicU64,
    pub(crate) oversize_frames: AtomicU64,
    pub(crate) msgs_in: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    pub(crate) heartbeat_timeouts: AtomicU64,
    pub(crate) relay_congested: AtomicU64,
    pub(crate) relayed: AtomicU64,
    pub(crate) relayed_msgs: AtomicU64,
    pub(crate) msgs_resent: AtomicU64,
    pub(crate) events_dropped: AtomicU64,
    pub(crate) shm_channels: AtomicU64,
    pub(crate) mem_channels: AtomicU64,
    pub(crate) forgotten_peers: AtomicU64,
    pub(crate) forgotten_sources: AtomicU64,
    pub(crate) forgotten_destinations: AtomicU64,
    pub(crate) late_replies: AtomicU64,
    pub(crate) misdirected_replies: AtomicU64,
    pub(crate) publishes_unheard: AtomicU64,
    pub(crate) publishes_unwanted: AtomicU64,
    pub(crate) group_copies_dropped: AtomicU64,
    pub(crate) group_forwards_dropped: AtomicU64,
    pub(crate) group_links_skipped: AtomicU64,
    pub(crate) group_interest_refused: AtomicU64,
    pub(crate) group_repairs_asked: AtomicU64,
    pub(crate) group_copies_sent: AtomicU64,
    pub(crate) group_repairs_refused: AtomicU64,
    pub(crate) multicast_forwards_dropped: AtomicU64,
    pub(crate) multicasts_refused: AtomicU64,
    pub(crate) publishes_refused: AtomicU64,
    pub(crate) group_log_reads: AtomicU64,
    pub(crate) group_logs_accepted: AtomicU64,
    pub(crate) group_logs_declined: AtomicU64,
    pub(crate) group_log_bytes: AtomicU64,
    pub(crate) group_log_overruns: AtomicU64,
    pub(crate) registrations_refused: AtomicU64,
    pub(crate) group_joins_refused: AtomicU64,
    pub(crate) publishes_denied: AtomicU64,
    pub(crate) registrations_refused_upstream: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

/// A snapshot of a node's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Connections opened (accepted or dialed).
    pub connections: u64,
    /// Accepted connections refused at once: past `NodeConfig::connections_max` open, or past
    /// `limits::HANDSHAKES_IN_FLIGHT_MAX` handshakes in progress.
    pub connections_refused: u64,
    /// Connections open now.
    pub connections_open: u64,
    /// Handshakes that failed for any reason (including authentication).
    pub handshake_failures: u64,
    /// Handshakes that failed authentication.
    pub auth_failures: u64,
    /// Links closed because the peer sent invalid frames (all kinds below included).
    pub protocol_errors: u64,
    /// Of those, frames whose checksum failed.
    pub checksum_failures: u64,
    /// Of those, frames over this node's frame limit.
    pub oversize_frames: u64,
    /// Messages received.
    pub msgs_in: u64,
    /// Payload bytes received.
    pub bytes_in: u64,
    /// Links closed because the peer went silent.
    pub heartbeat_timeouts: u64,
    /// ROUTED frames this node passed on as a relay (a frame carries many messages: see
    /// `relayed_msgs`).
    pub relayed: u64,
    /// Messages this node passed on as a relay (inside the ROUTED DATA frames it queued for
    /// their next hop).
    pub relayed_msgs: u64,
    /// ROUTED frames it refused to pass on for a full queue.
    pub relay_congested: u64,
    /// Messages queued for sending to peers.
    pub msgs_out: u64,
    /// Messages written again: on a new link because the last link to their peer dropped
    /// before they were acknowledged, or through relays because a path may have lost them
    /// (each time counted once per message).
    pub msgs_resent: u64,
    /// Events dropped because the application did not read them.
    pub events_dropped: u64,
    /// Peers currently up.
    pub peers_up: u64,
    /// Links whose incoming data moved to a shared-memory ring (same host), ever.
    pub shm_channels: u64,
    /// Links whose incoming data moved to an in-process ring (peer in this process), ever.
    pub mem_channels: u64,
    /// Peers forgotten after they stayed dead for `NodeConfig::forget_after_ms`, ever.
    pub forgotten_peers: u64,
    /// Sources of relayed messages forgotten after `forget_after_ms` without a frame, ever.
    pub forgotten_sources: u64,
    /// Relayed destinations forgotten after twice `forget_after_ms` holding nothing and not
    /// sent to, ever.
    pub forgotten_destinations: u64,
    /// Calls made by this node and not ended yet.
    pub calls_pending: u64,
    /// Replies that came after their call ended (timed out, cancelled, failed), dropped.
    pub late_replies: u64,
    /// Replies from a node other than the one called, dropped (the call goes on waiting).
    pub misdirected_replies: u64,
    /// Publishes of this node that reached no member (none was known), ever.
    pub publishes_unheard: u64,
    /// Publishes received for a group this node neither joined nor passes on (no peer asked
    /// for it here, e.g. a member that just left), dropped, ever.
    pub publishes_unwanted: u64,
    /// Publishes received a second time (by another path), dropped, ever.
    pub group_copies_dropped: u64,
    /// Publishes this node could not pass on to a peer that asked for them (its queue was
    /// full, it was gone, or the publish is larger than the frames it accepts): that peer's members see a gap (`Event::GroupGap`), ever.
    pub group_forwards_dropped: u64,
    /// Times a link toward members stayed full past its wait under `GroupPolicy::CutOff`
    /// (`GROUP_SLOW_MEMBER_WAIT_MS`, or `GROUP_HOP_WAIT_MS` toward a hop) and was skipped
    /// until it has room again, ever: at a relay once per link, at a publisher once per
    /// group and link (two `publish` calls that both waited count twice).
    pub group_links_skipped: u64,
    /// INTEREST messages ignored: the peer asked for `GROUPS_PER_PEER_MAX` groups already.
    pub group_interest_refused: u64,
    /// Repairs this member asked of a publisher for publishes it missed (a gap), ever.
    pub group_repairs_asked: u64,
    /// Copies of its publishes this publisher sent to members that asked, ever.
    pub group_copies_sent: u64,
    /// REPAIR messages not acted on: a copy that does not come from its publisher, or for a
    /// stream this node does not have; or an ask past `GROUP_REPAIRS_PENDING_MAX`, ever.
    pub group_repairs_refused: u64,
    /// Multicasts this node could not pass on toward some of their receivers (the link's
    /// queue was full, no route, or its hops ran out), ever: those receivers ask the source
    /// for copies (counted with the groups' `group_repairs_asked` and `group_copies_sent`).
    pub multicast_forwards_dropped: u64,
    /// MULTICAST messages refused: their source may not come over the link they came on
    /// (a peer speaking for another node), or it is this node itself, ever. Each closed the
    /// link it came on.
    pub multicasts_refused: u64,
    /// PUBLISH messages (marks included) refused: their publisher may not come over the link
    /// they came on (a peer speaking for another node), or it is this node itself, ever. Each
    /// closed the link it came on.
    pub publishes_refused: u64,
    /// Publishes this node read from its peers' group logs (one copy for every member on a
    /// host; see `NodeConfig::group_logs`), ever.
    pub group_log_reads: u64,
    /// Offers of this node's group logs that peers accepted (each then reads the group's
    /// publishes from the log instead of its link, until its ring ends), ever.
    pub group_logs_accepted: u64,
    /// Answers of peers that declined an offer of this node's group logs, or gave up one they
    /// read (group logs off there, the group not wanted, or the peer passes the group on:
    /// those take its publishes by their link), ever.
    pub group_logs_declined: u64,
    /// Bytes this node wrote into its group logs (each publish once, for all the readers on
    /// its host; record headers included), ever.
    pub group_log_bytes: u64,
    /// Times this node fell more than a log's size behind a peer's group log and skipped to
    /// its oldest record (what it missed is asked for as a repair), ever.
    pub group_log_overruns: u64,
    /// REGISTER ops this node refused (a range that holds this node, overlaps another
    /// downstream's, passes the downstream's quota, or comes from a peer that is no
    /// downstream); each was answered with the reason, and no link closed, ever.
    pub registrations_refused: u64,
    /// Joins (INTEREST) this node refused by its group permissions, ever; each was answered
    /// with the reason (`Event::GroupRefused` at the member).
    pub group_joins_refused: u64,
    /// Publishes (and marks) this node dropped by its group permissions (their publisher may
    /// not publish to that group here), ever; the publisher is told at most once a second per
    /// group.
    pub publishes_denied: u64,
    /// Registrations this node asked of its upstream that the upstream refused (logged with
    /// the reason; frames in the name of those ids do not go up; asked again after
    /// `REGISTER_RETRY_MS`), ever.
    pub registrations_refused_upstream: u64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            connections: self.connections.load(Relaxed),
            connections_refused: self.connections_refused.load(Relaxed),
            connections_open: 0,
            handshake_failures: self.handshake_failures.load(Relaxed),
            auth_failures: self.auth_failures.load(Relaxed),
            protocol_errors: self.protocol_errors.load(Relaxed),
            checksum_failures: self.checksum_failures.load(Relaxed),
            oversize_frames: self.oversize_frames.load(Relaxed),
            msgs_in: self.msgs_in.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            heartbeat_timeouts: self.heartbeat_timeouts.load(Relaxed),
            relayed: self.relayed.load(Relaxed),
            relayed_msgs: self.relayed_msgs.load(Relaxed),
            relay_congested: self.relay_congested.load(Relaxed),
            msgs_out: 0,
            msgs_resent: self.msgs_resent.load(Relaxed),
            events_dropped: self.events_dropped.load(Relaxed),
            peers_up: 0,
            shm_channels: self.shm_channels.load(Relaxed),
            mem_channels: self.mem_channels.load(Relaxed),
            forgotten_peers: self.forgotten_peers.load(Relaxed),
            forgotten_sources: self.forgotten_sources.load(Relaxed),
            forgotten_destinations: self.forgotten_destinations.load(Relaxed),
            calls_pending: 0,
            late_replies: self.late_replies.load(Relaxed),
            misdirected_replies: self.misdirected_replies.load(Relaxed),
            publishes_unheard: self.publishes_unheard.load(Relaxed),
            publishes_unwanted: self.publishes_unwanted.load(Relaxed),
            group_copies_dropped: self.group_copies_dropped.load(Relaxed),
            group_forwards_dropped: self.group_forwards_dropped.load(Relaxed),
            group_links_skipped: self.group_links_skipped.load(Relaxed),
            group_interest_refused: self.group_interest_refused.load(Relaxed),
            group_repairs_asked: self.group_repairs_asked.load(Relaxed),
            group_copies_sent: self.group_copies_sent.load(Relaxed),
            group_repairs_refused: self.group_repairs_refused.load(Relaxed),
            multicast_forwards_dropped: self.multicast_forwards_dropped.load(Relaxed),
            multicasts_refused: self.multicasts_refused.load(Relaxed),
            publishes_refused: self.publishes_refused.load(Relaxed),
            group_log_reads: self.group_log_reads.load(Relaxed),
            group_logs_accepted: self.group_logs_accepted.load(Relaxed),
            group_logs_declined: self.group_logs_declined.load(Relaxed),
            group_log_bytes: self.group_log_bytes.load(Relaxed),
            group_log_overruns: self.group_log_overruns.load(Relaxed),
            registrations_refused: self.registrations_refused.load(Relaxed),
            group_joins_refused: self.group_joins_refused.load(Relaxed),
            publishes_denied: self.publishes_denied.load(Relaxed),
            registrations_refused_upstream: self.registrations_refused_upstream.load(Relaxed),
        }
    }
}
