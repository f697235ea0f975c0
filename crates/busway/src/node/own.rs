//! What a node is: its configuration and identity, fixed when it starts.

use crate::addr::Addr;
use crate::node::config::NodeConfig;

/// A node's configuration and identity, read-only once the node runs.
pub(crate) struct Own {
    /// The configuration the node started with.
    pub(crate) config: NodeConfig,
    /// This run of the node (random at start; a peer tells restarts apart by it).
    pub(crate) incarnation: u64,
    /// This host's identity (HELLO tag 2): equal on both ends of a link within one host.
    pub(crate) host_id: Vec<u8>,
    /// The addresses the node listens on, as bound (a port 0 resolved).
    pub(crate) listen_addrs: Vec<Addr>,
}
