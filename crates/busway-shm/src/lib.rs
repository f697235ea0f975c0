//! busway-shm: rings in shared memory between two processes (or two threads), and everything
//! unsafe and lock-free that busway needs for them.
//!
//! - [`segment`]: anonymous shared memory (`memfd`) that vanishes with the last process holding
//!   it, mapped from a new file or from a descriptor received from the peer.
//! - [`ring`]: a single-producer single-consumer byte ring of checked, length-prefixed records
//!   inside a segment, with batched publication and futex wake-ups that are skipped when nobody
//!   sleeps.
//! - [`log`]: a broadcast log, one writer and any number of readers, each at its own pace: a
//!   group's publishes written once for every member on the host.
//! - [`announce`]: segments announced to a peer by descriptor, found again without a second
//!   mapping by a peer in the same process.
//! - [`pass`]: handing a segment's descriptor to the peer over a Unix socket.
//!
//! Why one SPSC ring per direction and not libatbus's one multi-writer ring per receiver: see
//! `docs/SHM.md`. In short, a link already has exactly one writer and one reader per direction,
//! and SPSC needs no compare-and-swap on the hot path and no lock a dead writer could hold.

#![deny(missing_docs)]

mod sync;
mod wait;

pub mod announce;
#[cfg(not(feature = "loom"))]
pub mod fuzzing;
#[cfg(not(feature = "loom"))]
pub mod log;
pub mod pass;
pub mod ring;
pub mod segment;

pub use ring::{Consumer, Corrupt, Producer, ReadWaiter, Ring, RingError, RoomWaiter};
pub use segment::Segment;
