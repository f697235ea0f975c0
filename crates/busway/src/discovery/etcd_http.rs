//! A small etcd v3 client over etcd's JSON gateway (`POST /v3/...` on the client URL, which
//! every etcd since 3.4 serves): the six calls discovery makes (lease grant, keep-alive and
//! revoke, put, range, watch), over hyper's HTTP/1 client. It needs nothing but Rust to
//! build: the gRPC client it replaces generated its code with `protoc` at build time, so
//! discovery was a build option the default binary lacked.
//!
//! Keys and values travel base64-encoded and 64-bit integers as strings (the gateway's JSON
//! mapping of protobuf). Every answer is bounded (`ETCD_ANSWER_BYTES_MAX`), and every call but
//! the watch by `ETCD_REQUEST_TIMEOUT_MS`; endpoints are tried in order until one answers.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::time::Duration;

/// Longest a connection to etcd, or one request, may take, in milliseconds.
pub(crate) const ETCD_REQUEST_TIMEOUT_MS: u64 = 3_000;
/// Longest a TCP connect to one etcd endpoint may take, in milliseconds: an endpoint whose
/// host is gone (packets dropped) costs this, not the whole request timeout, before the next.
const ETCD_CONNECT_TIMEOUT_MS: u64 = 1_000;
/// Largest answer read from etcd (a range of the whole directory included), in bytes.
const ETCD_ANSWER_BYTES_MAX: usize = 64 << 20;
/// Largest message of a watch stream, in bytes (a batch of events).
const ETCD_WATCH_MESSAGE_BYTES_MAX: usize = 16 << 20;

/// etcd at one or more client URLs (`http://HOST:PORT`).
#[derive(Clone, Debug)]
pub(crate) struct Etcd {
    /// `HOST:PORT` of each endpoint, in the order given.
    endpoints: Vec<String>,
}

/// A key and its value, as etcd holds them.
pub(crate) struct KeyValue {
    pub(crate) key: Vec<u8>,
    pub(crate) value: Vec<u8>,
}

/// What a watch reports at once.
pub(crate) enum Change {
    /// A key was written.
    Put(KeyValue),
    /// A key was deleted (or its lease expired).
    Delete(Vec<u8>),
}

/// A watch of a prefix: the changes, message by message.
pub(crate) struct Watch {
    body: Incoming,
    /// Bytes read and not yet a whole message.
    pending: Vec<u8>,
    /// How far `pending` is known to hold no end of line (each byte is looked at once).
    scanned: usize,
}

fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

/// A base64 field of an answer (absent: empty, as protobuf omits empty fields).
fn unb64(v: &Value, what: &str) -> Result<Vec<u8>, String> {
    match v.as_str() {
        None => Ok(Vec::new()),
        Some(s) => B64
            .decode(s)
            .map_err(|e| format!("etcd answered a {what} that is not base64: {e}")),
    }
}

/// A 64-bit integer of an answer: a string in the gateway's JSON, a number from some.
fn int(v: &Value) -> Option<i64> {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_i64())
}

/// The end of a prefix range: the prefix with its last byte one more (etcd's `range_end`).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Etcd {
    /// etcd at `urls` (`http://HOST:PORT`, as `EtcdConfig::validate` checked them).
    pub(crate) fn new(urls: &[String]) -> Result<Self, String> {
        let endpoints = urls
            .iter()
            .map(|u| {
                u.strip_prefix("http://")
                    .map(|rest| rest.trim_end_matches('/').to_owned())
                    .ok_or_else(|| format!("etcd endpoint {u:?}: only http:// is supported"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { endpoints })
    }

    /// How many endpoints it has.
    pub(crate) fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// A client of endpoint `i` (modulo their number) alone: a session keeps every call on the
    /// member its watch is on, so that a member cut off from the others fails its keep-alives
    /// too, rather than watching nothing while another member renews the lease.
    pub(crate) fn member(&self, i: usize) -> Etcd {
        Etcd {
            endpoints: vec![self.endpoints[i % self.endpoints.len()].clone()],
        }
    }

    /// POSTs `body` to `path` at the first endpoint that answers; the answer's body.
    async fn call(&self, path: &str, body: &Value) -> Result<Value, String> {
        let mut last = String::from("no endpoint");
        for at in &self.endpoints {
            let wait = Duration::from_millis(ETCD_REQUEST_TIMEOUT_MS);
            let answer = async {
                let incoming = post(at, path, body).await?;
                let bytes = Limited::new(incoming, ETCD_ANSWER_BYTES_MAX)
                    .collect()
                    .await
                    .map_err(|e| format!("reading the answer: {e}"))?
                    .to_bytes();
                serde_json::from_slice::<Value>(&bytes)
                    .map_err(|e| format!("an answer that is not JSON: {e}"))
            };
            match tokio::time::timeout(wait, answer).await {
                Ok(Ok(v)) => return answer_or_error(v),
                Ok(Err(e)) => last = format!("{at}: {e}"),
                Err(_) => last = format!("{at}: no answer within {ETCD_REQUEST_TIMEOUT_MS} ms"),
            }
        }
        Err(last)
    }

    /// A lease of `ttl_secs`: its id.
    pub(crate) async fn lease_grant(&self, ttl_secs: u64) -> Result<i64, String> {
        let v = self
            .call("/v3/lease/grant", &json!({"TTL": ttl_secs}))
            .await?;
        int(&v["ID"]).ok_or_else(|| format!("etcd lease grant: no lease id in {v}"))
    }

    /// Keeps `lease` alive once: its time left, in seconds (0: it expired).
    pub(crate) async fn lease_keep_alive(&self, lease: i64) -> Result<i64, String> {
        let v = self
            .call("/v3/lease/keepalive", &json!({"ID": lease.to_string()}))
            .await?;
        Ok(int(&v["TTL"]).unwrap_or(0))
    }

    /// Revokes `lease`: its keys go at once.
    pub(crate) async fn lease_revoke(&self, lease: i64) -> Result<(), String> {
        let body = json!({"ID": lease.to_string()});
        self.call("/v3/lease/revoke", &body).await.map(drop)
    }

    /// Writes `key` = `value` under `lease`.
    pub(crate) async fn put(&self, key: &str, value: &str, lease: i64) -> Result<(), String> {
        let body = json!({"key": b64(key.as_bytes()), "value": b64(value.as_bytes()),
                          "lease": lease.to_string()});
        self.call("/v3/kv/put", &body).await.map(drop)
    }

    /// The value of `key`, if it is set.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<KeyValue>, String> {
        let body = json!({"key": b64(key.as_bytes())});
        let v = self.call("/v3/kv/range", &body).await?;
        Ok(kvs(&v)?.into_iter().next())
    }

    /// Every key under `prefix`, and the revision they were read at.
    pub(crate) async fn range_prefix(&self, prefix: &str) -> Result<(i64, Vec<KeyValue>), String> {
        let body = json!({"key": b64(prefix.as_bytes()),
                          "range_end": b64(&prefix_end(prefix.as_bytes()))});
        let v = self.call("/v3/kv/range", &body).await?;
        Ok((int(&v["header"]["revision"]).unwrap_or(0), kvs(&v)?))
    }

    /// Watches every key under `prefix` from `revision` on. The watch has no timeout: it
    /// lasts while etcd holds it (the session's keep-alives find etcd gone).
    pub(crate) async fn watch(&self, prefix: &str, revision: i64) -> Result<Watch, String> {
        let body = json!({"create_request": {
            "key": b64(prefix.as_bytes()),
            "range_end": b64(&prefix_end(prefix.as_bytes())),
            "start_revision": revision.to_string(),
        }});
        let mut last = String::from("no endpoint");
        for at in &self.endpoints {
            let wait = Duration::from_millis(ETCD_REQUEST_TIMEOUT_MS);
            match tokio::time::timeout(wait, post(at, "/v3/watch", &body)).await {
                Ok(Ok(body)) => {
                    return Ok(Watch {
                        body,
                        pending: Vec::new(),
                        scanned: 0,
                    })
                }
                Ok(Err(e)) => last = format!("{at}: {e}"),
                Err(_) => last = format!("{at}: no answer within {ETCD_REQUEST_TIMEOUT_MS} ms"),
            }
        }
        Err(last)
    }
}

/// One POST of JSON over a connection of its own; the answer's body if its status is 200.
async fn post(at: &str, path: &str, body: &Value) -> Result<Incoming, String> {
    let connect = Duration::from_millis(ETCD_CONNECT_TIMEOUT_MS);
    let stream = tokio::time::timeout(connect, tokio::net::TcpStream::connect(at))
        .await
        .map_err(|_| format!("connect: no answer within {ETCD_CONNECT_TIMEOUT_MS} ms"))?
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    // The connection is driven by its own task; it ends with the answer's body (or its drop).
    tokio::spawn(conn);
    let request = Request::post(format!("http://{at}{path}"))
        .header(hyper::header::HOST, at)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| format!("request: {e}"))?;
    let answer = sender
        .send_request(request)
        .await
        .map_err(|e| format!("{path}: {e}"))?;
    if !answer.status().is_success() {
        let status = answer.status();
        let text = Limited::new(answer.into_body(), 4096)
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_default();
        return Err(format!("{path}: HTTP {status}: {}", text.trim()));
    }
    Ok(answer.into_body())
}

/// A streamed answer's message (`{"result": ...}` or `{"error": ...}`), or the plain answer.
fn answer_or_error(v: Value) -> Result<Value, String> {
    if let Some(e) = v.get("error") {
        return Err(format!(
            "etcd: {}",
            e["message"].as_str().unwrap_or("error")
        ));
    }
    Ok(match v.get("result") {
        Some(r) => r.clone(),
        None => v,
    })
}

/// The key-values of a range answer.
fn kvs(v: &Value) -> Result<Vec<KeyValue>, String> {
    v["kvs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|kv| {
            Ok(KeyValue {
                key: unb64(&kv["key"], "key")?,
                value: unb64(&kv["value"], "value")?,
            })
        })
        .collect()
}

impl Watch {
    /// The next batch of changes (a message with none, like the one that confirms the watch,
    /// gives an empty batch); an error when the watch ends or is cancelled.
    pub(crate) async fn next(&mut self) -> Result<Vec<Change>, String> {
        loop {
            let from = self.scanned;
            self.scanned = self.pending.len();
            if let Some(at) = self.pending[from..].iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=from + at).collect();
                self.scanned = 0;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let v: Value = serde_json::from_slice(&line)
                    .map_err(|e| format!("etcd watch: a message that is not JSON: {e}"))?;
                return changes(answer_or_error(v)?);
            }
            if self.pending.len() > ETCD_WATCH_MESSAGE_BYTES_MAX {
                return Err(format!(
                    "etcd watch: a message over {ETCD_WATCH_MESSAGE_BYTES_MAX} bytes"
                ));
            }
            match self.body.frame().await {
                None => return Err("etcd watch: the stream ended".into()),
                Some(Err(e)) => return Err(format!("etcd watch: {e}")),
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        self.pending.extend_from_slice(data);
                    }
                }
            }
        }
    }
}

/// The changes of one watch message.
fn changes(result: Value) -> Result<Vec<Change>, String> {
    if result["canceled"].as_bool() == Some(true) {
        let why = result["cancel_reason"]
            .as_str()
            .unwrap_or("no reason given");
        return Err(format!("etcd watch cancelled: {why}"));
    }
    result["events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|ev| {
            let kv = &ev["kv"];
            let key = unb64(&kv["key"], "key")?;
            // PUT is the enum's zero: the gateway leaves it out.
            Ok(match ev["type"].as_str() {
                Some("DELETE") => Change::Delete(key),
                _ => Change::Put(KeyValue {
                    key,
                    value: unb64(&kv["value"], "value")?,
                }),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_and_answers_are_read_as_the_gateway_writes_them() {
        assert_eq!(prefix_end(b"/busway/nodes/"), b"/busway/nodes0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), vec![0]);
        let range = json!({"header": {"revision": "42"},
                           "kvs": [{"key": b64(b"/p/1"), "value": b64(b"v1 9 tcp://a:1")}]});
        let got = kvs(&range).unwrap();
        assert_eq!(
            (got[0].key.as_slice(), got[0].value.as_slice()),
            (&b"/p/1"[..], &b"v1 9 tcp://a:1"[..])
        );
        assert_eq!(int(&range["header"]["revision"]), Some(42));
        let watch = json!({"result": {"events": [
            {"kv": {"key": b64(b"/p/2"), "value": b64(b"x")}},
            {"type": "DELETE", "kv": {"key": b64(b"/p/3")}},
        ]}});
        let ch = changes(answer_or_error(watch).unwrap()).unwrap();
        assert!(matches!(&ch[0], Change::Put(kv) if kv.key == b"/p/2" && kv.value == b"x"));
        assert!(matches!(&ch[1], Change::Delete(k) if k == b"/p/3"));
        let cancelled = json!({"result": {"canceled": true, "cancel_reason": "compacted"}});
        let e = changes(answer_or_error(cancelled).unwrap()).err().unwrap();
        assert!(e.contains("compacted"), "{e}");
        let error = json!({"error": {"grpc_code": 5, "message": "requested lease not found"}});
        assert!(answer_or_error(error)
            .unwrap_err()
            .contains("lease not found"));
        assert!(unb64(&json!("%%"), "key")
            .unwrap_err()
            .contains("not base64"));
        assert!(Etcd::new(&["https://h:1".into()])
            .unwrap_err()
            .contains("only http://"));
    }
}
