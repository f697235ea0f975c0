//! On-demand direct links. A relay that passes a source's data to a destination it has a link
//! to hints the source where the destination listens (ROUTED HINT); the source dials it, and
//! later traffic goes direct. Order holds across the switch: when the direct link comes up,
//! messages queued on it wait until everything sent through relays before is acknowledged
//! (`Remote::supersede`, `Peer::hold`).
//!
//! Hints are ROUTED traffic: a relay sends them and a source takes them in `routing`; this
//! module dials and switches. The dialer owns the link: it redials it with backoff while the
//! peer is not given up, and once the peer stays down past `peer_dead_after_ms`, traffic to it
//! goes back through relays (a later hint may bring the direct link back).

use crate::addr::Addr;
use crate::link;
use crate::link::backoff::Backoff;
use crate::link::dial::{Dial, Outcome};
use crate::link::transport;
use crate::peer::Peer;
use crate::shared::Shared;
use busway_core::BusId;
use std::sync::Arc;

impl Shared {
    /// Starts a dial task for each hint.
    pub(crate) async fn discovery_loop(self: Arc<Self>) {
        loop {
            let dials = self.routes.hints.next_dials().await;
            if self.is_shutting_down() {
                return;
            }
            for (dst, addrs) in dials {
                let shared = self.clone();
                self.links.loops.pick().spawn(async move {
                    shared.dial_direct(dst, &addrs).await;
                    shared.routes.hints.end_dial(dst);
                });
            }
        }
    }

    /// Dials `dst` at the first of `addrs` that answers and keeps the link up (redialing with
    /// backoff) until the node stops or `dst` stays down past its deadline.
    async fn dial_direct(self: &Arc<Self>, dst: BusId, addrs: &[String]) {
        let addrs: Vec<Addr> = addrs.iter().filter_map(|a| a.parse().ok()).collect();
        let mut backoff = Backoff::new(
            self.config().dial_backoff_min_ms,
            self.config().id.0 ^ dst.0 ^ self.incarnation(),
        );
        let started = self.clock_ms();
        while !self.is_shutting_down() {
            let mut outcome = Outcome::NeverUp;
            for addr in &addrs {
                if let Ok(stream) = transport::dial(addr).await {
                    outcome =
                        link::serve(self.clone(), stream, Dial::Direct(dst), addr.to_string())
                            .await;
                    if outcome == Outcome::WasUp {
                        break;
                    }
                }
            }
            if outcome == Outcome::WasUp {
                backoff.reset();
            }
            let given_up = match self.peer(dst) {
                Some(p) => p.is_dead() || p.is_up(),
                None => self.clock_ms().saturating_sub(started) >= self.config().peer_dead_after_ms,
            };
            if given_up {
                // Down past its deadline (traffic goes back through relays), another link
                // (dialed by the peer) serves it, or it never answered: stop.
                return;
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }

    /// A direct link to `id` is being attached: later sends go to it, and its messages wait
    /// until what went through relays before is acknowledged.
    pub(crate) fn switch_to_direct(&self, peer: &Peer) {
        if let Some(r) = self.remote_of(peer.id) {
            if r.supersede() > 0 {
                peer.hold();
                // The last acknowledgement may have come between the count and the hold.
                self.release_if_drained(peer.id);
            }
        }
    }
}
