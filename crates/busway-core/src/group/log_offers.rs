//! Where each peer stands with one of a publisher's group logs (see the runtime's
//! `group_log_out`): offered on a ring, read, or declined. An offer and its answer belong to
//! the ring they were made on (its epoch): an answer to another offer than the last made to
//! the peer, or on another ring than the peer's current one, changes nothing. Sans-IO: the
//! runtime makes the log, sends the offers and wakes the readers.

use crate::BusId;
use std::collections::HashMap;

/// Where one peer stands with the log, on one ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stand {
    /// Offered; no answer yet.
    Offered,
    /// Accepted: the peer reads the log.
    Reading,
    /// Declined, or never to be offered on this ring.
    Declined,
}

/// What an answer to an offer did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answered {
    /// The peer reads the log from now on.
    Reads,
    /// The peer is back on its link (a reader no more, if it was one).
    Declined,
    /// Nothing: not an answer to the offer made on the peer's current ring.
    Nothing,
}

/// The offers of one group's log and their answers, per peer.
#[derive(Debug, Default)]
pub struct LogOffers {
    /// Per peer: where it stands, the ring epoch and the serial of the offer made on it.
    peers: HashMap<BusId, (Stand, u64, u64)>,
    /// Offers made of this log, ever: the serial of the last.
    offers: u64,
}

impl LogOffers {
    /// Whether `peer`, on its ring of `epoch`, was offered the log (or declined for good)
    /// already: no other offer is due on that ring.
    pub fn settled_on(&self, peer: BusId, epoch: u64) -> bool {
        self.peers.get(&peer).is_some_and(|&(_, e, _)| e == epoch)
    }

    /// `peer` is never to be offered the log on its ring of `epoch` (it cannot read logs, or
    /// it passes the group on).
    pub fn never_on(&mut self, peer: BusId, epoch: u64) {
        self.peers.insert(peer, (Stand::Declined, epoch, 0));
    }

    /// An offer to `peer` on its ring of `epoch`: its serial.
    pub fn offer(&mut self, peer: BusId, epoch: u64) -> u64 {
        self.offers += 1;
        self.peers
            .insert(peer, (Stand::Offered, epoch, self.offers));
        self.offers
    }

    /// `peer` answered offer `serial` (`accept`), its ring now of `epoch`. An accept takes
    /// only while that ring is still the one the offer was made on (`ring_alive`).
    pub fn answered(
        &mut self,
        peer: BusId,
        serial: u64,
        epoch: u64,
        accept: bool,
        ring_alive: impl FnOnce() -> bool,
    ) -> Answered {
        let Some(&(stand, on, offered)) = self.peers.get(&peer) else {
            return Answered::Nothing;
        };
        if offered != serial || on != epoch {
            return Answered::Nothing;
        }
        match (stand, accept) {
            (Stand::Offered, true) => {
                if !ring_alive() {
                    // Its ring ended meanwhile: a new offer follows on the next one.
                    return Answered::Nothing;
                }
                self.peers.insert(peer, (Stand::Reading, epoch, serial));
                Answered::Reads
            }
            (Stand::Offered | Stand::Reading, false) => {
                self.peers.insert(peer, (Stand::Declined, epoch, serial));
                Answered::Declined
            }
            _ => Answered::Nothing,
        }
    }

    /// The offer to `peer` could not be sent: it is made again later.
    pub fn withdraw(&mut self, peer: BusId) {
        if matches!(self.peers.get(&peer), Some((Stand::Offered, _, _))) {
            self.peers.remove(&peer);
        }
    }

    /// `peer` no longer stands with the log (it gave up the group, is gone, or its ring
    /// ended): a new offer follows if it asks again.
    pub fn forget(&mut self, peer: BusId) {
        self.peers.remove(&peer);
    }

    /// Whether no peer reads the log, was offered it or declined it.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: BusId = BusId(7);

    #[test]
    fn an_answer_counts_only_for_the_last_offer_on_the_current_ring() {
        let mut o = LogOffers::default();
        assert!(!o.settled_on(P, 1));
        let first = o.offer(P, 1);
        assert!(
            o.settled_on(P, 1) && !o.settled_on(P, 3),
            "one offer per ring"
        );
        // The ring ended and a new one came: the old offer's answer is stale.
        assert_eq!(o.answered(P, first, 3, true, || true), Answered::Nothing);
        let second = o.offer(P, 3);
        assert_eq!(o.answered(P, first, 3, true, || true), Answered::Nothing);
        // An accept while its ring is ending takes nothing: a new offer follows.
        assert_eq!(o.answered(P, second, 3, true, || false), Answered::Nothing);
        assert_eq!(o.answered(P, second, 3, true, || true), Answered::Reads);
        assert_eq!(
            o.answered(P, second, 3, true, || true),
            Answered::Nothing,
            "once"
        );
        assert_eq!(o.answered(P, second, 3, false, || true), Answered::Declined);
        assert_eq!(o.answered(P, second, 3, false, || true), Answered::Nothing);
    }

    #[test]
    fn a_withdrawn_offer_is_made_again_and_a_forgotten_peer_leaves_nothing() {
        let mut o = LogOffers::default();
        o.offer(P, 1);
        o.withdraw(P);
        assert!(!o.settled_on(P, 1) && o.is_empty());
        o.never_on(P, 1);
        o.withdraw(P);
        assert!(
            o.settled_on(P, 1),
            "a peer never to be offered stays so on that ring"
        );
        assert_eq!(o.answered(P, 0, 1, true, || true), Answered::Nothing);
        o.forget(P);
        assert!(o.is_empty());
    }
}
