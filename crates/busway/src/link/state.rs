//! The link part's state shared by every connection of a node.

/// The link part's shared state: what every connection of the node takes its place in.
pub(crate) struct Links {
    /// The replay cache of handshakes, shared by every link's state machine.
    pub(crate) nonces: std::sync::Arc<std::sync::Mutex<busway_core::handshake::NonceCache>>,
    /// Open connections and handshakes in progress, within their limits.
    pub(crate) admission: crate::link::admission::Admission,
    /// The I/O loops links run on.
    pub(crate) loops: crate::link::io_loops::IoLoops,
    /// Repeated warnings about connections, held back per host (`warn_limit`).
    pub(crate) warnings: crate::link::warn_limit::WarnLimiter,
}

impl Links {
    /// The link part of a node that admits `connections_max` connections and runs its links
    /// on `loops`.
    pub(crate) fn new(connections_max: usize, loops: crate::link::io_loops::IoLoops) -> Self {
        Links {
            nonces: Default::default(),
            admission: crate::link::admission::Admission::new(connections_max),
            loops,
            warnings: Default::default(),
        }
    }
}
