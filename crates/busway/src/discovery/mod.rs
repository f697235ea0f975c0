//! The discovery part: where a node finds the others when no link says so.
//!
//! **Owns**: the `[etcd]` settings (`etcd_config`), what the node learned of the others and the
//! state of its session (`directory`), and the session itself (`etcd`: connect, lease,
//! register, read and watch the prefix, keep-alive, reconnect with backoff; the lease revoked
//! at shutdown).
//!
//! **Runs on**: one task on an I/O loop (the session); the application's threads read the
//! directory when a send finds no route.
//!
//! **May call**: the link part's backoff, the peer table, and the route part's hints (a send
//! to an id with no route queues the addresses found here for the direct dialer).

pub(crate) mod directory;
pub(crate) mod etcd;
pub(crate) mod etcd_config;
pub(crate) mod etcd_http;
