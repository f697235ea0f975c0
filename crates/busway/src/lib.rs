//! busway: a brokerless message bus for the server processes of one backend.
//!
//! Every process is a [`Node`] with a 64-bit [`BusId`]. Nodes listen and dial over TCP (IPv4 and
//! IPv6), TLS and Unix sockets, authenticate each other with a shared secret or certificates,
//! and exchange messages in order over links that batch small messages into few system calls;
//! two nodes on one host move their messages through shared memory on their own.
//!
//! # Send and receive
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
//! // Before the process exits: everything acknowledged (or reported), members served.
//! b.drain(std::time::Duration::from_secs(5)).await;
//! # Ok(()) }
//! ```
//!
//! # Errors, request and reply, groups and multicast, events
//!
//! Every error of the API says its [`ErrorKind`] (`kind()`): retry on `Full`, give up on
//! `Closed`, whatever the verb. A call waits for its reply; `Message::reply` answers one.
//! A group's members get what is published to it, in each publisher's order; a multicast
//! takes one payload to a list of ids, one frame per link on the way. The event stream tells
//! of links up and down, messages given up (never silently), groups cut off.
//!
//! ```no_run
//! # async fn demo(a: busway::Node, b: busway::Node) -> Result<(), Box<dyn std::error::Error>> {
//! use busway::{BusId, ErrorKind};
//! use bytes::Bytes;
//! match a.try_send(BusId(2), Bytes::from_static(b"tick")) {
//!     Ok(_number) => {}
//!     Err(e) if e.kind() == ErrorKind::Full => { /* the peer is behind: try later */ }
//!     Err(e) => eprintln!("{e}"),
//! }
//!
//! let mut inbox = b.take_inbox().unwrap();
//! tokio::spawn(async move {
//!     while let Some(m) = inbox.recv().await {
//!         // A plain message is no request: its `reply` says `NotARequest`.
//!         let _ = m.reply(Bytes::from_static(b"pong")).await;
//!     }
//! });
//! let timeout = std::time::Duration::from_secs(1);
//! let reply = a.call(BusId(2), Bytes::from_static(b"ping"), timeout).await?;
//! assert_eq!(&reply.payload[..], b"pong");
//!
//! b.join("scores")?;
//! let places = a.publish("scores", Bytes::from_static(b"42")).await?;
//! let receivers = a.multicast(&[BusId(5), BusId(9)], Bytes::from_static(b"to these two")).await?;
//! # let _ = (places, receivers);
//!
//! let mut events = a.take_events().unwrap();
//! while let Some(event) = events.recv().await {
//!     println!("{event:?}");
//! }
//! # Ok(()) }
//! ```
//!
//! # TLS, shared memory, a config file
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use busway::{BusId, Node, NodeConfig, TlsConfig};
//! use std::path::Path;
//! // Between hosts: TLS, each node's certificate naming its bus id.
//! let tls = TlsConfig::from_pem_files(Path::new("1.pem"), Path::new("1.key"), Path::new("ca.pem"))?;
//! let a = Node::start(NodeConfig::new(BusId(1)).tls(tls).listen("tls://0.0.0.0:7443".parse()?)).await?;
//! // On one host: `shm://NAME` asks for shared memory (links on one host switch to it
//! // anyway, `NodeConfig::shm_channels`).
//! let b = Node::start(NodeConfig::new(BusId(2)).listen("shm://game-2".parse()?)).await?;
//! // Every setting from a file; an error names the key and its line.
//! let c = Node::start(NodeConfig::from_toml_file(Path::new("node.toml"))?).await?;
//! # let _ = (a, b, c);
//! # Ok(()) }
//! ```

#![deny(missing_docs)]

/// The README's library example, compiled and run as a doc test (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

mod addr;
mod clock;
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

pub use addr::{Addr, HostPort, ParseAddrError};
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
pub use node::event::{DownReason, Event, Path, Rejection};
pub use node::inbox::Inbox;
pub use node::message::{Message, MessageBatch};
pub use node::stats::Stats;
pub use node::{Events, Node, PeerInfo, RelayedInfo, Relaying, SendError, StartError};
pub use rpc::call_table::{CallError, Reply};
pub use rpc::request::{ReplyError, Request};
pub use rpc::{CallOptions, WhenFull};
