//! Registrations along the tree, sans-IO: a relay tells its upstream which bus ids it serves
//! beyond the range it declared in its HELLO (its downstreams, and what they registered in
//! turn), so that `--upstream` relays carry traffic both ways without hand-kept ranges.
//!
//! The REGISTER control frame (kind 0x0F) carries one op: ADD or REMOVE a range, numbered
//! by the asker, or the ANSWER to one (ok, or refused with the reason). Ops are idempotent
//! (an ADD of a range the asker holds already, a REMOVE of one it does not hold, change
//! nothing), so the asker resends every op not answered yet when its link to the same
//! upstream comes back, in order, and the upstream's state ends where the asker meant it.
//!
//! The asker never sends a frame upward in the name of an id before the upstream answered
//! that id's range (see [`Upward::gate`]): the upstream refuses frames from ids a link may not
//! speak for and closes that link, and the REGISTER (on the socket) and the frames it covers
//! (on a ring, perhaps) do not share one ordered stream. Likewise a range is taken back only
//! after everything queued upward in its name was acknowledged.
//!
//! - [`Registry`]: what a node's downstreams registered with it (bounded per downstream).
//! - [`Upward`]: what a node asked of its upstream, what it was answered, and the gate.

use crate::id::BusId;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Ranges one downstream may hold registered at a node beyond its HELLO's range (the
/// registrations are charged to it; one past this is refused, not stored).
pub const REGISTERED_RANGES_PER_PEER_MAX: usize = 4096;
/// Bytes of the reason an ANSWER carries at most (longer ones are cut).
pub const REGISTER_REASON_BYTES_MAX: usize = 512;
/// Ops the asker keeps sent and unanswered at most, and removals waiting at most: past it,
/// the upstream is not answering, and new asks and removals wait for a later sync (see
/// [`Upward::sync`]).
pub const REGISTER_UNANSWERED_MAX: usize = 2 * REGISTERED_RANGES_PER_PEER_MAX;

const OP_ADD: u8 = 1;
const OP_REMOVE: u8 = 2;
const OP_ANSWER: u8 = 3;
const STATUS_OK: u8 = 0;
const STATUS_REFUSED: u8 = 1;

/// A range of bus ids, both ends included, `lo <= hi`.
pub type IdRange = (BusId, BusId);

/// One REGISTER frame's body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegisterOp {
    /// The asker serves `range` (through a downstream of its own); `version` numbers the op.
    Add {
        /// The op's number, given by the asker.
        version: u64,
        /// The ids the asker serves, both ends included.
        range: IdRange,
    },
    /// The asker no longer serves `range`.
    Remove {
        /// The op's number, given by the asker.
        version: u64,
        /// The ids the asker no longer serves, both ends included.
        range: IdRange,
    },
    /// The answer to op `version`: `None` if done, else why it was refused.
    Answer {
        /// The number of the op answered.
        version: u64,
        /// `None` if the op was done, else why it was refused (at most
        /// [`REGISTER_REASON_BYTES_MAX`] bytes).
        refused: Option<String>,
    },
}

impl RegisterOp {
    /// The body of a REGISTER frame carrying this op.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(25);
        match self {
            Self::Add { version, range } | Self::Remove { version, range } => {
                let op = if matches!(self, Self::Add { .. }) {
                    OP_ADD
                } else {
                    OP_REMOVE
                };
                out.push(op);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&range.0 .0.to_le_bytes());
                out.extend_from_slice(&range.1 .0.to_le_bytes());
            }
            Self::Answer { version, refused } => {
                out.push(OP_ANSWER);
                out.extend_from_slice(&version.to_le_bytes());
                match refused {
                    None => out.push(STATUS_OK),
                    Some(why) => {
                        out.push(STATUS_REFUSED);
                        out.extend_from_slice(cut_reason(why).as_bytes());
                    }
                }
            }
        }
        out
    }

    /// A REGISTER frame's body, checked: a known op, a version above 0, a range in order, a
    /// reason in UTF-8 within [`REGISTER_REASON_BYTES_MAX`]. The error names what is wrong.
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        let what = |e: &str| format!("REGISTER body of {} bytes: {e}", body.len());
        let u64_at = |at: usize| -> Option<u64> {
            body.get(at..at + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        };
        let (&op, _) = body.split_first().ok_or_else(|| what("empty"))?;
        let version = u64_at(1).ok_or_else(|| what("no version"))?;
        if version == 0 {
            return Err(what("version 0 (versions start at 1)"));
        }
        match op {
            OP_ADD | OP_REMOVE => {
                if body.len() != 25 {
                    return Err(what("an ADD or REMOVE is 25 bytes"));
                }
                let lo = BusId(u64_at(9).expect("length checked"));
                let hi = BusId(u64_at(17).expect("length checked"));
                if lo > hi {
                    return Err(what(&format!("the range {lo}..={hi} is empty")));
                }
                let range = (lo, hi);
                Ok(if op == OP_ADD {
                    Self::Add { version, range }
                } else {
                    Self::Remove { version, range }
                })
            }
            OP_ANSWER => {
                let refused = match body.get(9) {
                    Some(&STATUS_OK) if body.len() == 10 => None,
                    Some(&STATUS_REFUSED) if body.len() - 10 <= REGISTER_REASON_BYTES_MAX => Some(
                        std::str::from_utf8(&body[10..])
                            .map_err(|_| what("a reason that is not UTF-8"))?
                            .to_owned(),
                    ),
                    Some(&STATUS_OK) => return Err(what("an ok ANSWER is 10 bytes")),
                    Some(&STATUS_REFUSED) => return Err(what("a reason over 512 bytes")),
                    Some(s) => return Err(what(&format!("unknown status {s}"))),
                    None => return Err(what("no status")),
                };
                Ok(Self::Answer { version, refused })
            }
            other => Err(what(&format!("unknown op {other}"))),
        }
    }
}

/// `why` cut to at most [`REGISTER_REASON_BYTES_MAX`] bytes, on a character boundary.
fn cut_reason(why: &str) -> &str {
    let mut end = why.len().min(REGISTER_REASON_BYTES_MAX);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    &why[..end]
}

fn overlaps(a: IdRange, b: IdRange) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

fn show(r: IdRange) -> String {
    format!("{}..={}", r.0, r.1)
}

/// What a node's downstreams registered with it: disjoint ranges, each held by one peer, at
/// most [`REGISTERED_RANGES_PER_PEER_MAX`] per peer. Lookups are O(log n).
#[derive(Clone, Debug, Default)]
pub struct Registry {
    /// By the range's first id: (last id, the peer that registered it).
    ranges: BTreeMap<BusId, (BusId, BusId)>,
    per_peer: HashMap<BusId, usize>,
}

impl Registry {
    /// The peer that registered `id`, if any.
    pub fn lookup(&self, id: BusId) -> Option<BusId> {
        let (_, &(hi, peer)) = self.ranges.range(..=id).next_back()?;
        (id <= hi).then_some(peer)
    }

    /// The registered range that overlaps `range`, and its peer, other than `except`'s.
    pub fn overlapping(&self, range: IdRange, except: BusId) -> Option<(IdRange, BusId)> {
        self.overlapping_where(range, |peer| peer != except)
    }

    /// The registered range of a peer `pick` takes that overlaps `range`, and its peer.
    fn overlapping_where(
        &self,
        range: IdRange,
        pick: impl Fn(BusId) -> bool,
    ) -> Option<(IdRange, BusId)> {
        // Disjoint ranges sorted by their first id: those starting at or before `range.1`,
        // walked back while they still reach `range.0` (each earlier one ends before the
        // next starts).
        self.ranges
            .range(..=range.1)
            .rev()
            .take_while(|(_, &(hi, _))| hi >= range.0)
            .map(|(&lo, &(hi, peer))| ((lo, hi), peer))
            .find(|&(r, peer)| pick(peer) && overlaps(r, range))
    }

    /// How many ranges `peer` holds registered.
    pub fn ranges_held_by(&self, peer: BusId) -> usize {
        self.per_peer.get(&peer).copied().unwrap_or(0)
    }

    /// Whether `peer` holds any registration.
    pub fn holds_any(&self, peer: BusId) -> bool {
        self.per_peer.get(&peer).is_some_and(|&n| n > 0)
    }

    /// The ranges `peer` registered, in order.
    pub fn ranges_of(&self, peer: BusId) -> impl Iterator<Item = IdRange> + '_ {
        let held = self.holds_any(peer);
        self.ranges
            .iter()
            .filter(move |(_, &(_, p))| held && p == peer)
            .map(|(&lo, &(hi, _))| (lo, hi))
    }

    /// Every registration, as (range, peer), in order.
    pub fn iter(&self) -> impl Iterator<Item = (IdRange, BusId)> + '_ {
        self.ranges.iter().map(|(&lo, &(hi, p))| ((lo, hi), p))
    }

    /// Downstream `peer` of node `me` registers `range`. Refused, with the reason, if it holds
    /// `me`, overlaps what another peer registered or declared (`declared`: the HELLO range
    /// of another live downstream that overlaps it, if any), overlaps another of `peer`'s
    /// ranges without being equal to it, or would pass `peer`'s quota. A range `peer` holds
    /// already is done.
    pub fn add(
        &mut self,
        me: BusId,
        peer: BusId,
        range: IdRange,
        declared: Option<(IdRange, BusId)>,
    ) -> Result<(), String> {
        let what = format!("bus id {peer} registers bus ids {}", show(range));
        if range.0 <= me && me <= range.1 {
            return Err(format!("{what}, which holds this relay's own id {me}"));
        }
        if let Some((r, other)) = declared.filter(|&(_, other)| other != peer) {
            return Err(format!(
                "{what}, which overlaps bus ids {} bus id {other} declared",
                show(r)
            ));
        }
        if let Some((r, other)) = self.overlapping(range, peer) {
            return Err(format!(
                "{what}, which overlaps bus ids {} registered by bus id {other}",
                show(r)
            ));
        }
        if let Some((r, _)) = self.overlapping_where(range, |p| p == peer) {
            if r == range {
                return Ok(());
            }
            return Err(format!(
                "{what}, which overlaps its own bus ids {} (remove that first)",
                show(r)
            ));
        }
        let held = self.per_peer.entry(peer).or_default();
        if *held >= REGISTERED_RANGES_PER_PEER_MAX {
            return Err(format!(
                "{what}: it holds {REGISTERED_RANGES_PER_PEER_MAX} ranges already, the most one downstream may"
            ));
        }
        *held += 1;
        self.ranges.insert(range.0, (range.1, peer));
        Ok(())
    }

    /// `peer` takes back `range`; true if it held it (else nothing changes).
    pub fn remove(&mut self, peer: BusId, range: IdRange) -> bool {
        if self.ranges.get(&range.0) != Some(&(range.1, peer)) {
            return false;
        }
        self.ranges.remove(&range.0);
        self.uncount(peer, 1);
        true
    }

    /// Forgets everything `peer` registered (it was given up, or came back as another
    /// incarnation); true if it held anything.
    pub fn forget(&mut self, peer: BusId) -> bool {
        let Some(n) = self.per_peer.remove(&peer) else {
            return false;
        };
        self.ranges.retain(|_, &mut (_, p)| p != peer);
        n > 0
    }

    fn uncount(&mut self, peer: BusId, n: usize) {
        if let Some(held) = self.per_peer.get_mut(&peer) {
            *held -= n;
            if *held == 0 {
                self.per_peer.remove(&peer);
            }
        }
    }

    /// Applies `op` from downstream `peer` of node `me` (see [`Registry::add`] for
    /// `declared`); returns the ANSWER to send back, and whether anything changed.
    pub fn apply(
        &mut self,
        me: BusId,
        peer: BusId,
        op: &RegisterOp,
        declared: Option<(IdRange, BusId)>,
    ) -> (RegisterOp, bool) {
        let (version, result, changed) = match *op {
            RegisterOp::Add { version, range } => {
                let before = self.per_peer.get(&peer).copied().unwrap_or(0);
                let r = self.add(me, peer, range, declared);
                let after = self.per_peer.get(&peer).copied().unwrap_or(0);
                (version, r, after != before)
            }
            RegisterOp::Remove { version, range } => (version, Ok(()), self.remove(peer, range)),
            RegisterOp::Answer { version, .. } => (
                version,
                Err("an ANSWER to a REGISTER this node never sent".into()),
                false,
            ),
        };
        let answer = RegisterOp::Answer {
            version,
            refused: result.err(),
        };
        (answer, changed)
    }
}

/// What the asker knows of one range it wants registered upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Asked {
    /// ADD `version` is out, not answered yet.
    Pending(u64),
    /// The upstream holds it.
    Held,
    /// Refused for this reason; asked again from `retry_at_ms`.
    Refused { why: String, retry_at_ms: u64 },
}

/// Whether a frame in the name of an id may go to the upstream now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// The upstream holds the id's range (or the id needs no registration).
    Pass,
    /// Its registration is on its way: wait, or say "not yet".
    Wait,
    /// Refused by the upstream (the reason), or not wanted: do not send it up.
    Refused(String),
}

/// How long a refused registration waits before it is asked again, in milliseconds (a
/// conflicting range may be given up meanwhile: a downstream that moved).
pub const REGISTER_RETRY_MS: u64 = 5_000;

/// The asker's side: the ranges it wants its upstream to hold for it, what it was answered,
/// the ops still unanswered (resent, in order, on a new link to the same upstream), and the
/// removals that wait for what was queued before them. Every table here is bounded by
/// [`REGISTER_UNANSWERED_MAX`]: past it, new asks and removals wait for a later sync.
#[derive(Debug, Default)]
pub struct Upward {
    next_version: u64,
    /// By range; ranges here are disjoint (each is a downstream's, checked on arrival).
    asked: BTreeMap<IdRange, Asked>,
    unanswered: VecDeque<RegisterOp>,
    /// Ranges taken back whose REMOVE waits until the upstream acknowledged messages below
    /// the number given (what was queued in the range's name before), with what was known
    /// of them (restored if the range is wanted again meanwhile: nothing is sent then).
    removing: Vec<(IdRange, u64, Asked)>,
}

/// What an ANSWER told the asker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answered {
    /// A range is held now: frames in its name may go.
    Held(IdRange),
    /// A range was refused: the reason.
    Refused(IdRange, String),
    /// Nothing the asker still waits for (a REMOVE's answer, or a stale one).
    Nothing,
}

impl Upward {
    /// A new op numbered next, kept until answered; `None` if [`REGISTER_UNANSWERED_MAX`]
    /// ops wait for answers already (the upstream is not answering: ask later).
    fn op(&mut self, add: bool, range: IdRange) -> Option<RegisterOp> {
        if self.unanswered.len() >= REGISTER_UNANSWERED_MAX {
            return None;
        }
        self.next_version += 1;
        let version = self.next_version;
        let op = if add {
            RegisterOp::Add { version, range }
        } else {
            RegisterOp::Remove { version, range }
        };
        self.unanswered.push_back(op.clone());
        Some(op)
    }

    /// Brings what was asked in line with `wanted` (the ranges the node serves through its
    /// downstreams that the upstream does not hold by the HELLO, disjoint): returns the ADDs
    /// to send now. A range no longer wanted stops passing the gate at once, and its REMOVE
    /// waits until the upstream acknowledged messages below `queued_seq` (see
    /// [`Upward::removals_due`]); wanted again before that, it is as it was, and nothing is
    /// sent.
    pub fn sync(
        &mut self,
        wanted: impl IntoIterator<Item = IdRange>,
        queued_seq: u64,
        now_ms: u64,
    ) -> Vec<RegisterOp> {
        let wanted: std::collections::BTreeSet<IdRange> = wanted.into_iter().collect();
        let gone: Vec<IdRange> = self
            .asked
            .keys()
            .filter(|r| !wanted.contains(r))
            .copied()
            .collect();
        for r in gone {
            if matches!(self.asked.get(&r), Some(Asked::Refused { .. })) {
                self.asked.remove(&r);
            } else if self.removing.len() < REGISTER_UNANSWERED_MAX {
                let was = self.asked.remove(&r).expect("listed above");
                self.removing.push((r, queued_seq, was));
            }
            // Else it stays as it is until a later sync finds room.
        }
        let mut ops = Vec::new();
        for r in wanted {
            if let Some(i) = self.removing.iter().position(|&(x, _, _)| x == r) {
                let (_, _, was) = self.removing.swap_remove(i);
                self.asked.insert(r, was);
                continue;
            }
            let ask = match self.asked.get(&r) {
                None => true,
                Some(Asked::Refused { retry_at_ms, .. }) => now_ms >= *retry_at_ms,
                Some(_) => false,
            };
            if !ask {
                continue;
            }
            let Some(op) = self.op(true, r) else {
                break;
            };
            if let RegisterOp::Add { version, .. } = op {
                self.asked.insert(r, Asked::Pending(version));
            }
            ops.push(op);
        }
        ops
    }

    /// The REMOVEs whose range's earlier messages the upstream acknowledged (`acked`: it has
    /// every message below this number).
    pub fn removals_due(&mut self, acked: u64) -> Vec<RegisterOp> {
        let mut ops = Vec::new();
        let mut i = 0;
        while i < self.removing.len() {
            let (r, after, _) = self.removing[i];
            if after > acked {
                i += 1;
                continue;
            }
            let Some(op) = self.op(false, r) else {
                break;
            };
            self.removing.swap_remove(i);
            ops.push(op);
        }
        ops
    }

    /// The upstream answered op `version`.
    pub fn answered(&mut self, version: u64, refused: Option<String>, now_ms: u64) -> Answered {
        // Answers come in the order of the ops (they are sent in order, and answered in
        // order): those before it were answered on a link that went down with the answer.
        let Some(i) = self
            .unanswered
            .iter()
            .position(|op| version_of(op) == version)
        else {
            return Answered::Nothing;
        };
        let op = self
            .unanswered
            .drain(..=i)
            .next_back()
            .expect("position found");
        let RegisterOp::Add { range, .. } = op else {
            return Answered::Nothing;
        };
        // A range asked again on a new link (see `relink`) is held, not pending: a refusal
        // now (the upstream forgot it, and another took it) stops it passing all the same.
        match self.asked.get(&range) {
            Some(Asked::Pending(v)) if *v == version => {}
            Some(Asked::Held) => {}
            _ => return Answered::Nothing,
        }
        match refused {
            None => {
                self.asked.insert(range, Asked::Held);
                Answered::Held(range)
            }
            Some(why) => {
                self.asked.insert(
                    range,
                    Asked::Refused {
                        why: why.clone(),
                        retry_at_ms: now_ms.saturating_add(REGISTER_RETRY_MS),
                    },
                );
                Answered::Refused(range, why)
            }
        }
    }

    /// A new link to the same upstream incarnation: the ops to send on it first, in order:
    /// those not answered yet, then an ADD of every range held (the upstream may have given
    /// this node up meanwhile and forgotten them; an ADD of a range held is done again, and
    /// sent ahead of anything else on the link, it is read first).
    pub fn relink(&mut self) -> Vec<RegisterOp> {
        let mut ops: Vec<RegisterOp> = self.unanswered.iter().cloned().collect();
        let held: Vec<IdRange> = self
            .asked
            .iter()
            .filter(|(_, a)| **a == Asked::Held)
            .map(|(r, _)| *r)
            .collect();
        for r in held {
            match self.op(true, r) {
                Some(op) => ops.push(op),
                // No room to ask it again now: it stops passing until asked (next sync).
                None => {
                    self.asked.remove(&r);
                }
            }
        }
        ops
    }

    /// The upstream is another incarnation (or another node): it holds nothing of ours.
    pub fn reset(&mut self) {
        self.asked.clear();
        self.unanswered.clear();
        self.removing.clear();
    }

    /// Whether a frame in the name of `id` may go up now. An id in no range this node asked
    /// for is `Refused` (the caller passes ids that need no registration, its own and its
    /// HELLO's range, without asking).
    pub fn gate(&self, id: BusId) -> Gate {
        let found = self
            .asked
            .range(..=(id, BusId(u64::MAX)))
            .next_back()
            .filter(|((lo, hi), _)| *lo <= id && id <= *hi);
        match found {
            Some((_, Asked::Held)) => Gate::Pass,
            Some((_, Asked::Pending(_))) => Gate::Wait,
            Some((r, Asked::Refused { why, .. })) => Gate::Refused(format!(
                "the upstream refused the registration of bus ids {}: {why}",
                show(*r)
            )),
            None => Gate::Refused(format!("bus id {id} is not registered with the upstream")),
        }
    }

    /// Whether anything waits on time: removals waiting for acknowledgements, refused
    /// ranges to ask again.
    pub fn has_timed_work(&self) -> bool {
        !self.removing.is_empty()
            || self
                .asked
                .values()
                .any(|a| matches!(a, Asked::Refused { .. }))
    }

    /// Ranges held, pending and refused (for status).
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut c = (0, 0, 0);
        for a in self.asked.values() {
            match a {
                Asked::Held => c.0 += 1,
                Asked::Pending(_) => c.1 += 1,
                Asked::Refused { .. } => c.2 += 1,
            }
        }
        c
    }
}

fn version_of(op: &RegisterOp) -> u64 {
    match *op {
        RegisterOp::Add { version, .. }
        | RegisterOp::Remove { version, .. }
        | RegisterOp::Answer { version, .. } => version,
    }
}

#[cfg(test)]
mod tests;
