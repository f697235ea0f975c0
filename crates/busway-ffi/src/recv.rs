//! Receiving in C: batches of messages read in place (no copy) until released, and replies to
//! the requests among them.

use crate::event::{busway_event, OwnedEvent};
use crate::node::{busway_node, node_ref};
use crate::send::bytes_at;
use crate::status::{busway_status, fail, fail_with};
use busway::{MessageBatch, ReplyError};
use bytes::Bytes;
use std::ffi::c_char;

/// Messages from one sender, in the order sent, sharing one buffer: read each payload in place
/// with `busway_batch_payload` until `busway_batch_release`.
///
/// Thread safety: a batch may move between threads; it must not be used by two at once.
pub struct busway_batch {
    batch: MessageBatch,
}

/// Takes the next batch of received messages without waiting: `BUSWAY_STATUS_OK` with
/// `*batch` set (release it with `busway_batch_release`), or `BUSWAY_STATUS_EMPTY` when none
/// waits (wait for `busway_fd` to be readable).
///
/// # Safety
/// `node` is null or a node not yet stopped or freed; `batch` points to a writable pointer.
#[no_mangle]
pub unsafe extern "C" fn busway_recv(
    node: *const busway_node,
    batch: *mut *mut busway_batch,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantee.
    let n = match unsafe { node_ref(node) } {
        Ok(n) => n,
        Err(s) => return s,
    };
    // SAFETY: the caller guarantees `batch` is null or writable.
    let Some(out) = (unsafe { batch.as_mut() }) else {
        return fail(busway_status::BadArgument, "the batch pointer is null");
    };
    match n.bus.take_batch() {
        Some(b) => {
            *out = Box::into_raw(Box::new(busway_batch { batch: b }));
            busway_status::Ok
        }
        None => {
            *out = std::ptr::null_mut();
            busway_status::Empty
        }
    }
}

/// Takes the next event (links, messages given up, groups, finished calls) without waiting:
/// `BUSWAY_STATUS_OK` with `*event` filled (release it with `busway_event_release`), or
/// `BUSWAY_STATUS_EMPTY`.
///
/// # Safety
/// `node` is null or a node not yet stopped or freed; `event` points to a writable
/// `busway_event` (one holding an unreleased event leaks that one).
#[no_mangle]
pub unsafe extern "C" fn busway_next_event(
    node: *const busway_node,
    event: *mut busway_event,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantee.
    let n = match unsafe { node_ref(node) } {
        Ok(n) => n,
        Err(s) => return s,
    };
    if event.is_null() {
        return fail(busway_status::BadArgument, "the event pointer is null");
    }
    match n.bus.take_event() {
        Some(ev) => {
            // SAFETY: non-null and writable, by the caller's guarantee; written whole, so
            // nothing of what it held is read or dropped.
            unsafe { event.write(OwnedEvent::of_ready(ev).into_c()) };
            busway_status::Ok
        }
        None => busway_status::Empty,
    }
}

/// The batch behind `batch`, or the failure to return.
///
/// # Safety
/// `batch` is null or a batch not yet released.
unsafe fn batch_ref<'a>(batch: *const busway_batch) -> Result<&'a MessageBatch, busway_status> {
    // SAFETY: the caller guarantees `batch` is null or a live batch.
    unsafe { batch.as_ref() }
        .map(|b| &b.batch)
        .ok_or_else(|| fail(busway_status::BadArgument, "the batch is null"))
}

/// How many messages the batch holds (0 if `batch` is null).
///
/// # Safety
/// `batch` is null or a batch not yet released.
#[no_mangle]
pub unsafe extern "C" fn busway_batch_len(batch: *const busway_batch) -> usize {
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { batch_ref(batch) }.map_or(0, |b| b.len())
}

/// The bus id that sent every message of the batch (for publishes, their publisher).
///
/// # Safety
/// `batch` is null or a batch not yet released.
#[no_mangle]
pub unsafe extern "C" fn busway_batch_src(batch: *const busway_batch) -> u64 {
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { batch_ref(batch) }.map_or(0, |b| b.src().0)
}

/// The payload of message `index`: its first byte (null past the end), its length in `*len`.
/// Valid, in place, until the batch is released.
///
/// # Safety
/// `batch` is null or a batch not yet released; `len` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn busway_batch_payload(
    batch: *const busway_batch,
    index: usize,
    len: *mut usize,
) -> *const u8 {
    // SAFETY: forwarded from the caller's guarantee.
    let message = (unsafe { batch_ref(batch) })
        .ok()
        .filter(|b| index < b.len());
    let (at, n) = message.map_or((std::ptr::null(), 0), |b| {
        let p = b.payload(index);
        (p.as_ptr(), p.len())
    });
    // SAFETY: the caller guarantees `len` is null or writable.
    if let Some(out) = unsafe { len.as_mut() } {
        *out = n;
    }
    at
}

/// Writes the group the batch's messages were published to into `buf` (NUL-terminated, at most
/// `cap` bytes with the NUL); returns its length without the NUL (0: not a publish).
///
/// # Safety
/// `batch` is null or a batch not yet released; `buf` is null (with `cap` 0) or points to `cap`
/// writable bytes.
#[no_mangle]
pub unsafe extern "C" fn busway_batch_group(
    batch: *const busway_batch,
    buf: *mut c_char,
    cap: usize,
) -> usize {
    // SAFETY: forwarded from the caller's guarantee.
    let Some(group) = (unsafe { batch_ref(batch) }).ok().and_then(|b| b.group()) else {
        return 0;
    };
    if !buf.is_null() && cap > 0 {
        let take = group.len().min(cap - 1);
        // SAFETY: `buf` has `cap` writable bytes (the caller's guarantee); `take + 1 <= cap`.
        unsafe {
            std::ptr::copy_nonoverlapping(group.as_ptr().cast::<c_char>(), buf, take);
            *buf.add(take) = 0;
        }
    }
    group.len()
}

/// Whether message `index` is a request (sent with `busway_call`): answer it with
/// `busway_reply_to`. A request released unanswered gets an error reply at once.
///
/// # Safety
/// `batch` is null or a batch not yet released.
#[no_mangle]
pub unsafe extern "C" fn busway_batch_is_request(batch: *const busway_batch, index: usize) -> bool {
    // SAFETY: forwarded from the caller's guarantee.
    unsafe { batch_ref(batch) }.is_ok_and(|b| index < b.len() && b.request(index).is_some())
}

/// Answers request `index` of the batch with `len` bytes at `data`. With `wait` false it never
/// waits (`BUSWAY_STATUS_FULL`: the caller's queue is full; the request stays unanswered and
/// may be answered again), with `wait` true it waits while that queue is full.
///
/// # Safety
/// `node` is null or a node not yet stopped or freed; `batch` is null or a batch not yet
/// released; `data` is null with `len` 0 or points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn busway_reply_to(
    node: *const busway_node,
    batch: *const busway_batch,
    index: usize,
    data: *const u8,
    len: usize,
    wait: bool,
) -> busway_status {
    // SAFETY: forwarded from the caller's guarantees.
    let (n, b, payload) = match unsafe { (node_ref(node), batch_ref(batch), bytes_at(data, len)) } {
        (Ok(n), Ok(b), Ok(p)) => (n, b, Bytes::copy_from_slice(p)),
        (Err(s), _, _) | (_, Err(s), _) | (_, _, Err(s)) => return s,
    };
    let Some(request) = (index < b.len()).then(|| b.request(index)).flatten() else {
        let e = ReplyError::NotARequest;
        return fail_with(e.kind(), format!("message {index} of the batch: {e}"));
    };
    let _in_runtime = n.bus.enter();
    let result = if wait {
        n.bus.block_on(request.reply(payload))
    } else {
        request.try_reply(payload)
    };
    match result {
        Ok(()) => busway_status::Ok,
        Err(e) => fail_with(e.kind(), e),
    }
}

/// Releases a batch: its payloads may not be read after this; its unanswered requests get an
/// error reply. `batch` may be null.
///
/// # Safety
/// `batch` is null or a batch from `busway_recv` not yet released, used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn busway_batch_release(batch: *mut busway_batch) {
    if !batch.is_null() {
        // SAFETY: made by `busway_recv` (Box::into_raw), released once per the caller.
        drop(unsafe { Box::from_raw(batch) });
    }
}
