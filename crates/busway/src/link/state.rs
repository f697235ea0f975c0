//! The link part's state shared by every connection of a node.

/// The link part's shared state: what every connection of the node takes its place in.
pub(crate) struct Links {
    /// The replay cache of handshakes, shared by every link's state machine.
    pub(in crate::link) nonces:
        std::sync::Arc<std::sync::Mutex<busway_core::handshake::NonceCache>>,
    /// Open connections and handshakes in progress, within their limits.
    pub(in crate::link) admission: crate::link::admission::Admission,
    /// The I/O loops links run on.
    pub(in crate::link) loops: crate::link::io_loops::IoLoops,
    /// Repeated warnings about connections, held back per host (`warn_limit`).
    pub(in crate::link) warnings: crate::link::warn_limit::WarnLimiter,
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

    /// Runs `task` on the node's I/O loops until it ends or the loops stop.
    pub(crate) fn spawn<F>(&self, task: F)
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.loops.spawn(task);
    }

    /// Stops the node's I/O loops and every task on them.
    pub(crate) fn stop(&self) {
        self.loops.stop();
    }

    /// Connections open now.
    pub(crate) fn connections_open(&self) -> usize {
        self.admission.open()
    }

    /// Whether a warning under `key` is logged now (see `WarnLimiter::admit`): `Some` with
    /// how many were held back since the last one, `None` while it is held back.
    pub(crate) fn admit_warning(&self, key: &str, now_ms: u64) -> Option<u64> {
        self.warnings.admit(key, now_ms)
    }
}
