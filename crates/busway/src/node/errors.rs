//! Why a node could not start, and why a send failed. Every error type of the API says its
//! [`ErrorKind`] (`kind()`) and keeps its cause as its `source()`.

use crate::addr::Addr;
use crate::node::config_error::ConfigError;
use busway_core::error_kind::ErrorKind;
use busway_core::BusId;
use std::fmt;

/// Why a send failed. Nothing was queued.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendError {
    /// This node has never had a link to this id.
    NoRoute(BusId),
    /// The peer stayed down past `peer_dead_after_ms`, or shut down; sends fail until it is
    /// back.
    PeerDown(BusId),
    /// The peer's send queue holds its byte limit (`try_send` only).
    Full(BusId),
    /// A message to this node itself found its own inbox full: the application has not taken
    /// what it holds (`try_send`, and a call, to the node's own id; `send` waits instead). An
    /// inbox the application dropped takes messages and discards them, as for a peer's.
    InboxFull(BusId),
    /// The payload is over the node's `frame_body_max`.
    TooLarge {
        /// The payload's length, in bytes.
        len: usize,
        /// The longest payload a send takes, in bytes.
        max: usize,
    },
    /// The node is shutting down.
    Closed(BusId),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoRoute(id) => write!(f, "no route to bus id {id}: it was never connected"),
            Self::PeerDown(id) => write!(
                f,
                "bus id {id} is gone (it shut down, or stayed down past its deadline)"
            ),
            Self::Full(id) => write!(f, "the send queue to bus id {id} is full"),
            Self::InboxFull(id) => write!(
                f,
                "bus id {id} sent to itself and its own inbox is full (the application has not taken what it holds)"
            ),
            Self::TooLarge { len, max } => {
                write!(
                    f,
                    "payload of {len} bytes is over the {max}-byte frame limit"
                )
            }
            Self::Closed(id) => write!(f, "cannot send to bus id {id}: the node is shutting down"),
        }
    }
}

impl std::error::Error for SendError {}

impl SendError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::NoRoute(_) => ErrorKind::NoRoute,
            Self::PeerDown(_) => ErrorKind::PeerDown,
            Self::Full(_) | Self::InboxFull(_) => ErrorKind::Full,
            Self::TooLarge { .. } => ErrorKind::TooLarge,
            Self::Closed(_) => ErrorKind::Closed,
        }
    }
}

/// Why a node could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration is not one a node can run with; the error says what and where.
    Config(ConfigError),
    /// A listen address could not be bound.
    Bind {
        /// The address.
        addr: Addr,
        /// Why not.
        source: std::io::Error,
    },
    /// Another system call failed while the node started.
    Io(std::io::Error),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(what) => write!(f, "invalid node configuration: {what}"),
            Self::Bind { addr, source } => write!(f, "cannot listen on {addr}: {source}"),
            Self::Io(e) => write!(f, "cannot start the node: {e}"),
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Config(e) => Some(e),
            Self::Bind { source, .. } => Some(source),
            Self::Io(e) => Some(e),
        }
    }
}

impl StartError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Config(_) => ErrorKind::Config,
            Self::Bind { .. } | Self::Io(_) => ErrorKind::Io,
        }
    }
}
