//! How a connection came to be and how it ended: what the link, the peer table and the dialers
//! agree on.

use busway_core::handshake::Role;
use busway_core::BusId;

/// How a connection ended, for the dialer's backoff.
#[derive(PartialEq, Eq, Debug)]
pub(crate) enum Outcome {
    /// The handshake never completed.
    NeverUp,
    /// The link was up, then went down.
    WasUp,
}

/// How a connection came to be.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Dial {
    /// Accepted by a listener.
    Accepted,
    /// Dialed to a `connect` address.
    Peer,
    /// Dialed to the `upstream` address: this node registers as its downstream.
    Upstream,
    /// Dialed on a relay's hint to reach this bus id directly.
    Direct(BusId),
}

impl Dial {
    /// This end's side of the handshake.
    pub(crate) fn role(self) -> Role {
        match self {
            Dial::Accepted => Role::Listener,
            Dial::Peer | Dial::Upstream | Dial::Direct(_) => Role::Dialer,
        }
    }
}
