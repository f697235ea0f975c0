//! What kind of failure an error of the public API is, across its verb families (send, call,
//! reply, publish, multicast, start): each error type says its `kind()`, so a caller can act on
//! the kind (retry on `Full`, give up on `Closed`) without matching every family's variants.

/// The kind of a failure. Variants may be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No way to the destination is known (never linked, no relay to ask).
    NoRoute,
    /// The destination stayed down past its deadline, or shut down.
    PeerDown,
    /// A queue holds its byte limit; the same call may succeed later.
    Full,
    /// The payload does not fit one frame.
    TooLarge,
    /// This node is shutting down.
    Closed,
    /// No answer within the time given.
    Timeout,
    /// busway gave up on a message it had taken (the peer was given up, restarted, or the
    /// message was undeliverable).
    GaveUp,
    /// A request arrived but nothing answered it.
    NoHandler,
    /// As many calls are pending as a node keeps.
    TooManyPending,
    /// The message answered is not a request, or was answered already.
    NotAnswerable,
    /// A name or list given is not one the call takes (an empty or too long group name, no
    /// receivers, too many receivers).
    BadArgument,
    /// The configuration is not one a node can run with.
    Config,
    /// A system call failed.
    Io,
}
