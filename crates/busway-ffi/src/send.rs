//! Sending from C: one message, a batch, a publish to a group, a multicast, a call.
//!
//! Every payload is copied once, into the node's queue (C's memory is the caller's again when
//! the call returns). The waiting forms wait only while a queue is full; `busway_try_send`
//! never waits.

use crate::node::{busway_node, node_ref, text};
use crate::status::{busway_status, fail, fail_with};
use busway::{BusId, ErrorKind, GroupError, MulticastError, Reply, SendError};
use bytes::Bytes;
use std::ffi::c_char;
use std::time::Duration;

/// A payload in C's memory: `len` bytes at `data`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct busway_slice {
    /// The first byte (may be null when `len` is 0).
    pub data: *const u8,
    /// How many bytes.
    pub len: usize,
}

/// The `len` bytes at `data` as a slice, or the failure to return.
///
/// # Safety
/// `data` is null with `len` 0, or points to `len` readable bytes for the call.
pub(crate) unsafe fn bytes_at<'a>(data: *const u8, len: usize) -> Result<&'a [u8], busway_status> {
    if len == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(fail(
            busway_status::BadArgument,
            format!("the payload is null with a length of {len} bytes"),
        ));
    }
    // SAFETY: non-null and `len` readable bytes, by the caller's guarantee.
    Ok(unsafe { std::slice::from_raw_parts(data, len) })
}

/// Queues one message of `len` bytes at `data` for bus id `dst`, waiting while its queue is
/// full. On success, `*seq` (if not null) gets the message's number to `dst` (what an
/// `UNDELIVERABLE` event names).
///
/// # Safety
/// `node` is null or a node not yet stopped or freed; `data` is null with `len` 0 or points to
/// `len` readable bytes; `seq` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn busway_send(
    node: *const busway_node,
    dst: u64,
    data: *const u8,
    len: usize,
    seq: *mut u64,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantees.
    let (n, bytes) = match unsafe { (node_ref(node), bytes_at(data, len)) } {
        (Ok(n), Ok(p)) => (n, p),
        (Err(s), _) | (_, Err(s)) => return s,
    };
    // Without waiting first: a queue with room (the usual case) costs no hand-off, and the bytes
    // are copied straight into the link's buffer (no allocation per message). A node is used
    // from any thread without entering its runtime (`Node`'s promise), which costs a
    // thread-local swap per send.
    let result = match n.bus.node().try_send_batch(BusId(dst), &[bytes]) {
        Err(e) if e.kind() == ErrorKind::Full => n
            .bus
            .block_on(n.bus.node().send_batch(BusId(dst), &[bytes])),
        other => other,
    };
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { give(result.map(|seqs| seqs.start), SendError::kind, seq) }
}

/// Queues one message for bus id `dst` without waiting: `BUSWAY_STATUS_FULL` if its queue has
/// no room (try again later). `*seq` as for `busway_send`.
///
/// # Safety
/// As for `busway_send`.
#[no_mangle]
pub unsafe extern "C" fn busway_try_send(
    node: *const busway_node,
    dst: u64,
    data: *const u8,
    len: usize,
    seq: *mut u64,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantees.
    let (n, bytes) = match unsafe { (node_ref(node), bytes_at(data, len)) } {
        (Ok(n), Ok(p)) => (n, p),
        (Err(s), _) | (_, Err(s)) => return s,
    };
    let result = n.bus.node().try_send_batch(BusId(dst), &[bytes]);
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { give(result.map(|seqs| seqs.start), SendError::kind, seq) }
}

/// Writes a call's value to `out` (if not null) and says OK, or records its failure: the one
/// way every call here hands a number back.
///
/// # Safety
/// `out` is null or writable.
unsafe fn give<T, E: std::fmt::Display>(
    result: Result<T, E>,
    kind: impl FnOnce(&E) -> ErrorKind,
    out: *mut T,
) -> busway_status {
    match result {
        Ok(value) => {
            // SAFETY: the caller guarantees `out` is null or writable.
            if let Some(out) = unsafe { out.as_mut() } {
                *out = value;
            }
            busway_status::Ok
        }
        Err(e) => fail_with(kind(&e), e),
    }
}

/// Queues `count` messages for bus id `dst`, in order, each copied once into the link's write
/// buffer under one lock: the cheapest way to send many small messages. Waits for room as
/// needed. On success `*first_seq` (if not null) gets the first message's number (the others
/// follow it). On a failure, the messages before the failing one are queued.
///
/// # Safety
/// `node` is null or a node not yet stopped or freed; `msgs` is null with `count` 0 or points
/// to `count` readable `busway_slice`s, each of which points to its `len` readable bytes;
/// `first_seq` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn busway_send_batch(
    node: *const busway_node,
    dst: u64,
    msgs: *const busway_slice,
    count: usize,
    first_seq: *mut u64,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantee.
    let n = match unsafe { node_ref(node) } {
        Ok(n) => n,
        Err(s) => return s,
    };
    let slices: &[busway_slice] = if count == 0 {
        &[]
    } else if msgs.is_null() {
        return fail(busway_status::BadArgument, "the batch is null");
    } else {
        // SAFETY: `count` readable slices at `msgs`, by the caller's guarantee.
        unsafe { std::slice::from_raw_parts(msgs, count) }
    };
    let mut payloads = Vec::with_capacity(slices.len());
    for (i, s) in slices.iter().enumerate() {
        // SAFETY: each slice points to its readable bytes, by the caller's guarantee.
        match unsafe { bytes_at(s.data, s.len) } {
            Ok(p) => payloads.push(p),
            Err(_) => {
                return fail(
                    busway_status::BadArgument,
                    format!(
                        "message {i} of the batch is null with a length of {} bytes",
                        s.len
                    ),
                )
            }
        }
    }
    let result = n
        .bus
        .block_on(n.bus.node().send_batch(BusId(dst), &payloads))
        .map(|seqs| seqs.start);
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { give(result, SendError::kind, first_seq) }
}

/// Joins `group`: publishes to it reach this node from now on (in each publisher's order).
///
/// # Safety
/// `node` is null or a node not yet stopped or freed; `group` is a NUL-terminated string valid
/// for the call.
#[no_mangle]
pub unsafe extern "C" fn busway_join(
    node: *const busway_node,
    group: *const c_char,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantees.
    let (n, g) = match unsafe { (node_ref(node), text(group, "the group")) } {
        (Ok(n), Ok(g)) => (n, g),
        (Err(s), _) | (_, Err(s)) => return s,
    };
    let _in_runtime = n.bus.enter();
    match n.bus.node().join(g) {
        Ok(()) => busway_status::Ok,
        Err(e) => fail_with(e.kind(), e),
    }
}

/// Leaves `group` (nothing happens if this node is not a member).
///
/// # Safety
/// As for `busway_join`.
#[no_mangle]
pub unsafe extern "C" fn busway_leave(
    node: *const busway_node,
    group: *const c_char,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantees.
    let (n, g) = match unsafe { (node_ref(node), text(group, "the group")) } {
        (Ok(n), Ok(g)) => (n, g),
        (Err(s), _) | (_, Err(s)) => return s,
    };
    let _in_runtime = n.bus.enter();
    n.bus.node().leave(g);
    busway_status::Ok
}

/// Publishes one message to `group`'s members, packed once and sent once per link toward
/// them; waits while a queue is full. `*places` (if not null) gets how many links it went to
/// (0: no member is known now).
///
/// # Safety
/// As for `busway_join`, with `data`/`len` as for `busway_send` and `places` null or writable.
#[no_mangle]
pub unsafe extern "C" fn busway_publish(
    node: *const busway_node,
    group: *const c_char,
    data: *const u8,
    len: usize,
    places: *mut usize,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantees.
    let (n, g, payload) = match unsafe {
        (
            node_ref(node),
            text(group, "the group"),
            bytes_at(data, len),
        )
    } {
        (Ok(n), Ok(g), Ok(p)) => (n, g, Bytes::copy_from_slice(p)),
        (Err(s), _, _) | (_, Err(s), _) | (_, _, Err(s)) => return s,
    };
    let result = n.bus.block_on(n.bus.node().publish(g, payload));
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { give(result, GroupError::kind, places) }
}

/// Sends one message to each of the `count` bus ids at `ids`, one frame per link on the way.
/// `*receivers` (if not null) gets how many of them it was queued for.
///
/// # Safety
/// `node` as for `busway_send`; `ids` points to `count` readable ids; `data`/`len` as for
/// `busway_send`; `receivers` null or writable.
#[no_mangle]
pub unsafe extern "C" fn busway_multicast(
    node: *const busway_node,
    ids: *const u64,
    count: usize,
    data: *const u8,
    len: usize,
    receivers: *mut usize,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantees.
    let (n, payload) = match unsafe { (node_ref(node), bytes_at(data, len)) } {
        (Ok(n), Ok(p)) => (n, Bytes::copy_from_slice(p)),
        (Err(s), _) | (_, Err(s)) => return s,
    };
    let to: Vec<BusId> = if count == 0 {
        Vec::new()
    } else if ids.is_null() {
        return fail(busway_status::BadArgument, "the list of ids is null");
    } else {
        // SAFETY: `count` readable ids at `ids`, by the caller's guarantee.
        unsafe { std::slice::from_raw_parts(ids, count) }
            .iter()
            .map(|&i| BusId(i))
            .collect()
    };
    let result = n.bus.block_on(n.bus.node().multicast(&to, payload));
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { give(result, MulticastError::kind, receivers) }
}

/// A reply handed to C without a copy: `len` bytes at `data` from bus id `src`, valid until
/// `busway_reply_release`.
#[repr(C)]
#[derive(Debug)]
pub struct busway_reply {
    /// The node that answered.
    pub src: u64,
    /// The reply's payload.
    pub data: *const u8,
    /// Its length in bytes.
    pub len: usize,
    /// busway's own; the caller leaves it alone.
    pub owner: *mut std::ffi::c_void,
}

/// Sends a request to bus id `dst` and waits for its reply, at most `timeout_ms` milliseconds.
/// On success `*reply` holds the answer until `busway_reply_release`. Blocks the calling
/// thread: from an event loop, use `busway_call_start`.
///
/// # Safety
/// `node` and `data`/`len` as for `busway_send`; `reply` points to a writable `busway_reply`.
#[no_mangle]
pub unsafe extern "C" fn busway_call(
    node: *const busway_node,
    dst: u64,
    data: *const u8,
    len: usize,
    timeout_ms: u32,
    reply: *mut busway_reply,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantees.
    let (n, payload) = match unsafe { (node_ref(node), bytes_at(data, len)) } {
        (Ok(n), Ok(p)) => (n, Bytes::copy_from_slice(p)),
        (Err(s), _) | (_, Err(s)) => return s,
    };
    // SAFETY: the caller guarantees `reply` is null or writable.
    let Some(out) = (unsafe { reply.as_mut() }) else {
        return fail(busway_status::BadArgument, "the reply pointer is null");
    };
    let timeout = Duration::from_millis(u64::from(timeout_ms));
    match n
        .bus
        .block_on(n.bus.node().call(BusId(dst), payload, timeout))
    {
        Ok(Reply { src, payload, .. }) => {
            let held = Box::new(payload);
            *out = busway_reply {
                src: src.0,
                data: held.as_ptr(),
                len: held.len(),
                owner: Box::into_raw(held).cast(),
            };
            busway_status::Ok
        }
        Err(e) => fail_with(e.kind(), e),
    }
}

/// Releases a reply's payload and clears it; a cleared or zeroed reply (or null) is left alone.
///
/// # Safety
/// `reply` is null or a `busway_reply` filled by `busway_call` (or zeroed), used by no other
/// thread during the call.
#[no_mangle]
pub unsafe extern "C" fn busway_reply_release(reply: *mut busway_reply) {
    // SAFETY: the caller guarantees `reply` is null or valid and unshared.
    let Some(r) = (unsafe { reply.as_mut() }) else {
        return;
    };
    if !r.owner.is_null() {
        // SAFETY: a non-null owner was made by `busway_call` from a `Box<Bytes>`, and is
        // cleared below: released exactly once.
        drop(unsafe { Box::from_raw(r.owner.cast::<Bytes>()) });
    }
    r.owner = std::ptr::null_mut();
    r.data = std::ptr::null();
    r.len = 0;
}

/// Starts a call to bus id `dst` without waiting: its end comes as a `CALL_DONE` event
/// carrying `token` (the caller's own number for it) from `busway_next_event`, with the reply
/// or why it failed, within `timeout_ms` milliseconds. Fails at once only for a bad argument
/// or a stopped node; every other failure comes as the event.
///
/// # Safety
/// As for `busway_send`.
#[no_mangle]
pub unsafe extern "C" fn busway_call_start(
    node: *const busway_node,
    dst: u64,
    data: *const u8,
    len: usize,
    timeout_ms: u32,
    token: u64,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantees.
    let (n, payload) = match unsafe { (node_ref(node), bytes_at(data, len)) } {
        (Ok(n), Ok(p)) => (n, Bytes::copy_from_slice(p)),
        (Err(s), _) | (_, Err(s)) => return s,
    };
    let timeout = Duration::from_millis(u64::from(timeout_ms));
    n.bus.call_start(BusId(dst), payload, timeout, token);
    busway_status::Ok
}
