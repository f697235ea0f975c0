//! A node for C: started from a TOML text, a file or a few setters; its own runtime (one worker
//! thread, besides the node's I/O threads) reads its inbox and events for the caller; stopped
//! gracefully or at once.

use crate::bus::Bus;
use crate::status::{busway_status, fail, fail_with};
use busway::{Addr, BusId, ErrorKind, NodeConfig, Secret};
use std::ffi::{c_char, CStr};
use std::time::Duration;

/// A running node. Made by `busway_start`, `busway_start_toml` or `busway_start_file`; ended by
/// `busway_stop` or `busway_free`, which release it.
///
/// Thread safety: every call taking a `busway_node` may be made from any thread at the same
/// time as others, except `busway_stop` and `busway_free`, which must be the last call on it
/// (no other call in flight, none after).
pub struct busway_node {
    pub(crate) bus: Bus,
}

/// A configuration being built with setters; `busway_start` takes it.
pub struct busway_config {
    config: NodeConfig,
}

/// `s` as UTF-8, or the failure to return.
///
/// # Safety
/// `s` is null or a NUL-terminated string valid for the call.
pub(crate) unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<&'a str, busway_status> {
    if s.is_null() {
        return Err(fail(busway_status::BadArgument, format!("{what} is null")));
    }
    // SAFETY: non-null, and the caller guarantees a NUL-terminated string valid for the call.
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str().map_err(|e| {
        fail(
            busway_status::BadArgument,
            format!("{what} is not UTF-8: {e}"),
        )
    })
}

/// The node behind `node`, or the failure to return.
///
/// # Safety
/// `node` is null or a `busway_node` not yet stopped or freed.
pub(crate) unsafe fn node_ref<'a>(
    node: *const busway_node,
) -> Result<&'a busway_node, busway_status> {
    // SAFETY: the caller guarantees `node` is null or a live node.
    unsafe { node.as_ref() }.ok_or_else(|| fail(busway_status::BadArgument, "the node is null"))
}

/// Starts a bus, its failure recorded as this thread's last error.
fn start(config: NodeConfig) -> Result<Box<busway_node>, busway_status> {
    match Bus::start(config) {
        Ok(bus) => Ok(Box::new(busway_node { bus })),
        Err(e) => Err(fail_with(e.kind, e.message)),
    }
}

/// Hands a started node to C through `out`, or says why not (`*out` null then).
///
/// # Safety
/// `out` is null or writable.
unsafe fn hand_over(
    started: Result<Box<busway_node>, busway_status>,
    out: *mut *mut busway_node,
) -> busway_status {
    // SAFETY: the caller guarantees `out` is null or writable.
    let Some(out) = (unsafe { out.as_mut() }) else {
        // Nobody could stop it: not started (or stopped at once).
        return fail(busway_status::BadArgument, "the node pointer is null");
    };
    *out = std::ptr::null_mut();
    match started {
        Ok(node) => {
            *out = Box::into_raw(node);
            busway_status::Ok
        }
        Err(status) => status,
    }
}

/// Starts a node from a TOML configuration (the keys of `busway node -c FILE`, see
/// docs/OPERATIONS.md) and sets `*node` to it; on a failure `*node` is null and
/// `busway_last_error` says why (a configuration error names the key and its line).
///
/// The node's threads inherit the calling thread's signal mask: a program that reads SIGTERM
/// or SIGINT through a signalfd blocks them before it starts a node, or they may end the
/// process on one of those threads.
///
/// # Safety
/// `toml` is a NUL-terminated string valid for the call; `node` is writable.
#[no_mangle]
pub unsafe extern "C" fn busway_start_toml(
    toml: *const c_char,
    node: *mut *mut busway_node,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantee.
    let started = unsafe { text(toml, "the TOML text") }.and_then(|toml| {
        NodeConfig::from_toml(toml)
            .map_err(|e| fail_with(ErrorKind::Config, e))
            .and_then(start)
    });
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { hand_over(started, node) }
}

/// Starts a node from a TOML configuration file and sets `*node` to it, as
/// `busway_start_toml` does.
///
/// # Safety
/// `path` is a NUL-terminated string valid for the call; `node` is writable.
#[no_mangle]
pub unsafe extern "C" fn busway_start_file(
    path: *const c_char,
    node: *mut *mut busway_node,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantee.
    let started = unsafe { text(path, "the path") }.and_then(|path| {
        NodeConfig::from_toml_file(std::path::Path::new(path))
            .map_err(|e| fail_with(ErrorKind::Config, e))
            .and_then(start)
    });
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { hand_over(started, node) }
}

/// A new configuration for bus id `id`, every other setting at its default. Give it to
/// `busway_start`, or release it with `busway_config_free`.
#[no_mangle]
pub extern "C" fn busway_config_new(id: u64) -> *mut busway_config {
    Box::into_raw(Box::new(busway_config {
        config: NodeConfig::new(BusId(id)),
    }))
}

/// Adds one address to `config`'s list `which` (0 listen, 1 connect, 2 upstream).
///
/// # Safety
/// As for `busway_config_listen`.
unsafe fn add_addr(config: *mut busway_config, addr: *const c_char, which: u8) -> busway_status {
    // SAFETY: the caller guarantees `config` is null or a live, unshared configuration.
    let Some(c) = (unsafe { config.as_mut() }) else {
        return fail(busway_status::BadArgument, "the configuration is null");
    };
    // SAFETY: forwarded from the caller's guarantee.
    let addr = match unsafe { text(addr, "the address") } {
        Ok(a) => a,
        Err(status) => return status,
    };
    let parsed: Addr = match addr.parse() {
        Ok(a) => a,
        Err(e) => return fail(busway_status::BadArgument, e),
    };
    match which {
        0 => c.config.listen.push(parsed),
        1 => c.config.connect.push(parsed),
        _ => c.config.upstream = Some(parsed),
    }
    busway_status::Ok
}

/// Listens on `addr` (`tcp://127.0.0.1:7000`, `tcp://[::1]:0`, `unix:///run/x.sock`,
/// `shm://NAME`, `tls://HOST:PORT`); may be called more than once.
///
/// # Safety
/// `config` is null or a configuration from `busway_config_new` not yet given to
/// `busway_start` or freed, used by no other thread during the call; `addr` is a
/// NUL-terminated string valid for the call.
#[no_mangle]
pub unsafe extern "C" fn busway_config_listen(
    config: *mut busway_config,
    addr: *const c_char,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { add_addr(config, addr, 0) }
}

/// Dials `addr` and keeps a link to the node there; may be called more than once.
///
/// # Safety
/// As for `busway_config_listen`.
#[no_mangle]
pub unsafe extern "C" fn busway_config_connect(
    config: *mut busway_config,
    addr: *const c_char,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { add_addr(config, addr, 1) }
}

/// Dials `addr` as this node's upstream: bus ids it knows no way to go through it.
///
/// # Safety
/// As for `busway_config_listen`.
#[no_mangle]
pub unsafe extern "C" fn busway_config_upstream(
    config: *mut busway_config,
    addr: *const c_char,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { add_addr(config, addr, 2) }
}

/// Sets the shared secret every node of the bus authenticates with (at least 16 bytes).
///
/// # Safety
/// As for `busway_config_listen`, `secret` in place of `addr`.
#[no_mangle]
pub unsafe extern "C" fn busway_config_secret(
    config: *mut busway_config,
    secret: *const c_char,
) -> busway_status {
    // SAFETY: the caller guarantees `config` is null or a live, unshared configuration.
    let Some(c) = (unsafe { config.as_mut() }) else {
        return fail(busway_status::BadArgument, "the configuration is null");
    };
    // SAFETY: forwarded from the caller's guarantee.
    let secret = match unsafe { text(secret, "the secret") } {
        Ok(s) => s,
        Err(status) => return status,
    };
    match Secret::new(secret) {
        Ok(s) => {
            c.config.secret = Some(s);
            busway_status::Ok
        }
        Err(e) => fail(busway_status::Config, format!("the secret: {e}")),
    }
}

/// Releases a configuration not given to `busway_start`. `config` may be null.
///
/// # Safety
/// `config` is null or a configuration from `busway_config_new` not yet given to
/// `busway_start` or freed.
#[no_mangle]
pub unsafe extern "C" fn busway_config_free(config: *mut busway_config) {
    if !config.is_null() {
        // SAFETY: made by `busway_config_new` (Box::into_raw), released once per the caller.
        drop(unsafe { Box::from_raw(config) });
    }
}

/// Starts a node from `config`, which it takes (released, started or not), and sets `*node`
/// to it, as `busway_start_toml` does.
///
/// # Safety
/// `config` is a configuration from `busway_config_new` not yet given to `busway_start` or
/// freed, used by no other thread during the call; `node` is writable.
#[no_mangle]
pub unsafe extern "C" fn busway_start(
    config: *mut busway_config,
    node: *mut *mut busway_node,
) -> busway_status {
    let started = if config.is_null() {
        Err(fail(
            busway_status::BadArgument,
            "the configuration is null",
        ))
    } else {
        // SAFETY: made by `busway_config_new`, taken once per the caller.
        let config = unsafe { Box::from_raw(config) };
        start(config.config)
    };
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { hand_over(started, node) }
}

/// Stops the node gracefully and releases it: waits up to `drain_ms` milliseconds for what was
/// sent to be acknowledged (or reported), closes its links with a CLOSE that tells its peers
/// it shut down, then stops its threads. Batches and events not yet taken are dropped (batches
/// taken and not released stay valid until released). `node` may be null.
///
/// # Safety
/// `node` is null or a node not yet stopped or freed, with no other call on it in flight and
/// none after.
#[no_mangle]
pub unsafe extern "C" fn busway_stop(node: *mut busway_node, drain_ms: u32) {
    if node.is_null() {
        return;
    }
    // SAFETY: a live node, taken once per the caller.
    let n = unsafe { Box::from_raw(node) };
    n.bus.stop(Duration::from_millis(u64::from(drain_ms)));
}

/// Stops the node at once and releases it: no wait for acknowledgements (its peers keep what
/// it had not acknowledged for its next incarnation, or report it). `node` may be null.
///
/// # Safety
/// As for `busway_stop`.
#[no_mangle]
pub unsafe extern "C" fn busway_free(node: *mut busway_node) {
    if node.is_null() {
        return;
    }
    // SAFETY: a live node, taken once per the caller.
    let n = unsafe { Box::from_raw(node) };
    n.bus.stop_now();
}

/// The descriptor (an eventfd) that is readable while received batches or events wait: add it
/// to an epoll, libuv or asio loop for reading; when it is readable, call `busway_recv` and
/// `busway_next_event` until both say `BUSWAY_STATUS_EMPTY` (busway clears it itself; never
/// read or close it). -1 if `node` is null.
///
/// # Safety
/// `node` is null or a node not yet stopped or freed.
#[no_mangle]
pub unsafe extern "C" fn busway_fd(node: *const busway_node) -> i32 {
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { node_ref(node) }.map_or(-1, |n| n.bus.fd())
}

/// This node's bus id (0 if `node` is null).
///
/// # Safety
/// `node` is null or a node not yet stopped or freed.
#[no_mangle]
pub unsafe extern "C" fn busway_id(node: *const busway_node) -> u64 {
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { node_ref(node) }.map_or(0, |n| n.bus.node().id().0)
}

/// Writes the `index`-th address this node listens on (with the port it got, for port 0) into
/// `buf` as a NUL-terminated string, at most `cap` bytes with the NUL. Returns the string's
/// length without the NUL (larger than `cap - 1`: cut short; call again with more room), or 0
/// if there is no such address.
///
/// # Safety
/// `node` is null or a node not yet stopped or freed; `buf` is null (with `cap` 0) or points
/// to `cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn busway_listen_addr(
    node: *const busway_node,
    index: usize,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    // SAFETY: forwarded from the caller's guarantee.
    let Ok(n) = (unsafe { node_ref(node) }) else {
        return 0;
    };
    let Some(addr) = n
        .bus
        .node()
        .listen_addrs()
        .get(index)
        .map(|a| a.to_string())
    else {
        return 0;
    };
    if !buf.is_null() && cap > 0 {
        let take = addr.len().min(cap - 1);
        // SAFETY: `buf` has `cap` writable bytes (the caller's guarantee); `take + 1 <= cap`.
        unsafe {
            std::ptr::copy_nonoverlapping(addr.as_ptr().cast::<c_char>(), buf, take);
            *buf.add(take) = 0;
        }
    }
    addr.len()
}

/// Waits up to `timeout_ms` milliseconds for a link to bus id `id`; true if it is up.
///
/// # Safety
/// `node` is null or a node not yet stopped or freed.
#[no_mangle]
pub unsafe extern "C" fn busway_wait_peer(
    node: *const busway_node,
    id: u64,
    timeout_ms: u32,
) -> bool {
    // SAFETY: forwarded from the caller's guarantee.
    let Ok(n) = (unsafe { node_ref(node) }) else {
        return false;
    };
    let wait = Duration::from_millis(u64::from(timeout_ms));
    n.bus.block_on(n.bus.node().wait_for_peer(BusId(id), wait))
}

/// Waits up to `timeout_ms` milliseconds until every message sent so far is acknowledged by its
/// destination (or reported undeliverable); true if so.
///
/// # Safety
/// `node` is null or a node not yet stopped or freed.
#[no_mangle]
pub unsafe extern "C" fn busway_flush(node: *const busway_node, timeout_ms: u32) -> bool {
    // SAFETY: forwarded from the caller's guarantee.
    let Ok(n) = (unsafe { node_ref(node) }) else {
        return false;
    };
    let wait = Duration::from_millis(u64::from(timeout_ms));
    n.bus.block_on(n.bus.node().flush(wait))
}

/// A snapshot of a node's main counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct busway_stats {
    /// Messages received.
    pub msgs_in: u64,
    /// Payload bytes received.
    pub bytes_in: u64,
    /// Messages queued for sending to peers.
    pub msgs_out: u64,
    /// Messages written again after a link dropped or a path may have lost them.
    pub msgs_resent: u64,
    /// Messages passed on as a relay.
    pub relayed_msgs: u64,
    /// Peers up now.
    pub peers_up: u64,
    /// Connections open now.
    pub connections_open: u64,
    /// Handshakes that failed.
    pub handshake_failures: u64,
    /// Links closed for invalid frames.
    pub protocol_errors: u64,
    /// Calls made and not ended yet.
    pub calls_pending: u64,
    /// Events the node dropped because they were not read in time.
    pub events_dropped: u64,
}

/// Fills `out` with the node's counters.
///
/// # Safety
/// `node` is null or a node not yet stopped or freed; `out` is null or points to a writable
/// `busway_stats`.
#[no_mangle]
pub unsafe extern "C" fn busway_get_stats(
    node: *const busway_node,
    out: *mut busway_stats,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantee.
    let n = match unsafe { node_ref(node) } {
        Ok(n) => n,
        Err(status) => return status,
    };
    // SAFETY: the caller guarantees `out` is null or writable.
    let Some(out) = (unsafe { out.as_mut() }) else {
        return fail(busway_status::BadArgument, "the stats pointer is null");
    };
    let s = n.bus.node().stats();
    *out = busway_stats {
        msgs_in: s.msgs_in,
        bytes_in: s.bytes_in,
        msgs_out: s.msgs_out,
        msgs_resent: s.msgs_resent,
        relayed_msgs: s.relayed_msgs,
        peers_up: s.peers_up,
        connections_open: s.connections_open,
        handshake_failures: s.handshake_failures,
        protocol_errors: s.protocol_errors,
        calls_pending: s.calls_pending,
        events_dropped: s.events_dropped,
    };
    busway_status::Ok
}
