//! The group part's periodic work, registered with the node's timer (`node::timer`).

use crate::group::{host, relay};
use crate::shared::Shared;
use busway_core::{group, multicast};

/// The groups' and multicasts' periodic work, every tick of the node's timer, when any
/// stream or repair is under way: interest that did not fit a peer's queue when it changed,
/// then the machines' timers.
pub(crate) fn tick(shared: &Shared, now_ms: u64) {
    let multicasts = !shared.group.multicasts.lock().is_idle();
    let groups = !shared.group.table.lock().is_idle() || shared.group.table.has_repairs();
    if groups || multicasts {
        host::sync_group_adverts(shared);
        group_tick(shared, now_ms);
    }
    if multicasts {
        multicast_tick(shared, now_ms);
    }
}

/// The groups' and multicasts' timers, on the node's timer: first the publishes that wait
/// for room (a ring's reader retries them itself; a socket's link waits for them), then
/// the machines' own (see `group::node::tick` and `multicast::node::tick`).
fn group_tick(shared: &Shared, now_ms: u64) {
    relay::push_blocked_forwards(shared);
    host::with_group_host(shared, |h| group::node::tick(h, now_ms));
}

/// The multicasts' timers, on the node's timer (see `multicast::node::tick`).
fn multicast_tick(shared: &Shared, now_ms: u64) {
    host::with_group_host(shared, |h| multicast::node::tick(h, now_ms));
}
