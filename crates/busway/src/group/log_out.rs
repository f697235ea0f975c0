//! A publisher's logs of its groups, one per group, for the members on its host: a publish
//! is written once into the group's log (`busway_shm::log`) and every peer that reads the log
//! copies it out itself, instead of the publisher queueing one PUBLISH per member link. That
//! makes a publish cost the same for 1 or 1,000 same-host members (iceoryx2's one-copy
//! fan-out); peers on other hosts, or on links that did not switch to a ring, still get one
//! PUBLISH per link.
//!
//! A peer reads a log only once it accepted it: the publisher offers the log (GROUP_LOG
//! offer) on a link whose messages go through a ring, to a peer that asked for the group; the
//! peer opens it read-only, attaches it to its reader of that ring, and accepts; from the
//! accept on, the peer's publishes of the group go into the log alone: `append` says whom
//! each record was written for, and a publish goes by link to every other peer that asked.
//! An offer and its answer belong to the ring they were made on (its epoch, see
//! `Peer::ring_epoch`): when that ring ends, the reader is dropped at the next publish and
//! the publish goes by the link again until a new offer is accepted. A reader
//! that falls more than the log's size behind, or loses its ring, sees a gap in the stream
//! and asks for a repair over its link, as a member behind a dead relay does.
//!
//! Only groups under `GroupPolicy::CutOff` are logged: the log never waits for a reader,
//! while under backpressure the publisher must wait for its slowest member.

use crate::peer::Peer;
use busway_core::frame::FrameKind;
use busway_core::group::log_offers::{Answered, LogOffers};
use busway_core::group::state::GroupName;
use busway_core::group::{encode_log_offer, LogOffer};
use busway_core::BusId;
use busway_shm::announce::{Announced, InProcess};
use busway_shm::log::{Log, LogWriter};
use busway_shm::ring::Binding;
use busway_shm::Ring;
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Groups a node keeps a log of at most: each holds up to `shm_ring_bytes` and a descriptor.
/// Past it, a group's publishes go link by link.
pub(crate) const GROUP_LOGS_MAX: usize = 64;

/// Logs this process made: a reader in the same process takes the log from here instead of
/// mapping `/proc/self/fd` a second time. Weak: a log lives with its publisher.
pub(crate) static LOCAL_LOGS: InProcess<Log> = InProcess::new();

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A peer that reads the log: woken through its link's ring after each publish.
type Reader = (Arc<Peer>, Arc<Ring>);

/// One group's log.
struct GroupLog {
    log: Arc<Log>,
    /// Where a reader finds it.
    at: Announced,
    writer: LogWriter,
    token: u64,
    /// The offer made to each peer and its answer, with the ring they were for; the readers.
    offers: LogOffers<Reader>,
    /// Written since its readers were last woken.
    wake_due: bool,
}

/// What [`GroupLogs::append`] did.
#[derive(Default)]
pub(crate) struct Appended {
    /// The readers it was written for, sorted (`None`: it was not written): exactly the
    /// peers the publish must not go to by their links too. The one account of who reads the
    /// log, taken under the log's lock with the write itself.
    pub(crate) written_for: Option<Arc<Vec<BusId>>>,
    /// Bytes it took in the log (its record's header and padding included).
    pub(crate) bytes: usize,
}

/// A node's logs of the groups it publishes to.
pub(crate) struct GroupLogs {
    me: BusId,
    /// Bytes of data of each log (`NodeConfig::shm_ring_bytes`); 0: no logs.
    capacity: usize,
    /// Per group, its log, or `None` once making one failed (not tried again).
    logs: Mutex<HashMap<GroupName, Option<GroupLog>>>,
    /// A log was written since its readers were last woken (see [`GroupLogs::wake_due`]).
    due: AtomicBool,
    /// Wakes the task that wakes the readers (`wake_loop`).
    wake: Notify,
}

impl GroupLogs {
    pub(crate) fn new(me: BusId, capacity: usize) -> Self {
        Self {
            me,
            capacity,
            logs: Mutex::default(),
            due: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }

    /// Sends `peer` (which a publish is about to go to by its link) the GROUP_LOG offer of
    /// `name`'s log first, if one is due (one that does not fit its queue is made again at a
    /// later publish): its link writes into a ring and no offer was
    /// made on that ring yet. Makes the log the first time (at most `GROUP_LOGS_MAX`). A peer
    /// that passes the group on (`passes_on`, asked once per ring) is never offered one: a
    /// log does not wait for its reader, and a relay that fell behind would lose the stream
    /// for every member below it; by its link the wait goes back to the publisher.
    pub(crate) fn offer(&self, name: &str, peer: &Peer, passes_on: impl FnOnce() -> bool) {
        let Some(offer) = self.offer_due(name, peer, passes_on) else {
            return;
        };
        if peer
            .push_framed(FrameKind::GroupLog, &offer, &Bytes::new())
            .is_err()
        {
            if let Some(Some(g)) = lock(&self.logs).get_mut(name) {
                g.offers.withdraw(peer.id);
            }
        }
    }

    fn offer_due(
        &self,
        name: &str,
        peer: &Peer,
        passes_on: impl FnOnce() -> bool,
    ) -> Option<Vec<u8>> {
        let epoch = peer.ring_epoch();
        if self.capacity == 0 || epoch % 2 == 0 {
            return None;
        }
        let mut logs = lock(&self.logs);
        if !logs.contains_key(name) {
            if logs.len() >= GROUP_LOGS_MAX {
                return None;
            }
            let made = self.make(name);
            logs.insert(name.into(), made);
        }
        let g = logs.get_mut(name)?.as_mut()?;
        // A peer that could not take a record of the log as a frame keeps its link.
        if peer
            .frame_body_max()
            .is_some_and(|m| m < g.log.record_max())
        {
            return None;
        }
        if g.offers.settled_on(peer.id, epoch) {
            return None;
        }
        if !peer.answers_group_logs() || passes_on() {
            // An older peer would close the link on the frame, a relay must not fall behind
            // unseen: never offered on this ring.
            g.offers.never_on(peer.id, epoch);
            return None;
        }
        let serial = g.offers.offer(peer.id, epoch);
        Some(encode_log_offer(&LogOffer {
            name,
            token: g.token,
            serial,
            pid: g.at.pid,
            fd: g.at.fd,
            inode: g.at.inode,
            capacity: g.log.capacity() as u64,
        }))
    }

    fn make(&self, name: &str) -> Option<GroupLog> {
        let mut bytes = [0u8; 8];
        if getrandom::getrandom(&mut bytes).is_err() {
            // Not a secret, only a name unlikely to repeat: the process and an address will do.
            bytes = (std::process::id() as u64 ^ (self as *const Self as u64)).to_le_bytes();
        }
        let token = u64::from_le_bytes(bytes);
        let binding = Binding {
            token,
            writer: self.me.0,
            reader: 0,
        };
        let made = Log::create("busway-group-log", self.capacity, binding)
            .map_err(|e| e.to_string())
            .and_then(|(log, writer)| {
                let at = LOCAL_LOGS.announce(log.segment(), &log);
                Ok((at.map_err(|e| e.to_string())?, log, writer))
            });
        let (at, log, writer) = made
            .inspect_err(|e| tracing::warn!(group = name, error = %e, "cannot make the group's log: its publishes go link by link"))
            .ok()?;
        Some(GroupLog {
            log,
            at,
            writer,
            token,
            offers: LogOffers::default(),
            wake_due: false,
        })
    }

    /// `peer` answered offer `serial` of `name`'s log bound to `token` (or, declining, gave
    /// up a log it read); true if it reads the log from now on. An answer to another offer
    /// than the last made to the peer (an answer resent from an earlier ring), or on another
    /// ring than the peer's current one, changes nothing.
    pub(crate) fn answered(
        &self,
        name: &str,
        peer: &Arc<Peer>,
        (token, serial): (u64, u64),
        accept: bool,
    ) -> bool {
        let mut logs = lock(&self.logs);
        let Some(Some(g)) = logs.get_mut(name) else {
            return false;
        };
        if g.token != token {
            return false;
        }
        let epoch = peer.ring_epoch();
        // The ring the offer was made on, looked at once, as the accept takes.
        let ring = || {
            let ring = peer.outbound_ring().filter(|(e, _)| *e == epoch);
            ring.map(|(_, ring)| (peer.clone(), ring))
        };
        g.offers.answered(peer.id, serial, epoch, accept, ring) == Answered::Reads
    }

    /// Writes one publish (`head` then `payload`) into `name`'s log if anyone reads it. Its
    /// readers that sleep are woken by the node's log task once per burst, not per publish
    /// (see [`GroupLogs::wake_due`]): a hundred sleeping members would otherwise cost a
    /// hundred wake-ups per publish.
    pub(crate) fn append(&self, name: &str, head: &[u8], payload: &[u8]) -> Appended {
        let mut logs = lock(&self.logs);
        let Some(Some(g)) = logs.get_mut(name) else {
            return Appended::default();
        };
        // Readers whose ring ended read nothing more: by their link again, and a new offer.
        if !g.offers.keep_readers(|(p, _)| p.ring_epoch())
            || g.writer.push_parts(&[head, payload]).is_err()
        {
            // No reader left, or larger than half the log: link by link, to readers too
            // (they stay readers).
            return Appended::default();
        }
        g.writer.publish();
        g.wake_due = true;
        // Relaxed: a hint for the log task, whose `notified` permit carries the wake-up; the
        // records themselves are published by the log's tail (Release).
        if !self.due.swap(true, Relaxed) {
            self.wake.notify_one();
        }
        Appended {
            written_for: Some(g.offers.reader_ids().clone()),
            bytes: busway_shm::ring::RECORD_HEADER_BYTES
                + (head.len() + payload.len()).next_multiple_of(8),
        }
    }

    /// Wakes the readers of every log written since the last call that sleep (the others
    /// find the new records on their own): one look at each reader's waiting word, and a
    /// system call only for those asleep.
    pub(crate) fn wake_due(&self) {
        // Relaxed: see `append`; cleared before the logs are looked at, so a write after the
        // look sets it again and notifies again.
        if !self.due.swap(false, Relaxed) {
            return;
        }
        for g in lock(&self.logs).values_mut().flatten() {
            if std::mem::take(&mut g.wake_due) {
                g.offers.readers().for_each(|(_, ring)| ring.wake_reader());
            }
        }
    }

    /// The node's log task: wakes the readers of the logs written, once per burst of
    /// publishes (a burst ends when this task gets to run). Never returns.
    pub(crate) async fn wake_loop(&self) {
        loop {
            self.wake.notified().await;
            self.wake_due();
        }
    }

    /// `peer` no longer reads `name`'s log (it gave up the group; a new offer follows if it
    /// asks again).
    pub(crate) fn forget(&self, name: &str, peer: BusId) {
        let mut logs = lock(&self.logs);
        if let Some(Some(g)) = logs.get_mut(name) {
            g.offers.forget(peer);
            if g.offers.is_empty() {
                // Nobody reads it, was offered it or declined it: its memory and descriptor
                // go (a later asker gets a new log).
                logs.remove(name);
            }
        }
    }

    /// `peer` is gone for good: it reads no log (a log it alone stood with goes).
    pub(crate) fn forget_peer(&self, peer: BusId) {
        lock(&self.logs).retain(|_, g| {
            let Some(g) = g else {
                return true;
            };
            g.offers.forget(peer);
            !g.offers.is_empty()
        });
    }
}
