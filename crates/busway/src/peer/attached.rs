//! A peer's link: attached after its handshake (the outbox resumed where the peer says),
//! detached when it drops, cut, closed; the peer given up once down past its deadline.

use super::{Peer, PeerIntro, PeerSnapshot};
use busway_core::handshake::Established;
use std::ops::Range;

impl Peer {
    /// Attaches the authenticated link `link`: everything the peer lacks becomes unwritten again.
    /// Errors if a link is attached already (the text names it) or the handshake's numbers no
    /// longer hold. Returns how many messages written on an earlier link go out again.
    pub(crate) fn attach(&self, link: u64, est: &Established, addr: &str) -> Result<u64, String> {
        let mut st = self.lock();
        if st.slot.is_up() {
            return Err(format!(
                "bus id {} is already connected (via {})",
                self.id, st.addr
            ));
        }
        if est.own_auth.next_send_seq != st.outbox.acked()
            || est.own_auth.next_expected_seq != st.inbound_expected
        {
            return Err("the peer's state changed during the handshake; retry".into());
        }
        let written_before = st.outbox.written_end();
        let first = st
            .outbox
            .resume(est.peer_auth.next_expected_seq)
            .map_err(|e| format!("cannot resume: {e}"))?;
        let resent = written_before.saturating_sub(first);
        // Counted here, past the checks: a refused attach is no reconnect.
        self.links
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The peer resumes where it says; past what we expect only if it gave up on messages.
        st.inbound_expected = st.inbound_expected.max(est.peer_auth.next_send_seq);
        st.intro = PeerIntro::from(&est.peer);
        st.addr = addr.to_owned();
        self.set_carrier(super::Carrier::Socket);
        st.slot.attach(link);
        st.writer_idle = false;
        // The peer's AUTH acknowledged messages (those it got before the last link dropped,
        // and whose ACK was lost with it): senders waiting for that room must hear of it, as
        // no ACK frame will come for them.
        let wake = std::mem::take(&mut st.senders_waiting);
        drop(st);
        if wake {
            self.room.notify_waiters();
        }
        Ok(resent)
    }

    /// Detaches link `link` if it is the one attached; returns the detach epoch (for the
    /// deadline) and the messages still unacknowledged.
    pub(crate) fn detach(&self, link: u64) -> Option<(u64, u64)> {
        let mut st = self.lock();
        let epoch = st.detaches + 1;
        if !st.slot.detach(link, epoch) {
            return None;
        }
        st.detaches = epoch;
        Some((epoch, st.outbox.unacked()))
    }

    /// If no link came back since detach `epoch`, gives up on every unacknowledged message:
    /// returns their numbers. Later sends fail at once until a link is up again.
    pub(crate) fn expire(&self, epoch: u64, now_ms: u64) -> Option<Range<u64>> {
        let mut st = self.lock();
        if !st.slot.expire(epoch, now_ms) {
            return None;
        }
        let range = st.outbox.fail_all();
        drop(st);
        self.room.notify_waiters();
        Some(range)
    }

    /// Whether the peer has been dead (down past its deadline, nothing held) for `idle_ms` or
    /// more: the node may forget it. A link of the same incarnation coming back later starts
    /// from the numbers both sides state in the handshake; by then the peer has settled what
    /// it held for this node (see `NodeConfig::forget_after_ms`).
    pub(crate) fn dead_for(&self, now_ms: u64, idle_ms: u64) -> bool {
        let st = self.lock();
        st.slot
            .dead_since_ms()
            .is_some_and(|t| now_ms.saturating_sub(t) >= idle_ms)
    }

    /// Gives up on every message (the peer came back as a new incarnation).
    pub(crate) fn fail_all(&self) -> Range<u64> {
        let range = self.lock().outbox.fail_all();
        self.room.notify_waiters();
        range
    }

    pub(crate) fn is_up(&self) -> bool {
        self.lock().slot.is_up()
    }

    /// Asks the attached link to drop at once; false if none is attached. The request names
    /// the link and leaves a permit (`notify_one`): a link task that was not waiting yet (just
    /// up) still sees it, and a later link ignores a request meant for an earlier one.
    pub(crate) fn request_cut(&self) -> bool {
        self.cut_attached(None)
    }

    /// Closes the attached link for a lie it carried (`why` names it): the link ends as for a
    /// protocol error. False if no link is attached.
    pub(crate) fn refuse_link(&self, why: String) -> bool {
        self.cut_attached(Some(why))
    }

    fn cut_attached(&self, why: Option<String>) -> bool {
        if !self.lock().slot.cut(why) {
            return false;
        }
        self.cut.notify_one();
        true
    }

    /// Completes once a cut of link `link` was asked for (see `request_cut`): the lie that
    /// closes it, if that is why.
    pub(crate) async fn cut_requested(&self, link: u64) -> Option<String> {
        loop {
            self.cut.notified().await;
            if let Some(why) = self.lock().slot.take_cut(link) {
                return why;
            }
        }
    }

    /// No more messages; the writer drains what is queued and closes the link.
    pub(crate) fn close(&self) {
        let mut st = self.lock();
        st.closing = true;
        drop(st);
        self.writer_wake.notify_one();
        self.room.notify_waiters();
    }

    /// Whether this node closes the link because it shuts down (see `close`).
    pub(crate) fn is_closing(&self) -> bool {
        self.lock().closing
    }

    /// Whether the attached link is closing because its peer closed (see `close_link`): its
    /// reader will not free room in a ring any more. (Our own node closing is not that: the
    /// peer still reads, and what is queued goes out within the linger time.)
    pub(crate) fn is_closed_by_peer(&self) -> bool {
        self.lock().slot.closed_by_peer()
    }

    /// The attached link's writer drains what is queued, sends CLOSE and finishes.
    pub(crate) fn close_link(&self) {
        self.lock().slot.close_by_peer();
        self.writer_wake.notify_one();
    }

    pub(crate) fn snapshot(&self) -> PeerSnapshot {
        let st = self.lock();
        PeerSnapshot {
            intro: st.intro.clone(),
            addr: st.addr.clone(),
            up: st.slot.is_up(),
            unacked: st.outbox.unacked(),
            bytes: st.outbox.bytes(),
            msgs_total: st.msgs_total,
            bytes_sent: st.outbox.bytes_pushed(),
        }
    }
}
