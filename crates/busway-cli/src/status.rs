//! `busway status`: what a running node knows, read from its admin endpoint.
//!
//! `busway node --admin ADDR` serves the node's snapshot (peers, relayed destinations,
//! counters) over HTTP at `/status.json` (see `admin`); `busway status ADDR` fetches it and
//! prints it.

use busway::{Addr, Node};
use clap::Args;
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Longest a status query waits for the node, in seconds.
const STATUS_WAIT_SECS: u64 = 5;
/// Largest snapshot a status query reads, in bytes.
const SNAPSHOT_BYTES_MAX: u64 = 16 << 20;

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    /// The node's admin address (its `busway node --admin`).
    addr: Addr,
    /// Print the raw JSON snapshot.
    #[arg(long)]
    json: bool,
}

/// A 64-bit incarnation as JSON: a hex string, as events and logs write it (a JSON number
/// above 2^53 loses digits in most readers, `jq` included).
fn incarnation_json(inc: u64) -> Value {
    json!(format!("{inc:#x}"))
}

/// A bus id as JSON: a decimal string (64 bits, as `incarnation_json` says why).
fn id_json(id: busway::BusId) -> Value {
    json!(id.0.to_string())
}

/// A bus id written by `id_json`, read back.
pub(crate) fn id_of(v: &Value) -> Option<u64> {
    v.as_str()?.parse().ok()
}

/// The node's state as JSON. Ids and incarnations are strings (see `incarnation_json`); peers
/// that are up come first, then those down (kept until `forget_after_ms`), each by id.
pub(crate) fn snapshot(node: &Node) -> Value {
    let s = node.stats();
    let mut peers = node.peers();
    peers.sort_by_key(|p| (!p.up, p.id));
    json!({
        "id": id_json(node.id()),
        "incarnation": incarnation_json(node.incarnation()),
        "listen": node.listen_addrs().iter().map(ToString::to_string).collect::<Vec<_>>(),
        "peers": peers.iter().map(|p| json!({
            "id": id_json(p.id),
            "up": p.up,
            "transport": p.transport,
            "incarnation": incarnation_json(p.incarnation),
            "addr": p.addr,
            "rtt_us": p.rtt_us,
            "unacked_msgs": p.unacked_msgs,
            "unacked_bytes": p.unacked_bytes,
            "msgs_sent": p.msgs_sent,
            "bytes_sent": p.bytes_sent,
            "msgs_received": p.msgs_received,
            "bytes_received": p.bytes_received,
            "reconnects": p.reconnects,
            "msgs_relayed_from": p.relayed.msgs_from,
            "msgs_relayed_to": p.relayed.msgs_to,
        })).collect::<Vec<_>>(),
        "relayed": node.relayed_peers().iter().map(|r| json!({
            "id": id_json(r.id),
            "incarnation": r.incarnation.map(incarnation_json),
            "unacked_msgs": r.unacked_msgs,
            "unacked_bytes": r.unacked_bytes,
            "msgs_sent": r.msgs_sent,
        })).collect::<Vec<_>>(),
        "stats": {
            "connections": s.connections,
            "connections_open": s.connections_open,
            "connections_refused": s.connections_refused,
            "handshake_failures": s.handshake_failures,
            "auth_failures": s.auth_failures,
            "protocol_errors": s.protocol_errors,
            "checksum_failures": s.checksum_failures,
            "oversize_frames": s.oversize_frames,
            "heartbeat_timeouts": s.heartbeat_timeouts,
            "msgs_in": s.msgs_in,
            "bytes_in": s.bytes_in,
            "msgs_out": s.msgs_out,
            "msgs_resent": s.msgs_resent,
            "relayed": s.relayed,
            "relayed_msgs": s.relayed_msgs,
            "relay_congested": s.relay_congested,
            "events_dropped": s.events_dropped,
            "peers_up": s.peers_up,
            "shm_channels": s.shm_channels,
            "mem_channels": s.mem_channels,
            "forgotten_peers": s.forgotten_peers,
            "forgotten_sources": s.forgotten_sources,
            "forgotten_destinations": s.forgotten_destinations,
            "calls_pending": s.calls_pending,
            "late_replies": s.late_replies,
            "misdirected_replies": s.misdirected_replies,
            "publishes_unheard": s.publishes_unheard,
            "publishes_unwanted": s.publishes_unwanted,
            "group_copies_dropped": s.group_copies_dropped,
            "group_forwards_dropped": s.group_forwards_dropped,
            "group_links_skipped": s.group_links_skipped,
            "group_interest_refused": s.group_interest_refused,
            "group_repairs_asked": s.group_repairs_asked,
            "group_copies_sent": s.group_copies_sent,
            "group_repairs_refused": s.group_repairs_refused,
            "multicast_forwards_dropped": s.multicast_forwards_dropped,
            "multicasts_refused": s.multicasts_refused,
            "publishes_refused": s.publishes_refused,
            "group_log_reads": s.group_log_reads,
            "group_logs_accepted": s.group_logs_accepted,
            "group_logs_declined": s.group_logs_declined,
            "group_log_bytes": s.group_log_bytes,
            "group_log_overruns": s.group_log_overruns,
            "registrations_refused": s.registrations_refused,
            "group_joins_refused": s.group_joins_refused,
            "publishes_denied": s.publishes_denied,
            "registrations_refused_upstream": s.registrations_refused_upstream,
        },
        "groups": node.groups(),
        "etcd": node.discovery().map(|d| json!({
            "connected": d.connected,
            "registrations": d.registrations,
            "last_error": d.last_error,
            "nodes": d.nodes.iter().map(|n| json!({
                "id": id_json(n.id),
                "incarnation": incarnation_json(n.incarnation),
                "addrs": n.addrs,
            })).collect::<Vec<_>>(),
        })),
        "open_files_max": crate::fd_limit::current_limit(),
        "connections_allowed": crate::fd_limit::connections_allowed(busway::limits::DEFAULT_CONNECTIONS_MAX),
    })
}

pub(crate) fn not_admin(addr: &Addr) -> String {
    format!("{addr} is a link address; the admin endpoint is tcp:// or unix://")
}

/// `GET /status.json` over HTTP/1.0 on `s` (the server closes when done): the answer, head
/// and body, read up to `SNAPSHOT_BYTES_MAX`.
async fn get_status<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    out: &mut Vec<u8>,
) -> std::io::Result<usize> {
    s.write_all(b"GET /status.json HTTP/1.0\r\nHost: busway\r\n\r\n")
        .await?;
    s.take(SNAPSHOT_BYTES_MAX).read_to_end(out).await
}

/// The body of an HTTP answer, if its status is 200; else the error names what came.
fn http_body(addr: &Addr, answer: &[u8]) -> Result<Vec<u8>, String> {
    let text = String::from_utf8_lossy(answer);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(format!(
            "{addr} did not answer HTTP (is it a node's --admin address?)"
        ));
    };
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("{addr} answered {status:?} for /status.json"));
    }
    Ok(body.as_bytes().to_vec())
}

async fn fetch(addr: &Addr) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    let read = async {
        match addr {
            Addr::Tcp(a) => get_status(tokio::net::TcpStream::connect(a).await?, &mut body).await,
            Addr::TcpHost(hp) => {
                let s = tokio::net::TcpStream::connect((hp.host(), hp.port())).await?;
                get_status(s, &mut body).await
            }
            Addr::Unix(p) => get_status(tokio::net::UnixStream::connect(p).await?, &mut body).await,
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                not_admin(addr),
            )),
        }
    };
    match tokio::time::timeout(Duration::from_secs(STATUS_WAIT_SECS), read).await {
        Ok(Ok(_)) => http_body(addr, &body),
        Ok(Err(e)) => Err(format!("cannot read the status of {addr}: {e}")),
        Err(_) => Err(format!("no status from {addr} within {STATUS_WAIT_SECS} s")),
    }
}

pub(crate) async fn run(args: StatusArgs) -> Result<ExitCode, String> {
    let body = fetch(&args.addr).await?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| format!("{} did not answer with a status snapshot: {e}", args.addr))?;
    if args.json {
        println!("{v}");
        return Ok(ExitCode::SUCCESS);
    }
    print!("{}", render(&v));
    Ok(ExitCode::SUCCESS)
}

/// The snapshot as a few readable tables: counts with thousands separators, rates (messages
/// per second over the endpoint's last second) as `1.41 M`.
fn render(v: &Value) -> String {
    use crate::human::{count, rate};
    let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let n = |v: &Value| v.as_u64().map(count).unwrap_or_else(|| "-".into());
    let r = |v: &Value| v.as_f64().map(rate).unwrap_or_else(|| "-".into());
    let mut out = format!(
        "node {} (incarnation {}), listening on {}\n",
        text(&v["id"]),
        text(&v["incarnation"]),
        v["listen"]
            .as_array()
            .map(|a| a
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    );
    let line = |cells: [String; 11]| {
        let [a, b, c, d, e, f, g, h, i, j, k] = cells;
        format!("{a:<20} {b:<5} {c:<6} {d:>8} {e:>9} {f:>9} {g:>10} {h:>10} {i:>13} {j:>13} {k:>9}")
    };
    out += &line(
        [
            "peer",
            "state",
            "via",
            "rtt us",
            "in/s",
            "out/s",
            "relay in/s",
            "relay out/s",
            "received",
            "sent",
            "unacked",
        ]
        .map(String::from),
    );
    out += "  address\n";
    for p in v["peers"].as_array().into_iter().flatten() {
        let up = p["up"].as_bool() == Some(true);
        out += &line([
            text(&p["id"]),
            (if up { "up" } else { "down" }).into(),
            text(&p["transport"]),
            n(&p["rtt_us"]),
            r(&p["msgs_received_per_sec"]),
            r(&p["msgs_sent_per_sec"]),
            r(&p["msgs_relayed_from_per_sec"]),
            r(&p["msgs_relayed_to_per_sec"]),
            n(&p["msgs_received"]),
            n(&p["msgs_sent"]),
            n(&p["unacked_msgs"]),
        ]);
        out += &format!("  {}\n", text(&p["addr"]));
    }
    for d in v["relayed"].as_array().into_iter().flatten() {
        out += &line([
            text(&d["id"]),
            "-".into(),
            "relays".into(),
            "-".into(),
            "-".into(),
            r(&d["msgs_sent_per_sec"]),
            "-".into(),
            "-".into(),
            "-".into(),
            n(&d["msgs_sent"]),
            n(&d["unacked_msgs"]),
        ]);
        out += "  (through relays)\n";
    }
    if let Some(stats) = v["stats"].as_object() {
        let line: Vec<String> = stats.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out += &format!("counters: {}\n", line.join(" "));
    }
    let groups: Vec<&str> = v["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !groups.is_empty() {
        out += &format!("member of: {}\n", groups.join(", "));
    }
    if let Some(etcd) = v["etcd"].as_object() {
        let nodes: Vec<String> = etcd["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| n["id"].as_str().unwrap_or("").to_owned())
            .collect();
        out += &format!(
            "etcd: {} (registered {} times{}); nodes known: {}\n",
            if etcd["connected"].as_bool() == Some(true) {
                "connected"
            } else {
                "unreachable"
            },
            etcd["registrations"],
            etcd["last_error"]
                .as_str()
                .map_or(String::new(), |e| format!("; last error: {e}")),
            if nodes.is_empty() {
                "none".to_owned()
            } else {
                nodes.join(", ")
            }
        );
    }
    let unlimited = |v: &Value| v.as_u64().map_or("unlimited".to_owned(), |n| n.to_string());
    out += &format!(
        "open files: at most {} (connections allowed: {})\n",
        unlimited(&v["open_files_max"]),
        v["connections_allowed"]
    );
    out
}
