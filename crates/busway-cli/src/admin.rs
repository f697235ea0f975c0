//! The admin endpoint of `busway node --admin ADDR`: HTTP on a TCP or unix address.
//!
//! * `/` a small HTML page: the node, its peers (state, round trip, messages and bytes sent
//!   per second, unacknowledged bytes), the destinations it reaches through relays, and its
//!   counters with their rates; it reloads itself every few seconds.
//! * `/status.json` the same as JSON (`status::snapshot` plus `rates`): what `busway status`
//!   reads.
//! * `/metrics` the Prometheus text format: every counter as `busway_<name>_total`, the
//!   node's gauges, and per-peer series labelled `peer` (see `docs/OPERATIONS.md`).
//!
//! Rates are per second over the last `RATE_WINDOW_MS`, sampled by a task of the endpoint.

use crate::status::snapshot;
use axum::http::header::CONTENT_TYPE;
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::Router;
use busway::{Addr, Node};
use metrics_exporter_prometheus::PrometheusBuilder;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Over how long rates are measured, in milliseconds.
const RATE_WINDOW_MS: u64 = 1_000;
/// How often the HTML page reloads itself, in seconds.
const PAGE_REFRESH_SECS: u64 = 2;
/// Counters of `Stats` that are levels, not counts: gauges in `/metrics`.
const GAUGES: [&str; 3] = ["connections_open", "peers_up", "calls_pending"];
/// Prometheus' content type for its text format.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Per peer, the counters that get a rate on the page.
const PEER_RATED: [&str; 4] = ["msgs_sent", "bytes_sent", "msgs_received", "bytes_received"];

/// Counter values at one moment: the node's, and each peer's `PEER_RATED`.
#[derive(Clone, Default)]
struct Sample {
    counters: HashMap<String, u64>,
    peers: HashMap<u64, [u64; 4]>,
}

impl Sample {
    fn of(status: &Value) -> Self {
        let counters = status["stats"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| !GAUGES.contains(&k.as_str()))
            .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
            .collect();
        let peers = status["peers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                let values = PEER_RATED.map(|k| p[k].as_u64().unwrap_or(0));
                Some((p["id"].as_u64()?, values))
            })
            .collect();
        Self { counters, peers }
    }
}

/// The two last samples, from which rates are taken.
#[derive(Default)]
struct Rates {
    before: Option<(Instant, Sample)>,
    last: Option<(Instant, Sample)>,
}

impl Rates {
    fn push(&mut self, at: Instant, s: Sample) {
        self.before = self.last.replace((at, s));
    }

    /// Per second: each counter's, and each peer's `PEER_RATED`.
    fn per_second(&self) -> (Map<String, Value>, HashMap<u64, [f64; 4]>) {
        let (Some((t0, a)), Some((t1, b))) = (&self.before, &self.last) else {
            return Default::default();
        };
        let secs = t1.duration_since(*t0).as_secs_f64().max(1e-3);
        let rate = |x: u64, y: u64| y.saturating_sub(x) as f64 / secs;
        let counters = b
            .counters
            .iter()
            .map(|(k, &v)| {
                let r = rate(a.counters.get(k).copied().unwrap_or(0), v);
                (format!("{k}_per_sec"), json!((r * 10.0).round() / 10.0))
            })
            .collect();
        let peers = b
            .peers
            .iter()
            .map(|(id, now)| {
                let then = a.peers.get(id).copied().unwrap_or_default();
                let mut r = [0.0; 4];
                for i in 0..4 {
                    r[i] = rate(then[i], now[i]);
                }
                (*id, r)
            })
            .collect();
        (counters, peers)
    }
}

struct Admin {
    node: Node,
    rates: Mutex<Rates>,
}

impl Admin {
    /// The node's snapshot with the rates merged in.
    fn status(&self) -> Value {
        let mut v = snapshot(&self.node);
        let (counters, peers) = self
            .rates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .per_second();
        if let Some(list) = v["peers"].as_array_mut() {
            for p in list {
                let rates = p["id"]
                    .as_u64()
                    .and_then(|id| peers.get(&id).copied())
                    .unwrap_or_default();
                for (k, r) in PEER_RATED.iter().zip(rates) {
                    p[format!("{k}_per_sec")] = json!(r.round());
                }
            }
        }
        v["rates"] = Value::Object(counters);
        v
    }
}

/// Serves the admin endpoint of `node` on `addr` (TCP or unix) until the task is dropped;
/// prints "admin on ADDR" once it listens. A bind error is returned at once.
pub(crate) async fn serve(node: Node, addr: Addr) -> Result<(), String> {
    let bind_err = |e: std::io::Error| format!("cannot listen for admin on {addr}: {e}");
    let admin = Arc::new(Admin {
        node,
        rates: Mutex::default(),
    });
    let sampler = {
        let admin = admin.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(RATE_WINDOW_MS));
            loop {
                tick.tick().await;
                let s = Sample::of(&snapshot(&admin.node));
                let mut rates = admin.rates.lock().unwrap_or_else(|e| e.into_inner());
                rates.push(Instant::now(), s);
            }
        })
    };
    let _sampler = crate::AbortOnDrop(sampler);
    let app = router(admin);
    match &addr {
        Addr::Tcp(a) => {
            let l = tokio::net::TcpListener::bind(a).await.map_err(bind_err)?;
            println!("admin on tcp://{}", l.local_addr().map_err(bind_err)?);
            crate::admin_serve::serve(l, app).await
        }
        Addr::Unix(p) => {
            let _ = std::fs::remove_file(p);
            let l = tokio::net::UnixListener::bind(p).map_err(bind_err)?;
            println!("admin on {addr}");
            crate::admin_serve::serve(l, app).await
        }
        Addr::Shm(_) | Addr::Tls(_) => Err(crate::status::not_admin(&addr)),
    }
}

fn router(admin: Arc<Admin>) -> Router {
    let page = {
        let admin = admin.clone();
        move || async move { Html(render_page(&admin.status())) }
    };
    let json = {
        let admin = admin.clone();
        move || async move {
            (
                [(CONTENT_TYPE, "application/json")],
                admin.status().to_string(),
            )
                .into_response()
        }
    };
    let metrics = move || async move {
        (
            [(CONTENT_TYPE, METRICS_CONTENT_TYPE)],
            render_metrics(&admin.status()),
        )
            .into_response()
    };
    Router::new()
        .route("/", get(page))
        .route("/status.json", get(json))
        .route("/metrics", get(metrics))
}

/// The status in the Prometheus text format. A recorder made for each scrape: a peer gone
/// leaves no stale series behind.
fn render_metrics(status: &Value) -> String {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        let id = status["id"].to_string();
        let incarnation = format!("{:#x}", status["incarnation"].as_u64().unwrap_or(0));
        metrics::describe_gauge!("busway_info", "The node: its bus id and incarnation.");
        metrics::gauge!("busway_info", "id" => id, "incarnation" => incarnation).set(1.0);
        for (k, v) in status["stats"].as_object().into_iter().flatten() {
            let Some(v) = v.as_u64() else { continue };
            if GAUGES.contains(&k.as_str()) {
                metrics::gauge!(format!("busway_{k}")).set(v as f64);
            } else {
                metrics::counter!(format!("busway_{k}_total")).absolute(v);
            }
        }
        if let Some(n) = status["open_files_max"].as_u64() {
            metrics::gauge!("busway_open_files_max").set(n as f64);
        }
        if let Some(etcd) = status["etcd"].as_object() {
            let up = u8::from(etcd["connected"].as_bool() == Some(true));
            metrics::gauge!("busway_etcd_connected").set(f64::from(up));
            let known = etcd["nodes"].as_array().map_or(0, Vec::len);
            metrics::gauge!("busway_etcd_nodes_known").set(known as f64);
            let sessions = etcd["registrations"].as_u64().unwrap_or(0);
            metrics::counter!("busway_etcd_registrations_total").absolute(sessions);
        }
        for p in status["peers"].as_array().into_iter().flatten() {
            let peer = p["id"].to_string();
            let g = |name: &'static str, v: &Value| {
                metrics::gauge!(name, "peer" => peer.clone()).set(v.as_f64().unwrap_or(0.0));
            };
            g(
                "busway_peer_up",
                &json!(u8::from(p["up"].as_bool() == Some(true))),
            );
            g("busway_peer_rtt_microseconds", &p["rtt_us"]);
            g("busway_peer_unacked_messages", &p["unacked_msgs"]);
            g("busway_peer_unacked_bytes", &p["unacked_bytes"]);
            let c = |name: &'static str, v: &Value| {
                metrics::counter!(name, "peer" => peer.clone()).absolute(v.as_u64().unwrap_or(0));
            };
            c("busway_peer_sent_messages_total", &p["msgs_sent"]);
            c("busway_peer_sent_bytes_total", &p["bytes_sent"]);
            c("busway_peer_received_messages_total", &p["msgs_received"]);
            c("busway_peer_received_bytes_total", &p["bytes_received"]);
            c("busway_peer_reconnects_total", &p["reconnects"]);
        }
        for r in status["relayed"].as_array().into_iter().flatten() {
            let dst = r["id"].to_string();
            let unacked = r["unacked_msgs"].as_f64().unwrap_or(0.0);
            metrics::gauge!("busway_relayed_unacked_messages", "destination" => dst.clone())
                .set(unacked);
            let sent = r["msgs_sent"].as_u64().unwrap_or(0);
            metrics::counter!("busway_relayed_sent_messages_total", "destination" => dst)
                .absolute(sent);
        }
    });
    handle.render()
}

/// Escapes text for HTML.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The status as a small HTML page that reloads itself.
fn render_page(v: &Value) -> String {
    let text = |v: &Value| escape(&v.as_str().map_or_else(|| v.to_string(), str::to_owned));
    let mut out = format!(
        "<!doctype html><html><head><meta charset=utf-8>\
         <meta http-equiv=refresh content={PAGE_REFRESH_SECS}>\
         <title>busway node {id}</title>\
         <style>body{{font-family:sans-serif}}td,th{{padding:2px 8px;text-align:right}}\
         td:first-child,th:first-child{{text-align:left}}</style></head><body>\
         <h1>busway node {id}</h1><p>incarnation {inc:#x}; listening on {listen}; \
         <a href=/status.json>status.json</a> · <a href=/metrics>metrics</a></p>",
        id = v["id"],
        inc = v["incarnation"].as_u64().unwrap_or(0),
        listen = escape(
            &v["listen"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    out += "<h2>Peers</h2><table><tr><th>peer</th><th>state</th><th>round trip µs</th>\
            <th>in msg/s</th><th>in B/s</th><th>out msg/s</th><th>out B/s</th><th>sent</th>\
            <th>unacked</th><th>unacked B</th><th>reconnects</th><th>address</th></tr>";
    for p in v["peers"].as_array().into_iter().flatten() {
        let state = if p["up"].as_bool() == Some(true) {
            "up"
        } else {
            "down"
        };
        out += &format!(
            "<tr><td>{}</td><td>{state}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            p["id"],
            p["rtt_us"],
            p["msgs_received_per_sec"],
            p["bytes_received_per_sec"],
            p["msgs_sent_per_sec"],
            p["bytes_sent_per_sec"],
            p["msgs_sent"],
            p["unacked_msgs"],
            p["unacked_bytes"],
            p["reconnects"],
            text(&p["addr"]),
        );
    }
    out += "</table><h2>Reached through relays</h2><table><tr><th>destination</th>\
            <th>sent</th><th>unacked</th><th>unacked B</th></tr>";
    for r in v["relayed"].as_array().into_iter().flatten() {
        out += &format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            r["id"], r["msgs_sent"], r["unacked_msgs"], r["unacked_bytes"]
        );
    }
    out += "</table><h2>Counters</h2><table><tr><th>counter</th><th>value</th>\
            <th>per second</th></tr>";
    for (k, val) in v["stats"].as_object().into_iter().flatten() {
        let rate = &v["rates"][format!("{k}_per_sec")];
        let rate = if rate.is_null() {
            String::new()
        } else {
            rate.to_string()
        };
        out += &format!(
            "<tr><td>{}</td><td>{val}</td><td>{rate}</td></tr>",
            escape(k)
        );
    }
    out += "</table>";
    let groups: Vec<String> = v["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    if !groups.is_empty() {
        out += &format!("<p>member of: {}</p>", groups.join(", "));
    }
    out += "</body></html>";
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(msgs_in: u64, sent: u64) -> Value {
        json!({
            "id": 7, "incarnation": 1, "listen": ["tcp://127.0.0.1:1"],
            "peers": [{"id": 2, "up": true, "rtt_us": 40, "unacked_msgs": 1,
                       "unacked_bytes": 9, "msgs_sent": sent, "bytes_sent": sent * 10,
                       "addr": "<x>"}],
            "relayed": [],
            "stats": {"msgs_in": msgs_in, "peers_up": 1},
            "groups": [],
        })
    }

    #[test]
    fn rates_are_the_difference_of_two_samples_per_second() {
        let mut r = Rates::default();
        let t = Instant::now();
        r.push(t, Sample::of(&status(100, 5)));
        assert!(r.per_second().0.is_empty(), "one sample: no rate yet");
        r.push(t + Duration::from_secs(2), Sample::of(&status(300, 25)));
        let (counters, peers) = r.per_second();
        assert_eq!(counters["msgs_in_per_sec"], json!(100.0));
        assert!(
            !counters.contains_key("peers_up_per_sec"),
            "a gauge has no rate"
        );
        assert_eq!(peers[&2][..2], [10.0, 100.0]);
    }

    #[test]
    fn metrics_name_counters_gauges_and_peers_and_the_page_escapes_text() {
        let m = render_metrics(&status(100, 5));
        assert!(m.contains("busway_msgs_in_total 100"), "{m}");
        assert!(m.contains("busway_peers_up 1"), "{m}");
        assert!(
            m.contains("busway_peer_rtt_microseconds{peer=\"2\"} 40"),
            "{m}"
        );
        assert!(
            m.contains("busway_peer_sent_bytes_total{peer=\"2\"} 50"),
            "{m}"
        );
        let page = render_page(&status(100, 5));
        assert!(
            page.contains("&lt;x&gt;") && !page.contains("<x>"),
            "{page}"
        );
    }
}
