//! Where a message to a bus id goes, and queuing it there: the one send path behind `Node`'s
//! `try_send`, `send` and `send_batch`, calls, replies and repairs. `try_enqueue` routes and
//! queues without waiting (routing again at most `REROUTES_MAX` times when a direct link
//! replaces relays under it); `enqueue` does the same and waits for room while the queue is
//! full, after looking the id up in etcd if it has no route. A direct peer and a relayed
//! destination are one queue to them (`Route::push`, `Route::wait_for_room`).

use crate::limits::{REROUTES_MAX, ROUTED_OVERHEAD_BYTES_MAX};
use crate::node::errors::SendError;
use crate::node::event::Path;
use crate::peer::{Peer, PushError};
use crate::route;
use crate::route::tasks;
use crate::route::Route;
use crate::shared::Shared;
use busway_core::frame::FrameKind;
use busway_core::BusId;
use bytes::Bytes;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

/// A payload over the node's frame limit is refused before it is routed.
pub(crate) fn check_size(shared: &Shared, len: usize) -> Result<(), SendError> {
    let max = shared.config().frame_body_max;
    if len > max {
        return Err(SendError::TooLarge { len, max });
    }
    Ok(())
}

/// The way to `dst` for a message of `len` bytes.
pub(crate) fn route_for(shared: &Shared, dst: BusId, len: usize) -> Result<Route, SendError> {
    let route = route::route(shared, dst).ok_or(SendError::NoRoute(dst))?;
    match &route {
        Route::Relayed(_) => {
            // A relayed message also carries the ROUTED header and its route.
            let max = shared.config().frame_body_max - ROUTED_OVERHEAD_BYTES_MAX;
            if len > max {
                return Err(SendError::TooLarge { len, max });
            }
        }
        Route::Direct(p) => fits_direct(p, len)?,
    }
    Ok(route)
}

/// A message of `len` bytes to the direct peer `p`: both ends use the smaller frame limit
/// (the peer closes a link over a larger frame).
fn fits_direct(p: &Peer, len: usize) -> Result<(), SendError> {
    match p.frame_body_max().filter(|&max| len > max) {
        Some(max) => Err(SendError::TooLarge { len, max }),
        None => Ok(()),
    }
}

/// Queues one plain message for the direct peer `p`: its number. Over a ring it may wait
/// unpublished on the node's `Deferred` list (see `Peer::push_single`).
fn push_single_direct(shared: &Shared, p: &Arc<Peer>, payload: &Bytes) -> Result<u64, PushError> {
    let deferred = shared.peers.deferred();
    let (seq, note) = p.push_single(payload, deferred.looks())?;
    if note {
        deferred.note(p);
    }
    Ok(seq)
}

pub(crate) fn push_error(dst: BusId, e: PushError) -> SendError {
    match e {
        PushError::Full => SendError::Full(dst),
        PushError::Closed => SendError::Closed(dst),
        PushError::Dead => SendError::PeerDown(dst),
        // Callers route again; seen here only if the route keeps changing under them.
        PushError::Rerouted => SendError::Full(dst),
    }
}

/// [`route_for`]; for an id with no route that etcd names, dials it and waits
/// for the link (at most `DISCOVERED_DIAL_WAIT_MS`).
pub(crate) async fn route_or_discover(
    shared: &Shared,
    dst: BusId,
    len: usize,
) -> Result<Route, SendError> {
    match route_for(shared, dst, len) {
        Err(SendError::NoRoute(_)) if crate::discovery::etcd::discover(shared, dst) => {
            let wait = Duration::from_millis(crate::discovery::etcd::DISCOVERED_DIAL_WAIT_MS);
            wait_for_peer(shared, dst, wait).await;
            route_for(shared, dst, len)
        }
        other => other,
    }
}

/// Dials those of `ids` that etcd names (as `route_or_discover` does for one) and waits
/// for their links, at most `DISCOVERED_DIAL_WAIT_MS` in all; true if any was dialed.
pub(crate) async fn discover_all(shared: &Shared, ids: &[BusId]) -> bool {
    let dialed: Vec<BusId> = ids
        .iter()
        .copied()
        .filter(|&id| crate::discovery::etcd::discover(shared, id))
        .collect();
    let wait = Duration::from_millis(crate::discovery::etcd::DISCOVERED_DIAL_WAIT_MS);
    let deadline = tokio::time::Instant::now() + wait;
    for &id in &dialed {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        wait_for_peer(shared, id, left).await;
    }
    !dialed.is_empty()
}

/// Waits until a link to `id` is up, at most `timeout`; false if it did not come.
pub(crate) async fn wait_for_peer(shared: &Shared, id: BusId, timeout: Duration) -> bool {
    let wait = async {
        loop {
            let changed = shared.peers.changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if shared.peer(id).is_some_and(|p| p.is_up()) {
                return;
            }
            changed.await;
        }
    };
    tokio::time::timeout(timeout, wait).await.is_ok()
}

/// A message on its way to a bus id: what the send path queues.
pub(crate) enum Outgoing<'a, P = Bytes> {
    /// A plain message sent on its own (`try_send`, `send`). Over a ring it may wait
    /// unpublished for the sender's burst to end (see `Peer::push_single`).
    Single(&'a Bytes),
    /// Messages sent together (`send_batch`), each copied into the queue; as many as fit
    /// are queued at a time.
    Copies(&'a [P]),
    /// A CALL, REPLY or REPAIR: `head`, then `payload`, in one frame of `kind`.
    Framed {
        kind: FrameKind,
        head: &'a [u8],
        payload: &'a Bytes,
    },
}

impl<'a> Outgoing<'a, Bytes> {
    /// A plain message sent on its own.
    pub(crate) fn single(payload: &'a Bytes) -> Self {
        Outgoing::Single(payload)
    }

    /// A CALL, REPLY or REPAIR frame.
    pub(crate) fn framed(kind: FrameKind, head: &'a [u8], payload: &'a Bytes) -> Self {
        Outgoing::Framed {
            kind,
            head,
            payload,
        }
    }
}

impl<P: AsRef<[u8]>> Outgoing<'_, P> {
    /// The longest message's length, in bytes (what must fit a frame on the way).
    fn longest(&self) -> usize {
        match self {
            Outgoing::Single(p) => p.len(),
            Outgoing::Copies(ps) => ps.iter().map(|p| p.as_ref().len()).max().unwrap_or(0),
            Outgoing::Framed { head, payload, .. } => head.len() + payload.len(),
        }
    }

    /// The same message without the `done` copies queued already.
    fn after(&self, done: usize) -> Self {
        match *self {
            Outgoing::Copies(ps) => Outgoing::Copies(&ps[done..]),
            Outgoing::Single(p) => Outgoing::Single(p),
            Outgoing::Framed {
                kind,
                head,
                payload,
            } => Outgoing::Framed {
                kind,
                head,
                payload,
            },
        }
    }

    /// The first message's length, in bytes (the room to wait for when none fits).
    fn first_len(&self) -> usize {
        match self {
            Outgoing::Single(p) => p.len(),
            Outgoing::Copies(ps) => ps.first().map_or(0, |p| p.as_ref().len()),
            Outgoing::Framed { head, payload, .. } => head.len() + payload.len(),
        }
    }

    /// How many messages it is.
    fn count(&self) -> usize {
        match self {
            Outgoing::Copies(ps) => ps.len(),
            _ => 1,
        }
    }
}

/// Where a message went: the path and its numbers there.
pub(crate) struct Queued {
    pub(crate) path: Path,
    pub(crate) seqs: Range<u64>,
}

/// Why `try_enqueue` queued nothing more.
pub(crate) enum Blocked {
    /// The queue on `Route` is full: wait for its room, or report `Full`.
    Full(Route),
    /// The send fails (no route, too large, the peer down, shutting down).
    Failed(SendError),
}

impl Route {
    /// Queues `msg` here (as many of its copies as fit): its path and numbers. A ring's
    /// single sends may wait unpublished on the node's `Deferred` list.
    #[inline]
    fn push<P: AsRef<[u8]>>(
        &self,
        shared: &Shared,
        msg: &Outgoing<'_, P>,
    ) -> Result<Queued, PushError> {
        let (path, seqs) = match (self, msg) {
            (Route::Direct(p), Outgoing::Single(payload)) => {
                let seq = push_single_direct(shared, p, payload)?;
                (Path::Direct, seq..seq + 1)
            }
            (Route::Direct(p), Outgoing::Copies(ps)) => (Path::Direct, p.push_copies(ps)?),
            (
                Route::Direct(p),
                Outgoing::Framed {
                    kind,
                    head,
                    payload,
                },
            ) => {
                let seq = p.push_framed(*kind, head, payload)?;
                (Path::Direct, seq..seq + 1)
            }
            (Route::Relayed(r), msg) => {
                let seqs = match msg {
                    Outgoing::Single(payload) => r.push_shared(payload).map(|s| s..s + 1),
                    Outgoing::Copies(ps) => r.push_copies(ps),
                    Outgoing::Framed {
                        kind,
                        head,
                        payload,
                    } => r.push_framed(*kind, head, payload).map(|s| s..s + 1),
                };
                // Pumped even when refused: what was queued before goes on.
                tasks::schedule_pump(shared, r);
                (Path::Relayed, seqs?)
            }
        };
        Ok(Queued { path, seqs })
    }

    /// Waits until a message of `len` bytes would fit here (or no more can be queued).
    pub(crate) async fn wait_for_room(&self, len: usize) {
        match self {
            Route::Direct(p) => p.wait_for_room(len).await,
            Route::Relayed(r) => r.wait_for_room(len).await,
        }
    }
}

/// Routes `msg` to `dst` (not this node) and queues what fits, without waiting, routing
/// again at most `REROUTES_MAX` times when the route changes under it.
#[inline]
pub(crate) fn try_enqueue<P: AsRef<[u8]>>(
    shared: &Shared,
    dst: BusId,
    route: Option<Route>,
    msg: &Outgoing<'_, P>,
) -> Result<Queued, Blocked> {
    let len = msg.longest();
    let mut route = match route {
        Some(r) => r,
        None => route_for(shared, dst, len).map_err(Blocked::Failed)?,
    };
    for _ in 0..=REROUTES_MAX {
        match route.push(shared, msg) {
            Err(PushError::Rerouted) => {
                route = route_for(shared, dst, len).map_err(Blocked::Failed)?;
            }
            Err(PushError::Full) => return Err(Blocked::Full(route)),
            Ok(q) if q.seqs.is_empty() && msg.count() > 0 => return Err(Blocked::Full(route)),
            other => return other.map_err(|e| Blocked::Failed(push_error(dst, e))),
        }
    }
    // The route kept changing under it: as a full queue, for a caller that does not wait.
    Err(Blocked::Full(route))
}

/// [`try_enqueue`] of one plain message (`try_send`, and `send` before it waits), its size
/// checked first: the number it was given.
#[inline]
pub(crate) fn try_enqueue_single(
    shared: &Shared,
    dst: BusId,
    payload: &Bytes,
) -> Result<u64, Blocked> {
    check_size(shared, payload.len()).map_err(Blocked::Failed)?;
    // A thread that sends to one peer in a loop: its last look at the peer table holds
    // while the table has not changed, and the peer is pushed to in place.
    let pushed = shared
        .peers
        .with_last_looked_up(dst, |p| push_single_to_looked_up(shared, p, payload));
    if let Some(Some(done)) = pushed {
        return done;
    }
    try_enqueue(shared, dst, None, &Outgoing::single(payload)).map(|q| q.seqs.start)
}

/// [`Route::push`] of one plain message to the direct peer `p` that [`route`] would give:
/// `None` if the peer is one `route` looks at further (a peer dialed on a hint, which its
/// deadline takes out of use), or the push failed (routed again and reported by the caller).
#[inline]
fn push_single_to_looked_up(
    shared: &Shared,
    p: &Arc<Peer>,
    payload: &Bytes,
) -> Option<Result<u64, Blocked>> {
    if p.discovered {
        return None;
    }
    if let Err(e) = fits_direct(p, payload.len()) {
        return Some(Err(Blocked::Failed(e)));
    }
    push_single_direct(shared, p, payload).ok().map(Ok)
}

/// Routes `msg` to `dst` (not this node) and queues all of it, waiting for room while the
/// queue is full; an id with no route that etcd names is dialed first. Returns the path
/// and the numbers given (copies queued in parts: from the first part's first number to
/// the last part's end, on the last part's path).
pub(crate) async fn enqueue<P: AsRef<[u8]>>(
    shared: &Shared,
    dst: BusId,
    msg: Outgoing<'_, P>,
) -> Result<Queued, SendError> {
    check_size(shared, msg.longest())?;
    // The common case at once, with no await: a route, and room for all of it. A send in
    // a loop pays for no more than this (the waiting below is boxed, out of its future).
    let route = match try_enqueue(shared, dst, None, &msg) {
        Ok(q) if (q.seqs.end - q.seqs.start) as usize >= msg.count() => return Ok(q),
        Ok(q) => {
            let rest = msg.after((q.seqs.end - q.seqs.start) as usize);
            return Box::pin(enqueue_waiting(shared, dst, rest, Some(q), None)).await;
        }
        Err(Blocked::Full(route)) => Some(route),
        // Perhaps etcd knows it: looked up (and dialed) on the way that waits.
        Err(Blocked::Failed(SendError::NoRoute(_))) => None,
        Err(Blocked::Failed(e)) => return Err(e),
    };
    Box::pin(enqueue_waiting(shared, dst, msg, None, route)).await
}

/// [`enqueue`] past its first try: waits for room on `route` (or finds one, with
/// etcd if need be), then queues what is left of `msg`, `queued` being what went before.
async fn enqueue_waiting<P: AsRef<[u8]>>(
    shared: &Shared,
    dst: BusId,
    mut msg: Outgoing<'_, P>,
    mut queued: Option<Queued>,
    route: Option<Route>,
) -> Result<Queued, SendError> {
    let mut route = match route {
        Some(full) => {
            full.wait_for_room(msg.first_len()).await;
            Some(full)
        }
        None if queued.is_none() => Some(route_or_discover(shared, dst, msg.longest()).await?),
        None => None,
    };
    loop {
        match try_enqueue(shared, dst, route.take(), &msg) {
            Ok(q) => {
                let n = (q.seqs.end - q.seqs.start) as usize;
                let q = match queued.take() {
                    Some(before) => Queued {
                        path: q.path,
                        seqs: before.seqs.start..q.seqs.end,
                    },
                    None => q,
                };
                if n >= msg.count() {
                    return Ok(q);
                }
                queued = Some(q);
                msg = msg.after(n);
            }
            Err(Blocked::Full(full)) => {
                full.wait_for_room(msg.first_len()).await;
                route = Some(full);
            }
            Err(Blocked::Failed(e)) => return Err(e),
        }
    }
}
