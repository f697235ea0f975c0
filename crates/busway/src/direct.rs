//! On-demand direct links. A relay that passes a source's data to a destination it has a link
//! to hints the source where the destination listens (ROUTED HINT); the source dials it, and
//! later traffic goes direct. Order holds across the switch: when the direct link comes up,
//! messages queued on it wait until everything sent through relays before is acknowledged
//! (`Remote::supersede`, `Peer::hold`).
//!
//! The dialer owns the link: it redials it with backoff while the peer is not given up, and
//! once the peer stays down past `peer_dead_after_ms`, traffic to it goes back through relays
//! (a later hint may bring the direct link back).

use crate::addr::Addr;
use crate::backoff::Backoff;
use crate::dial::{Dial, Outcome};
use crate::link;
use crate::peer::Peer;
use crate::shared::Shared;
use crate::transport;
use busway_core::routed::{encode_hint, RoutedType};
use busway_core::BusId;
use std::sync::Arc;

/// `addr` with an unspecified IP (0.0.0.0, [::]) replaced by the IP the relay sees the peer at
/// (`seen_at`, the remote address of its link), so that others can dial it.
fn dialable(addr: &str, seen_at: &str) -> Option<String> {
    let parsed: Addr = addr.parse().ok()?;
    match parsed {
        Addr::Tcp(mut sa) if sa.ip().is_unspecified() => {
            let seen: Addr = seen_at.parse().ok()?;
            let Addr::Tcp(seen) = seen else { return None };
            sa.set_ip(seen.ip());
            Some(Addr::Tcp(sa).to_string())
        }
        _ => Some(addr.to_owned()),
    }
}

impl Shared {
    /// Relay side: data from `src` is being passed to `dst_peer`, its final hop. Hints `src`
    /// (at most every `DIRECT_HINT_INTERVAL_MS`) if the destination accepts direct links.
    pub(crate) fn maybe_hint(&self, src: BusId, dst_peer: &Peer) {
        if !dst_peer.accepts_direct() {
            return;
        }
        if !self.direct.due(src, dst_peer.id, self.clock_ms()) {
            return;
        }
        let snap = dst_peer.snapshot();
        let addrs: Vec<String> = snap
            .hello
            .listen_addrs
            .iter()
            .filter_map(|a| dialable(a, &snap.addr))
            .collect();
        let h = self.control_header(RoutedType::Hint, src, 0);
        self.send_routed_control(src, encode_hint(&h, dst_peer.id, &addrs));
    }

    /// Source side: a relay says `dst` listens at `addrs`.
    pub(crate) fn hint_received(&self, dst: BusId, addrs: Vec<String>) {
        if !self.config.direct_links || dst == self.config.id || addrs.is_empty() {
            return;
        }
        if self.peer(dst).is_some_and(|p| !p.is_dead()) {
            return;
        }
        self.direct.queue(dst, addrs);
    }

    /// Starts a dial task for each hint.
    pub(crate) async fn discovery_loop(self: Arc<Self>) {
        loop {
            let dials = self.direct.next_dials().await;
            if self.is_shutting_down() {
                return;
            }
            for (dst, addrs) in dials {
                let shared = self.clone();
                self.loops.pick().spawn(async move {
                    shared.dial_direct(dst, &addrs).await;
                    shared.direct.end_dial(dst);
                });
            }
        }
    }

    /// Dials `dst` at the first of `addrs` that answers and keeps the link up (redialing with
    /// backoff) until the node stops or `dst` stays down past its deadline.
    async fn dial_direct(self: &Arc<Self>, dst: BusId, addrs: &[String]) {
        let addrs: Vec<Addr> = addrs.iter().filter_map(|a| a.parse().ok()).collect();
        let mut backoff = Backoff::new(
            self.config.dial_backoff_min_ms,
            self.config.id.0 ^ dst.0 ^ self.incarnation,
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
                None => self.clock_ms().saturating_sub(started) >= self.config.peer_dead_after_ms,
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

    /// Lets a held direct link go once nothing sent to `id` through relays is unacknowledged.
    pub(crate) fn release_if_drained(&self, id: BusId) {
        let drained = self.remote_of(id).is_none_or(|r| r.unacked() == 0);
        if drained {
            if let Some(p) = self.peer(id) {
                p.release();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::dialable;

    #[test]
    fn unspecified_hosts_become_the_address_the_relay_sees() {
        assert_eq!(
            dialable("tcp://0.0.0.0:7000", "tcp://10.1.2.3:5555").as_deref(),
            Some("tcp://10.1.2.3:7000")
        );
        assert_eq!(
            dialable("tcp://127.0.0.1:7000", "tcp://10.1.2.3:5555").as_deref(),
            Some("tcp://127.0.0.1:7000")
        );
        assert_eq!(
            dialable("unix:///tmp/a.sock", "unix://").as_deref(),
            Some("unix:///tmp/a.sock")
        );
        assert_eq!(dialable("tcp://[::]:7000", "unix://x"), None);
    }
}
