//! End-to-end delivery through relays, sans-IO: the sender's side ([`Departures`]) and the
//! receiver's side ([`Arrivals`]) of messages numbered explicitly per (source incarnation,
//! destination), for paths whose relays keep no state and may lose anything.
//!
//! The sender holds every message until the destination acknowledges it, and writes all it
//! holds again whenever the path may have lost something: a link came up, a relay reported a
//! transient failure, the destination reported a gap, or nothing was acknowledged for a while.
//! The receiver delivers each number once, in order, drops what it already has, and reports a
//! frame that starts past what it expects. Time comes in as an argument (milliseconds of any
//! monotonic clock). The runtime (`busway::Remote`) wraps a `Departures` in a lock.

use crate::id::BusId;
use crate::outbox::Outbox;
use crate::routed::{routed_frame_parts, FailReason, RoutedHeader, RoutedType};
use bytes::Bytes;
use std::collections::HashMap;
use std::ops::Range;

/// What an acknowledgement or a gap report changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The destination did not restart (or this is the first incarnation heard of).
    Nothing,
    /// The destination restarted: these messages to its previous incarnation (given) are lost.
    Restarted(Range<u64>, u64),
}

/// What the sender should do at a tick.
#[derive(Debug, PartialEq, Eq)]
pub enum Check {
    /// Nothing to do: nothing is held, things move, or a retry was written recently.
    Idle,
    /// Write everything held again.
    Retry,
    /// Give up on everything held (nothing moved for the deadline).
    Expire,
}

/// What a FAIL did to a destination's departures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailOutcome {
    /// A gap: everything from the number the destination expects is unwritten again (write
    /// it); the verdict says whether the destination restarted.
    Resend(Verdict),
    /// A transient failure (the destination down for now, a congested relay): the messages
    /// wait for a path; the deadline counts from now.
    Stalled,
    /// A failure for good (unknown id, TTL, loop): these messages are given up; report them.
    GaveUp(Range<u64>),
}

/// The sender's side for one destination.
#[derive(Debug)]
pub struct Departures {
    outbox: Outbox,
    limit_bytes: usize,
    /// The destination's incarnation, learned from its acknowledgements.
    incarnation: Option<u64>,
    /// Since when nothing moved (no path, a transient failure, or silence); `None` while things
    /// move.
    stalled_since: Option<u64>,
    /// When the wait for the next acknowledgement started.
    last_progress_ms: u64,
    last_retry_ms: u64,
    dead: bool,
    /// A direct link to the destination came up: new messages go there, and what is held
    /// here is acknowledged first (see [`Departures::supersede`]).
    superseded: bool,
    /// Most bytes written toward the destination and not yet acknowledged (see
    /// [`Departures::set_window`]).
    window_bytes: usize,
}

/// Most bytes of messages' frames a source packs into one ROUTED DATA frame from consecutive
/// chunks: one chunk of copies at most, so that a packed frame is within what every node
/// accepts (a relayed chunk of small messages is that large already).
pub const ROUTED_PACK_BYTES_MAX: usize = crate::outbox::CHUNK_OF_COPIES_BYTES_MAX;

/// An outbox of relayed messages: its frames go without checks of their own, since they travel
/// inside ROUTED frames whose content check covers them on every hop (one hash per byte at the
/// source, not two).
fn relayed_outbox(limit_bytes: usize, first_seq: u64) -> Outbox {
    let mut outbox = Outbox::new(limit_bytes, first_seq);
    outbox.set_checks(false);
    outbox
}

impl Departures {
    /// Departures that hold at most `limit_bytes` of frames, waiting for an acknowledgement
    /// from `now_ms` (milliseconds).
    pub fn new(limit_bytes: usize, now_ms: u64) -> Self {
        Self {
            outbox: relayed_outbox(limit_bytes, 0),
            limit_bytes,
            incarnation: None,
            stalled_since: None,
            last_progress_ms: now_ms,
            last_retry_ms: 0,
            dead: false,
            superseded: false,
            window_bytes: usize::MAX,
        }
    }

    /// Writes at most `bytes` toward the destination ahead of its acknowledgements (default:
    /// no limit). What a destination that does not read can hold on its way, at the relays
    /// included: end-to-end backpressure per destination, so that a stuck one fills no
    /// relay's queue and slows no other destination sharing the path.
    pub fn set_window(&mut self, bytes: usize) {
        self.window_bytes = bytes;
    }

    /// Whether messages wait to be written (for the window, or for a path).
    pub fn has_unwritten(&self) -> bool {
        self.outbox.has_unwritten_messages()
    }

    /// A direct link to the destination came up: later messages must take it (the caller
    /// checks [`Departures::is_superseded`] before queueing here). Returns how many messages
    /// sent through relays are still unacknowledged: the direct link holds its own messages
    /// until these are acknowledged (or given up), so that order holds across the switch.
    pub fn supersede(&mut self) -> u64 {
        self.superseded = true;
        self.outbox.unacked()
    }

    /// Whether new messages go by a direct link instead (see [`Departures::supersede`]).
    pub fn is_superseded(&self) -> bool {
        self.superseded
    }

    /// A send found no direct link in use and chose this path: whether it may queue here.
    /// `direct_in_use` is asked only if a direct link superseded this path, and must look at
    /// the direct link *now* (the caller holds whatever lock guards this value): a send that
    /// looked before the link came up must not take traffic back to the relays (its message
    /// would travel behind later ones sent direct). True: relaying goes on (resumed if the
    /// direct link was given up); false: route again, to the direct link.
    pub fn open_for_send(&mut self, direct_in_use: impl FnOnce() -> bool) -> bool {
        if self.superseded {
            if direct_in_use() {
                return false;
            }
            self.superseded = false;
        }
        true
    }

    /// The outbox of the messages held for the destination.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// The outbox, to queue messages (see [`Outbox::push_copies`], [`Outbox::push_shared`]).
    pub fn outbox_mut(&mut self) -> &mut Outbox {
        &mut self.outbox
    }

    /// Whether sends fail at once (the destination expired; see [`Departures::revive`]).
    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// The destination's incarnation, learned from its acknowledgements; `None` before the
    /// first.
    pub fn incarnation(&self) -> Option<u64> {
        self.incarnation
    }

    /// Every unwritten message as ROUTED DATA frames from `src` to `dst`, each as the buffers
    /// it is written from (see [`routed_frame_parts`]: the chunks' frames are shared with the
    /// outbox, not copied). Consecutive chunks share a frame while their bytes stay within
    /// [`ROUTED_PACK_BYTES_MAX`] (a larger chunk goes alone): a stream of large messages, one
    /// chunk each, costs relays and the destination one frame per megabyte, not one per message.
    pub fn take_frame_parts(
        &mut self,
        src: BusId,
        src_incarnation: u64,
        dst: BusId,
        ttl: u8,
        now_ms: u64,
    ) -> Vec<Vec<Bytes>> {
        let had_in_flight = self.outbox.has_written_unacked();
        // Everything below the oldest unacknowledged message is settled (acknowledged, or
        // given up and reported): the frame that starts there says so.
        let settled_below = self.outbox.acked();
        let header = |first_seq: u64| RoutedHeader {
            kind: RoutedType::Data,
            ttl,
            src,
            src_incarnation,
            dst,
            seq: first_seq,
            settled: first_seq == settled_below,
            route: Vec::new(),
        };
        let mut frames = Vec::new();
        // The frame being packed: its first number, its inner buffers and their bytes.
        let mut packing: Option<(u64, Vec<Bytes>, usize)> = None;
        self.outbox
            .take_chunks_within(self.window_bytes, |first_seq, inner, payload| {
                let len = inner.len() + payload.map_or(0, Bytes::len);
                let fits =
                    matches!(&packing, Some((_, _, bytes)) if bytes + len <= ROUTED_PACK_BYTES_MAX);
                if !fits {
                    if let Some((first, parts, _)) = packing.take() {
                        frames.push(routed_frame_parts(&header(first), &parts));
                    }
                    packing = Some((first_seq, Vec::with_capacity(2), 0));
                }
                if let Some((_, parts, bytes)) = &mut packing {
                    *bytes += len;
                    parts.push(inner.clone());
                    parts.extend(payload.cloned());
                }
            });
        if let Some((first, parts, _)) = packing {
            frames.push(routed_frame_parts(&header(first), &parts));
        }
        if !frames.is_empty() && !had_in_flight {
            // Nothing was awaiting acknowledgement: the wait for one starts now.
            self.last_progress_ms = now_ms;
        }
        frames
    }

    /// Like [`Departures::take_frame_parts`], each frame in one buffer (for simulations).
    pub fn take_frames(
        &mut self,
        src: BusId,
        src_incarnation: u64,
        dst: BusId,
        ttl: u8,
        now_ms: u64,
    ) -> Vec<Bytes> {
        self.take_frame_parts(src, src_incarnation, dst, ttl, now_ms)
            .into_iter()
            .map(|parts| Bytes::from(parts.concat()))
            .collect()
    }

    /// A FAIL from a relay or the destination about the messages from `seq` on (the FAIL's
    /// source incarnation is `incarnation`, meaningful for a gap only): what this end does.
    pub fn on_fail(
        &mut self,
        reason: FailReason,
        incarnation: u64,
        seq: u64,
        now_ms: u64,
    ) -> FailOutcome {
        if reason == FailReason::Gap {
            FailOutcome::Resend(self.gap(incarnation, seq))
        } else if reason == FailReason::TooLarge && seq < self.outbox.acked() {
            // About a message given up already (a copy written again before the first report
            // came): later messages are not concerned.
            let at = self.outbox.acked();
            FailOutcome::GaveUp(at..at)
        } else if reason.is_transient() {
            self.stall(now_ms);
            FailOutcome::Stalled
        } else {
            FailOutcome::GaveUp(self.fail_all())
        }
    }

    /// No path now, or a transient failure: remember since when.
    pub fn stall(&mut self, now_ms: u64) {
        self.stalled_since.get_or_insert(now_ms);
    }

    /// Everything unacknowledged becomes unwritten again. Returns how many messages that were
    /// written will be written again.
    pub fn rewind(&mut self) -> u64 {
        let written = self.outbox.written_end();
        let at = self.outbox.acked();
        let _ = self.outbox.resume(at);
        written.saturating_sub(at)
    }

    /// An acknowledgement from the destination's incarnation `incarnation`. Returns the
    /// verdict and the bytes freed.
    pub fn ack(&mut self, incarnation: u64, next_expected: u64, now_ms: u64) -> (Verdict, usize) {
        let verdict = self.check_incarnation(incarnation, next_expected);
        let freed = self.outbox.ack_explicit(next_expected);
        if freed > 0 {
            self.last_progress_ms = now_ms;
            self.stalled_since = None;
        }
        (verdict, freed)
    }

    /// The destination expects `next_expected` next and saw a frame start past it: write
    /// everything from there again.
    pub fn gap(&mut self, incarnation: u64, next_expected: u64) -> Verdict {
        let verdict = self.check_incarnation(incarnation, next_expected);
        self.outbox.ack_explicit(next_expected);
        self.rewind();
        verdict
    }

    /// Whether `incarnation` (from an ACK or a gap report that says the destination expects
    /// `next_expected`) is a new process: then everything held is lost to the old one, and
    /// the numbering goes on from where the new one stands (0 unless it took a settled frame
    /// first; numbering from 0 regardless would make it skip what follows as duplicates).
    fn check_incarnation(&mut self, incarnation: u64, next_expected: u64) -> Verdict {
        match self.incarnation.replace(incarnation) {
            Some(old) if old != incarnation => {
                let lost = self.outbox.fail_all();
                self.outbox = relayed_outbox(self.limit_bytes, next_expected);
                Verdict::Restarted(lost, old)
            }
            _ => Verdict::Nothing,
        }
    }

    /// Gives up on every message held; later sends should fail until [`Departures::revive`].
    pub fn fail_all(&mut self) -> Range<u64> {
        self.dead = true;
        self.stalled_since = None;
        self.outbox.fail_all()
    }

    /// A path may exist again.
    pub fn revive(&mut self) {
        self.dead = false;
    }

    /// What to do at this tick: write everything held again at most every `resend_after_ms`
    /// while nothing moves, and give up once nothing moved for `dead_after_ms`. Only an
    /// acknowledgement counts as moving.
    pub fn check(&mut self, now_ms: u64, resend_after_ms: u64, dead_after_ms: u64) -> Check {
        if self.dead || self.outbox.unacked() == 0 {
            self.stalled_since = None;
            return Check::Idle;
        }
        if self.stalled_since.is_none()
            && now_ms.saturating_sub(self.last_progress_ms) >= resend_after_ms
        {
            // Silence counts from the last progress.
            self.stalled_since = Some(self.last_progress_ms);
        }
        let Some(since) = self.stalled_since else {
            return Check::Idle;
        };
        if now_ms.saturating_sub(since) >= dead_after_ms {
            return Check::Expire;
        }
        let pace = resend_after_ms.min(dead_after_ms / 4).max(1);
        if now_ms.saturating_sub(self.last_retry_ms) >= pace {
            self.last_retry_ms = now_ms;
            return Check::Retry;
        }
        Check::Idle
    }
}

/// The receiver's side: where each source's numbering stands.
///
/// A source not heard from for a while is forgotten ([`Arrivals::forget_idle`]): its next
/// frame is numbered from where it holds messages (flagged `settled`, so it is taken). That is
/// safe once the source has settled everything it held (acknowledged or given up), which
/// bounds how long a source may hold a relayed message (`peer_dead_after_ms`) below the time
/// a destination waits before it forgets.
///
/// A source's messages may come by more than one link at once (through a relay, and over a
/// direct link that carries what the source writes again after a switch). One reader at a time
/// hands a source's messages over ([`Arrivals::claim`]), and it counts what is fresh when it
/// holds the claim ([`Arrivals::already_delivered`]), not when it read the frame: two readers
/// that each found the same frame fresh would otherwise both deliver it.
#[derive(Debug, Default)]
pub struct Arrivals {
    /// Per source: (its incarnation, the number expected next, when a frame of it last came).
    expected: HashMap<BusId, (u64, u64, u64)>,
    /// Per source being handed over now: the reader (a caller's token) that does it, and
    /// whether another reader was refused meanwhile (it waits to be told of the release).
    claims: HashMap<BusId, (u64, bool)>,
}

impl Arrivals {
    /// Reader `reader` (any token unique among the caller's readers) is to hand over messages
    /// of `src`: true if it may (no other reader is doing it), false if it must wait for
    /// [`Arrivals::release`] by the other. Claims do not nest: a reader claims a source once
    /// and releases it once. At most one claim per source: the table is bounded by the
    /// readers at work.
    pub fn claim(&mut self, src: BusId, reader: u64) -> bool {
        let (holder, contended) = self.claims.entry(src).or_insert((reader, false));
        if *holder == reader {
            return true;
        }
        *contended = true;
        false
    }

    /// Reader `reader` is done handing over messages of `src` (delivered, or gave up): true
    /// if another reader was refused meanwhile and waits to be told.
    pub fn release(&mut self, src: BusId, reader: u64) -> bool {
        match self.claims.get(&src) {
            Some(&(holder, contended)) if holder == reader => {
                self.claims.remove(&src);
                contended
            }
            _ => false,
        }
    }

    /// How many messages, of those numbered from `first_seq` in incarnation `src_incarnation`,
    /// were delivered already (by any reader). Asked under the claim, right before handing over.
    pub fn already_delivered(&self, src: BusId, src_incarnation: u64, first_seq: u64) -> u64 {
        match self.expected.get(&src) {
            Some(&(inc, e, _)) if inc == src_incarnation => e.saturating_sub(first_seq),
            _ => 0,
        }
    }

    /// A DATA frame from `src` whose messages are numbered from `first_seq`: how many of them to
    /// skip (already delivered), or `Err(expected)` if the frame leaves a gap. `pending` is the
    /// number expected after what the caller already accepted but has not yet marked delivered.
    /// `settled`: the source says every number below `first_seq` is settled there (see
    /// `RoutedHeader::settled`): what is missing below it was given up, not lost on the way,
    /// so the frame is taken and the numbering moves on to it.
    pub fn check(
        &self,
        src: BusId,
        src_incarnation: u64,
        first_seq: u64,
        pending: Option<u64>,
        settled: bool,
    ) -> Result<u64, u64> {
        let expected = match self.expected.get(&src) {
            Some(&(inc, e, _)) if inc == src_incarnation => e,
            _ => 0,
        };
        let expected = pending.unwrap_or(expected).max(expected);
        if first_seq > expected {
            if settled {
                return Ok(0);
            }
            Err(expected)
        } else {
            Ok(expected - first_seq)
        }
    }

    /// Messages from `src` below `next_expected` were delivered (or a frame of duplicates came)
    /// at `now_ms`.
    pub fn delivered(&mut self, src: BusId, src_incarnation: u64, next_expected: u64, now_ms: u64) {
        let e = self
            .expected
            .entry(src)
            .or_insert((src_incarnation, 0, now_ms));
        if e.0 != src_incarnation {
            *e = (src_incarnation, 0, now_ms);
        }
        e.1 = e.1.max(next_expected);
        e.2 = e.2.max(now_ms);
    }

    /// Forgets the sources no frame came from for `idle_ms` or more; returns how many.
    pub fn forget_idle(&mut self, now_ms: u64, idle_ms: u64) -> usize {
        let before = self.expected.len();
        self.expected
            .retain(|_, &mut (_, _, last)| now_ms.saturating_sub(last) < idle_ms);
        before - self.expected.len()
    }

    /// Sources remembered.
    pub fn len(&self) -> usize {
        self.expected.len()
    }

    /// Whether no source is remembered.
    pub fn is_empty(&self) -> bool {
        self.expected.is_empty()
    }
}

#[cfg(test)]
mod tests {
    //! A simulated path: sender -> relays that lose frames -> receiver, with a virtual clock.
    //! Seeded schedules cut the path, lose frames and acknowledgements, and restart the
    //! relay; every schedule must deliver every message exactly once, in order.

    use super::*;
    use crate::frame::{FrameDecoder, BODY_LEN_CEILING};
    use crate::sim::{inner_messages, SimRng};
    use bytes::BytesMut;
    use std::collections::VecDeque;

    const SRC: BusId = BusId(1);
    const DST: BusId = BusId(2);
    const RESEND_AFTER_MS: u64 = 50;
    const DEAD_AFTER_MS: u64 = 1_000_000;

    /// The messages of a ROUTED DATA frame: (first number, payloads).
    fn open(frame: &Bytes) -> (u64, Vec<Vec<u8>>) {
        let mut buf = BytesMut::from(&frame[..]);
        let f = FrameDecoder::new(BODY_LEN_CEILING)
            .decode(&mut buf)
            .unwrap()
            .unwrap();
        let (h, at) = RoutedHeader::decode(&f.body).unwrap();
        (h.seq, inner_messages(&f.body[at..]))
    }

    fn run(seed: u64) {
        let mut rng = SimRng::new(seed);
        let total = 200 + rng.next() % 800;
        let mut now = 0u64;
        let mut tx = Departures::new(8 << 20, now);
        let mut rx = Arrivals::default();
        let mut path: VecDeque<Bytes> = VecDeque::new(); // sender -> receiver, FIFO
        let mut acks: VecDeque<u64> = VecDeque::new(); // receiver -> sender
        let mut delivered: Vec<u64> = Vec::new();
        let mut next = 0u64;
        let mut path_up = true;
        for _step in 0..20_000 {
            if delivered.len() as u64 == total && tx.outbox().unacked() == 0 {
                break;
            }
            now += 1 + rng.next() % 5;
            // The application sends a few messages.
            if next < total && rng.chance(10) {
                // A large message: a chunk of its own, packed with its neighbours.
                let mut m = next.to_le_bytes().to_vec();
                m.resize(3_000 + (rng.next() % 300_000) as usize, 0xab);
                if tx.outbox_mut().push_shared(&Bytes::from(m)).is_some() {
                    next += 1;
                }
            } else if next < total && rng.chance(60) {
                let n = (1 + rng.next() % 20).min(total - next);
                let batch: Vec<Vec<u8>> =
                    (next..next + n).map(|i| i.to_le_bytes().to_vec()).collect();
                next += tx.outbox_mut().push_copies(&batch) as u64;
            }
            // The path goes down (a relay dies with what it held) or comes back.
            if rng.chance(3) {
                path_up = !path_up;
                if !path_up {
                    path.clear();
                    acks.clear();
                } else {
                    tx.revive();
                    tx.rewind();
                }
            }
            if path_up {
                for f in tx.take_frames(SRC, 7, DST, 16, now) {
                    // A relay may drop a frame (congestion, a restart) without a report.
                    if !rng.chance(10) {
                        path.push_back(f);
                    }
                }
            } else {
                tx.stall(now);
            }
            // The receiver takes what arrived.
            while let Some(f) = path.pop_front().filter(|_| rng.chance(80)) {
                let (first, msgs) = open(&f);
                // The flag as sent: were it set on a frame after a loss, a message would be
                // skipped and the numbering check below would fail.
                let settled = crate::routed::RoutedHeader::decode(&f[crate::frame::HEADER_LEN..])
                    .unwrap()
                    .0
                    .settled;
                match rx.check(SRC, 7, first, None, settled) {
                    Err(expected) => {
                        let v = tx.gap(9, expected);
                        assert_eq!(v, Verdict::Nothing);
                    }
                    Ok(skip) => {
                        for (i, m) in msgs.iter().enumerate().skip(skip as usize) {
                            let seq = u64::from_le_bytes(m[..8].try_into().unwrap());
                            assert_eq!(seq, first + i as u64, "seed {seed}: numbering");
                            delivered.push(seq);
                        }
                        let end = first + msgs.len() as u64;
                        rx.delivered(SRC, 7, end, now);
                        if !rng.chance(20) {
                            acks.push_back(end.max(rx.check(SRC, 7, 0, None, false).unwrap_or(0)));
                        }
                    }
                }
            }
            while let Some(a) = acks.pop_front() {
                tx.ack(9, a, now);
            }
            match tx.check(now, RESEND_AFTER_MS, DEAD_AFTER_MS) {
                Check::Retry => {
                    tx.rewind();
                }
                Check::Expire => panic!("seed {seed}: gave up"),
                Check::Idle => {}
            }
        }
        let want: Vec<u64> = (0..total).collect();
        assert_eq!(delivered, want, "seed {seed}: every message once, in order");
        assert_eq!(
            tx.outbox().unacked(),
            0,
            "seed {seed}: everything acknowledged"
        );
    }

    #[test]
    fn a_forgotten_source_is_taken_again_from_its_settled_frame() {
        let mut tx = Departures::new(1 << 20, 0);
        let mut rx = Arrivals::default();
        let deliver = |tx: &mut Departures, rx: &mut Arrivals, now: u64| -> Vec<u64> {
            let mut got = Vec::new();
            for f in tx.take_frames(SRC, 7, DST, 16, now) {
                let (first, msgs) = open(&f);
                let settled = crate::routed::RoutedHeader::decode(&f[crate::frame::HEADER_LEN..])
                    .unwrap()
                    .0
                    .settled;
                let skip = rx.check(SRC, 7, first, None, settled).expect("no gap");
                for m in msgs.iter().skip(skip as usize) {
                    got.push(u64::from_le_bytes(m[..8].try_into().unwrap()));
                }
                let end = first + msgs.len() as u64;
                rx.delivered(SRC, 7, end, now);
                tx.ack(9, end, now);
            }
            got
        };
        let batch = |r: std::ops::Range<u64>| -> Vec<Vec<u8>> {
            r.map(|i| i.to_le_bytes().to_vec()).collect()
        };
        tx.outbox_mut().push_copies(&batch(0..10));
        assert_eq!(deliver(&mut tx, &mut rx, 0), (0..10).collect::<Vec<_>>());
        assert_eq!(
            rx.forget_idle(999, 1_000),
            0,
            "heard from within the window"
        );
        assert_eq!(rx.forget_idle(1_000, 1_000), 1);
        assert!(rx.is_empty());
        // Numbered on from 10; the destination, which forgot, takes it (settled), nothing lost.
        tx.outbox_mut().push_copies(&batch(10..15));
        assert_eq!(
            deliver(&mut tx, &mut rx, 2_000),
            (10..15).collect::<Vec<_>>()
        );
    }

    #[test]
    fn consecutive_chunks_share_a_frame_within_the_pack_limit() {
        let mut tx = Departures::new(64 << 20, 0);
        let sizes: Vec<usize> = (0..40).map(|i| 3_000 + i * 7_919).collect();
        for (i, &n) in sizes.iter().enumerate() {
            let mut m = (i as u64).to_le_bytes().to_vec();
            m.resize(n, 1);
            tx.outbox_mut().push_shared(&Bytes::from(m)).unwrap();
        }
        // A small one after them joins the last frame if it fits.
        tx.outbox_mut().push_copies(&[40u64.to_le_bytes()]);
        let frames = tx.take_frames(SRC, 7, DST, 16, 0);
        assert!(frames.len() < 20, "{} frames for 41 messages", frames.len());
        let mut next = 0u64;
        for f in &frames {
            let (first, msgs) = open(f);
            assert_eq!(first, next, "frames number on from each other");
            let inner: usize = f.len() - crate::frame::HEADER_LEN - crate::routed::ROUTED_FIXED_LEN;
            assert!(
                msgs.len() == 1 || inner <= ROUTED_PACK_BYTES_MAX,
                "a packed frame of {inner} bytes"
            );
            for (k, m) in msgs.iter().enumerate() {
                assert_eq!(
                    u64::from_le_bytes(m[..8].try_into().unwrap()),
                    first + k as u64
                );
            }
            next += msgs.len() as u64;
        }
        assert_eq!(next, 41);
    }

    #[test]
    fn seeded_schedules_deliver_every_message_once_in_order() {
        // BUSWAY_SIM_SEEDS=N runs more schedules on demand.
        let seeds: u64 = std::env::var("BUSWAY_SIM_SEEDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(300);
        for seed in 0..seeds {
            run(seed);
        }
    }

    #[test]
    fn a_restarted_destination_fails_what_its_predecessor_held() {
        let mut tx = Departures::new(1 << 20, 0);
        tx.outbox_mut().push_copies(&[b"a", b"b", b"c"]);
        tx.take_frames(SRC, 1, DST, 16, 0);
        assert_eq!(tx.ack(100, 1, 1).0, Verdict::Nothing);
        let (v, _) = tx.ack(200, 0, 2);
        assert_eq!(v, Verdict::Restarted(1..3, 100));
        assert_eq!(
            tx.outbox().next_seq(),
            0,
            "the new incarnation numbers from 0"
        );
    }

    #[test]
    fn silence_expires_at_the_deadline_counted_from_the_last_progress() {
        let mut tx = Departures::new(1 << 20, 0);
        tx.outbox_mut().push_copies(&[b"x"]);
        tx.take_frames(SRC, 1, DST, 16, 10);
        assert_eq!(tx.check(20, 50, 200), Check::Idle);
        assert_eq!(tx.check(60, 50, 200), Check::Retry);
        assert_eq!(tx.check(70, 50, 200), Check::Idle, "paced");
        assert_eq!(tx.check(210, 50, 200), Check::Expire);
        assert_eq!(tx.fail_all(), 0..1);
        assert!(tx.is_dead());
    }

    #[test]
    fn after_a_restart_numbering_goes_on_where_the_new_incarnation_stands() {
        let mut d = Departures::new(1 << 20, 0);
        d.outbox_mut().push_copies(&[b"a", b"b"]);
        d.take_frames(SRC, 1, DST, 16, 0);
        assert_eq!(d.ack(7, 2, 0).0, Verdict::Nothing);
        // A third message: its frame starts at the oldest unacknowledged one, settled.
        d.outbox_mut().push_copies(&[b"c"]);
        let f = d.take_frames(SRC, 1, DST, 16, 0);
        let h = crate::routed::RoutedHeader::decode(&f[0][crate::frame::HEADER_LEN..])
            .unwrap()
            .0;
        assert!(h.settled && h.seq == 2);
        // A new incarnation of the destination took it and expects 3 next: later messages are
        // numbered from 3 (numbered from 0, it would skip them as duplicates).
        assert_eq!(d.ack(8, 3, 0).0, Verdict::Restarted(2..3, 7));
        assert_eq!(d.outbox().next_seq(), 3);
        // A too-large report about a message given up already concerns nothing later.
        d.outbox_mut().push_copies(&[b"d"]);
        d.take_frames(SRC, 1, DST, 16, 0);
        let stale = d.on_fail(FailReason::TooLarge, 8, 1, 0);
        assert_eq!(stale, FailOutcome::GaveUp(3..3));
        assert_eq!(d.outbox().unacked(), 1, "message 3 still held");
    }

    #[test]
    fn one_reader_at_a_time_hands_a_source_over_and_counts_what_others_delivered() {
        let mut a = Arrivals::default();
        let src = BusId(7);
        // Two links read the same frame (messages 0..10) and both find it fresh.
        assert_eq!(a.check(src, 1, 0, None, false), Ok(0));
        assert_eq!(a.check(src, 1, 0, None, false), Ok(0));
        assert!(a.claim(src, 1), "the first reader claims the source");
        assert!(a.claim(src, 1), "and may claim it again");
        assert!(!a.claim(src, 2), "the second waits");
        assert!(a.claim(BusId(8), 2), "another source is free");
        assert_eq!(a.already_delivered(src, 1, 0), 0);
        a.delivered(src, 1, 10, 0);
        a.release(src, 2);
        assert!(!a.claim(src, 2), "only the holder releases");
        a.release(src, 1);
        assert!(a.claim(src, 2));
        assert_eq!(
            a.already_delivered(src, 1, 0),
            10,
            "all of it came by the other link"
        );
        assert_eq!(a.already_delivered(src, 1, 4), 6);
        assert_eq!(a.already_delivered(src, 1, 12), 0);
        assert_eq!(a.already_delivered(src, 2, 0), 0, "another incarnation");
    }

    #[test]
    fn a_send_that_looked_before_the_switch_stays_off_the_relays() {
        let mut d = Departures::new(1 << 20, 0);
        assert!(d.open_for_send(|| unreachable!("asked only once superseded")));
        d.supersede();
        assert!(!d.open_for_send(|| true), "the direct link is in use");
        assert!(d.is_superseded());
        assert!(d.open_for_send(|| false), "the direct link was given up");
        assert!(!d.is_superseded(), "relaying resumed");
    }
}
