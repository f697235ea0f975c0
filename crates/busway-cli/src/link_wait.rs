//! Waiting for the link a command needs, with the cause of its failure named as soon as it is
//! known: a dial refused (after a few backoff steps), a handshake the peer refused (a wrong
//! secret, an id in use, TLS), or a node of another id at the address dialed, rather than a
//! generic timeout after `PEER_WAIT_SECS`. Only for a node that dials one address: with
//! several, a failure at one says nothing of the link that matters, which may come up at
//! another, so the wait runs its course.

use busway::{BusId, Event, Events, Rejection};
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// How long a dial that fails below the handshake (refused, unreachable) may go on failing,
/// a few backoff steps, before a command waiting for its link gives up with the cause, in
/// milliseconds. A peer being restarted is back within it.
pub(crate) const DIAL_FAILING_GIVE_UP_MS: u64 = 1_000;

/// How long the peer may go on refusing this node's bus id as in use before a command gives
/// up, in milliseconds. A holder killed on this or another live host is found gone at once
/// (its kernel closes its sockets; the peer reads their end), so a restarted process waits out
/// only the moment the peer takes to read that. A holder that is alive, frozen or on a host
/// that vanished keeps the id (up to the heartbeat limit, 3 s by default, for the last two):
/// the command names it within 2 s, and says that a retry helps if the holder just died.
pub(crate) const ID_IN_USE_GIVE_UP_MS: u64 = 1_500;

/// What a command waits for, and on which addresses it dials.
pub(crate) struct LinkWait<'a> {
    /// The bus id the command sends to.
    pub(crate) to: BusId,
    /// The addresses this node dials (`--connect`, `--upstream`), as events name them.
    pub(crate) dialed: &'a [String],
    /// Whether `to` may be reached through another node (an upstream, or etcd): a link to
    /// another id at a dialed address is then no mistake.
    pub(crate) through_others: bool,
    /// How long to wait in all, in seconds.
    pub(crate) wait_secs: u64,
}

impl LinkWait<'_> {
    /// Waits for `reachable` (true: the link is up in time) while reading `events`: an error
    /// names the cause as soon as waiting cannot help.
    pub(crate) async fn run(
        &self,
        events: &mut Events,
        reachable: impl Future<Output = bool>,
    ) -> Result<(), String> {
        tokio::pin!(reachable);
        let to = self.to;
        let deadline = Instant::now() + Duration::from_secs(self.wait_secs);
        let mut failing: Option<(Instant, String, Duration)> = None;
        let mut events_open = true;
        loop {
            let give_up = failing
                .as_ref()
                .map_or(deadline, |(since, _, grace)| *since + *grace);
            tokio::select! {
                up = &mut reachable => {
                    if up {
                        return Ok(());
                    }
                    let cause = failing.map_or(String::new(), |(_, why, _)| format!(": {why}"));
                    return Err(format!(
                        "no link to bus id {to} came up within {} s{cause}",
                        self.wait_secs
                    ));
                }
                ev = events.recv(), if events_open => match ev {
                    Some(_) if self.dialed.len() != 1 => {}
                    Some(ev) => {
                        if let Some(why) = self.hopeless(&ev) {
                            return Err(format!("no link to bus id {to}: {why}"));
                        }
                        match ev {
                            Event::DialFailed { addr, reason } => {
                                let why = format!("dialing {addr}: {reason}");
                                failing.get_or_insert((Instant::now(), why, dial_grace()));
                            }
                            // Perhaps a holder that died and is not yet known dead there.
                            Event::Rejected { addr, reason, kind: Rejection::IdInUse, .. } => {
                                let why = format!(
                                    "the handshake with {addr} failed: {reason} (if the process that had this id just died, try again in a few seconds)"
                                );
                                let grace = Duration::from_millis(ID_IN_USE_GIVE_UP_MS);
                                failing.get_or_insert((Instant::now(), why, grace));
                            }
                            Event::PeerUp { .. } => failing = None,
                            _ => {}
                        }
                    }
                    None => events_open = false,
                },
                _ = tokio::time::sleep_until(give_up), if failing.is_some() => {
                    let (_, why, grace) = failing.take().expect("a failure is on record");
                    return Err(format!(
                        "no link to bus id {to}: {why} (still failing after {} ms)",
                        grace.as_millis()
                    ));
                }
            }
        }
    }

    /// Why `ev` means the link cannot come up by waiting, if it does.
    fn hopeless(&self, ev: &Event) -> Option<String> {
        match ev {
            Event::Rejected { addr, reason, kind, .. }
                if self.dialed == [addr.as_str()] && *kind != Rejection::IdInUse =>
            {
                Some(format!("the handshake with {addr} failed: {reason}"))
            }
            // With no other way to `to`, the one address dialed must be `to`'s.
            Event::PeerUp { peer, addr, .. }
                if *peer != self.to && !self.through_others && self.dialed == [addr.as_str()] =>
            {
                Some(format!(
                    "the node at {addr} is bus id {peer}, not {}: send with --to {peer}, or give its address as --upstream to send through it",
                    self.to
                ))
            }
            _ => None,
        }
    }
}

fn dial_grace() -> Duration {
    Duration::from_millis(DIAL_FAILING_GIVE_UP_MS)
}
