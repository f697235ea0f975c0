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
mod discovery;
mod group;
mod id_hash;
pub mod limits;
mod link;
mod node;
mod peer;
mod route;
mod rpc;
mod shared;

pub use addr::{Addr, ParseAddrError};
pub use busway_core::error_kind::ErrorKind;
pub use busway_core::group::permissions::{
    GroupPermissions, GroupRule, GROUP_RULES_MAX, GROUP_RULE_PATTERNS_MAX,
    PUBLISH_REFUSAL_REPORT_INTERVAL_MS,
};
pub use busway_core::group::state::GroupPolicy;
pub use busway_core::handshake::Secret;
pub use busway_core::BusId;
pub use discovery::directory::{DiscoveredNode, DiscoveryInfo};
pub use discovery::etcd_config::ETCD_LEASE_TTL_MIN_SECS;
pub use discovery::etcd_config::{EtcdConfig, DEFAULT_ETCD_LEASE_TTL_SECS, DEFAULT_ETCD_PREFIX};
pub use group::groups::GroupError;
pub use group::multicast::MulticastError;
pub use link::tls::TlsConfig;
pub use node::config::{IoThreads, NodeConfig};
pub use node::config_error::ConfigError;
pub use node::event::{DownReason, Event, Path};
pub use node::inbox::Inbox;
pub use node::message::{Message, MessageBatch};
pub use node::stats::Stats;
pub use node::{Events, Node, PeerInfo, RelayedInfo, SendError, StartError};
pub use rpc::call_table::{CallError, Reply};
pub use rpc::request::{ReplyError, Request};
pub use rpc::{CallOptions, WhenFull};
