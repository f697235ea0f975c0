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

use crate::metrics_text::GAUGES;
use crate::status::{id_of, snapshot};
use axum::http::header::CONTENT_TYPE;
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use axum::Router;
use busway::{Addr, Node};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Over how long rates are measured, in milliseconds.
const RATE_WINDOW_MS: u64 = 1_000;
/// Prometheus' content type for its text format.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Per peer, the counters that get a rate (`_per_sec`) in `/status.json` and on the page.
const PEER_RATED: [&str; 6] = [
    "msgs_sent",
    "bytes_sent",
    "msgs_received",
    "bytes_received",
    "msgs_relayed_from",
    "msgs_relayed_to",
];

/// Counter values at one moment: the node's, each peer's `PEER_RATED`, and what was sent to
/// each destination reached through relays.
#[derive(Clone, Default)]
struct Sample {
    counters: HashMap<String, u64>,
    peers: HashMap<u64, [u64; PEER_RATED.len()]>,
    relayed: HashMap<u64, u64>,
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
                Some((id_of(&p["id"])?, values))
            })
            .collect();
        let relayed = status["relayed"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| Some((id_of(&r["id"])?, r["msgs_sent"].as_u64()?)))
            .collect();
        Self {
            counters,
            peers,
            relayed,
        }
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

    /// Per second: each counter's, each peer's `PEER_RATED`, each relayed destination's.
    fn per_second(&self) -> PerSecond {
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
                (*id, std::array::from_fn(|i| rate(then[i], now[i])))
            })
            .collect();
        let relayed = b
            .relayed
            .iter()
            .map(|(id, &now)| (*id, rate(a.relayed.get(id).copied().unwrap_or(0), now)))
            .collect();
        PerSecond {
            counters,
            peers,
            relayed,
        }
    }
}

/// Rates from the two last samples (`Rates::per_second`).
#[derive(Default)]
struct PerSecond {
    /// `KEY_per_sec` for each counter.
    counters: Map<String, Value>,
    /// Each peer's `PEER_RATED`, per second.
    peers: HashMap<u64, [f64; PEER_RATED.len()]>,
    /// Messages per second sent to each destination through relays.
    relayed: HashMap<u64, f64>,
}

struct Admin {
    node: Node,
    rates: Mutex<Rates>,
}

impl Admin {
    /// The node's snapshot with the rates merged in.
    fn status(&self) -> Value {
        let mut v = snapshot(&self.node);
        let rates = self
            .rates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .per_second();
        for p in v["peers"].as_array_mut().into_iter().flatten() {
            let of = id_of(&p["id"]).and_then(|id| rates.peers.get(&id).copied());
            for (k, r) in PEER_RATED.iter().zip(of.unwrap_or_default()) {
                p[format!("{k}_per_sec")] = json!(r.round());
            }
        }
        for r in v["relayed"].as_array_mut().into_iter().flatten() {
            let of = id_of(&r["id"]).and_then(|id| rates.relayed.get(&id).copied());
            r["msgs_sent_per_sec"] = json!(of.unwrap_or(0.0).round());
        }
        v["rates"] = Value::Object(rates.counters);
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
        Addr::TcpHost(hp) => {
            let l = tokio::net::TcpListener::bind((hp.host(), hp.port()))
                .await
                .map_err(bind_err)?;
            println!("admin on tcp://{}", l.local_addr().map_err(bind_err)?);
            crate::admin_serve::serve(l, app).await
        }
        Addr::Unix(p) => {
            let _ = std::fs::remove_file(p);
            let l = tokio::net::UnixListener::bind(p).map_err(bind_err)?;
            println!("admin on {addr}");
            crate::admin_serve::serve(l, app).await
        }
        _ => Err(crate::status::not_admin(&addr)),
    }
}

fn router(admin: Arc<Admin>) -> Router {
    let page = {
        let admin = admin.clone();
        move || async move { Html(crate::status_page::render(&admin.status())) }
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
            crate::metrics_text::render(&admin.status()),
        )
            .into_response()
    };
    Router::new()
        .route("/", get(page))
        .route("/status.json", get(json))
        .route("/metrics", get(metrics))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(msgs_in: u64, sent: u64) -> Value {
        json!({
            "id": "7", "incarnation": "0x1", "listen": ["tcp://127.0.0.1:1"],
            "peers": [{"id": "2", "up": true, "rtt_us": 40, "unacked_msgs": 1,
                       "unacked_bytes": 9, "msgs_sent": sent, "bytes_sent": sent * 10,
                       "msgs_relayed_to": 3 * sent, "addr": "<x>"}],
            "relayed": [{"id": "9", "msgs_sent": sent}],
            "stats": {"msgs_in": msgs_in, "peers_up": 1},
            "groups": [],
        })
    }

    #[test]
    fn rates_are_the_difference_of_two_samples_per_second() {
        let mut r = Rates::default();
        let t = Instant::now();
        r.push(t, Sample::of(&status(100, 5)));
        assert!(
            r.per_second().counters.is_empty(),
            "one sample: no rate yet"
        );
        r.push(t + Duration::from_secs(2), Sample::of(&status(300, 25)));
        let rates = r.per_second();
        assert_eq!(rates.counters["msgs_in_per_sec"], json!(100.0));
        assert!(
            !rates.counters.contains_key("peers_up_per_sec"),
            "a gauge has no rate"
        );
        assert_eq!(rates.peers[&2][..2], [10.0, 100.0]);
        assert_eq!(rates.peers[&2][5], 30.0, "relayed to it");
        assert_eq!(rates.relayed[&9], 10.0);
    }
}
