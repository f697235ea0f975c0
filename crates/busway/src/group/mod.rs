//! The group part: groups and multicast on this node, the runtime's side of busway-core's
//! group and multicast machines (`busway_core::group`, `busway_core::multicast`).
//!
//! **Owns**, each behind busway-core's locks: the group state and the repairs under way
//! (`busway_core::group::locked::GroupTable`), the multicast state
//! (`busway_core::turns::InTurn`), the publishes a relay passes on that wait for room
//! (`busway_core::group::locked::LockedForwards`), and the order in which deliveries reach
//! the inbox (`busway_core::turns::Handover`; all four in `state::GroupPart`); this node's
//! logs of the groups it publishes to and the peers' logs it reads (`log_out`, `log_in`).
//!
//! **Runs on**: the application's tasks (`Node::join`, `leave`, `publish`, `multicast`: the
//! public API in `groups` and `multicast`), every link's I/O thread (each read's group frames,
//! handed to `busway_core::group::reads` by `reads` through `host`, which makes the node the
//! machines' host), the ring readers (their group logs, through `ring_link::GroupMessages`,
//! which `reads::NodeGroups` implements), and the
//! node's timer (the machines' timers, `tick`). No lock is held across links: each state
//! has its own, and a delivery takes its turn under it.
//!
//! **May call**: the peers' queues (push, wait for room), the routes, the inbox's sender, the
//! node's events and counters. The rules (who may speak for whom, numbering, gaps, repairs,
//! marks, permissions, cut-offs) are busway-core's; nothing here decodes a group frame by
//! offset.

pub(crate) mod groups;
pub(crate) mod host;
pub(crate) mod log_in;
pub(crate) mod log_out;
pub(crate) mod multicast;
pub(crate) mod permissions;
pub(crate) mod reads;
pub(crate) mod relay;
pub(crate) mod state;
pub(crate) mod tick;

/// What one read or timer delivers to this node's application, handed to the inbox in the
/// order decided (see `busway_core::turns`).
pub(crate) type Delivered<'a> =
    busway_core::turns::Delivered<'a, crate::node::message::MessageBatch>;
