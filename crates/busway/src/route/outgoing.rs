//! Where a message to a bus id goes, and queuing it there: shared by `Node`'s sends and by
//! calls (their requests and replies).

use crate::limits::{REROUTES_MAX, ROUTED_OVERHEAD_BYTES_MAX};
use crate::node::event::Path;
use crate::node::SendError;
use crate::peer::PushError;
use crate::route::Route;
use crate::shared::Shared;
use busway_core::frame::FrameKind;
use busway_core::BusId;
use bytes::Bytes;
use std::time::Duration;

impl Shared {
    /// A payload over the node's frame limit is refused before it is routed.
    pub(crate) fn check_size(&self, len: usize) -> Result<(), SendError> {
        let max = self.config.frame_body_max;
        if len > max {
            return Err(SendError::TooLarge { len, max });
        }
        Ok(())
    }

    /// The way to `dst` for a message of `len` bytes.
    pub(crate) fn route_for(&self, dst: BusId, len: usize) -> Result<Route, SendError> {
        let route = self.route(dst).ok_or(SendError::NoRoute(dst))?;
        match &route {
            Route::Relayed(_) => {
                // A relayed message also carries the ROUTED header and its route.
                let max = self.config.frame_body_max - ROUTED_OVERHEAD_BYTES_MAX;
                if len > max {
                    return Err(SendError::TooLarge { len, max });
                }
            }
            Route::Direct(p) => {
                // Both ends use the smaller limit: the peer closes a link over a larger frame.
                if let Some(max) = p.frame_body_max().filter(|&max| len > max) {
                    return Err(SendError::TooLarge { len, max });
                }
            }
        }
        Ok(route)
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

    /// Queues one plain message sent on its own on `route`; returns its number there. Over a
    /// ring it may wait unpublished (see `Peer::push_single`).
    pub(crate) fn push_payload(&self, route: &Route, payload: &Bytes) -> Result<u64, PushError> {
        match route {
            Route::Direct(p) => {
                let (seq, note) = p.push_single(payload, self.deferred.looks())?;
                if note {
                    self.deferred.note(p);
                }
                Ok(seq)
            }
            Route::Relayed(r) => {
                let seq = r.push_shared(payload);
                self.schedule_pump(r);
                seq
            }
        }
    }

    /// Queues one CALL or REPLY on `route`; returns its path and number there.
    fn push_framed(
        &self,
        route: &Route,
        kind: FrameKind,
        head: &[u8],
        payload: &Bytes,
    ) -> Result<(Path, u64), PushError> {
        match route {
            Route::Direct(p) => p
                .push_framed(kind, head, payload)
                .map(|s| (Path::Direct, s)),
            Route::Relayed(r) => {
                let seq = r.push_framed(kind, head, payload);
                self.schedule_pump(r);
                seq.map(|s| (Path::Relayed, s))
            }
        }
    }

    /// Queues one CALL or REPLY (`head`, then `payload`) for `dst` (not this node) without
    /// waiting; returns the path and number it was given.
    pub(crate) fn try_send_framed(
        &self,
        dst: BusId,
        kind: FrameKind,
        head: &[u8],
        payload: &Bytes,
    ) -> Result<(Path, u64), SendError> {
        let len = head.len() + payload.len();
        self.check_size(len)?;
        for _ in 0..=REROUTES_MAX {
            match self.push_framed(&self.route_for(dst, len)?, kind, head, payload) {
                Err(PushError::Rerouted) => continue,
                other => return other.map_err(|e| Self::push_error(dst, e)),
            }
        }
        Err(SendError::Full(dst))
    }

    /// [`Shared::try_send_framed`], waiting while the queue toward `dst` is full.
    /// [`Shared::route_for`]; for an id with no route that etcd names, dials it and waits
    /// for the link (at most `DISCOVERED_DIAL_WAIT_MS`).
    pub(crate) async fn route_or_discover(
        &self,
        dst: BusId,
        len: usize,
    ) -> Result<Route, SendError> {
        match self.route_for(dst, len) {
            #[cfg(feature = "etcd")]
            Err(SendError::NoRoute(_)) if self.discover(dst) => {
                let wait = Duration::from_millis(crate::discovery::etcd::DISCOVERED_DIAL_WAIT_MS);
                self.wait_for_peer(dst, wait).await;
                self.route_for(dst, len)
            }
            other => other,
        }
    }

    /// Dials those of `ids` that etcd names (as `route_or_discover` does for one) and waits
    /// for their links, at most `DISCOVERED_DIAL_WAIT_MS` in all; true if any was dialed.
    #[cfg(feature = "etcd")]
    pub(crate) async fn discover_all(&self, ids: &[BusId]) -> bool {
        let dialed: Vec<BusId> = ids
            .iter()
            .copied()
            .filter(|&id| self.discover(id))
            .collect();
        let wait = Duration::from_millis(crate::discovery::etcd::DISCOVERED_DIAL_WAIT_MS);
        let deadline = tokio::time::Instant::now() + wait;
        for &id in &dialed {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            self.wait_for_peer(id, left).await;
        }
        !dialed.is_empty()
    }

    /// Waits until a link to `id` is up, at most `timeout`; false if it did not come.
    pub(crate) async fn wait_for_peer(&self, id: BusId, timeout: Duration) -> bool {
        let wait = async {
            loop {
                let changed = self.peers.changed();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if self.peer(id).is_some_and(|p| p.is_up()) {
                    return;
                }
                changed.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }

    pub(crate) async fn send_framed(
        &self,
        dst: BusId,
        kind: FrameKind,
        head: &[u8],
        payload: &Bytes,
    ) -> Result<(Path, u64), SendError> {
        let len = head.len() + payload.len();
        self.check_size(len)?;
        let mut route = self.route_or_discover(dst, len).await?;
        loop {
            match self.push_framed(&route, kind, head, payload) {
                Err(PushError::Rerouted) => route = self.route_for(dst, len)?,
                Err(PushError::Full) => match &route {
                    Route::Direct(p) => p.wait_for_room(len).await,
                    Route::Relayed(r) => r.wait_for_room(len).await,
                },
                other => return other.map_err(|e| Self::push_error(dst, e)),
            }
        }
    }
}
