//! Events for C: what the node tells (links up and down, messages given up, groups cut off,
//! refusals) and the results of calls started with `busway_call_start`, in one flat struct.

use crate::ready::ReadyEvent;
use crate::status::busway_status;
use busway::{CallError, Event, Reply};
use bytes::Bytes;
use std::ffi::{c_char, c_void, CString};

/// What an event tells. The fields of `busway_event` that each kind sets are named at the kind;
/// the others are 0 or null.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum busway_event_kind {
    /// A peer's link came up: `peer`, `incarnation`, `text` (its address).
    PeerUp = 0,
    /// A peer's link went down: `peer`, `count` (messages kept for its next link), `text` (why).
    PeerDown = 1,
    /// busway gave up on messages `first..end` (numbers as the sends returned them) to `peer`:
    /// not confirmed (some may have arrived); `incarnation` (0 if not learned), `text` (why).
    Undeliverable = 2,
    /// A connection was refused in its handshake: `text` (why), `address` (the remote).
    Rejected = 3,
    /// A dial failed (busway retries): `text` (why), `address`.
    DialFailed = 4,
    /// `count` publishes of `peer` to `group` never came (the node stays a member): `text`.
    GroupGap = 5,
    /// The node fell behind in `group` and left it, `count` publishes of `peer` lost: `text`.
    GroupCutOff = 6,
    /// `peer` refused this node's join of `group` (`count` 0) or its publishes (`count` 1): `text`.
    GroupRefused = 7,
    /// `count` multicasts of `peer` never reached this node: `text`.
    MulticastGap = 8,
    /// Relay `peer` could not pass multicast `first` on toward `end` (the receiver): `text`.
    MulticastUnreachable = 9,
    /// A call started with `busway_call_start` ended: `token` (the caller's), `status`
    /// (`BUSWAY_STATUS_OK` with the reply in `data`/`len` from `peer`, or why it failed in `text`).
    CallDone = 10,
    /// An event this version of the header does not know: `text` describes it.
    Other = 11,
}

/// One event. Every pointer in it stays valid until `busway_event_release` is called on it.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct busway_event {
    /// What the event tells.
    pub kind: busway_event_kind,
    /// The bus id it is about (a peer, a publisher, a source, a relay, a callee).
    pub peer: u64,
    /// The peer's incarnation, if the event names one.
    pub incarnation: u64,
    /// First message number given up (`Undeliverable`), multicast number (`MulticastUnreachable`).
    pub first: u64,
    /// One past the last number given up (`Undeliverable`), the receiver (`MulticastUnreachable`).
    pub end: u64,
    /// A count: messages kept, publishes or multicasts missed, or 1 for a refused publish.
    pub count: u64,
    /// `CallDone`: the token given to `busway_call_start`.
    pub token: u64,
    /// `CallDone`: the call's status.
    pub status: busway_status,
    /// `CallDone` that succeeded: the reply's payload (no copy), `len` bytes.
    pub data: *const u8,
    /// The length of `data` in bytes.
    pub len: usize,
    /// Why, or what: NUL-terminated UTF-8, never null (empty if nothing to say).
    pub text: *const c_char,
    /// The group the event is about (NUL-terminated), or null.
    pub group: *const c_char,
    /// The remote address (NUL-terminated) of `Rejected` and `DialFailed`, or null.
    pub address: *const c_char,
    /// busway's own; the caller leaves it alone.
    pub owner: *mut c_void,
}

/// An event with the storage its pointers point into.
pub(crate) struct OwnedEvent {
    event: busway_event,
    storage: Box<Storage>,
}

/// What an event's pointers point into (boxed: it stays put when the event moves).
#[derive(Default)]
struct Storage {
    text: CString,
    group: Option<CString>,
    address: Option<CString>,
    reply: Option<Bytes>,
}

fn c_text(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

impl OwnedEvent {
    fn build(kind: busway_event_kind, fill: impl FnOnce(&mut busway_event, &mut Storage)) -> Self {
        let mut event = busway_event {
            kind,
            peer: 0,
            incarnation: 0,
            first: 0,
            end: 0,
            count: 0,
            token: 0,
            status: busway_status::Ok,
            data: std::ptr::null(),
            len: 0,
            text: std::ptr::null(),
            group: std::ptr::null(),
            address: std::ptr::null(),
            owner: std::ptr::null_mut(),
        };
        let mut storage = Box::<Storage>::default();
        fill(&mut event, &mut storage);
        event.text = storage.text.as_ptr();
        event.group = storage
            .group
            .as_ref()
            .map_or(std::ptr::null(), |g| g.as_ptr());
        event.address = (storage.address.as_ref()).map_or(std::ptr::null(), |a| a.as_ptr());
        if let Some(reply) = &storage.reply {
            event.data = reply.as_ptr();
            event.len = reply.len();
        }
        Self { event, storage }
    }

    /// What waited for the caller, in C's terms.
    pub(crate) fn of_ready(ev: ReadyEvent) -> Self {
        match ev {
            ReadyEvent::Node(ev) => Self::of(ev),
            ReadyEvent::CallDone { token, result } => Self::call_done(token, result),
        }
    }

    /// A node's event in C's terms.
    fn of(ev: Event) -> Self {
        use busway_event_kind as K;
        match ev {
            Event::PeerUp {
                peer,
                incarnation,
                addr,
            } => Self::build(K::PeerUp, |e, s| {
                e.peer = peer.0;
                e.incarnation = incarnation;
                s.text = c_text(&addr);
            }),
            Event::PeerDown {
                peer,
                reason,
                unacked,
            } => Self::build(K::PeerDown, |e, s| {
                e.peer = peer.0;
                e.count = unacked;
                s.text = c_text(&reason.to_string());
            }),
            Event::Undeliverable {
                peer,
                seqs,
                reason,
                incarnation,
                ..
            } => Self::build(K::Undeliverable, |e, s| {
                e.peer = peer.0;
                e.first = seqs.start;
                e.end = seqs.end;
                e.incarnation = incarnation.unwrap_or(0);
                s.text = c_text(&reason);
            }),
            Event::Rejected { addr, reason, .. } => Self::build(K::Rejected, |_, s| {
                s.text = c_text(&reason);
                s.address = Some(c_text(&addr));
            }),
            Event::DialFailed { addr, reason } => Self::build(K::DialFailed, |_, s| {
                s.text = c_text(&reason);
                s.address = Some(c_text(&addr));
            }),
            Event::GroupGap {
                group,
                publisher,
                missed,
                reason,
            } => Self::group(K::GroupGap, &group, publisher.0, missed, &reason),
            Event::GroupCutOff {
                group,
                publisher,
                missed,
                reason,
            } => Self::group(K::GroupCutOff, &group, publisher.0, missed, &reason),
            Event::GroupRefused {
                group,
                by,
                publish,
                reason,
            } => Self::group(K::GroupRefused, &group, by.0, u64::from(publish), &reason),
            Event::MulticastGap {
                source,
                missed,
                reason,
            } => Self::build(K::MulticastGap, |e, s| {
                e.peer = source.0;
                e.count = missed;
                s.text = c_text(&reason);
            }),
            Event::MulticastUnreachable {
                receiver,
                number,
                relay,
                reason,
            } => Self::build(K::MulticastUnreachable, |e, s| {
                e.peer = relay.0;
                e.first = number;
                e.end = receiver.0;
                s.text = c_text(&reason);
            }),
            other => Self::build(K::Other, |_, s| s.text = c_text(&format!("{other:?}"))),
        }
    }

    fn group(kind: busway_event_kind, group: &str, peer: u64, count: u64, why: &str) -> Self {
        Self::build(kind, |e, s| {
            e.peer = peer;
            e.count = count;
            s.text = c_text(why);
            s.group = Some(c_text(group));
        })
    }

    /// The end of a call started with `busway_call_start`.
    fn call_done(token: u64, result: Result<Reply, CallError>) -> Self {
        Self::build(busway_event_kind::CallDone, |e, s| {
            e.token = token;
            match result {
                Ok(reply) => {
                    e.peer = reply.src.0;
                    s.reply = Some(reply.payload);
                }
                Err(err) => {
                    e.status = err.kind().into();
                    s.text = c_text(&err.to_string());
                }
            }
        })
    }

    /// Hands the event to C: its fields copied into `out`, its storage owned by `out.owner`
    /// until `busway_event_release`.
    pub(crate) fn into_c(self) -> busway_event {
        let mut event = self.event;
        event.owner = Box::into_raw(self.storage).cast();
        event
    }
}

/// Releases what `ev`'s pointers point into and clears it. Releasing a cleared or zeroed event
/// does nothing; `ev` may be null.
///
/// # Safety
/// `ev` is null or points to a `busway_event` filled by `busway_next_event` (or zeroed), and no
/// other thread uses it during the call.
#[no_mangle]
pub unsafe extern "C" fn busway_event_release(ev: *mut busway_event) {
    // SAFETY: the caller guarantees `ev` is null or a valid, unshared `busway_event`.
    let Some(ev) = (unsafe { ev.as_mut() }) else {
        return;
    };
    if !ev.owner.is_null() {
        // SAFETY: a non-null `owner` was made by `into_c` from a `Box<Storage>` and is cleared
        // below, so it is released exactly once.
        drop(unsafe { Box::from_raw(ev.owner.cast::<Storage>()) });
    }
    ev.owner = std::ptr::null_mut();
    ev.text = std::ptr::null();
    ev.group = std::ptr::null();
    ev.address = std::ptr::null();
    ev.data = std::ptr::null();
    ev.len = 0;
}
