//! The application's receive side: messages from every link, bounded in bytes.
//!
//! A link hands over what one `read` produced as one [`MessageBatch`]: one shared buffer and the
//! places of the payloads in it, so neither a copy nor a reference count is paid per message,
//! and the channel and the wake-up are paid once per batch. A link first takes byte permits for
//! its batch; while the inbox holds its limit, links stop reading and the kernel's flow control
//! slows the senders. Nothing is dropped.
//!
//! A link that switched to shared memory hands its peer's ring to the inbox instead, and the
//! application reads it directly (see `ring_rx`): `recv` looks at its rings and its channel in
//! turn, spins `NodeConfig::shm_spins` times over them while it has rings and nothing is ready,
//! then sleeps until a ring's waiter thread or a link wakes it. A ring that fills stops its
//! sender the same way a full inbox does. A ring batch goes behind whatever the channel held
//! when it was read (`busway_core::take_order`): a peer's messages relayed or written again
//! over a socket around its switch to a direct link are in the channel, acknowledged, before
//! the peer writes what follows them into its ring.
//!
//! Publishes to a group (see `groups`) take another way in: each node decides the order of a
//! publisher's stream in one place (a gap holds later publishes until its repair comes, by
//! whichever link), and hands the batches over in that order (`busway_core::turns`), without
//! waiting for permits (`InboxSender::deliver_reserved`). They count against
//! `GROUP_INBOX_BYTES_MAX` instead: past it, links stop reading (socket links wait for room,
//! ring readers leave their rings unread) until the application takes them.

use crate::node::message::{Message, MessageBatch};
use crate::peer::deferred::Deferred;
use crate::peer::ring_rx::{InboundRing, Polled, WakeInbox};
use busway_core::take_order::{Sources, TakeOrder};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, Notify, Semaphore};

/// Bytes of group publishes handed to the inbox and not yet taken by the application; past
/// it, links stop reading until the application takes some.
pub(crate) const GROUP_INBOX_BYTES_MAX: usize = 8 << 20;

/// Spins of a waiting inbox between two yields to the runtime.
const INBOX_SPINS_PER_YIELD: u32 = 64;
/// Empty looks (each followed by a yield to the tasks sharing the thread) an inbox makes at
/// a peer's group log that had records, before it sleeps: a log in use gets its next record
/// soon, and waking a sleeping reader costs a system call on each side. Spin, then yield, then
/// sleep, as Aeron's back-off idle strategy does. With a hundred members of one publisher on
/// a thread, 16 looks left 38 ns per delivery, 256 looks 23-28 ns (`docs/BENCHMARKS.md`); an
/// inbox alone on its thread yields back at once, so 256 looks last about 50-100 us.
const INBOX_LOG_LOOKS_BEFORE_SLEEP: u32 = 256;

pub(crate) enum Delivery {
    /// Messages from a socket link, holding `permits` of the inbox's byte budget.
    Batch { batch: MessageBatch, permits: u32 },
    /// Publishes to a group, in their stream's order, counted in `GroupBacklog`.
    Group { batch: MessageBatch, bytes: usize },
    /// A peer's ring, to read from now on (after every batch sent before it).
    Ring(InboundRing),
    /// Something may be ready in a ring (or a ring's link ended): look again.
    Wake,
}

/// Wakes a sleeping inbox; does not keep it open (a node that is gone closes it).
#[derive(Clone)]
pub(crate) struct InboxWaker(mpsc::WeakUnboundedSender<Delivery>);

impl WakeInbox for InboxWaker {
    fn wake(&self) -> bool {
        self.0
            .upgrade()
            .is_some_and(|tx| tx.send(Delivery::Wake).is_ok())
    }
}

/// Group publishes in the channel, in bytes, and the wake-up of links waiting for room.
#[derive(Default)]
pub(crate) struct GroupBacklog {
    bytes: AtomicUsize,
    room: Notify,
}

impl GroupBacklog {
    fn is_full(&self) -> bool {
        self.bytes.load(Relaxed) > GROUP_INBOX_BYTES_MAX
    }

    /// The application took `bytes`: links waiting for room look again.
    fn taken(&self, bytes: usize) {
        let before = self.bytes.fetch_sub(bytes, Relaxed);
        if before > GROUP_INBOX_BYTES_MAX && before - bytes <= GROUP_INBOX_BYTES_MAX {
            self.room.notify_waiters();
        }
    }
}

/// The sending half, cloned into every link.
#[derive(Clone)]
pub(crate) struct InboxSender {
    tx: mpsc::UnboundedSender<Delivery>,
    budget: Arc<Semaphore>,
    limit: u32,
    groups: Arc<GroupBacklog>,
}

/// The application's end. Owned by one task at a time (`recv` takes `&mut self`).
///
/// Besides handing over messages, `recv`, `recv_batch` and their `try_` forms do work on the
/// application's thread, because that is where a peer's shared-memory ring is read (no
/// hand-off to another thread on the way in):
/// - what a ring brings is dispatched as a socket's reads are: group publishes are passed on
///   to the members behind this node and ordered into their streams (a gap asks the
///   publisher for a repair), replies end the calls waiting for them, a peer's offers of its
///   group logs are attached, and the logs are read;
/// - each look first publishes into their rings the single sends this node's own senders left
///   waiting for the end of a burst (see `Node::send`), so that a loop of sends then a wait
///   for the answers costs one ring publication, not one per send.
///
/// An inbox nobody reads therefore also holds up those rings' acknowledgements and their
/// group traffic: a node that receives nothing should take its inbox and drop it
/// (`Node::take_inbox`).
pub struct Inbox {
    /// The channel and the rings the batches come from.
    sources: InboxSources,
    /// Which of them goes next, and what was taken out of order (see `TakeOrder`: a ring
    /// batch goes behind what the channel held when it was read).
    order: TakeOrder<Delivery, MessageBatch>,
    /// A batch being read message by message, and the index of the next message.
    current: Option<(MessageBatch, usize)>,
    /// Looks over rings and channel before sleeping, while there are rings.
    spins: u32,
    waker: InboxWaker,
    /// Single sends of this node waiting to be published into rings: published before the
    /// inbox looks for messages (the application's next await is often here).
    deferred: Arc<Deferred>,
}

/// The application's channel and the peers' rings it reads directly.
struct InboxSources {
    rx: mpsc::UnboundedReceiver<Delivery>,
    budget: Arc<Semaphore>,
    groups: Arc<GroupBacklog>,
    /// Peers' rings read directly.
    rings: Vec<InboundRing>,
    /// The ring looked at first next time (round robin).
    next_ring: usize,
    /// A ring read queued an acknowledgement: let the link task run before returning.
    ack_queued: bool,
    /// A ring read held only replies, which woke their callers: let them run before spinning.
    answered: bool,
    /// The channel said the node is gone.
    closed: bool,
}

pub(crate) fn inbox(
    limit_bytes: usize,
    spins: u32,
    deferred: Arc<Deferred>,
) -> (InboxSender, Inbox) {
    let limit = u32::try_from(limit_bytes).unwrap_or(u32::MAX);
    let budget = Arc::new(Semaphore::new(limit as usize));
    let (tx, rx) = mpsc::unbounded_channel();
    let waker = InboxWaker(tx.downgrade());
    let groups = Arc::new(GroupBacklog::default());
    (
        InboxSender {
            tx,
            budget: budget.clone(),
            limit,
            groups: groups.clone(),
        },
        Inbox {
            sources: InboxSources {
                rx,
                budget,
                groups,
                rings: Vec::new(),
                next_ring: 0,
                ack_queued: false,
                answered: false,
                closed: false,
            },
            order: TakeOrder::default(),
            current: None,
            spins,
            waker,
            deferred,
        },
    )
}

impl busway_core::turns::Sink<MessageBatch> for InboxSender {
    /// Counts `bytes` of group publishes decided for the application, sent or not yet (see
    /// `busway_core::turns`: ones that wait for an earlier turn count too, so links stop
    /// reading for them as for those in the channel).
    fn reserve(&self, bytes: usize) {
        self.groups.bytes.fetch_add(bytes, Relaxed);
    }

    /// Hands group publishes, their `footprint` reserved, to the application now, in the
    /// order given (callers hand over in the order their streams were decided, see
    /// `busway_core::turns`); false if the inbox is gone.
    fn deliver_reserved(&self, batch: MessageBatch) -> bool {
        let bytes = batch.footprint();
        let sent = self.tx.send(Delivery::Group { batch, bytes }).is_ok();
        if !sent {
            self.groups.taken(bytes);
        }
        sent
    }
}

impl InboxSender {
    /// Whether the group publishes the application has not taken are past
    /// `GROUP_INBOX_BYTES_MAX`: links should stop reading.
    pub(crate) fn group_backlogged(&self) -> bool {
        self.groups.is_full() && !self.tx.is_closed()
    }

    /// Waits until the group publishes not taken are back within `GROUP_INBOX_BYTES_MAX` (or
    /// the application dropped its inbox).
    pub(crate) async fn wait_group_room(&self) {
        loop {
            let room = self.groups.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if !self.group_backlogged() {
                return;
            }
            tokio::select! {
                _ = room => {}
                _ = self.tx.closed() => return,
            }
        }
    }

    fn permits(&self, batch: &MessageBatch) -> u32 {
        u32::try_from(batch.footprint())
            .unwrap_or(u32::MAX)
            .min(self.limit)
    }

    /// Hands a batch to the application, waiting while the inbox is full. Returns false if the
    /// application dropped its inbox (the batch is discarded: nobody is left to read it).
    pub(crate) async fn deliver(&self, batch: MessageBatch) -> bool {
        let permits = self.permits(&batch);
        match self.budget.acquire_many(permits).await {
            Ok(p) => p.forget(),
            Err(_) => return false,
        }
        self.tx.send(Delivery::Batch { batch, permits }).is_ok()
    }

    /// Hands a peer's ring to the application, or gives it back if the inbox is gone.
    pub(crate) fn add_ring(&self, ring: InboundRing) -> Result<(), Box<InboundRing>> {
        self.tx.send(Delivery::Ring(ring)).map_err(|e| match e.0 {
            Delivery::Ring(r) => Box::new(r),
            _ => unreachable!("sent a ring"),
        })
    }

    /// Makes a sleeping inbox look at its rings again.
    pub(crate) fn wake(&self) {
        let _ = self.tx.send(Delivery::Wake);
    }

    /// Like `deliver`, without waiting: false if the inbox is full or gone (for tests; the
    /// node tells the two apart with `deliver_now`).
    #[cfg(test)]
    pub(crate) fn try_deliver(&self, batch: MessageBatch) -> bool {
        self.deliver_now(batch).unwrap_or(false)
    }

    /// Like `deliver`, without waiting: the batch back if the inbox is full; otherwise
    /// whether it was delivered (false: the application dropped its inbox).
    pub(crate) fn deliver_now(&self, batch: MessageBatch) -> Result<bool, MessageBatch> {
        let permits = self.permits(&batch);
        match self.budget.try_acquire_many(permits) {
            Ok(p) => p.forget(),
            Err(tokio::sync::TryAcquireError::NoPermits) => return Err(batch),
            Err(tokio::sync::TryAcquireError::Closed) => return Ok(false),
        }
        Ok(self.tx.send(Delivery::Batch { batch, permits }).is_ok())
    }
}

impl Sources for InboxSources {
    type Delivery = Delivery;
    type Batch = MessageBatch;

    fn try_channel(&mut self) -> Option<Delivery> {
        match self.rx.try_recv() {
            Ok(d) => Some(d),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                self.closed = true;
                None
            }
        }
    }

    /// Takes a delivery from the channel: a batch to return, or bookkeeping.
    fn accept(&mut self, d: Delivery) -> Option<MessageBatch> {
        match d {
            Delivery::Batch { batch, permits } => {
                self.budget.add_permits(permits as usize);
                Some(batch)
            }
            Delivery::Group { batch, bytes } => {
                self.groups.taken(bytes);
                Some(batch)
            }
            Delivery::Ring(r) => {
                self.rings.push(r);
                None
            }
            Delivery::Wake => None,
        }
    }

    /// A batch from the rings, round robin; drops rings that are done with.
    fn poll_rings(&mut self) -> Option<MessageBatch> {
        let n = self.rings.len();
        let mut found = None;
        let mut gone = false;
        for k in 0..n {
            let i = (self.next_ring + k) % n;
            match self.rings[i].poll() {
                Polled::Batch(b, ack_queued) => {
                    self.ack_queued |= ack_queued;
                    self.next_ring = i + 1;
                    found = Some(b);
                    break;
                }
                Polled::Answered => self.answered = true,
                Polled::Empty => {}
                Polled::Gone => gone = true,
            }
        }
        if gone {
            self.rings.retain(|r| !r.is_gone());
        }
        found
    }
}

impl Inbox {
    /// The rest of a batch that `recv` had started on, if any.
    fn take_current(&mut self) -> Option<MessageBatch> {
        let (mut batch, next) = self.current.take()?;
        batch.skip(next);
        (!batch.is_empty()).then_some(batch)
    }

    /// A batch that is ready now, from the rings or the channel, in order (`TakeOrder`);
    /// `Err` once the node is gone and its rings are read out.
    fn poll_ready(&mut self) -> Result<Option<MessageBatch>, TryRecvError> {
        match self.order.next(&mut self.sources) {
            Some(b) => Ok(Some(b)),
            None if self.sources.closed => Err(TryRecvError::Disconnected),
            None => Ok(None),
        }
    }

    /// The next batch, waiting for one: spins over rings and channel first while there are
    /// rings, then sleeps.
    async fn next_batch(&mut self) -> Option<MessageBatch> {
        self.deferred.publish_all();
        let mut spins = 0;
        loop {
            match self.poll_ready() {
                Ok(Some(b)) => {
                    if !std::mem::take(&mut self.sources.ack_queued) {
                        return Some(b);
                    }
                    // The link task may share this thread (`IoThreads::Current`): let it send
                    // the ACK. The batch waits in `current` meanwhile, so that a caller that
                    // drops this future at the yield (`select!`, `timeout`) loses nothing: its
                    // messages are counted and acknowledged already.
                    self.current = Some((b, 0));
                    tokio::task::yield_now().await;
                    if let Some(b) = self.take_current() {
                        return Some(b);
                    }
                }
                Ok(None) => {}
                Err(_) => return None,
            }
            if std::mem::take(&mut self.sources.answered) {
                // Callers were woken by their replies: let them run now (they may share this
                // thread), then spin afresh for what they send next.
                spins = 0;
                tokio::task::yield_now().await;
                continue;
            }
            if !self.sources.rings.is_empty() && spins < self.spins {
                spins += 1;
                std::hint::spin_loop();
                if spins % INBOX_SPINS_PER_YIELD == 0 {
                    // Spinning must not starve tasks that share this thread.
                    tokio::task::yield_now().await;
                }
                continue;
            }
            spins = 0;
            if self
                .sources
                .rings
                .iter()
                .any(|r| r.log_read_within(INBOX_LOG_LOOKS_BEFORE_SLEEP))
            {
                tokio::task::yield_now().await;
                continue;
            }
            for r in &mut self.sources.rings {
                r.arm(&self.waker);
            }
            // A record published after the last look makes the armed waiter fire at once.
            let waiting = self.deferred.app_waiting();
            let delivery = self.sources.rx.recv().await;
            drop(waiting);
            match delivery {
                Some(d) => {
                    if let Some(b) = self.sources.accept(d) {
                        return Some(b);
                    }
                }
                None => return self.order.from_rings(&mut self.sources),
            }
        }
    }

    /// The next message; `None` once the node is gone and everything was read.
    pub async fn recv(&mut self) -> Option<Message> {
        loop {
            if let Some(m) = self.next_of_current() {
                return Some(m);
            }
            let batch = self.next_batch().await?;
            self.current = Some((batch, 0));
        }
    }

    /// The next message if one is ready now (`None`: none is, or the node is gone and
    /// everything was read). Does the same work `recv` does before it would wait.
    pub fn try_recv(&mut self) -> Option<Message> {
        loop {
            if let Some(m) = self.next_of_current() {
                return Some(m);
            }
            self.deferred.publish_all();
            let batch = self.poll_ready().ok().flatten()?;
            self.current = Some((batch, 0));
        }
    }

    /// The next message of the batch being read, if any is left.
    fn next_of_current(&mut self) -> Option<Message> {
        let (batch, next) = self.current.as_mut()?;
        if *next < batch.len() {
            *next += 1;
            // The request (if it is one) moves to the message: answered or dropped by the
            // application, not kept alive by the rest of the batch.
            return Some(batch.take_message(*next - 1));
        }
        self.current = None;
        None
    }

    /// The next batch of messages (all from one sender, in order); `None` once the node is gone
    /// and everything was read. The fastest way to receive.
    pub async fn recv_batch(&mut self) -> Option<MessageBatch> {
        if let Some(b) = self.take_current() {
            return Some(b);
        }
        self.next_batch().await
    }

    /// The next batch if one is ready now.
    pub fn try_recv_batch(&mut self) -> Option<MessageBatch> {
        self.deferred.publish_all();
        if let Some(b) = self.take_current() {
            return Some(b);
        }
        self.poll_ready().ok().flatten()
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        // Wake links waiting for room: their batches now have nowhere to go.
        self.sources.budget.close();
        // Rings handed to the application that it will not read: read and discard them on
        // threads of their own, so that their messages are acknowledged (as on a socket) and
        // their writers do not wait on a reader that is gone. A ring handed over after the
        // close is refused and goes to such a thread by itself (`ShmLink::switch_in`).
        let s = &mut self.sources;
        s.rx.close();
        let taken: Vec<Delivery> = self.order.drain_ahead().collect();
        for d in taken
            .into_iter()
            .chain(std::iter::from_fn(|| s.rx.try_recv().ok()))
        {
            if let Delivery::Ring(r) = d {
                s.rings.push(r);
            }
        }
        for r in s.rings.drain(..) {
            r.discard_on_a_thread();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use busway_core::body::Span;
    use busway_core::BusId;
    use bytes::Bytes;

    /// Group publishes that wait for their turn (`busway_core::turns`) hold links back as
    /// those in the channel do, from their reservation until the application takes them.
    #[tokio::test]
    async fn reserved_group_bytes_hold_links_back_until_taken() {
        use busway_core::turns::Sink;
        let (tx, mut rx) = inbox(1 << 30, 0, Arc::default());
        let batch = MessageBatch::single(BusId(1), Bytes::from(vec![0; GROUP_INBOX_BYTES_MAX + 1]));
        tx.reserve(batch.footprint());
        assert!(tx.group_backlogged(), "reserved, not sent yet");
        assert!(tx.deliver_reserved(batch));
        assert!(tx.group_backlogged(), "sent, not taken");
        assert!(rx.try_recv_batch().is_some());
        assert!(!tx.group_backlogged(), "taken");
    }

    #[tokio::test]
    async fn try_recv_takes_what_is_ready_one_message_at_a_time() {
        let (tx, mut rx) = inbox(1 << 20, 0, Arc::default());
        assert!(rx.try_recv().is_none(), "nothing yet");
        let buf = Bytes::from_static(b"aabbb");
        assert!(tx.try_deliver(MessageBatch::new(
            BusId(9),
            buf,
            vec![Span::data(0, 2), Span::data(2, 3)]
        )));
        let got: Vec<Bytes> = std::iter::from_fn(|| rx.try_recv().map(|m| m.payload)).collect();
        assert_eq!(got, [&b"aa"[..], &b"bbb"[..]]);
        assert!(rx.try_recv().is_none(), "all taken");
        drop(tx);
        assert!(rx.try_recv().is_none(), "gone");
    }

    #[tokio::test]
    async fn recv_and_recv_batch_see_every_message_once_in_order() {
        let (tx, mut rx) = inbox(1 << 20, 0, Arc::default());
        let buf = Bytes::from_static(b"aabbbcc");
        assert!(
            tx.deliver(MessageBatch::new(
                BusId(9),
                buf,
                vec![Span::data(0, 2), Span::data(2, 3), Span::data(5, 2)]
            ))
            .await
        );
        assert!(tx.try_deliver(MessageBatch::single(BusId(8), Bytes::from_static(b"z"))));
        let first = rx.recv().await.unwrap();
        assert_eq!((first.src, &first.payload[..]), (BusId(9), &b"aa"[..]));
        let rest = rx.recv_batch().await.unwrap();
        assert_eq!(
            rest.iter().collect::<Vec<_>>(),
            vec![&b"bbb"[..], &b"cc"[..]]
        );
        let z = rx.try_recv_batch().unwrap();
        assert_eq!((z.src(), z.payload(0)), (BusId(8), &b"z"[..]));
        assert!(rx.try_recv_batch().is_none());
    }

    #[tokio::test]
    async fn a_full_inbox_refuses_without_waiting() {
        let (tx, _rx) = inbox(4, 0, Arc::default());
        assert!(tx.try_deliver(MessageBatch::single(BusId(1), Bytes::from_static(b"1234"))));
        assert!(!tx.try_deliver(MessageBatch::single(BusId(1), Bytes::from_static(b"5"))));
    }
}
