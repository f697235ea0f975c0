//! `/metrics` of the admin endpoint: the node's status snapshot (`status::snapshot`) in the
//! Prometheus text format, every family with its help, in one order at every scrape (see
//! `docs/OPERATIONS.md` for the names).

use crate::prom::{Exposition, Kind};
use crate::status::id_of;
use serde_json::Value;

/// Counters of `Stats` that are levels, not counts: gauges, without `_total`.
pub(crate) const GAUGES: [&str; 3] = ["connections_open", "peers_up", "calls_pending"];

/// Each counter of the status' `stats`, in the order `/metrics` writes them, with its help
/// (`busway::Stats`' documentation of the field).
const STATS_HELP: &[(&str, &str)] = &[
    ("connections", "Connections opened (accepted or dialed)."),
    ("connections_refused", "Accepted connections refused at once: past NodeConfig::connections_max open, or past limits::HANDSHAKES_IN_FLIGHT_MAX handshakes in progress."),
    ("connections_open", "Connections open now."),
    ("handshake_failures", "Handshakes that failed for any reason (including authentication)."),
    ("auth_failures", "Handshakes that failed authentication."),
    ("protocol_errors", "Links closed because the peer sent invalid frames (all kinds below included)."),
    ("checksum_failures", "Of those, frames whose checksum failed."),
    ("oversize_frames", "Of those, frames over this node's frame limit."),
    ("msgs_in", "Messages received."),
    ("bytes_in", "Payload bytes received."),
    ("heartbeat_timeouts", "Links closed because the peer went silent."),
    ("relayed", "ROUTED frames this node passed on as a relay (a frame carries many messages: see relayed_msgs)."),
    ("relayed_msgs", "Messages this node passed on as a relay (inside the ROUTED DATA frames it queued for their next hop)."),
    ("relay_congested", "ROUTED frames it refused to pass on for a full queue."),
    ("msgs_out", "Messages queued for sending to peers."),
    ("msgs_resent", "Messages written again: on a new link because the last link to their peer dropped before they were acknowledged, or through relays because a path may have lost them (each time counted once per message)."),
    ("events_dropped", "Events dropped because the application did not read them."),
    ("peers_up", "Peers currently up."),
    ("shm_channels", "Links whose incoming data moved to a shared-memory ring (same host), ever."),
    ("mem_channels", "Links whose incoming data moved to an in-process ring (peer in this process), ever."),
    ("forgotten_peers", "Peers forgotten after they stayed dead for NodeConfig::forget_after_ms, ever."),
    ("forgotten_sources", "Sources of relayed messages forgotten after forget_after_ms without a frame, ever."),
    ("forgotten_destinations", "Relayed destinations forgotten after twice forget_after_ms holding nothing and not sent to, ever."),
    ("calls_pending", "Calls made by this node and not ended yet."),
    ("late_replies", "Replies that came after their call ended (timed out, cancelled, failed), dropped."),
    ("misdirected_replies", "Replies from a node other than the one called, dropped (the call goes on waiting)."),
    ("publishes_unheard", "Publishes of this node that reached no member (none was known), ever."),
    ("publishes_unwanted", "Publishes received for a group this node neither joined nor passes on (no peer asked for it here, e.g. a member that just left), dropped, ever."),
    ("group_copies_dropped", "Publishes received a second time (by another path), dropped, ever."),
    ("group_forwards_dropped", "Publishes this node could not pass on to a peer that asked for them (its queue was full, it was gone, or the publish is larger than the frames it accepts): that peer's members see a gap (Event::GroupGap), ever."),
    ("group_links_skipped", "Times a link toward members stayed full past its wait under GroupPolicy::CutOff (GROUP_SLOW_MEMBER_WAIT_MS, or GROUP_HOP_WAIT_MS toward a hop) and was skipped until it has room again, ever: at a relay once per link, at a publisher once per group and link (two publish calls that both waited count twice)."),
    ("group_interest_refused", "INTEREST messages ignored: the peer asked for GROUPS_PER_PEER_MAX groups already."),
    ("group_repairs_asked", "Repairs this member asked of a publisher for publishes it missed (a gap), ever."),
    ("group_copies_sent", "Copies of its publishes this publisher sent to members that asked, ever."),
    ("group_repairs_refused", "REPAIR messages not acted on: a copy that does not come from its publisher, or for a stream this node does not have; or an ask past GROUP_REPAIRS_PENDING_MAX, ever."),
    ("multicast_forwards_dropped", "Multicasts this node could not pass on toward some of their receivers (the link's queue was full, no route, or its hops ran out), ever: those receivers ask the source for copies (counted with the groups' group_repairs_asked and group_copies_sent)."),
    ("multicasts_refused", "MULTICAST messages refused: their source may not come over the link they came on (a peer speaking for another node), or it is this node itself, ever. Each closed the link it came on."),
    ("publishes_refused", "PUBLISH messages (marks included) refused: their publisher may not come over the link they came on (a peer speaking for another node), or it is this node itself, ever. Each closed the link it came on."),
    ("group_log_reads", "Publishes this node read from its peers' group logs (one copy for every member on a host; see NodeConfig::group_logs), ever."),
    ("group_logs_accepted", "Offers of this node's group logs that peers accepted (each then reads the group's publishes from the log instead of its link, until its ring ends), ever."),
    ("group_logs_declined", "Answers of peers that declined an offer of this node's group logs, or gave up one they read (group logs off there, the group not wanted, or the peer passes the group on: those take its publishes by their link), ever."),
    ("group_log_bytes", "Bytes this node wrote into its group logs (each publish once, for all the readers on its host; record headers included), ever."),
    ("group_log_overruns", "Times this node fell more than a log's size behind a peer's group log and skipped to its oldest record (what it missed is asked for as a repair), ever."),
    ("registrations_refused", "REGISTER ops this node refused (a range that holds this node, overlaps another downstream's, passes the downstream's quota, or comes from a peer that is no downstream); each was answered with the reason, and no link closed, ever."),
    ("group_joins_refused", "Joins (INTEREST) this node refused by its group permissions, ever; each was answered with the reason (Event::GroupRefused at the member)."),
    ("publishes_denied", "Publishes (and marks) this node dropped by its group permissions (their publisher may not publish to that group here), ever; the publisher is told at most once a second per group."),
    ("registrations_refused_upstream", "Registrations this node asked of its upstream that the upstream refused (logged with the reason; frames in the name of those ids do not go up; asked again after REGISTER_RETRY_MS), ever."),
];

/// The status in the Prometheus text format.
pub(crate) fn render(status: &Value) -> String {
    let mut e = Exposition::default();
    let id = id_of(&status["id"]).unwrap_or(0).to_string();
    let incarnation = status["incarnation"].as_str().unwrap_or("0x0");
    e.family(
        "busway_info",
        Kind::Gauge,
        "The node: its bus id and incarnation.",
    )
    .sample(
        "busway_info",
        &[("id", &id), ("incarnation", incarnation)],
        1.0,
    );
    let stats = &status["stats"];
    for (key, help) in STATS_HELP {
        let Some(v) = stats[*key].as_u64() else {
            continue;
        };
        if GAUGES.contains(key) {
            e.single(&format!("busway_{key}"), Kind::Gauge, help, v as f64);
        } else {
            e.single(
                &format!("busway_{key}_total"),
                Kind::Counter,
                help,
                v as f64,
            );
        }
    }
    if let Some(n) = status["open_files_max"].as_u64() {
        let help = "The open-file limit of the node's process (each connection holds one).";
        e.single("busway_open_files_max", Kind::Gauge, help, n as f64);
    }
    if let Some(etcd) = status["etcd"].as_object() {
        let up = u8::from(etcd["connected"].as_bool() == Some(true));
        let known = etcd["nodes"].as_array().map_or(0, Vec::len);
        let sessions = etcd["registrations"].as_u64().unwrap_or(0);
        e.single(
            "busway_etcd_connected",
            Kind::Gauge,
            "1 while etcd answers.",
            f64::from(up),
        )
        .single(
            "busway_etcd_nodes_known",
            Kind::Gauge,
            "Nodes registered in etcd that this node sees.",
            known as f64,
        )
        .single(
            "busway_etcd_registrations_total",
            Kind::Counter,
            "Times this node registered in etcd (a new lease each).",
            sessions as f64,
        );
    }
    peers(&mut e, status);
    relayed(&mut e, status);
    e.finish()
}

/// Per-peer families, each labelled `peer`.
fn peers(e: &mut Exposition, status: &Value) {
    const FAMILIES: [(&str, Kind, &str, &str); 11] = [
        (
            "busway_peer_up",
            Kind::Gauge,
            "up",
            "1 while a link to the peer is up.",
        ),
        (
            "busway_peer_rtt_microseconds",
            Kind::Gauge,
            "rtt_us",
            "The last round trip measured to the peer.",
        ),
        (
            "busway_peer_unacked_messages",
            Kind::Gauge,
            "unacked_msgs",
            "Messages sent to the peer and not acknowledged yet.",
        ),
        (
            "busway_peer_unacked_bytes",
            Kind::Gauge,
            "unacked_bytes",
            "The bytes of those messages.",
        ),
        (
            "busway_peer_sent_messages_total",
            Kind::Counter,
            "msgs_sent",
            "Messages this node sent to the peer (its own, not relayed).",
        ),
        (
            "busway_peer_sent_bytes_total",
            Kind::Counter,
            "bytes_sent",
            "Bytes of frames queued for the peer, headers and relayed frames included.",
        ),
        (
            "busway_peer_received_messages_total",
            Kind::Counter,
            "msgs_received",
            "Messages received from the peer for this node.",
        ),
        (
            "busway_peer_received_bytes_total",
            Kind::Counter,
            "bytes_received",
            "Payload bytes of those messages.",
        ),
        (
            "busway_peer_relayed_from_messages_total",
            Kind::Counter,
            "msgs_relayed_from",
            "Messages from the peer that this node passed on as a relay.",
        ),
        (
            "busway_peer_relayed_to_messages_total",
            Kind::Counter,
            "msgs_relayed_to",
            "Messages this node passed on to the peer as a relay.",
        ),
        (
            "busway_peer_reconnects_total",
            Kind::Counter,
            "reconnects",
            "Times a link to the peer came back after the first.",
        ),
    ];
    per_entry(e, &status["peers"], "peer", &FAMILIES);
}

/// Per-destination families of what this node sends through relays, labelled `destination`.
fn relayed(e: &mut Exposition, status: &Value) {
    const FAMILIES: [(&str, Kind, &str, &str); 2] = [
        (
            "busway_relayed_unacked_messages",
            Kind::Gauge,
            "unacked_msgs",
            "Messages sent through relays to the destination and not acknowledged end to end yet.",
        ),
        (
            "busway_relayed_sent_messages_total",
            Kind::Counter,
            "msgs_sent",
            "Messages this node sent to the destination through relays.",
        ),
    ];
    per_entry(e, &status["relayed"], "destination", &FAMILIES);
}

/// Each family of `families` (name, kind, key, help), with a sample per entry of the list
/// `entries` (the entry's `key`, a true as 1), labelled `label` with the entry's bus id.
fn per_entry(
    e: &mut Exposition,
    entries: &Value,
    label: &str,
    families: &[(&str, Kind, &str, &str)],
) {
    let list: Vec<&Value> = entries.as_array().into_iter().flatten().collect();
    for &(name, kind, key, help) in families {
        e.family(name, kind, help);
        for entry in &list {
            let id = id_of(&entry["id"]).unwrap_or(0).to_string();
            let v = match &entry[key] {
                Value::Bool(b) => f64::from(u8::from(*b)),
                v => v.as_f64().unwrap_or(0.0),
            };
            e.sample(name, &[(label, &id)], v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every counter of the snapshot has its help, and no help names a counter that is gone.
    #[test]
    fn every_counter_of_the_status_has_its_help() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let status = rt.block_on(async {
            let node = busway::Node::start(busway::NodeConfig::new(busway::BusId(1)))
                .await
                .unwrap();
            let s = crate::status::snapshot(&node);
            node.shutdown().await;
            s
        });
        let keys: Vec<&String> = status["stats"].as_object().unwrap().keys().collect();
        for k in &keys {
            assert!(STATS_HELP.iter().any(|(h, _)| h == k), "no help for {k}");
        }
        for (h, _) in STATS_HELP {
            assert!(
                keys.iter().any(|k| k == h),
                "help for {h}, not in the status"
            );
        }
        let text = render(&status);
        let helps = text.lines().filter(|l| l.starts_with("# HELP ")).count();
        let types = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!(helps, types);
        assert!(helps > STATS_HELP.len(), "{text}");
        assert!(
            text.contains("busway_info{id=\"1\",incarnation=\"0x"),
            "{text}"
        );
    }
}
