//! busway-core: the sans-IO heart of busway.
//!
//! Everything here is pure: no sockets, no threads, no clock (time comes in as an argument) and no
//! `unsafe`. The runtime crate (`busway`) feeds bytes in and writes the bytes it is given out, so
//! the same code can be driven by real sockets, by a simulated cluster in a test, or by a fuzzer.
//!
//! - [`id`]: bus ids and incarnations.
//! - [`frame`]: the v1 frame layout, its integrity check and the streaming decoder.
//! - [`body`]: one message of a read: where it lies, its kind, its body typed.
//! - [`channel`]: the CHANNEL frame that moves a link's data to shared memory.
//! - [`control`]: bodies of the small control frames (close, ping/pong).
//! - [`handshake`]: the HELLO/AUTH exchange, shared-secret proofs and the replay cache.
//! - [`link`]: one link's protocol as a state machine (handshake, frame rules, heartbeats, rings).
//! - [`outbox`], [`e2e`]: numbering, holding and resending messages on a link and end to end.
//! - [`routed`], [`relay`], [`hints`]: the ROUTED frame, routing decisions, direct-link hints.
//! - [`registry`]: the REGISTER frame, what downstreams registered, what a relay asked upstream.
//! - [`group`]: the INTEREST, PUBLISH and REPAIR frames of groups.
//! - [`multicast`]: the MULTICAST frame (one payload to the receivers behind a link).
//! - [`take_order`]: the order in which an application takes batches from a channel and rings.
//! - [`error_kind`]: the kind of a failure, shared by the public API's error types.
//! - [`fuzzing`]: entry points shared by the fuzz targets and the property tests.

#![deny(missing_docs)]

pub mod body;
pub mod cert_ids;
pub mod channel;
pub mod control;
pub mod e2e;
pub mod entries;
pub mod error_kind;
pub mod frame;
pub mod fuzzing;
pub mod group;
pub mod handshake;
pub mod hints;
pub mod id;
pub mod link;
pub mod multicast;
pub mod outbox;
pub mod registry;
pub mod relay;
pub mod routed;
pub mod sim;
pub mod take_order;
pub mod turns;

pub use frame::{DecodeError, Frame, FrameDecoder, FrameKind};
pub use id::BusId;
