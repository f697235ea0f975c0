//! The node that the group and multicast machines (`group::node`, `multicast::node`) run in:
//! what they ask of it ([`Host`]: the state under its locks, the links, the application's
//! inbox) and what they tell it ([`Report`]). The runtime is one host, the seeded simulation
//! another: both drive the same decisions.

use super::forwards::{Push, WaitingForwards};
use super::permissions::GroupPermissions;
use super::repairs::{AskRefused, Repairs};
use super::state::GroupState;
use crate::body::Span;
use crate::frame::FrameKind;
use crate::multicast::state::MulticastState;
use crate::BusId;
use bytes::Bytes;

/// Where a node's links lead.
pub trait Routes {
    /// A look at the routes, taken once for many destinations (see [`Routes::hop`]).
    type Hops;

    /// A look at the routes now.
    fn hops(&self) -> Self::Hops;
    /// The link a frame to `dst` takes: a direct link to it (even while it is down: its
    /// queue is resent when it is back), else the unicast next hop; never `except`.
    fn hop(&self, hops: &Self::Hops, dst: BusId, except: Option<BusId>) -> Option<BusId>;
}

/// Why an end-to-end frame did not go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsent {
    /// The way to it has no room now: try again later.
    Full,
    /// It cannot go (no route, the peer down for good, the node closing): the text says why.
    Failed(String),
}

/// What happened, for the host's counters, logs and events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// `n` receivers' copies of a multicast could not be passed on (no hop left, no route, a
    /// full link, a frame past the link's limit, a name the upstream does not hold for this
    /// node): those receivers see a gap and ask the source.
    MulticastForwardsDropped(u64),
    /// An INTEREST past the link's quota of groups, refused (nothing else changes).
    InterestRefused,
    /// Copies of publishes or multicasts seen already, dropped.
    CopiesDropped(u64),
    /// A PUBLISH from `from` that only a liar sends (`why`): the host closes that link.
    PublishLie {
        /// The peer the PUBLISH came from.
        from: BusId,
        /// What is wrong with it.
        why: String,
    },
    /// `n` publishes of `publisher` to `group`, which nobody here wants (no member, no peer
    /// that asked), dropped.
    Unwanted {
        /// The publisher of the dropped publishes.
        publisher: BusId,
        /// The group's name.
        group: String,
        /// How many publishes were dropped.
        n: u64,
    },
    /// `n` publishes could not be passed on to a peer (gone, past its frame limit, a name the
    /// upstream does not hold for this node, a lagging link): its members repair the gap.
    ForwardsDropped(u64),
    /// A relay gave up on a peer's way that stayed full (its cut-off publishes dropped until
    /// it has room again).
    LinkSkipped,
    /// A MULTICAST from `from` that only a liar sends (`why`): the host closes that link.
    MulticastLie {
        /// The peer the MULTICAST came from.
        from: BusId,
        /// What is wrong with it.
        why: String,
    },
    /// `member`'s join of `group` refused here (`why`); it was told.
    JoinRefused {
        /// The node whose join was refused.
        member: BusId,
        /// The group's name.
        group: String,
        /// Why it was refused.
        why: String,
    },
    /// `n` publishes (a mark counts one) of `publisher` to `group` refused here (`why`).
    PublishesDenied {
        /// The publisher whose publishes were refused.
        publisher: BusId,
        /// The group's name.
        group: String,
        /// How many publishes were refused (a mark counts one).
        n: u64,
        /// Why they were refused.
        why: String,
    },
    /// A REPAIR taken for nothing (a copy in another's name, a loss or a report of another
    /// incarnation, a copy for no stream here).
    RepairRefused,
    /// `from`'s ask for copies of `stream` refused (the member asks again or gives up).
    AskRefused {
        /// The member that asked.
        from: BusId,
        /// The group's name, or `MULTICAST_STREAM` for this node's multicasts.
        stream: String,
        /// Why the ask was refused.
        why: AskRefused,
    },
    /// An ask for copies went to a publisher or source.
    RepairAsked,
    /// A copy went to `to`, a member that asked.
    CopySent {
        /// The member the copy went to.
        to: BusId,
    },
    /// A repair for `member` was dropped: its way failed for good (`why`).
    RepairDropped {
        /// The member the repair was for.
        member: BusId,
        /// The group's name, or `MULTICAST_STREAM` for this node's multicasts.
        stream: String,
        /// Why its way failed.
        why: String,
    },
    /// `by` refused this node's joins or publishes (`publish`) to `group`: the application
    /// is told.
    GroupRefused {
        /// The group's name.
        group: String,
        /// The node that refused.
        by: BusId,
        /// The refusal is of this node's publishes (true) or of its join (false).
        publish: bool,
        /// Why, as the refusing node says.
        reason: String,
    },
    /// `missed` publishes of `publisher` to `group` never come (`reason`); the member stays
    /// in the group (`cut_off` false), or its application fell behind and it was cut off.
    GroupGap {
        /// The group's name.
        group: String,
        /// The publisher whose publishes never come.
        publisher: BusId,
        /// How many publishes never come.
        missed: u64,
        /// Why they never come.
        reason: String,
        /// The member's application fell behind and the member was cut off.
        cut_off: bool,
        /// It left the group by this (its peers are to be told).
        left: bool,
    },
    /// `missed` multicasts of `source` never come (`reason`): the application is told.
    MulticastGap {
        /// The multicasts' source.
        source: BusId,
        /// How many multicasts never come.
        missed: u64,
        /// Why they never come.
        reason: String,
    },
    /// `relay` could not pass a multicast on to `receiver`: the application is told.
    Unreachable {
        /// The receiver the relay had no way on toward.
        receiver: BusId,
        /// The multicast's number in this node's stream to `receiver`.
        number: u64,
        /// The relay that reported it.
        relay: BusId,
        /// Why, as the relay says.
        reason: String,
    },
}

/// The node the group and multicast rules run in.
pub trait Host {
    /// Where its links lead.
    type Routes: Routes;

    /// This node's routes.
    fn routes(&self) -> &Self::Routes;
    /// This node's id and incarnation.
    fn me(&self) -> (BusId, u64);
    /// Runs `f` on this node's group state, under the host's lock; if `delivers` holds for
    /// its answer, the host takes its turn to hand deliveries over before the lock goes, so
    /// that they reach the application in the order decided.
    fn groups<R>(&mut self, delivers: fn(&R) -> bool, f: impl FnOnce(&mut GroupState) -> R) -> R;
    /// Runs `f` on this node's multicast state (see [`Host::groups`]).
    fn multicasts<R>(
        &mut self,
        delivers: fn(&R) -> bool,
        f: impl FnOnce(&mut MulticastState) -> R,
    ) -> R;
    /// Runs `f` on the repairs under way (groups' and multicasts' alike), under their lock.
    fn repairs<R>(&mut self, f: impl FnOnce(&mut Repairs) -> R) -> R;
    /// Whether a frame in `speaker`'s name may cross the link to `peer` (the upstream closes
    /// a link that speaks for a node it does not hold registered there).
    fn may_pass_to(&self, peer: BusId, speaker: BusId) -> bool;
    /// Whether the link `from` may speak for `speaker` in a frame of `what` (its own peer, an
    /// id it registered, or the relay on the route toward it); the error says why not.
    fn may_speak_for(&mut self, from: BusId, speaker: BusId, what: &str) -> Result<(), String>;
    /// Queues a frame of `kind` (`head`, then `payload`) on the link to `peer`, never
    /// waiting: `Full` if it has no room now, `Gone` if it cannot take it (the peer gone,
    /// the frame past its limit).
    fn push(&mut self, peer: BusId, kind: FrameKind, head: &[u8], payload: &Bytes) -> Push;
    /// Queues this node's own PUBLISH (`head`, then `payload`) on the link to `peer` as
    /// [`Host::push`] does (the host may batch it with the publishes before it).
    fn push_own_publish(&mut self, peer: BusId, head: &[u8], payload: &Bytes) -> Push;
    /// Sends a REPAIR (`head`, then `payload`) to `to` end to end, never waiting.
    fn send_repair(&mut self, to: BusId, head: &[u8], payload: &Bytes) -> Result<(), Unsent>;
    /// Whether the link to `peer` has room again for more than a mark (a lagging link is
    /// sent publishes again from then).
    fn has_caught_up(&self, peer: BusId) -> bool;
    /// Whether publishes this relay passes on wait for room toward `peer` (a mark waits
    /// behind them).
    fn forwards_wait_for(&self, peer: BusId) -> bool;
    /// Whether the way to `peer` lags: its cut-off publishes are dropped at once while it
    /// stays full (see `forwards`).
    fn forwards_lagging(&self, peer: BusId) -> bool;
    /// Runs `f` on the publishes waiting for room, under the host's lock.
    fn forwards<R>(&mut self, f: impl FnOnce(&mut WaitingForwards) -> R) -> R;
    /// How long (ms) a cut-off publish waits for room toward `peer` (a relay's way waits
    /// less than a member's: `GROUP_HOP_WAIT_MS`, `GROUP_SLOW_MEMBER_WAIT_MS`).
    fn wait_ms(&self, peer: BusId) -> u64;
    /// Whether a frame body of `len` bytes is within what `peer` takes (it closes a link
    /// over a frame past its stated limit).
    fn fits(&self, peer: BusId, len: usize) -> bool;
    /// Whether `peer` reads PUBLISH batches (one that does not gets them one by one).
    fn takes_batches(&self, peer: BusId) -> bool;
    /// Whether `peer` reads gap marks (one that does not gets a plain mark instead).
    fn takes_gap_marks(&self, peer: BusId) -> bool;
    /// Whether the group state may owe a peer a mark (a hint read on every forward, so
    /// cheap: a look without the state's lock; see `GroupState::owes_none`).
    fn owes_marks(&self) -> bool;
    /// Who may join and publish to which groups here (`None`: anyone, anything).
    fn permissions(&self) -> Option<&GroupPermissions>;
    /// Whether `peer` passes groups on to others (a relay: its upstream, or a downstream
    /// that registered more ids than its own).
    fn passes_on(&self, peer: BusId) -> bool;
    /// Whether this node's application is behind on its group publishes now, and when it
    /// last was (ms), if ever (see `stream::cuts_off`).
    fn app_behind(&self) -> (bool, Option<u64>);
    /// Whether this node dialed the link to `peer` on a relay's hint (such a link carries no
    /// group traffic: both ends hear publishes by the tree).
    fn hinted(&mut self, peer: BusId) -> bool;
    /// How many groups the peer `from` may ask for (its quota, charged to whom it stands for).
    fn interest_quota(&self, from: BusId) -> usize;
    /// `from` no longer wants `group`: it stops reading this node's log of it, if it did.
    fn left_log(&mut self, from: BusId, group: &str);
    /// Hands `from`'s publish to `group` (`None`: a multicast) at `span` (a data span) of
    /// `chunk` to the application.
    fn deliver_span(&mut self, from: BusId, group: Option<&str>, chunk: &Bytes, span: Span);
    /// Hands `from`'s publishes to `group` at `spans` of `chunk`, in order, to the application.
    fn deliver_run(&mut self, from: BusId, group: &str, chunk: &Bytes, spans: Vec<Span>);
    /// Hands `from`'s `payloads` (that waited for a gap) to the application.
    fn deliver(&mut self, from: BusId, group: Option<&str>, payloads: Vec<Bytes>);
    /// Tells the host what happened.
    fn report(&mut self, report: Report);
}

/// A host for the machines' unit tests: one node, direct links to `peers` and nothing
/// behind them, every frame and report recorded.
#[cfg(test)]
pub(crate) mod fake {
    use super::*;
    use crate::group::stream::HeldBudget;
    use std::sync::Arc;

    /// Direct links only: a frame to a peer goes to it, to anyone else nowhere.
    pub(crate) struct Direct(pub Vec<BusId>);

    impl Routes for Direct {
        type Hops = ();

        fn hops(&self) {}

        fn hop(&self, _: &(), dst: BusId, except: Option<BusId>) -> Option<BusId> {
            (self.0.contains(&dst) && Some(dst) != except).then_some(dst)
        }
    }

    pub(crate) struct FakeHost {
        pub me: BusId,
        pub routes: Direct,
        pub groups: GroupState,
        pub multicasts: MulticastState,
        pub repairs: Repairs,
        pub waiting: WaitingForwards,
        /// The largest frame body the peers take.
        pub frame_max: usize,
        /// Frames queued on links: (peer, kind, bytes).
        pub pushed: Vec<(BusId, FrameKind, Vec<u8>)>,
        /// REPAIRs sent end to end: (to, bytes).
        pub repairs_sent: Vec<(BusId, Vec<u8>)>,
        pub reports: Vec<Report>,
        pub delivered: Vec<(BusId, Option<String>, Bytes)>,
        pub permissions: Option<GroupPermissions>,
        /// The peers that pass groups on.
        pub relays: Vec<BusId>,
        /// The peers whose links are full.
        pub full: Vec<BusId>,
        /// The peers read gap marks (`caps::GAP_MARKS`).
        pub gap_marks: bool,
        /// A publisher on another thread: before each look at the group state this node
        /// numbers a publish to this group, as a thread may between two holds of its lock.
        pub interleave: Option<String>,
        /// The publishes `interleave` numbered: (number, the peers it goes to).
        pub interleaved: Vec<(u64, Vec<BusId>)>,
    }

    impl FakeHost {
        pub(crate) fn new(me: u64, peers: &[u64]) -> Self {
            let held = Arc::new(HeldBudget::default());
            Self {
                me: BusId(me),
                routes: Direct(peers.iter().map(|&p| BusId(p)).collect()),
                groups: GroupState::new(1 << 20, held.clone()),
                multicasts: MulticastState::new(1 << 20, held),
                repairs: Repairs::default(),
                waiting: WaitingForwards::default(),
                frame_max: 1 << 20,
                pushed: Vec::new(),
                repairs_sent: Vec::new(),
                reports: Vec::new(),
                delivered: Vec::new(),
                permissions: None,
                relays: Vec::new(),
                full: Vec::new(),
                gap_marks: true,
                interleave: None,
                interleaved: Vec::new(),
            }
        }
    }

    impl Host for FakeHost {
        type Routes = Direct;

        fn routes(&self) -> &Direct {
            &self.routes
        }
        fn me(&self) -> (BusId, u64) {
            (self.me, 1)
        }
        fn groups<R>(&mut self, _: fn(&R) -> bool, f: impl FnOnce(&mut GroupState) -> R) -> R {
            if let Some(group) = &self.interleave {
                let p = self
                    .groups
                    .publish(group, &Bytes::from_static(b"beside"), 0);
                self.interleaved.push((p.number, p.to));
            }
            f(&mut self.groups)
        }
        fn multicasts<R>(
            &mut self,
            _: fn(&R) -> bool,
            f: impl FnOnce(&mut MulticastState) -> R,
        ) -> R {
            f(&mut self.multicasts)
        }
        fn repairs<R>(&mut self, f: impl FnOnce(&mut Repairs) -> R) -> R {
            f(&mut self.repairs)
        }
        fn may_pass_to(&self, _: BusId, _: BusId) -> bool {
            true
        }
        fn may_speak_for(&mut self, from: BusId, speaker: BusId, what: &str) -> Result<(), String> {
            (from == speaker)
                .then_some(())
                .ok_or_else(|| format!("{what} of {speaker} from {from}"))
        }
        fn push(&mut self, peer: BusId, kind: FrameKind, head: &[u8], payload: &Bytes) -> Push {
            if !self.routes.0.contains(&peer) || !self.fits(peer, head.len() + payload.len()) {
                return Push::Gone;
            }
            if self.full.contains(&peer) {
                return Push::Full;
            }
            self.pushed.push((peer, kind, [head, payload].concat()));
            Push::Sent
        }
        fn push_own_publish(&mut self, peer: BusId, head: &[u8], payload: &Bytes) -> Push {
            self.push(peer, FrameKind::Publish, head, payload)
        }
        fn send_repair(&mut self, to: BusId, head: &[u8], payload: &Bytes) -> Result<(), Unsent> {
            self.repairs_sent.push((to, [head, payload].concat()));
            Ok(())
        }
        fn has_caught_up(&self, _: BusId) -> bool {
            true
        }
        fn forwards_wait_for(&self, peer: BusId) -> bool {
            self.waiting.waits_for(peer)
        }
        fn forwards_lagging(&self, peer: BusId) -> bool {
            self.waiting.is_lagging(peer)
        }
        fn forwards<R>(&mut self, f: impl FnOnce(&mut WaitingForwards) -> R) -> R {
            f(&mut self.waiting)
        }
        fn wait_ms(&self, _: BusId) -> u64 {
            1_000
        }
        fn fits(&self, _: BusId, len: usize) -> bool {
            len <= self.frame_max
        }
        fn takes_batches(&self, _: BusId) -> bool {
            true
        }
        fn takes_gap_marks(&self, _: BusId) -> bool {
            self.gap_marks
        }
        fn owes_marks(&self) -> bool {
            !self.groups.owes_none()
        }
        fn permissions(&self) -> Option<&GroupPermissions> {
            self.permissions.as_ref()
        }
        fn passes_on(&self, peer: BusId) -> bool {
            self.relays.contains(&peer)
        }
        fn hinted(&mut self, _: BusId) -> bool {
            false
        }
        fn interest_quota(&self, _: BusId) -> usize {
            16
        }
        fn left_log(&mut self, _: BusId, _: &str) {}
        fn app_behind(&self) -> (bool, Option<u64>) {
            (false, None)
        }
        fn deliver_span(&mut self, from: BusId, group: Option<&str>, chunk: &Bytes, span: Span) {
            let payload = chunk.slice(span.range());
            self.delivered
                .push((from, group.map(str::to_owned), payload));
        }
        fn deliver_run(&mut self, from: BusId, group: &str, chunk: &Bytes, spans: Vec<Span>) {
            for span in spans {
                self.deliver_span(from, Some(group), chunk, span);
            }
        }
        fn deliver(&mut self, from: BusId, group: Option<&str>, payloads: Vec<Bytes>) {
            let group = group.map(str::to_owned);
            let each = payloads.into_iter().map(|p| (from, group.clone(), p));
            self.delivered.extend(each);
        }
        fn report(&mut self, report: Report) {
            self.reports.push(report);
        }
    }
}
