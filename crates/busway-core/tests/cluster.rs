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
//! ([`Departures::supersede`]). Every schedule must deliver every message exactly once and in
//! order per (source, destination), whatever path it took, and end with everything
//! acknowledged.
//! `BUSWAY_SIM_SEEDS=N` runs N schedules (default 200); `BUSWAY_SIM_SEED=S` runs one.

use busway_core::control::{ack_frame, decode_token};
use busway_core::e2e::{Arrivals, Check, Departures, FailOutcome, Verdict};
use busway_core::frame::{message_spans, FrameKind, BODY_LEN_CEILING, HEADER_LEN};
use busway_core::hints::HintBook;
use busway_core::outbox::Outbox;
use busway_core::relay::{self, Neighbor};
use busway_core::routed::{
    decode_fail, decode_hint, encode_fail, encode_hint, forwarded_parts, routed_frame, FailReason,
    RoutedHeader, RoutedType, DEFAULT_TTL,
};
use busway_core::sim::{inner_messages, SimRng};
use busway_core::{BusId, FrameDecoder};
use bytes::{Bytes, BytesMut};
use std::collections::{BTreeMap, HashMap};

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
    inbound_expected: u64,
    /// Messages wait (ACKs still flow) until everything sent through relays is acknowledged.
    held: bool,
}

#[derive(Default)]
struct Node {
    departures: BTreeMap<u64, Departures>,
    direct: BTreeMap<u64, DirectPeer>,
    hints: HintBook,
    arrivals: Arrivals,
    /// Per source: the numbers delivered, in delivery order.
    delivered: HashMap<u64, Vec<u64>>,
    /// Per destination: the next message number the application sends.
    sent: HashMap<u64, u64>,
}

struct Cluster {
    now: u64,
    links: BTreeMap<(u64, u64), Link>,
    /// By (lower id, higher id).
    direct_links: BTreeMap<(u64, u64), DirectLink>,
    /// How many direct links came up, and how many switches held messages back.
    direct_ups: u64,
    held_switches: u64,
    nodes: BTreeMap<u64, Node>,
    incarnation: HashMap<u64, u64>,
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
    fn new() -> Self {
        let mut nodes = BTreeMap::new();
        let mut incarnation = HashMap::new();
        for id in LEAVES.iter().chain(&[101, 102, HUB]) {
            nodes.insert(*id, Node::default());
            incarnation.insert(*id, 1000 + id);
        }
        for leaf in LEAVES {
            let n = nodes.get_mut(&leaf).unwrap();
            for dst in LEAVES.iter().filter(|&&d| d != leaf) {
                n.departures.insert(*dst, Departures::new(1 << 20, 0));
                n.sent.insert(*dst, 0);
            }
        }
        Self {
            now: 0,
            links: EDGES.iter().map(|&(c, p)| ((c, p), Link::new())).collect(),
            direct_links: BTreeMap::new(),
            direct_ups: 0,
            held_switches: 0,
            nodes,
            incarnation,
        }
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
        relay::next_hop(BusId(dst), &self.neighbors(at), up, except.map(BusId)).map(|b| b.0)
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
        let Some(hop) = self.hop(src, dst, None) else {
            return;
        };
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
        self.put(src, hop, frame);
    }

    /// A leaf hands what its departures hold unwritten to its next hop.
    fn pump(&mut self, leaf: u64) {
        let dsts: Vec<u64> = self.nodes[&leaf].departures.keys().copied().collect();
        for dst in dsts {
            let (now, inc) = (self.now, self.incarnation[&leaf]);
            let hop = self.hop(leaf, dst, None);
            let d = self
                .nodes
                .get_mut(&leaf)
                .unwrap()
                .departures
                .get_mut(&dst)
                .unwrap();
            let Some(hop) = hop else {
                d.stall(now);
                continue;
            };
            for f in d.take_frames(BusId(leaf), inc, BusId(dst), DEFAULT_TTL, now) {
                self.put(leaf, hop, f);
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

    /// Node `at` receives `frame` from neighbor `from`.
    fn receive(&mut self, at: u64, from: u64, frame: Bytes) {
        let mut buf = BytesMut::from(&frame[..]);
        let f = FrameDecoder::new(BODY_LEN_CEILING)
            .decode(&mut buf)
            .unwrap()
            .unwrap();
        let (h, inner_at) = RoutedHeader::decode(&f.body).unwrap();
        let inner = f.body.slice(inner_at..);
        if h.dst.0 != at {
            return self.relay(at, from, h, &f.body);
        }
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
                        let got = node.delivered.entry(src).or_default();
                        for m in msgs.iter().skip(skip as usize) {
                            got.push(u64::from_le_bytes(m[..8].try_into().unwrap()));
                        }
                        let next = h.seq + msgs.len() as u64;
                        node.arrivals
                            .delivered(h.src, h.src_incarnation, next, self.now);
                        self.control(at, RoutedType::Ack, src, next, None);
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
                let relayed = node.departures.get_mut(&other).unwrap().supersede();
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
            }
        }
    }

    /// Direct links: release what was held, write what is queued, deliver what arrived.
    fn run_direct(&mut self) {
        let now = self.now;
        for leaf in LEAVES {
            let node = self.nodes.get_mut(&leaf).unwrap();
            for (&other, p) in node.direct.iter_mut() {
                if p.held && node.departures[&other].outbox().unacked() == 0 {
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

    /// Leaf `at` reads `bytes` (whole frames) from its direct link to `from`.
    fn direct_receive(&mut self, at: u64, from: u64, bytes: &[u8]) {
        let node = self.nodes.get_mut(&at).unwrap();
        let mut dec = FrameDecoder::new(BODY_LEN_CEILING);
        let mut pos = 0;
        let mut spans = Vec::new();
        let mut acked = None;
        while let Some((kind, len)) = dec.peek(&bytes[pos..]).expect("whole, checked frames") {
            let body = &bytes[pos + HEADER_LEN..pos + len];
            if kind == FrameKind::Ack {
                acked = decode_token(body);
            } else {
                message_spans(kind, body, pos + HEADER_LEN, &mut spans).unwrap();
            }
            pos += len;
        }
        let p = node.direct.get_mut(&from).expect("a peer on each end");
        if let Some(next) = acked {
            p.outbox.ack(next).expect("a good ACK");
        }
        if !spans.is_empty() {
            p.inbound_expected += spans.len() as u64;
            p.outbox.push_control(ack_frame(p.inbound_expected));
            let got = node.delivered.entry(from).or_default();
            for (s, l) in spans {
                let m = &bytes[s as usize..(s + l) as usize];
                got.push(u64::from_le_bytes(m[..8].try_into().unwrap()));
            }
        }
    }

    /// The schedule cuts a direct link: what it carried is lost; the dialer dials again.
    fn cut_direct(&mut self, key: (u64, u64), redial_ms: u64) {
        let now = self.now;
        if let Some(d) = self.direct_links.get_mut(&key) {
            if d.up {
                d.up = false;
                d.lanes = Default::default();
                d.dial_at = Some(now + redial_ms);
            }
        }
    }

    fn all_sent_and_acknowledged(&self, total: u64) -> bool {
        self.nodes.values().all(|n| {
            n.sent.values().all(|&s| s == total)
                && n.departures.values().all(|d| d.outbox().unacked() == 0)
                && n.direct.values().all(|p| p.outbox.unacked() == 0)
        })
    }
}

/// Runs one schedule; returns (direct links brought up, switches that held messages back).
fn run(seed: u64) -> (u64, u64) {
    let mut rng = SimRng::new(seed);
    let total = 100 + rng.below(400);
    let mut c = Cluster::new();
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
                let link = c.links.get_mut(&key).unwrap();
                match rng.below(5) {
                    0 => link.cut(),
                    1 => link.up = true,
                    2 => link.delay_ms = rng.below(30),
                    3 => link.reorder = !link.reorder,
                    _ => {
                        let relay = [101, 102, HUB][rng.below(3) as usize];
                        for (k, l) in c.links.iter_mut() {
                            if k.0 == relay || k.1 == relay {
                                l.cut();
                                l.up = true;
                            }
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
        // The applications send.
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
            let relayed = node.departures.get_mut(&dst).unwrap();
            *next += if relayed.is_superseded() {
                let p = node
                    .direct
                    .get_mut(&dst)
                    .expect("switched to a direct link");
                p.outbox.push_copies(&batch) as u64
            } else {
                relayed.outbox_mut().push_copies(&batch) as u64
            };
        }
        for leaf in LEAVES {
            c.pump(leaf);
        }
        c.dial();
        c.run_direct();
        c.deliver_due(&mut rng);
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
        if c.all_sent_and_acknowledged(total)
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
            assert_eq!(
                got, &want,
                "seed {seed}: {src} -> {dst} exactly once, in order"
            );
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
        c.all_sent_and_acknowledged(total),
        "seed {seed}: everything acknowledged"
    );
    (c.direct_ups, c.held_switches)
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
    let (mut ups, mut held) = (0, 0);
    for seed in 0..seeds {
        let (u, h) = run(seed);
        ups += u;
        held += h;
    }
    eprintln!("{seeds} schedules: {ups} direct links up, {held} switches held messages back");
    if seeds >= 20 {
        assert!(ups > 0 && held > 0, "the switch to direct links is taken");
    }
}
