//! What every call returns: a status code, and for a failure a message the caller can read.

use busway::ErrorKind;
use std::cell::RefCell;
use std::ffi::{c_char, CString};

/// The result of a call. `BUSWAY_STATUS_OK` is 0; every other code is a failure whose words
/// `busway_last_error` gives, except `BUSWAY_STATUS_EMPTY` (nothing is waiting: no failure).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum busway_status {
    /// Done.
    Ok = 0,
    /// Nothing is waiting now (a receive, an event): not a failure; wait for the descriptor.
    Empty = 1,
    /// A queue holds its limit: the same call may succeed later (retry, or use the waiting form).
    Full = 2,
    /// The node is shutting down or stopped.
    Closed = 3,
    /// No way to the destination is known.
    NoRoute = 4,
    /// The destination stayed down past its deadline, or shut down.
    PeerDown = 5,
    /// The payload does not fit one frame.
    TooLarge = 6,
    /// No answer within the time given.
    Timeout = 7,
    /// busway gave up on a message it had taken (the peer was given up or restarted).
    GaveUp = 8,
    /// A request arrived but nothing answered it.
    NoHandler = 9,
    /// As many calls are pending as a node keeps.
    TooManyPending = 10,
    /// The message answered is not a request, or was answered already.
    NotAnswerable = 11,
    /// An argument is not one the call takes (a null pointer, an index past the end, a bad
    /// address or group name, text that is not UTF-8).
    BadArgument = 12,
    /// The configuration is not one a node can run with (the message names the setting).
    Config = 13,
    /// A system call failed.
    Io = 14,
}

impl From<ErrorKind> for busway_status {
    fn from(kind: ErrorKind) -> Self {
        match kind {
            ErrorKind::NoRoute => Self::NoRoute,
            ErrorKind::PeerDown => Self::PeerDown,
            ErrorKind::Full => Self::Full,
            ErrorKind::TooLarge => Self::TooLarge,
            ErrorKind::Closed => Self::Closed,
            ErrorKind::Timeout => Self::Timeout,
            ErrorKind::GaveUp => Self::GaveUp,
            ErrorKind::NoHandler => Self::NoHandler,
            ErrorKind::TooManyPending => Self::TooManyPending,
            ErrorKind::NotAnswerable => Self::NotAnswerable,
            ErrorKind::BadArgument => Self::BadArgument,
            ErrorKind::Config => Self::Config,
            ErrorKind::Io => Self::Io,
            // A kind added later reads as the nearest general one.
            _ => Self::Io,
        }
    }
}

thread_local! {
    /// The words of the last failure on this thread (what `busway_last_error` returns).
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error and returns `status` (for `return fail(..)`).
pub(crate) fn fail(status: busway_status, message: impl std::fmt::Display) -> busway_status {
    // A NUL inside the text would cut it short in C: shown as a space instead.
    let text = message.to_string().replace('\0', " ");
    let text = CString::new(text).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
    status
}

/// An error of the busway API as a status, its words recorded.
pub(crate) fn fail_with<E: std::fmt::Display>(kind: ErrorKind, e: E) -> busway_status {
    fail(kind.into(), e)
}

/// The words of the last failed call on the calling thread: what failed and where, as
/// NUL-terminated UTF-8. Never null (empty before any failure).
///
/// Lifetime: valid until the next failing busway call on the same thread; copy it to keep it.
/// Thread safety: each thread has its own.
#[no_mangle]
pub extern "C" fn busway_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
