//! Where each peer stands with one of a publisher's group logs (see the runtime's
//! `group::log_out`): offered on a ring, read, or declined; and its readers, the one account
//! of whom a publish written into the log was written for. An offer and its answer belong to
//! the ring they were made on (its epoch): an answer to another offer than the last made to
//! the peer, or on another ring than the peer's current one, changes nothing. Sans-IO: the
//! runtime makes the log, sends the offers and wakes the readers.

use crate::BusId;
use std::collections::HashMap;
use std::sync::Arc;

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

/// The offers of one group's log and their answers, per peer, and its readers, each with
/// the host's handle `R` of it (to wake it).
#[derive(Debug)]
pub struct LogOffers<R> {
    /// Per peer: where it stands, the ring epoch and the serial of the offer made on it.
    peers: HashMap<BusId, (Stand, u64, u64)>,
    /// Offers made of this log, ever: the serial of the last.
    offers: u64,
    /// The peers that read the log: the ring epoch they read on, and their handles.
    readers: Vec<(BusId, u64, R)>,
    /// The ids of `readers`, sorted, as a write hands them out (made again when they change).
    reader_ids: Arc<Vec<BusId>>,
}

impl<R> Default for LogOffers<R> {
    fn default() -> Self {
        Self {
            peers: HashMap::new(),
            offers: 0,
            readers: Vec::new(),
            reader_ids: Arc::default(),
        }
    }
}

impl<R> LogOffers<R> {
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
    /// only while that ring is still the one the offer was made on (`ring`: its reader's
    /// handle, if so); the peer then reads the log. A decline drops it from the readers.
    pub fn answered(
        &mut self,
        peer: BusId,
        serial: u64,
        epoch: u64,
        accept: bool,
        ring: impl FnOnce() -> Option<R>,
    ) -> Answered {
        let Some(&(stand, on, offered)) = self.peers.get(&peer) else {
            return Answered::Nothing;
        };
        if offered != serial || on != epoch {
            return Answered::Nothing;
        }
        match (stand, accept) {
            (Stand::Offered, true) => {
                let Some(reader) = ring() else {
                    // Its ring ended meanwhile: a new offer follows on the next one.
                    return Answered::Nothing;
                };
                self.peers.insert(peer, (Stand::Reading, epoch, serial));
                self.drop_reader(peer);
                self.readers.push((peer, epoch, reader));
                self.readers_changed();
                Answered::Reads
            }
            (Stand::Offered | Stand::Reading, false) => {
                self.peers.insert(peer, (Stand::Declined, epoch, serial));
                self.drop_reader(peer);
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
        self.drop_reader(peer);
    }

    /// Drops the readers whose ring ended (`epoch_of` a reader's peer is not the epoch it
    /// read on): they read nothing more, get the publishes by their link again, and a new
    /// offer. Returns whether any reader is left.
    pub fn keep_readers(&mut self, epoch_of: impl Fn(&R) -> u64) -> bool {
        let ended: Vec<BusId> = self
            .readers
            .iter()
            .filter(|(_, epoch, r)| epoch_of(r) != *epoch)
            .map(|&(id, _, _)| id)
            .collect();
        for id in ended {
            self.forget(id);
        }
        !self.readers.is_empty()
    }

    /// The readers' handles.
    pub fn readers(&self) -> impl Iterator<Item = &R> {
        self.readers.iter().map(|(_, _, r)| r)
    }

    /// The readers' ids, sorted: whom a record written now is written for.
    pub fn reader_ids(&self) -> &Arc<Vec<BusId>> {
        &self.reader_ids
    }

    fn drop_reader(&mut self, peer: BusId) {
        if self.readers.iter().any(|&(id, _, _)| id == peer) {
            self.readers.retain(|&(id, _, _)| id != peer);
            self.readers_changed();
        }
    }

    fn readers_changed(&mut self) {
        let mut ids: Vec<BusId> = self.readers.iter().map(|&(id, _, _)| id).collect();
        ids.sort_unstable();
        self.reader_ids = Arc::new(ids);
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
        let mut o = LogOffers::<()>::default();
        assert!(!o.settled_on(P, 1));
        let first = o.offer(P, 1);
        assert!(
            o.settled_on(P, 1) && !o.settled_on(P, 3),
            "one offer per ring"
        );
        // The ring ended and a new one came: the old offer's answer is stale.
        assert_eq!(
            o.answered(P, first, 3, true, || Some(())),
            Answered::Nothing
        );
        let second = o.offer(P, 3);
        assert_eq!(
            o.answered(P, first, 3, true, || Some(())),
            Answered::Nothing
        );
        // An accept while its ring is ending takes nothing: a new offer follows.
        assert_eq!(o.answered(P, second, 3, true, || None), Answered::Nothing);
        assert_eq!(o.answered(P, second, 3, true, || Some(())), Answered::Reads);
        assert_eq!(**o.reader_ids(), [P], "a reader from its accept");
        assert_eq!(
            o.answered(P, second, 3, true, || Some(())),
            Answered::Nothing,
            "once"
        );
        assert_eq!(
            o.answered(P, second, 3, false, || Some(())),
            Answered::Declined
        );
        assert!(o.reader_ids().is_empty(), "no reader after its decline");
        assert_eq!(
            o.answered(P, second, 3, false, || Some(())),
            Answered::Nothing
        );
    }

    #[test]
    fn a_withdrawn_offer_is_made_again_and_a_forgotten_peer_leaves_nothing() {
        let mut o = LogOffers::<()>::default();
        o.offer(P, 1);
        o.withdraw(P);
        assert!(!o.settled_on(P, 1) && o.is_empty());
        o.never_on(P, 1);
        o.withdraw(P);
        assert!(
            o.settled_on(P, 1),
            "a peer never to be offered stays so on that ring"
        );
        assert_eq!(o.answered(P, 0, 1, true, || Some(())), Answered::Nothing);
        o.forget(P);
        assert!(o.is_empty());
    }

    #[test]
    fn a_reader_whose_ring_ended_is_dropped_and_offered_again() {
        let mut o = LogOffers::default();
        let (q, serial_p) = (BusId(9), o.offer(P, 1));
        let serial_q = o.offer(q, 5);
        assert_eq!(
            o.answered(P, serial_p, 1, true, || Some(1)),
            Answered::Reads
        );
        assert_eq!(
            o.answered(q, serial_q, 5, true, || Some(5)),
            Answered::Reads
        );
        assert_eq!(**o.reader_ids(), [P, q]);
        // P's ring is now of epoch 3; q's still 5.
        assert!(o.keep_readers(|&r| if r == 1 { 3 } else { 5 }));
        assert_eq!(**o.reader_ids(), [q]);
        assert_eq!(o.readers().copied().collect::<Vec<_>>(), [5]);
        assert!(!o.settled_on(P, 3), "offered again on its new ring");
        assert!(!o.keep_readers(|_| 7), "none left");
    }
}
