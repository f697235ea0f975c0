//! A simulated cluster: seven nodes in a tree over in-memory links, with a virtual clock, driven
//! by busway-core's own routing ([`relay`]), relaying ([`relay::pass_on`], [`busway_core::routed::forwarded_parts`]), ROUTED codec and
//! end-to-end delivery ([`Departures`], [`Arrivals`]); no sockets, no threads, no real time.
//!
//! ```text
//!                 hub 100
//!              /          \
//!        relay 101      relay 102
//!        /     \        /     \
//!     leaf 1  leaf 2  leaf 3  leaf 4
//! ```
//!
//! Every leaf streams numbered messages to the other leaves. A seeded schedule cuts and restores
//! links (what they carried is lost), delays them, makes them reorder, restarts relays (what they
//! queued is lost) and jumps the clock. Relays hint sources where a destination is
//! ([`HintBook`]); a source dials on a hint, and from then on the pair talks over a direct link
//! (numbered by its own [`Outbox`], resumed after the schedule cuts it), switching in order:
//! later messages wait until everything sent through relays is acknowledged
//! ([`Departures::supersede`]).
//!
//! The switch is where order is easiest to lose, so the schedules reach into it the way the
//! runtime's threads do:
//! - a send looks for a direct link, and queues on the path it chose a moment later, after a
//!   direct link may have come up ([`Departures::open_for_send`]);
//! - relayed messages wait at the source (a small window), in flight, at a relay (delays), or in
//!   a destination's reader that is blocked on a full inbox; the relayed messages still held go
//!   over the direct link too once it is up (as the runtime's next hop is the direct peer), so
//!   a source's messages come by two links at once ([`Arrivals::claim`]);
//! - a destination's application takes what arrived in its own time: socket links hand their
//!   batches into one channel (acknowledged there), a direct link moved to a ring is read by the
//!   application itself (acknowledged when read), and the two are merged by the runtime's rule
//!   ([`TakeOrder`]).
//!
//! Every schedule must deliver every message to the receiving application exactly once and in
//! order per (source, destination), whatever path it took, and end with everything
//! acknowledged.
//! `BUSWAY_SIM_SEEDS=N` runs N schedules (default 200); `BUSWAY_SIM_SEED=S` runs one.

use busway_core::body::message_spans;
use busway_core::control::{ack_frame, decode_token};
use busway_core::e2e::{Arrivals, Check, Departures, FailOutcome, Verdict};
use busway_core::frame::{FrameKind, BODY_LEN_CEILING, HEADER_LEN};
use busway_core::hints::HintBook;
use busway_core::outbox::Outbox;
use busway_core::relay::{self, Neighbor};
use busway_core::routed::{
    decode_fail, decode_hint, encode_fail, encode_hint, forwarded_parts, routed_frame, FailReason,
    RoutedHeader, RoutedType, DEFAULT_TTL,
};
use busway_core::sim::{inner_messages, SimRng};
use busway_core::take_order::{Sources, TakeOrder};
use busway_core::{BusId, FrameDecoder};
use bytes::{Bytes, BytesMut};
use std::collections::{BTreeMap, HashMap, VecDeque};

const LEAVES: [u64; 4] = [1, 2, 3, 4];
const HUB: u64 = 100;
/// (child, parent) of every link.
const EDGES: [(u64, u64); 6] = [
    (101, HUB),
    (102, HUB),
    (1, 101),
    (2, 101),
    (3, 102),
    (4, 102),
];
const RESEND_AFTER_MS: u64 = 40;
/// Never reached: the schedules always heal, so nothing may be given up.
const DEAD_AFTER_MS: u64 = u64::MAX / 2;
const STEPS_MAX: usize = 60_000;
/// Time a dial takes, from a hint (or a cut) to the direct link being up, in virtual ms.
const DIAL_MS: u64 = 5;

/// One direction of a link: frames in flight with the time they arrive.
#[derive(Default)]
struct Lane {
    in_flight: Vec<(u64, Bytes)>,
}

/// A link between a child and its parent. A test changes it by writing its fields.
struct Link {
    up: bool,
    /// Extra time a frame takes, in virtual ms.
    delay_ms: u64,
    /// Frames that are due may arrive in any order.
    reorder: bool,
    up_lane: Lane,
    down_lane: Lane,
}

impl Link {
    fn new() -> Self {
        Self {
            up: true,
            delay_ms: 0,
            reorder: false,
            up_lane: Lane::default(),
            down_lane: Lane::default(),
        }
    }

    fn cut(&mut self) {
        self.up = false;
        self.up_lane.in_flight.clear();
        self.down_lane.in_flight.clear();
    }
}

/// A direct link between two leaves: what is in flight each way, by (dialer, other).
#[derive(Default)]
struct DirectLink {
    up: bool,
    /// When the dialer has it up again (after a hint or a cut).
    dial_at: Option<u64>,
    /// To the higher id, to the lower id.
    lanes: [Lane; 2],
}

/// What a leaf keeps about a leaf it has a direct link to (the runtime's `Peer`).
struct DirectPeer {
    outbox: Outbox,
    /// Messages the application has (through the channel, or read from the ring).
    inbound_expected: u64,
    /// Messages wait (ACKs still flow) until everything sent through relays is acknowledged.
    held: bool,
}

/// A batch of message numbers from one source, as the application takes it.
#[derive(Debug)]
struct AppBatch {
    src: u64,
    numbers: Vec<u64>,
}

/// A frame one of a leaf's link readers has read and not yet handed over.
enum ReaderWork {
    /// A ROUTED frame for this leaf (data, or end-to-end control).
    Routed(Bytes),
    /// Messages of a direct link's own numbering, over its socket.
    Direct(Vec<u64>),
}

/// A ROUTED DATA frame a reader checked and is handing over (the runtime's `deliver` waiting
/// for room in the inbox): its claim on the source, once taken, is held meanwhile.
struct Handing {
    src: u64,
    src_incarnation: u64,
    /// The number of the first of `numbers`.
    first: u64,
    next: u64,
    numbers: Vec<u64>,
    claimed: bool,
}

/// One link's reader at a leaf: it reads in order and hands over one frame at a time.
#[derive(Default)]
struct Reader {
    queue: VecDeque<ReaderWork>,
    handing: Option<Handing>,
}

/// Which link a reader reads: (the other end, whether it is a direct link).
type ReaderKey = (u64, bool);

fn reader_token(key: ReaderKey) -> u64 {
    key.0 * 2 + u64::from(key.1)
}

#[derive(Default)]
struct Node {
    departures: BTreeMap<u64, Departures>,
    direct: BTreeMap<u64, DirectPeer>,
    hints: HintBook,
    arrivals: Arrivals,
    readers: BTreeMap<ReaderKey, Reader>,
    /// What socket links handed to the application, in order.
    channel: VecDeque<AppBatch>,
    /// Per direct link moved to a ring: the batches written and not yet read.
    rings: BTreeMap<u64, VecDeque<AppBatch>>,
    order: TakeOrder<AppBatch, AppBatch>,
    /// Which ring the application looks at first next time.
    next_ring: usize,
    /// Per source: the numbers the application took, in order.
    delivered: HashMap<u64, Vec<u64>>,
    /// Per destination: the next message number the application sends.
    sent: HashMap<u64, u64>,
}

/// What a leaf's application reads from: its channel and its rings (reading a ring batch
/// acknowledges it, as the runtime's ring reader does).
struct AppSources<'a> {
    channel: &'a mut VecDeque<AppBatch>,
    rings: &'a mut BTreeMap<u64, VecDeque<AppBatch>>,
    direct: &'a mut BTreeMap<u64, DirectPeer>,
    next_ring: &'a mut usize,
}

impl Sources for AppSources<'_> {
    type Delivery = AppBatch;
    type Batch = AppBatch;

    fn try_channel(&mut self) -> Option<AppBatch> {
        self.channel.pop_front()
    }

    fn accept(&mut self, d: AppBatch) -> Option<AppBatch> {
        Some(d)
    }

    fn poll_rings(&mut self) -> Option<AppBatch> {
        let peers: Vec<u64> = self.rings.keys().copied().collect();
        for k in 0..peers.len() {
            let i = (*self.next_ring + k) % peers.len();
            let Some(b) = self.rings.get_mut(&peers[i]).unwrap().pop_front() else {
                continue;
            };
            *self.next_ring = i + 1;
            let p = self
                .direct
                .get_mut(&b.src)
                .expect("a ring belongs to a direct peer");
            p.inbound_expected += b.numbers.len() as u64;
            p.outbox.push_control(ack_frame(p.inbound_expected));
            return Some(b);
        }
        None
    }
}

struct Cluster {
    now: u64,
    links: BTreeMap<(u64, u64), Link>,
    /// By (lower id, higher id).
    direct_links: BTreeMap<(u64, u64), DirectLink>,
    /// Bytes a source writes through relays ahead of acknowledgements.
    window: usize,
    /// Whether direct links move their messages to rings (the two leaves share a host).
    rings: bool,
    /// How many direct links came up, and how many switches held messages back.
    direct_ups: u64,
    held_switches: u64,
    /// Handovers where a reader waited for another link's claim on the same source.
    claims_waited: u64,
    nodes: BTreeMap<u64, Node>,
    incarnation: HashMap<u64, u64>,
}

/// The header and inner part of a whole ROUTED frame.
fn decode_routed(frame: &Bytes) -> (RoutedHeader, Bytes) {
    let body = routed_body(frame);
    let (h, inner_at) = RoutedHeader::decode(&body).unwrap();
    (h, body.slice(inner_at..))
}

/// The body of a whole ROUTED frame.
fn routed_body(frame: &Bytes) -> Bytes {
    let mut buf = BytesMut::from(&frame[..]);
    FrameDecoder::new(BODY_LEN_CEILING)
        .decode(&mut buf)
        .unwrap()
        .unwrap()
        .body
}

fn parent_of(id: u64) -> Option<u64> {
    EDGES.iter().find(|e| e.0 == id).map(|e| e.1)
}

fn link_key(a: u64, b: u64) -> (u64, u64) {
    if parent_of(a) == Some(b) {
        (a, b)
    } else {
        (b, a)
    }
}

/// The ids a node serves for its parent: itself and its subtree.
fn subtree(id: u64) -> (BusId, BusId) {
    match id {
        101 => (BusId(1), BusId(2)),
        102 => (BusId(3), BusId(4)),
        x => (BusId(x), BusId(x)),
    }
}

impl Cluster {
    /// `window`: bytes a source writes through relays ahead of acknowledgements (the rest
    /// waits at the source); `rings`: whether direct links move their messages to rings.
    fn new(window: usize, rings: bool) -> Self {
        let mut nodes = BTreeMap::new();
        let mut incarnation = HashMap::new();
        for id in LEAVES.iter().chain(&[101, 102, HUB]) {
            nodes.insert(*id, Node::default());
            incarnation.insert(*id, 1000 + id);
        }
        for leaf in LEAVES {
            let n = nodes.get_mut(&leaf).unwrap();
            for dst in LEAVES.iter().filter(|&&d| d != leaf) {
                // Its relayed entry is made by the first send that goes through relays, as
                // the runtime makes it (a switch before that finds none to supersede).
                n.sent.insert(*dst, 0);
            }
        }
        Self {
            now: 0,
            links: EDGES.iter().map(|&(c, p)| ((c, p), Link::new())).collect(),
            direct_links: BTreeMap::new(),
            window,
            rings,
            direct_ups: 0,
            held_switches: 0,
            claims_waited: 0,
            nodes,
            incarnation,
        }
    }

    /// Whether a direct link between `a` and `b` is up (each end then has its peer).
    fn direct_up(&self, a: u64, b: u64) -> bool {
        self.direct_links
            .get(&(a.min(b), a.max(b)))
            .is_some_and(|d| d.up)
    }

    fn neighbors(&self, id: u64) -> Vec<Neighbor> {
        EDGES
            .iter()
            .filter(|e| e.0 == id || e.1 == id)
            .map(|&(c, p)| {
                let other = if c == id { p } else { c };
                Neighbor {
                    id: BusId(other),
                    up: self.links[&(c, p)].up,
                    serves: (other == c).then(|| subtree(c)),
                }
            })
            .collect()
    }

    fn hop(&self, at: u64, dst: u64, except: Option<u64>) -> Option<u64> {
        let up = parent_of(at).map(BusId);
        relay::next_hop(BusId(dst), &self.neighbors(at), up, except.map(BusId), None).map(|b| b.0)
    }

    /// Puts a frame on the link from `from` to `to`.
    fn put(&mut self, from: u64, to: u64, frame: Bytes) {
        let now = self.now;
        let link = self.links.get_mut(&link_key(from, to)).unwrap();
        if !link.up {
            return;
        }
        let due = now + 1 + link.delay_ms;
        let lane = if parent_of(from) == Some(to) {
            &mut link.up_lane
        } else {
            &mut link.down_lane
        };
        lane.in_flight.push((due, frame));
    }

    /// Sends a ROUTED control frame from `src` toward `dst`, if there is a hop now.
    fn control(&mut self, src: u64, kind: RoutedType, dst: u64, seq: u64, inner: Option<Bytes>) {
        let direct = self.direct_up(src, dst);
        let hop = self.hop(src, dst, None);
        if !direct && hop.is_none() {
            return;
        }
        let h = RoutedHeader {
            kind,
            ttl: DEFAULT_TTL,
            src: BusId(src),
            src_incarnation: self.incarnation[&src],
            dst: BusId(dst),
            seq,
            settled: false,
            route: Vec::new(),
        };
        let frame = inner.unwrap_or_else(|| routed_frame(&h, &[]));
        self.send_routed(src, dst, hop, frame);
    }

    /// Puts a ROUTED frame from `at` toward `dst` on its next hop: the direct link to `dst` if
    /// one is up (it is the runtime's next hop then, held or not), else `hop` on the tree.
    fn send_routed(&mut self, at: u64, dst: u64, hop: Option<u64>, frame: Bytes) {
        if self.direct_up(at, dst) {
            let p = self
                .nodes
                .get_mut(&at)
                .unwrap()
                .direct
                .get_mut(&dst)
                .unwrap();
            p.outbox.push_control(frame);
        } else if let Some(hop) = hop {
            self.put(at, hop, frame);
        }
    }

    /// A leaf hands what its departures hold unwritten to its next hop.
    fn pump(&mut self, leaf: u64) {
        let dsts: Vec<u64> = self.nodes[&leaf].departures.keys().copied().collect();
        for dst in dsts {
            let (now, inc) = (self.now, self.incarnation[&leaf]);
            let hop = self.hop(leaf, dst, None);
            let direct = self.direct_up(leaf, dst);
            let d = self
                .nodes
                .get_mut(&leaf)
                .unwrap()
                .departures
                .get_mut(&dst)
                .unwrap();
            if hop.is_none() && !direct {
                d.stall(now);
                continue;
            }
            for f in d.take_frames(BusId(leaf), inc, BusId(dst), DEFAULT_TTL, now) {
                self.send_routed(leaf, dst, hop, f);
            }
        }
    }

    /// A link came back: every leaf writes again what it holds (a relay may have lost it).
    fn relink(&mut self) {
        for n in self.nodes.values_mut() {
            for d in n.departures.values_mut() {
                d.revive();
                d.rewind();
            }
        }
    }

    /// Node `at` receives `frame` from tree neighbor `from`: a relay passes it on at once; a
    /// leaf's reader of that link takes it in turn.
    fn receive(&mut self, at: u64, from: u64, frame: Bytes) {
        let (h, _) = decode_routed(&frame);
        if h.dst.0 != at {
            let body = routed_body(&frame);
            return self.relay(at, from, h, &body);
        }
        let node = self.nodes.get_mut(&at).unwrap();
        let reader = node.readers.entry((from, false)).or_default();
        reader.queue.push_back(ReaderWork::Routed(frame));
    }

    /// Leaf `at`'s reader of link `key` goes on with what it read, unless it is blocked (on
    /// a full inbox) or waits for another reader's claim on the same source.
    fn read_on(&mut self, at: u64, key: ReaderKey, rng: &mut SimRng) {
        loop {
            let now = self.now;
            let node = self.nodes.get_mut(&at).unwrap();
            let Some(reader) = node.readers.get_mut(&key) else {
                return;
            };
            if let Some(h) = reader.handing.as_mut() {
                if !h.claimed {
                    if !node.arrivals.claim(BusId(h.src), reader_token(key)) {
                        self.claims_waited += 1;
                        return;
                    }
                    h.claimed = true;
                }
                // Waits for room in the inbox, its claim held.
                if rng.chance(30) {
                    return;
                }
                let mut h = reader.handing.take().unwrap();
                // Counted again under the claim: another reader may have handed them over.
                let done =
                    node.arrivals
                        .already_delivered(BusId(h.src), h.src_incarnation, h.first);
                h.numbers.drain(..(done as usize).min(h.numbers.len()));
                if !h.numbers.is_empty() {
                    node.channel.push_back(AppBatch {
                        src: h.src,
                        numbers: h.numbers,
                    });
                }
                node.arrivals
                    .delivered(BusId(h.src), h.src_incarnation, h.next, now);
                node.arrivals.release(BusId(h.src), reader_token(key));
                self.control(at, RoutedType::Ack, h.src, h.next, None);
                continue;
            }
            let Some(work) = reader.queue.pop_front() else {
                return;
            };
            match work {
                ReaderWork::Direct(numbers) => {
                    let p = node.direct.get_mut(&key.0).expect("a peer on each end");
                    p.inbound_expected += numbers.len() as u64;
                    p.outbox.push_control_frame(ack_frame(p.inbound_expected));
                    node.channel.push_back(AppBatch {
                        src: key.0,
                        numbers,
                    });
                }
                ReaderWork::Routed(frame) => self.routed_for_me(at, key, frame),
            }
        }
    }

    /// A ROUTED frame for leaf `at`, read by its reader `key`.
    fn routed_for_me(&mut self, at: u64, key: ReaderKey, frame: Bytes) {
        let (h, inner) = decode_routed(&frame);
        let src = h.src.0;
        match h.kind {
            RoutedType::Data => {
                let msgs = inner_messages(&inner);
                let node = self.nodes.get_mut(&at).unwrap();
                match node
                    .arrivals
                    .check(h.src, h.src_incarnation, h.seq, None, h.settled)
                {
                    Err(expected) => {
                        let gap = self.fail_frame(at, src, expected, FailReason::Gap, at);
                        self.control(at, RoutedType::Fail, src, expected, Some(gap));
                    }
                    Ok(skip) => {
                        let numbers: Vec<u64> = msgs
                            .iter()
                            .skip(skip as usize)
                            .map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
                            .collect();
                        let next = h.seq + msgs.len() as u64;
                        node.readers.get_mut(&key).unwrap().handing = Some(Handing {
                            src,
                            src_incarnation: h.src_incarnation,
                            first: next - numbers.len() as u64,
                            next,
                            numbers,
                            claimed: false,
                        });
                    }
                }
            }
            RoutedType::Ack => {
                let now = self.now;
                let d = self.departure(at, src);
                let (v, _) = d.ack(h.src_incarnation, h.seq, now);
                assert_eq!(v, Verdict::Nothing, "nobody restarts in this cluster");
            }
            RoutedType::Fail => {
                let (reason, about, text) = decode_fail(&inner).unwrap();
                let now = self.now;
                let d = self.departure(at, about.0);
                match d.on_fail(reason, h.src_incarnation, h.seq, now) {
                    FailOutcome::Resend(v) => assert_eq!(v, Verdict::Nothing),
                    FailOutcome::Stalled => {}
                    FailOutcome::GaveUp(_) => panic!("gave up on messages: {reason}: {text}"),
                }
            }
            RoutedType::Hint => {
                let (about, addrs) = decode_hint(&inner).unwrap();
                let node = self.nodes.get_mut(&at).unwrap();
                if !node.direct.contains_key(&about.0) {
                    node.hints.take_hint(about, addrs);
                }
            }
        }
    }

    /// Every leaf's readers go on (in a seeded order), then every leaf's application takes
    /// a few batches, or none.
    fn read_and_take(&mut self, rng: &mut SimRng) {
        for leaf in LEAVES {
            let mut keys: Vec<ReaderKey> = self.nodes[&leaf].readers.keys().copied().collect();
            for i in (1..keys.len()).rev() {
                keys.swap(i, rng.below(i as u64 + 1) as usize);
            }
            for key in keys {
                if !rng.chance(30) {
                    self.read_on(leaf, key, rng);
                }
            }
        }
        for leaf in LEAVES {
            if !rng.chance(50) {
                continue;
            }
            let node = self.nodes.get_mut(&leaf).unwrap();
            let mut sources = AppSources {
                channel: &mut node.channel,
                rings: &mut node.rings,
                direct: &mut node.direct,
                next_ring: &mut node.next_ring,
            };
            for _ in 0..1 + rng.below(4) {
                let Some(b) = node.order.next(&mut sources) else {
                    break;
                };
                node.delivered.entry(b.src).or_default().extend(b.numbers);
            }
        }
    }

    /// A link's reader stops with its link: what it read and did not hand over is lost (its
    /// sender writes it again), and its claim goes.
    fn stop_reader(&mut self, at: u64, key: ReaderKey) {
        let Some(node) = self.nodes.get_mut(&at) else {
            return;
        };
        if let Some(r) = node.readers.remove(&key) {
            if let Some(h) = r.handing.filter(|h| h.claimed) {
                node.arrivals.release(BusId(h.src), reader_token(key));
            }
        }
    }

    /// The schedule cuts a tree link: what it carried is lost, and so is what its readers held.
    fn cut_link(&mut self, key: (u64, u64)) {
        self.links.get_mut(&key).unwrap().cut();
        self.stop_reader(key.0, (key.1, false));
        self.stop_reader(key.1, (key.0, false));
    }

    fn departure(&mut self, at: u64, dst: u64) -> &mut Departures {
        self.nodes
            .get_mut(&at)
            .unwrap()
            .departures
            .get_mut(&dst)
            .unwrap()
    }

    fn fail_frame(&self, at: u64, to: u64, seq: u64, reason: FailReason, about: u64) -> Bytes {
        let h = RoutedHeader {
            kind: RoutedType::Fail,
            ttl: DEFAULT_TTL,
            src: BusId(at),
            src_incarnation: self.incarnation[&at],
            dst: BusId(to),
            seq,
            settled: false,
            route: Vec::new(),
        };
        encode_fail(&h, reason, BusId(about), "simulated")
    }

    /// Relay `at` passes a frame on, or reports why not to its source: the relay's decision is
    /// busway-core's (`relay::forward`), as in the runtime.
    fn relay(&mut self, at: u64, from: u64, mut h: RoutedHeader, body: &Bytes) {
        let neighbors = self.neighbors(at);
        let view = relay::RelayView {
            me: BusId(at),
            neighbors: &neighbors,
            upstream: parent_of(at).map(BusId),
            uptime_ms: self.now,
            grace_ms: 0,
            registry: &relay::Registry::default(),
        };
        match relay::forward(&mut h, BusId(from), &view) {
            Ok(hop) => {
                let now = self.now;
                let last_hop = hop == h.dst && h.kind == RoutedType::Data;
                if last_hop
                    && self
                        .nodes
                        .get_mut(&at)
                        .unwrap()
                        .hints
                        .due(h.src, h.dst, now)
                {
                    let hint = RoutedHeader {
                        kind: RoutedType::Hint,
                        ttl: DEFAULT_TTL,
                        src: BusId(at),
                        src_incarnation: self.incarnation[&at],
                        dst: h.src,
                        seq: 0,
                        settled: false,
                        route: Vec::new(),
                    };
                    let addr = vec![format!("sim://{}", h.dst)];
                    let f = encode_hint(&hint, h.dst, &addr);
                    self.control(at, RoutedType::Hint, h.src.0, 0, Some(f));
                }
                // Passed on as the runtime does: a new route prefix, the content as it came.
                let frame: Vec<u8> = forwarded_parts(&h, body).concat();
                self.put(at, hop.0, Bytes::from(frame));
            }
            Err(refusal) if refusal.report => {
                let f = self.fail_frame(at, h.src.0, h.seq, refusal.reason, h.dst.0);
                self.control(at, RoutedType::Fail, h.src.0, h.seq, Some(f));
            }
            Err(_) => {}
        }
    }

    /// Moves every frame that is due across its link.
    fn deliver_due(&mut self, rng: &mut SimRng) {
        let now = self.now;
        let mut arrivals = Vec::new();
        for (&(child, parent), link) in self.links.iter_mut() {
            for (lane, to, from) in [
                (&mut link.up_lane, parent, child),
                (&mut link.down_lane, child, parent),
            ] {
                let (mut due, later): (Vec<_>, Vec<_>) =
                    lane.in_flight.drain(..).partition(|(t, _)| *t <= now);
                lane.in_flight = later;
                if link.reorder {
                    for i in (1..due.len()).rev() {
                        due.swap(i, rng.below(i as u64 + 1) as usize);
                    }
                }
                arrivals.extend(due.into_iter().map(|(_, f)| (to, from, f)));
            }
        }
        for (to, from, f) in arrivals {
            self.receive(to, from, f);
        }
    }

    /// Leaves dial the hints they took; dials that are due come up (both ends switch).
    fn dial(&mut self) {
        let now = self.now;
        for leaf in LEAVES {
            let dials = self.nodes.get_mut(&leaf).unwrap().hints.dials_to_start();
            for (dst, _) in dials {
                let key = (leaf.min(dst.0), leaf.max(dst.0));
                let d = self.direct_links.entry(key).or_default();
                if !d.up && d.dial_at.is_none() {
                    d.dial_at = Some(now + DIAL_MS);
                }
            }
        }
        let due: Vec<(u64, u64)> = self
            .direct_links
            .iter()
            .filter(|(_, d)| !d.up && d.dial_at.is_some_and(|t| t <= now))
            .map(|(k, _)| *k)
            .collect();
        for (a, b) in due {
            let d = self.direct_links.get_mut(&(a, b)).unwrap();
            d.up = true;
            d.dial_at = None;
            self.direct_ups += 1;
            // The handshake: each end says what it expects next; the other resumes from there.
            let expects = |c: &Cluster, at: u64, from: u64| {
                c.nodes[&at]
                    .direct
                    .get(&from)
                    .map_or(0, |p| p.inbound_expected)
            };
            let (a_expects, b_expects) = (expects(self, a, b), expects(self, b, a));
            for (me, other, other_expects) in [(a, b, b_expects), (b, a, a_expects)] {
                let node = self.nodes.get_mut(&me).unwrap();
                if let Some(p) = node.direct.get_mut(&other) {
                    p.outbox.resume(other_expects).expect("resume");
                    continue;
                }
                // First time up: the switch. What went through relays is acknowledged first.
                let relayed = node
                    .departures
                    .get_mut(&other)
                    .map_or(0, Departures::supersede);
                if relayed > 0 {
                    self.held_switches += 1;
                }
                node.direct.insert(
                    other,
                    DirectPeer {
                        outbox: Outbox::new(1 << 20, 0),
                        inbound_expected: 0,
                        held: relayed > 0,
                    },
                );
                if self.rings {
                    node.rings.insert(other, VecDeque::new());
                }
            }
        }
    }

    /// Direct links: release what was held, write what is queued, deliver what arrived.
    fn run_direct(&mut self) {
        let now = self.now;
        for leaf in LEAVES {
            let node = self.nodes.get_mut(&leaf).unwrap();
            for (&other, p) in node.direct.iter_mut() {
                let relayed = node.departures.get(&other);
                if p.held && relayed.is_none_or(|d| d.outbox().unacked() == 0) {
                    p.held = false;
                }
            }
        }
        let keys: Vec<(u64, u64)> = self.direct_links.keys().copied().collect();
        for (a, b) in keys {
            if !self.direct_links[&(a, b)].up {
                continue;
            }
            for (from, to, lane) in [(a, b, 0), (b, a, 1)] {
                let mut out = Vec::new();
                let p = self
                    .nodes
                    .get_mut(&from)
                    .unwrap()
                    .direct
                    .get_mut(&to)
                    .unwrap();
                if p.held {
                    p.outbox.take_control(&mut out);
                } else {
                    p.outbox.take_unwritten(&mut out);
                }
                let d = self.direct_links.get_mut(&(a, b)).unwrap();
                for f in out {
                    d.lanes[lane].in_flight.push((now + 1, f));
                }
            }
            for (to, from, lane) in [(b, a, 0), (a, b, 1)] {
                let d = self.direct_links.get_mut(&(a, b)).unwrap();
                let (due, later): (Vec<_>, Vec<_>) = d.lanes[lane]
                    .in_flight
                    .drain(..)
                    .partition(|(t, _)| *t <= now);
                d.lanes[lane].in_flight = later;
                let mut bytes = Vec::new();
                for (_, f) in due {
                    bytes.extend_from_slice(&f);
                }
                self.direct_receive(to, from, &bytes);
            }
        }
    }

    /// Leaf `at` reads `bytes` (whole frames) from its direct link to `from`: ACKs at once;
    /// messages into the ring (read by the application) or to the link's reader (over the
    /// socket); ROUTED frames to the link's reader.
    fn direct_receive(&mut self, at: u64, from: u64, bytes: &[u8]) {
        let rings = self.rings;
        let node = self.nodes.get_mut(&at).unwrap();
        let mut dec = FrameDecoder::new(BODY_LEN_CEILING);
        let mut pos = 0;
        while let Some((kind, len)) = dec.peek(&bytes[pos..]).expect("whole, checked frames") {
            let body = &bytes[pos + HEADER_LEN..pos + len];
            let reader = node.readers.entry((from, true)).or_default();
            match kind {
                FrameKind::Ack => {
                    let p = node.direct.get_mut(&from).expect("a peer on each end");
                    p.outbox
                        .ack(decode_token(body).unwrap())
                        .expect("a good ACK");
                }
                FrameKind::Routed => {
                    reader
                        .queue
                        .push_back(ReaderWork::Routed(Bytes::copy_from_slice(
                            &bytes[pos..pos + len],
                        )))
                }
                _ => {
                    let mut spans = Vec::new();
                    message_spans(kind, body, 0, &mut spans).unwrap();
                    let numbers: Vec<u64> = spans
                        .iter()
                        .map(|span| {
                            let s = span.start() as usize;
                            let m = &body[s..s + 8];
                            u64::from_le_bytes(m.try_into().unwrap())
                        })
                        .collect();
                    if rings {
                        let ring = node.rings.get_mut(&from).expect("a ring per direct peer");
                        ring.push_back(AppBatch { src: from, numbers });
                    } else {
                        reader.queue.push_back(ReaderWork::Direct(numbers));
                    }
                }
            }
            pos += len;
        }
    }

    /// The schedule cuts a direct link: what it carried is lost, what its reader held too,
    /// and what its ring held unread (acknowledged only once read, so written again); the
    /// dialer dials again.
    fn cut_direct(&mut self, key: (u64, u64), redial_ms: u64) {
        let now = self.now;
        if let Some(d) = self.direct_links.get_mut(&key) {
            if d.up {
                d.up = false;
                d.lanes = Default::default();
                d.dial_at = Some(now + redial_ms);
                for (at, other) in [(key.0, key.1), (key.1, key.0)] {
                    self.stop_reader(at, (other, true));
                    if let Some(ring) = self.nodes.get_mut(&at).unwrap().rings.get_mut(&other) {
                        ring.clear();
                    }
                }
            }
        }
    }

    /// Whether everything sent was acknowledged and the applications took it all.
    fn all_done(&self, total: u64) -> bool {
        self.all_sent_and_acknowledged(total)
            && self.nodes.values().all(|n| {
                n.channel.is_empty()
                    && n.rings.values().all(VecDeque::is_empty)
                    && n.readers
                        .values()
                        .all(|r| r.queue.is_empty() && r.handing.is_none())
            })
    }

    fn all_sent_and_acknowledged(&self, total: u64) -> bool {
        self.nodes.values().all(|n| {
            n.sent.values().all(|&s| s == total)
                && n.departures.values().all(|d| d.outbox().unacked() == 0)
                && n.direct.values().all(|p| p.outbox.unacked() == 0)
        })
    }
}

/// What one schedule did.
#[derive(Default)]
struct Took {
    direct_ups: u64,
    held_switches: u64,
    claims_waited: u64,
    /// Sends that looked for a direct link before one came up and queued after.
    late_queues: u64,
}

/// A send the application looked up and had not queued yet.
struct Looked {
    leaf: u64,
    dst: u64,
    direct: bool,
    batch: Vec<Vec<u8>>,
}

impl Cluster {
    /// Queues a send on the path it looked up: the direct link, or the relays unless a direct
    /// link superseded them since (the runtime asks again under the relayed entry's lock).
    fn queue(&mut self, s: Looked) -> u64 {
        let window = self.window;
        let node = self.nodes.get_mut(&s.leaf).unwrap();
        let direct_now = node.direct.contains_key(&s.dst);
        if !s.direct {
            let made = !node.departures.contains_key(&s.dst);
            let d = node.departures.entry(s.dst).or_insert_with(|| {
                let mut d = Departures::new(1 << 20, 0);
                d.set_window(window);
                d
            });
            // A switch that looked for the entry before it was made superseded nothing: the
            // direct link, in the table already, goes first.
            if !(made && direct_now) && d.open_for_send(|| direct_now) {
                return d.outbox_mut().push_copies(&s.batch) as u64;
            }
        }
        let p = node
            .direct
            .get_mut(&s.dst)
            .expect("switched to a direct link");
        p.outbox.push_copies(&s.batch) as u64
    }
}

/// Runs one schedule.
fn run(seed: u64) -> Took {
    let mut rng = SimRng::new(seed);
    let total = 100 + rng.below(400);
    // A window of a few messages to a few hundred: relayed messages wait at the source too.
    let window = 64 + rng.below(8_192) as usize;
    let mut c = Cluster::new(window, rng.chance(50));
    let mut late_queues = 0;
    let mut healed_at = None;
    for step in 0..STEPS_MAX {
        // The clock moves, sometimes by a lot.
        c.now += if rng.chance(2) {
            200 + rng.below(400)
        } else {
            1 + rng.below(4)
        };
        let calm = step > STEPS_MAX / 3
            || c.nodes
                .values()
                .all(|n| n.sent.values().sum::<u64>() == 3 * total);
        if !calm {
            // The schedule writes the links' fields: cut, restore, delay, reorder, and restarts
            // a relay (its links drop what they carried).
            if rng.chance(2) && !c.direct_links.is_empty() {
                let keys: Vec<(u64, u64)> = c.direct_links.keys().copied().collect();
                let key = keys[rng.below(keys.len() as u64) as usize];
                let redial_ms = 1 + rng.below(50);
                c.cut_direct(key, redial_ms);
            }
            if rng.chance(4) {
                let key = EDGES[rng.below(EDGES.len() as u64) as usize];
                match rng.below(5) {
                    0 => c.cut_link(key),
                    1 => c.links.get_mut(&key).unwrap().up = true,
                    2 => c.links.get_mut(&key).unwrap().delay_ms = rng.below(30),
                    3 => {
                        let link = c.links.get_mut(&key).unwrap();
                        link.reorder = !link.reorder;
                    }
                    _ => {
                        let relay = [101, 102, HUB][rng.below(3) as usize];
                        let keys: Vec<(u64, u64)> = c
                            .links
                            .keys()
                            .filter(|k| k.0 == relay || k.1 == relay)
                            .copied()
                            .collect();
                        for k in keys {
                            c.cut_link(k);
                            c.links.get_mut(&k).unwrap().up = true;
                        }
                    }
                }
                if c.links[&key].up {
                    c.relink();
                }
            }
        } else if healed_at.is_none() {
            // Heal: every link up, in order, prompt; the protocol must finish the job.
            for l in c.links.values_mut() {
                l.up = true;
                l.reorder = false;
                l.delay_ms = 0;
            }
            c.relink();
            healed_at = Some(step);
        }
        // The applications look up where their sends go; some queue at once, the others
        // after the dials below (a direct link may come up in between).
        let mut later = Vec::new();
        for leaf in LEAVES {
            if !rng.chance(50) {
                continue;
            }
            let dst = LEAVES[rng.below(4) as usize];
            if dst == leaf {
                continue;
            }
            let node = c.nodes.get_mut(&leaf).unwrap();
            let next = node.sent.entry(dst).or_insert(0);
            let n = (1 + rng.below(10)).min(total - *next);
            let batch: Vec<Vec<u8>> = (*next..*next + n)
                .map(|i| i.to_le_bytes().to_vec())
                .collect();
            let looked = Looked {
                leaf,
                dst,
                direct: node.direct.contains_key(&dst),
                batch,
            };
            if rng.chance(50) {
                let queued = c.queue(looked);
                *c.nodes.get_mut(&leaf).unwrap().sent.get_mut(&dst).unwrap() += queued;
            } else {
                later.push(looked);
            }
        }
        for leaf in LEAVES {
            c.pump(leaf);
        }
        c.dial();
        for looked in later {
            let (leaf, dst) = (looked.leaf, looked.dst);
            if !looked.direct && c.nodes[&leaf].direct.contains_key(&dst) {
                late_queues += 1;
            }
            let queued = c.queue(looked);
            *c.nodes.get_mut(&leaf).unwrap().sent.get_mut(&dst).unwrap() += queued;
        }
        for leaf in LEAVES {
            c.pump(leaf);
        }
        c.run_direct();
        c.deliver_due(&mut rng);
        c.read_and_take(&mut rng);
        let now = c.now;
        for n in c.nodes.values_mut() {
            for d in n.departures.values_mut() {
                match d.check(now, RESEND_AFTER_MS, DEAD_AFTER_MS) {
                    Check::Retry => {
                        d.rewind();
                    }
                    Check::Expire => panic!("seed {seed}: gave up"),
                    Check::Idle => {}
                }
            }
        }
        if c.all_done(total)
            && c.links
                .values()
                .all(|l| l.up_lane.in_flight.is_empty() && l.down_lane.in_flight.is_empty())
            && c.direct_links
                .values()
                .all(|d| d.lanes.iter().all(|l| l.in_flight.is_empty()))
        {
            break;
        }
    }
    for (&dst, node) in &c.nodes {
        for (&src, got) in &node.delivered {
            let want: Vec<u64> = (0..c.nodes[&src].sent[&dst]).collect();
            if got != &want {
                let wrong = got.iter().zip(&want).position(|(g, w)| g != w);
                panic!(
                    "seed {seed}: {src} -> {dst} exactly once, in order, at the application: \
                     {} taken for {} sent, first wrong at {wrong:?}: {:?}",
                    got.len(),
                    want.len(),
                    wrong.map(|i| &got[i.saturating_sub(2)..(i + 3).min(got.len())])
                );
            }
        }
    }
    for (&src, node) in &c.nodes {
        for (&dst, &sent) in &node.sent {
            assert_eq!(sent, total, "seed {seed}: {src} sent everything to {dst}");
            let got = c.nodes[&dst].delivered.get(&src).map_or(0, Vec::len) as u64;
            assert_eq!(got, total, "seed {seed}: {src} -> {dst} all delivered");
        }
    }
    assert!(
        c.all_done(total),
        "seed {seed}: everything acknowledged and taken"
    );
    Took {
        direct_ups: c.direct_ups,
        held_switches: c.held_switches,
        claims_waited: c.claims_waited,
        late_queues,
    }
}

#[test]
fn seeded_schedules_deliver_every_message_once_in_order_through_relays() {
    if let Some(seed) = std::env::var("BUSWAY_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        run(seed);
        return;
    }
    let seeds: u64 = std::env::var("BUSWAY_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let mut all = Took::default();
    for seed in 0..seeds {
        let t = run(seed);
        all.direct_ups += t.direct_ups;
        all.held_switches += t.held_switches;
        all.claims_waited += t.claims_waited;
        all.late_queues += t.late_queues;
    }
    eprintln!(
        "{seeds} schedules: {} direct links up, {} switches held messages back, {} sends \
         queued after a switch they looked before, {} handovers waited for another link",
        all.direct_ups, all.held_switches, all.late_queues, all.claims_waited
    );
    if seeds >= 20 {
        assert!(
            all.direct_ups > 0
                && all.held_switches > 0
                && all.late_queues > 0
                && all.claims_waited > 0,
            "the schedules reach into the switch"
        );
    }
}
