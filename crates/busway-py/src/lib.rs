//! `busway._busway`: the Rust half of the Python package. A `_Node` is a `busway_ffi::bus::Bus`
//! (the node, its own threads, the queues and the eventfd the caller polls); the Python half
//! (`python/busway/__init__.py`) builds the blocking `Node` and the asyncio `AsyncNode` on it.
//! Every call that may wait lets go of the GIL while it waits.

use busway::{BusId, ErrorKind, Event as NodeEvent, NodeConfig, Request};
use busway_ffi::bus::Bus;
use busway_ffi::ReadyEvent;
use bytes::Bytes;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::sync::{Arc, RwLock};
use std::time::Duration;

pyo3::create_exception!(
    _busway,
    BuswayError,
    PyException,
    "A busway call failed; `kind` names the kind of failure (busway's ErrorKind, in snake case)."
);
pyo3::create_exception!(
    _busway,
    Full,
    BuswayError,
    "A queue holds its limit: the same call may succeed later."
);

/// The name of an error kind, as Python sees it in `BuswayError.kind` (`no_route`).
fn kind_name(kind: ErrorKind) -> String {
    let mut snake = String::new();
    for (i, c) in format!("{kind:?}").chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            snake.push('_');
        }
        snake.push(c.to_ascii_lowercase());
    }
    snake
}

/// A busway error as a Python exception carrying its kind.
fn error(py: Python<'_>, kind: ErrorKind, message: impl std::fmt::Display) -> PyErr {
    let text = message.to_string();
    let err = if kind == ErrorKind::Full {
        Full::new_err(text)
    } else {
        BuswayError::new_err(text)
    };
    let _ = err.value(py).setattr("kind", kind_name(kind));
    err
}

/// Seconds from Python as a duration (negative: none).
fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX)
}

/// A node, its threads and queues. Made from a TOML text (`busway node -c FILE`'s keys).
#[pyclass(frozen)]
struct _Node {
    /// Taken out by `stop`; calls in flight keep their own handle until they end.
    bus: RwLock<Option<Arc<Bus>>>,
}

/// One received message.
#[pyclass(frozen)]
struct Message {
    src: u64,
    payload: Py<PyBytes>,
    group: Option<String>,
    request: Option<Request>,
    bus: Arc<Bus>,
}

/// The answer to a call.
#[pyclass(frozen, get_all)]
struct Reply {
    /// The node that answered.
    src: u64,
    /// What it answered.
    payload: Py<PyBytes>,
}

/// Something the node tells, or the end of a call started with `call_start`.
#[pyclass(frozen, get_all)]
struct Event {
    /// `peer_up`, `peer_down`, `undeliverable`, `rejected`, `dial_failed`, `group_gap`,
    /// `group_cut_off`, `group_refused`, `multicast_gap`, `multicast_unreachable`,
    /// `call_done` or `other`.
    kind: &'static str,
    /// The bus id it is about (peer, publisher, source, relay, callee), or 0.
    peer: u64,
    /// First number given up (`undeliverable`), the multicast's number (`multicast_unreachable`).
    first: u64,
    /// One past the last number given up (`undeliverable`), the receiver (`multicast_unreachable`).
    end: u64,
    /// Messages kept (`peer_down`), publishes or multicasts missed; 1 for a refused publish.
    count: u64,
    /// `call_done`: the caller's token.
    token: u64,
    /// Why or what (an address for `peer_up`).
    text: String,
    /// The group, if the event is about one.
    group: Option<String>,
    /// `call_done`: the reply's payload, or None if the call failed (then `error_kind` and
    /// `text` say why).
    reply: Option<Py<PyBytes>>,
    /// `call_done` that failed: the error's kind.
    error_kind: Option<String>,
}

impl Event {
    fn new(kind: &'static str) -> Self {
        Event {
            kind,
            peer: 0,
            first: 0,
            end: 0,
            count: 0,
            token: 0,
            text: String::new(),
            group: None,
            reply: None,
            error_kind: None,
        }
    }

    fn of(py: Python<'_>, ev: ReadyEvent) -> Self {
        match ev {
            ReadyEvent::CallDone { token, result } => {
                let mut e = Event::new("call_done");
                e.token = token;
                match result {
                    Ok(r) => {
                        e.peer = r.src.0;
                        e.reply = Some(PyBytes::new(py, &r.payload).unbind());
                    }
                    Err(err) => {
                        e.error_kind = Some(kind_name(err.kind()));
                        e.text = err.to_string();
                    }
                }
                e
            }
            ReadyEvent::Node(ev) => Self::of_node(ev),
            _ => Event::new("other"),
        }
    }

    fn of_node(ev: NodeEvent) -> Self {
        match ev {
            NodeEvent::PeerUp { peer, addr, .. } => Event {
                peer: peer.0,
                text: addr,
                ..Event::new("peer_up")
            },
            NodeEvent::PeerDown {
                peer,
                reason,
                unacked,
            } => Event {
                peer: peer.0,
                count: unacked,
                text: reason.to_string(),
                ..Event::new("peer_down")
            },
            NodeEvent::Undeliverable {
                peer, seqs, reason, ..
            } => Event {
                peer: peer.0,
                first: seqs.start,
                end: seqs.end,
                text: reason,
                ..Event::new("undeliverable")
            },
            NodeEvent::Rejected { addr, reason, .. } => Event {
                text: format!("{addr}: {reason}"),
                ..Event::new("rejected")
            },
            NodeEvent::DialFailed { addr, reason } => Event {
                text: format!("{addr}: {reason}"),
                ..Event::new("dial_failed")
            },
            NodeEvent::GroupGap {
                group,
                publisher,
                missed,
                reason,
            } => Event {
                peer: publisher.0,
                count: missed,
                text: reason,
                group: Some(group),
                ..Event::new("group_gap")
            },
            NodeEvent::GroupCutOff {
                group,
                publisher,
                missed,
                reason,
            } => Event {
                peer: publisher.0,
                count: missed,
                text: reason,
                group: Some(group),
                ..Event::new("group_cut_off")
            },
            NodeEvent::GroupRefused {
                group,
                by,
                publish,
                reason,
            } => Event {
                peer: by.0,
                count: u64::from(publish),
                text: reason,
                group: Some(group),
                ..Event::new("group_refused")
            },
            NodeEvent::MulticastGap {
                source,
                missed,
                reason,
            } => Event {
                peer: source.0,
                count: missed,
                text: reason,
                ..Event::new("multicast_gap")
            },
            NodeEvent::MulticastUnreachable {
                receiver,
                number,
                relay,
                reason,
            } => Event {
                peer: relay.0,
                first: number,
                end: receiver.0,
                text: reason,
                ..Event::new("multicast_unreachable")
            },
            other => Event {
                text: format!("{other:?}"),
                ..Event::new("other")
            },
        }
    }
}

#[pymethods]
impl Event {
    fn __repr__(&self) -> String {
        format!(
            "Event(kind={:?}, peer={}, text={:?})",
            self.kind, self.peer, self.text
        )
    }
}

#[pymethods]
impl Message {
    /// The sender's bus id (for a publish, its publisher).
    #[getter]
    fn src(&self) -> u64 {
        self.src
    }

    /// The payload.
    #[getter]
    fn payload(&self, py: Python<'_>) -> Py<PyBytes> {
        self.payload.clone_ref(py)
    }

    /// The group it was published to, or None.
    #[getter]
    fn group(&self) -> Option<String> {
        self.group.clone()
    }

    /// Whether it is a request (sent with `call`): answer it with `reply`.
    #[getter]
    fn is_request(&self) -> bool {
        self.request.is_some()
    }

    /// Answers the request, waiting while the caller's queue is full.
    fn reply(&self, py: Python<'_>, payload: &[u8]) -> PyResult<()> {
        let Some(request) = &self.request else {
            return Err(error(
                py,
                ErrorKind::NotAnswerable,
                "this message is not a request",
            ));
        };
        let payload = Bytes::copy_from_slice(payload);
        let bus = self.bus.clone();
        let request = request.clone();
        py.detach(move || bus.block_on(request.reply(payload)))
            .map_err(|e| error(py, e.kind(), e))
    }

    /// Answers the request without waiting (`Full`: the caller's queue is full; it stays
    /// unanswered and may be answered again).
    fn try_reply(&self, py: Python<'_>, payload: &[u8]) -> PyResult<()> {
        let Some(request) = &self.request else {
            return Err(error(
                py,
                ErrorKind::NotAnswerable,
                "this message is not a request",
            ));
        };
        let _in_runtime = self.bus.enter();
        request
            .try_reply(Bytes::copy_from_slice(payload))
            .map_err(|e| error(py, e.kind(), e))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Message(src={}, payload={} bytes, group={:?}, is_request={})",
            self.src,
            self.payload.bind(py).as_bytes().len(),
            self.group,
            self.request.is_some()
        )
    }
}

#[pymethods]
impl _Node {
    /// Starts a node from a TOML text (the keys of `busway node -c FILE`).
    #[new]
    fn new(py: Python<'_>, toml: &str) -> PyResult<Self> {
        let config = NodeConfig::from_toml(toml).map_err(|e| error(py, ErrorKind::Config, e))?;
        let bus = py
            .detach(|| Bus::start(config))
            .map_err(|e| error(py, e.kind, e.message))?;
        Ok(_Node {
            bus: RwLock::new(Some(Arc::new(bus))),
        })
    }

    /// This node's bus id.
    #[getter]
    fn id(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.bus(py)?.node().id().0)
    }

    /// The eventfd, readable while messages, events or finished calls wait.
    fn fd(&self, py: Python<'_>) -> PyResult<i32> {
        Ok(self.bus(py)?.fd())
    }

    /// The addresses it listens on (with the ports it got).
    fn listen_addrs(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let bus = self.bus(py)?;
        Ok(bus
            .node()
            .listen_addrs()
            .iter()
            .map(|a| a.to_string())
            .collect())
    }

    /// Waits up to `timeout` seconds for a link to `id`; True if it is up.
    fn wait_peer(&self, py: Python<'_>, id: u64, timeout: f64) -> PyResult<bool> {
        let bus = self.bus(py)?;
        Ok(py.detach(|| bus.block_on(bus.node().wait_for_peer(BusId(id), seconds(timeout)))))
    }

    /// Sends one message, waiting while the queue to `dst` is full; its number to `dst`.
    fn send(&self, py: Python<'_>, dst: u64, payload: &[u8]) -> PyResult<u64> {
        let bus = self.bus(py)?;
        let result = {
            let _in_runtime = bus.enter();
            bus.node()
                .try_send(BusId(dst), Bytes::copy_from_slice(payload))
        };
        let result = match result {
            Err(e) if e.kind() == ErrorKind::Full => {
                let payload = Bytes::copy_from_slice(payload);
                py.detach(|| bus.block_on(bus.node().send(BusId(dst), payload)))
            }
            other => other,
        };
        result.map_err(|e| error(py, e.kind(), e))
    }

    /// Sends one message without waiting (`Full` if the queue to `dst` has no room).
    fn try_send(&self, py: Python<'_>, dst: u64, payload: &[u8]) -> PyResult<u64> {
        let bus = self.bus(py)?;
        let _in_runtime = bus.enter();
        (bus.node()
            .try_send(BusId(dst), Bytes::copy_from_slice(payload)))
        .map_err(|e| error(py, e.kind(), e))
    }

    /// Sends many messages in order, each copied once; the first one's number.
    fn send_batch(&self, py: Python<'_>, dst: u64, payloads: Vec<Vec<u8>>) -> PyResult<u64> {
        let bus = self.bus(py)?;
        py.detach(|| bus.block_on(bus.node().send_batch(BusId(dst), &payloads)))
            .map(|seqs| seqs.start)
            .map_err(|e| error(py, e.kind(), e))
    }

    /// The messages of the next received batch (without waiting), or None.
    fn take_batch(&self, py: Python<'_>) -> PyResult<Option<Vec<Message>>> {
        let bus = self.bus(py)?;
        let Some(batch) = bus.take_batch() else {
            return Ok(None);
        };
        let group = batch.group().map(str::to_owned);
        let messages = (0..batch.len())
            .map(|i| {
                let m = batch.message(i);
                Message {
                    src: m.src.0,
                    payload: PyBytes::new(py, &m.payload).unbind(),
                    group: group.clone(),
                    request: m.request,
                    bus: bus.clone(),
                }
            })
            .collect();
        Ok(Some(messages))
    }

    /// The next event or finished call (without waiting), or None.
    fn take_event(&self, py: Python<'_>) -> PyResult<Option<Event>> {
        let bus = self.bus(py)?;
        Ok(bus.take_event().map(|ev| Event::of(py, ev)))
    }

    /// Calls `dst` and waits up to `timeout` seconds for the reply.
    fn call(&self, py: Python<'_>, dst: u64, payload: &[u8], timeout: f64) -> PyResult<Reply> {
        let bus = self.bus(py)?;
        let payload = Bytes::copy_from_slice(payload);
        let reply = py
            .detach(|| bus.block_on(bus.node().call(BusId(dst), payload, seconds(timeout))))
            .map_err(|e| error(py, e.kind(), e))?;
        Ok(Reply {
            src: reply.src.0,
            payload: PyBytes::new(py, &reply.payload).unbind(),
        })
    }

    /// Starts a call; its end comes as a `call_done` event with `token`.
    fn call_start(
        &self,
        py: Python<'_>,
        dst: u64,
        payload: &[u8],
        timeout: f64,
        token: u64,
    ) -> PyResult<()> {
        let bus = self.bus(py)?;
        bus.call_start(
            BusId(dst),
            Bytes::copy_from_slice(payload),
            seconds(timeout),
            token,
        );
        Ok(())
    }

    /// Joins `group`.
    fn join(&self, py: Python<'_>, group: &str) -> PyResult<()> {
        let bus = self.bus(py)?;
        let _in_runtime = bus.enter();
        bus.node().join(group).map_err(|e| error(py, e.kind(), e))
    }

    /// Leaves `group`.
    fn leave(&self, py: Python<'_>, group: &str) -> PyResult<()> {
        let bus = self.bus(py)?;
        let _in_runtime = bus.enter();
        bus.node().leave(group);
        Ok(())
    }

    /// Publishes to `group`; how many links it went to (0: no member known yet).
    fn publish(&self, py: Python<'_>, group: &str, payload: &[u8]) -> PyResult<usize> {
        let bus = self.bus(py)?;
        let payload = Bytes::copy_from_slice(payload);
        py.detach(|| bus.block_on(bus.node().publish(group, payload)))
            .map_err(|e| error(py, e.kind(), e))
    }

    /// Sends one payload to each of `ids`; how many it was queued for.
    fn multicast(&self, py: Python<'_>, ids: Vec<u64>, payload: &[u8]) -> PyResult<usize> {
        let bus = self.bus(py)?;
        let to: Vec<BusId> = ids.into_iter().map(BusId).collect();
        let payload = Bytes::copy_from_slice(payload);
        py.detach(|| bus.block_on(bus.node().multicast(&to, payload)))
            .map_err(|e| error(py, e.kind(), e))
    }

    /// Waits up to `timeout` seconds until everything sent is acknowledged; True if so.
    fn flush(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let bus = self.bus(py)?;
        Ok(py.detach(|| bus.block_on(bus.node().flush(seconds(timeout)))))
    }

    /// The node's main counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.bus(py)?.node().stats();
        let d = PyDict::new(py);
        for (k, v) in [
            ("msgs_in", s.msgs_in),
            ("bytes_in", s.bytes_in),
            ("msgs_out", s.msgs_out),
            ("msgs_resent", s.msgs_resent),
            ("relayed_msgs", s.relayed_msgs),
            ("peers_up", s.peers_up),
            ("connections_open", s.connections_open),
            ("handshake_failures", s.handshake_failures),
            ("calls_pending", s.calls_pending),
            ("events_dropped", s.events_dropped),
            ("shm_channels", s.shm_channels),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Stops gracefully: waits up to `drain` seconds for what was sent to be acknowledged, then
    /// closes the links. Calls after it fail with kind `closed`; a second stop does nothing.
    fn stop(&self, py: Python<'_>, drain: f64) {
        let taken = {
            let mut held = self.bus.write().unwrap_or_else(|p| p.into_inner());
            held.take()
        };
        if let Some(bus) = taken {
            py.detach(|| bus.close(seconds(drain)));
        }
    }
}

impl _Node {
    fn bus(&self, py: Python<'_>) -> PyResult<Arc<Bus>> {
        let held = self.bus.read().unwrap_or_else(|p| p.into_inner());
        (held.clone()).ok_or_else(|| error(py, ErrorKind::Closed, "the node is stopped"))
    }
}

/// The Rust half of the `busway` package.
#[pymodule]
fn _busway(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<_Node>()?;
    m.add_class::<Message>()?;
    m.add_class::<Reply>()?;
    m.add_class::<Event>()?;
    m.add("BuswayError", m.py().get_type::<BuswayError>())?;
    m.add("Full", m.py().get_type::<Full>())?;
    Ok(())
}
