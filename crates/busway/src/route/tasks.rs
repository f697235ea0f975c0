//! The route part's tasks: the pump, which hands relayed messages to their next hops as they
//! pile up, and the retry tick (every `ROUTED_RETRY_INTERVAL_MS`), which writes again what
//! relayed destinations hold, gives up on those unreachable too long, forgets idle state and
//! runs the other parts' periodic work.

use crate::limits::{FORGET_SWEEP_INTERVAL_MS, ROUTED_RESEND_AFTER_MS, ROUTED_RETRY_INTERVAL_MS};
use crate::node::event::Path;
use crate::route::remote::Remote;
use crate::shared::Shared;
use busway_core::e2e::Check;
use busway_core::frame::HEADER_LEN;
use bytes::Bytes;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

impl Shared {
    /// Hands what `remote` has unwritten to the next hop, or notes that there is none.
    pub(crate) fn pump(&self, remote: &Remote) {
        let now = self.clock_ms();
        let Some(hop) = self.next_hop(remote.id, None) else {
            remote.stall(now);
            return;
        };
        let frames =
            remote.take_frame_parts(self.config().id, self.incarnation(), self.config().ttl, now);
        let body_len = |f: &Vec<Bytes>| f.iter().map(Bytes::len).sum::<usize>() - HEADER_LEN;
        let too_large = hop.frame_body_max().and_then(|max| {
            frames
                .iter()
                .map(body_len)
                .find(|&n| n > max)
                .map(|n| (n, max))
        });
        if let Some((body_len, max)) = too_large {
            // Its first hop would refuse one of them (and close the link over it, and it would
            // come back forever): nothing of this take is sent, all of it is given up here and
            // reported, and later messages go on (the destination is not down).
            let seqs = remote.fail_all();
            remote.revive();
            self.release_if_drained(remote.id);
            self.report_undeliverable(
                remote.id,
                seqs,
                format!(
                    "a relayed frame of {body_len} bytes is over the {max} bytes bus id {} accepts",
                    hop.id
                ),
                Path::Relayed,
                remote.incarnation(),
            );
            return;
        }
        for f in frames {
            hop.push_forward(f, None);
        }
    }

    /// Has the pump task hand `remote`'s new messages on (batched with whatever else comes in
    /// before it runs).
    pub(crate) fn schedule_pump(&self, remote: &Remote) {
        if remote.mark_for_pump() {
            self.routes.relayed.wake_pump();
        }
    }

    /// Hands newly queued relayed messages to their next hops, as many at a time as have
    /// piled up since the last round.
    pub(crate) async fn pump_loop(self: Arc<Self>) {
        loop {
            self.routes.relayed.pump_woken().await;
            if self.is_shutting_down() {
                return;
            }
            for r in self.remotes_snapshot() {
                if r.take_pump_mark() {
                    self.pump(&r);
                }
            }
        }
    }

    /// A link came up: whatever relayed messages are held may have a path now.
    pub(crate) fn relink_remotes(&self) {
        for r in self.remotes_snapshot() {
            r.revive();
            self.count_resent(r.rewind());
            self.pump(&r);
        }
    }

    /// Writes again what relayed destinations hold when paths may have lost it, and gives up
    /// on destinations that stayed unreachable past `peer_dead_after_ms`.
    pub(crate) async fn retry_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_millis(ROUTED_RETRY_INTERVAL_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next_sweep = 0;
        loop {
            tick.tick().await;
            if self.is_shutting_down() {
                return;
            }
            // The coarse clock is read by sends (a clock read per send would cost more than
            // the send's own work).
            let now = self.clock.tick();
            if now >= next_sweep {
                next_sweep = now + FORGET_SWEEP_INTERVAL_MS;
                self.forget_idle(now);
            }
            self.registrations_tick();
            let multicasts = !self.group.multicasts.lock().is_idle();
            if !self.group.table.lock().is_idle() || self.group.table.has_repairs() || multicasts {
                // Interest that did not fit a peer's queue when it changed.
                self.sync_group_adverts();
                self.group_tick(now);
            }
            if multicasts {
                self.multicast_tick(now);
            }
            for r in self.remotes_snapshot() {
                match r.check(
                    now,
                    ROUTED_RESEND_AFTER_MS,
                    self.config().peer_dead_after_ms,
                ) {
                    Check::Idle => {}
                    Check::Retry => {
                        self.count_resent(r.rewind());
                        self.pump(&r);
                    }
                    Check::Expire => {
                        let seqs = r.fail_all();
                        self.release_if_drained(r.id);
                        self.give_up_on_peer(
                            r.id,
                            seqs,
                            format!(
                                "no path to bus id {} for {} ms",
                                r.id,
                                self.config().peer_dead_after_ms
                            ),
                            Path::Relayed,
                            r.incarnation(),
                        );
                    }
                }
            }
        }
    }

    /// Forgets state nobody needs any more (issue #11: every map shrinks): peers dead for
    /// `forget_after_ms`, relayed sources silent that long, relayed destinations that hold
    /// nothing and were not sent to for twice that.
    fn forget_idle(&self, now: u64) {
        let window = self.config().forget_after_ms;
        let c = &self.counters;
        let n = self.peers.forget_dead(now, window) as u64;
        c.forgotten_peers.fetch_add(n, Relaxed);
        let n = self.routes.relayed.forget_sources(now, window) as u64;
        c.forgotten_sources.fetch_add(n, Relaxed);
        let n = self
            .routes
            .relayed
            .forget_destinations(now, window.saturating_mul(2)) as u64;
        c.forgotten_destinations.fetch_add(n, Relaxed);
    }
}
