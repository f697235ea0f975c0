//! busway: a brokerless message bus for the server processes of one backend.
//!
//! Every process is a [`Node`] with a 64-bit [`BusId`]. Nodes listen and dial over TCP (IPv4 and
//! IPv6) and Unix sockets, authenticate each other with a shared secret, and exchange messages
//! in order over links that batch small messages into few system calls.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use busway::{Addr, BusId, Node, NodeConfig};
//! let a = Node::start(NodeConfig::new(BusId(1)).listen("tcp://127.0.0.1:7000".parse()?)).await?;
//! let b = Node::start(NodeConfig::new(BusId(2)).connect("tcp://127.0.0.1:7000".parse()?)).await?;
//! let mut inbox = a.take_inbox().unwrap();
//! b.wait_for_peer(BusId(1), std::time::Duration::from_secs(5)).await;
//! b.send(BusId(1), bytes::Bytes::from_static(b"hello")).await?;
//! let msg = inbox.recv().await.unwrap();
//! assert_eq!(msg.src, BusId(2));
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

/// The README's library example, compiled and run as a doc test (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

mod addr;
mod admission;
mod backoff;
mod call_table;
mod calls;
mod config;
mod config_file;
mod connector;
mod deferred;
mod dial;
mod direct;
mod directory;
#[cfg(feature = "etcd")]
mod discovery;
mod drain;
mod etcd_config;
mod event;
mod event_queue;
mod group;
mod hints;
mod id_hash;
mod inbox;
mod io_loops;
pub mod limits;
mod link;
mod message;
mod node;
mod outgoing;
mod peer;
mod peer_table;
mod registration_table;
mod registrations;
mod relayed_table;
mod remote;
mod request;
mod ring_link;
mod ring_rx;
mod ring_tx;
mod routing;
mod shared;
mod shm_link;
mod stats;
mod tls;
mod transport;
mod warn_limit;

pub use addr::{Addr, ParseAddrError};
pub use busway_core::group::permissions::{
    GroupPermissions, GroupRule, GROUP_RULES_MAX, GROUP_RULE_PATTERNS_MAX,
    PUBLISH_REFUSAL_REPORT_INTERVAL_MS,
};
pub use busway_core::group::state::GroupPolicy;
pub use busway_core::handshake::Secret;
pub use busway_core::BusId;
pub use call_table::{CallError, Reply};
pub use calls::{CallOptions, WhenFull};
pub use config::{IoThreads, NodeConfig};
pub use directory::{DiscoveredNode, DiscoveryInfo};
pub use etcd_config::ETCD_LEASE_TTL_MIN_SECS;
pub use etcd_config::{EtcdConfig, DEFAULT_ETCD_LEASE_TTL_SECS, DEFAULT_ETCD_PREFIX};
pub use event::{DownReason, Event, Path};
pub use group::groups::GroupError;
pub use group::multicast::MulticastError;
pub use inbox::Inbox;
pub use message::{Message, MessageBatch};
pub use node::{Events, Node, PeerInfo, RelayedInfo, SendError, StartError};
pub use request::{ReplyError, Request};
pub use stats::Stats;
pub use tls::TlsConfig;
