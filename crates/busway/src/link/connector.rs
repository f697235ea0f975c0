//! The tasks that make connections: a listener's accept loop, a configured address's dial
//! loop (redialed with backoff), and the dials of on-demand direct links (hinted, see
//! `route::direct`), each handing its connections to `link`.

use crate::addr::Addr;
use crate::link;
use crate::link::backoff::Backoff;
use crate::link::dial::{Dial, Outcome};
use crate::link::transport::{self, StdListener};
use crate::node::event::Event;
use crate::shared::Shared;
use busway_core::BusId;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

pub(crate) async fn accept_loop(shared: Arc<Shared>, listener: StdListener) {
    let listener = match listener.register() {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot register a listener");
            return;
        }
    };
    let mut shutdown = shared.app.stop_signal();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => {
                    let shared2 = shared.clone();
                    shared
                        .links.loops
                        .spawn(link::serve_std(shared2, stream, remote));
                }
                Err(e) => {
                    // Out of descriptors or a connection reset before accept: wait a little so
                    // a persistent error does not spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = stopped(&mut shutdown) => return,
        }
    }
}

/// Keeps a link to `addr` up: dials, runs the link, and dials again after it goes down, with an
/// exponential backoff (jittered from the node id so that many nodes do not dial in step).
pub(crate) async fn dial_loop(shared: Arc<Shared>, addr: Addr, upstream: bool) {
    let mut shutdown = shared.app.stop_signal();
    let mut backoff = Backoff::new(
        shared.config().dial_backoff_min_ms,
        shared.config().id.0 ^ shared.incarnation(),
    );
    let mut reported = false;
    let mut attempt: u64 = 0;
    while !shared.is_shutting_down() {
        attempt += 1;
        tracing::debug!(%addr, attempt, "dialing");
        let outcome = match transport::dial(&addr).await {
            Ok(stream) => {
                reported = false;
                let role = if upstream { Dial::Upstream } else { Dial::Peer };
                link::serve(shared.clone(), stream, role, addr.to_string()).await
            }
            Err(e) => {
                let reason = dial_error_text(&e);
                tracing::debug!(%addr, attempt, %reason, "dial failed");
                // Once per streak of failures: a peer that stays away is not reported at
                // every backoff step.
                if !reported {
                    shared.emit(Event::DialFailed {
                        addr: addr.to_string(),
                        reason,
                    });
                    reported = true;
                }
                Outcome::NeverUp
            }
        };
        if outcome == Outcome::WasUp {
            backoff.reset();
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.next_delay()) => {}
            _ = stopped(&mut shutdown) => return,
        }
    }
}

/// Why a dial failed, as a user reads it: a refused connection says so in those words.
fn dial_error_text(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => {
            "connection refused (nothing listens at that address)".into()
        }
        _ => e.to_string(),
    }
}

/// Resolves once the node is shutting down.
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Starts a dial task for each hint (`route::direct`).
pub(crate) async fn direct_dial_loop(shared: Arc<Shared>) {
    loop {
        let dials = shared.routes.next_dials().await;
        if shared.is_shutting_down() {
            return;
        }
        for (dst, addrs) in dials {
            let node = shared.clone();
            shared.links.loops.spawn(async move {
                dial_direct(&node, dst, &addrs).await;
                node.routes.end_dial(dst);
            });
        }
    }
}

/// Dials `dst` at the first of `addrs` that answers and keeps the link up (redialing with
/// backoff) until the node stops or `dst` stays down past its deadline.
async fn dial_direct(shared: &Arc<Shared>, dst: BusId, addrs: &[String]) {
    let addrs: Vec<Addr> = addrs.iter().filter_map(|a| a.parse().ok()).collect();
    let mut backoff = Backoff::new(
        shared.config().dial_backoff_min_ms,
        shared.config().id.0 ^ dst.0 ^ shared.incarnation(),
    );
    let started = shared.clock_ms();
    while !shared.is_shutting_down() {
        let mut outcome = Outcome::NeverUp;
        for addr in &addrs {
            if let Ok(stream) = transport::dial(addr).await {
                outcome =
                    link::serve(shared.clone(), stream, Dial::Direct(dst), addr.to_string()).await;
                if outcome == Outcome::WasUp {
                    break;
                }
            }
        }
        if outcome == Outcome::WasUp {
            backoff.reset();
        }
        let given_up = match shared.peer(dst) {
            Some(p) => p.is_dead() || p.is_up(),
            None => shared.clock_ms().saturating_sub(started) >= shared.config().peer_dead_after_ms,
        };
        if given_up {
            // Down past its deadline (traffic goes back through relays), another link
            // (dialed by the peer) serves it, or it never answered: stop.
            return;
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}
