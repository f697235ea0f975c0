//! `/` of the admin endpoint: the status (`/status.json`, rates merged in) as a small HTML
//! page for people: live links with what carries them and their rates (a relay's passed-on
//! messages too), peers that are down apart (until the node forgets them), the destinations
//! reached through relays with their rates, and the counters. Numbers are written for
//! reading: counts with thousands separators, rates as `1.41 M`.

use crate::human::{count, rate};
use crate::status::id_of;
use serde_json::Value;

/// How often the page reloads itself, in seconds.
const PAGE_REFRESH_SECS: u64 = 2;

/// Escapes text for HTML.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A JSON count, formatted with `count` (empty if absent).
fn count_of(v: &Value) -> String {
    v.as_u64().map(count).unwrap_or_default()
}

/// A JSON rate, formatted with `rate` (empty if absent).
fn rate_of(v: &Value) -> String {
    v.as_f64().map(rate).unwrap_or_default()
}

/// One table row of cells (already escaped or formatted).
fn row(cells: &[String]) -> String {
    let mut out = String::from("<tr>");
    for c in cells {
        out += "<td>";
        out += c;
        out += "</td>";
    }
    out + "</tr>"
}

/// A table's head row.
fn head(names: &[&str]) -> String {
    let mut out = String::from("<table><tr>");
    for n in names {
        out += "<th>";
        out += n;
        out += "</th>";
    }
    out + "</tr>"
}

/// The status as a small HTML page that reloads itself.
pub(crate) fn render(v: &Value) -> String {
    let id = id_of(&v["id"]).unwrap_or(0);
    let listen: Vec<&str> = v["listen"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut out = format!(
        "<!doctype html><html><head><meta charset=utf-8>\
         <meta http-equiv=refresh content={PAGE_REFRESH_SECS}>\
         <title>busway node {id}</title>\
         <style>body{{font-family:sans-serif}}td,th{{padding:2px 8px;text-align:right}}\
         td:first-child,th:first-child{{text-align:left}}</style></head><body>\
         <h1>busway node {id}</h1><p>incarnation {inc}; listening on {listen}; \
         <a href=/status.json>status.json</a> · <a href=/metrics>metrics</a></p>",
        inc = escape(v["incarnation"].as_str().unwrap_or("")),
        listen = escape(&listen.join(", ")),
    );
    let peers: Vec<&Value> = v["peers"].as_array().into_iter().flatten().collect();
    out += "<h2>Links</h2>";
    out += &head(&[
        "peer",
        "carried by",
        "round trip µs",
        "in msg/s",
        "in B/s",
        "out msg/s",
        "out B/s",
        "relayed from it msg/s",
        "relayed to it msg/s",
        "sent",
        "unacked",
        "unacked B",
        "reconnects",
        "address",
    ]);
    for p in peers.iter().filter(|p| p["up"].as_bool() == Some(true)) {
        out += &row(&[
            escape(p["id"].as_str().unwrap_or("")),
            escape(p["transport"].as_str().unwrap_or("")),
            count_of(&p["rtt_us"]),
            rate_of(&p["msgs_received_per_sec"]),
            rate_of(&p["bytes_received_per_sec"]),
            rate_of(&p["msgs_sent_per_sec"]),
            rate_of(&p["bytes_sent_per_sec"]),
            rate_of(&p["msgs_relayed_from_per_sec"]),
            rate_of(&p["msgs_relayed_to_per_sec"]),
            count_of(&p["msgs_sent"]),
            count_of(&p["unacked_msgs"]),
            count_of(&p["unacked_bytes"]),
            count_of(&p["reconnects"]),
            escape(p["addr"].as_str().unwrap_or("")),
        ]);
    }
    out += "</table><h2>Down (held until forgotten)</h2>";
    out += &head(&["peer", "unacked", "unacked B", "sent", "last address"]);
    for p in peers.iter().filter(|p| p["up"].as_bool() != Some(true)) {
        out += &row(&[
            escape(p["id"].as_str().unwrap_or("")),
            count_of(&p["unacked_msgs"]),
            count_of(&p["unacked_bytes"]),
            count_of(&p["msgs_sent"]),
            escape(p["addr"].as_str().unwrap_or("")),
        ]);
    }
    out += "</table><h2>Reached through relays</h2>";
    out += &head(&["destination", "out msg/s", "sent", "unacked", "unacked B"]);
    for r in v["relayed"].as_array().into_iter().flatten() {
        out += &row(&[
            escape(r["id"].as_str().unwrap_or("")),
            rate_of(&r["msgs_sent_per_sec"]),
            count_of(&r["msgs_sent"]),
            count_of(&r["unacked_msgs"]),
            count_of(&r["unacked_bytes"]),
        ]);
    }
    out += "</table><h2>Counters</h2>";
    out += &head(&["counter", "value", "per second"]);
    for (k, val) in v["stats"].as_object().into_iter().flatten() {
        out += &row(&[
            escape(k),
            count_of(val),
            rate_of(&v["rates"][format!("{k}_per_sec")]),
        ]);
    }
    out += "</table>";
    let groups: Vec<String> = v["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(escape)
        .collect();
    if !groups.is_empty() {
        out += &format!("<p>member of: {}</p>", groups.join(", "));
    }
    out + "</body></html>"
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn live_links_and_down_peers_are_apart_and_text_is_escaped() {
        let v = json!({
            "id": "7", "incarnation": "0x1", "listen": ["tcp://127.0.0.1:1"],
            "peers": [
                {"id": "2", "up": true, "transport": "shm", "rtt_us": 40, "msgs_sent": 5,
                 "msgs_received_per_sec": 1_409_778.0, "msgs_relayed_to_per_sec": 2000.0,
                 "addr": "<x>"},
                {"id": "3", "up": false, "unacked_msgs": 12_000, "addr": "tcp://a"},
            ],
            "relayed": [{"id": "9", "msgs_sent": 1_000_000, "msgs_sent_per_sec": 5e5}],
            "stats": {"msgs_in": 100_000, "peers_up": 1},
            "rates": {"msgs_in_per_sec": 1234.0},
            "groups": ["a<b"],
        });
        let page = render(&v);
        assert!(page.contains("<h1>busway node 7</h1>"), "{page}");
        let links = &page[page.find("<h2>Links").unwrap()..page.find("<h2>Down").unwrap()];
        assert!(
            links.contains("<tr><td>2</td><td>shm</td><td>40</td><td>1.41 M</td>"),
            "{links}"
        );
        assert!(
            links.contains("<td>2.00 k</td>") && !links.contains(">3<"),
            "{links}"
        );
        let down = &page[page.find("<h2>Down").unwrap()..page.find("<h2>Reached").unwrap()];
        assert!(down.contains("<tr><td>3</td><td>12,000</td>"), "{down}");
        assert!(
            page.contains("<tr><td>9</td><td>500 k</td><td>1,000,000</td>"),
            "{page}"
        );
        assert!(
            page.contains("<tr><td>msgs_in</td><td>100,000</td><td>1.23 k</td></tr>"),
            "{page}"
        );
        assert!(
            page.contains("&lt;x&gt;") && !page.contains("<x>"),
            "{page}"
        );
        assert!(page.contains("a&lt;b"), "{page}");
    }
}
