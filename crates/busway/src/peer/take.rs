//! What a link's writer takes from its peer to write on the socket (`Take`), and the ACK of a
//! read, which the writer may hold back a moment for the application's answer.

use super::{Peer, Take};
use bytes::Bytes;

impl Peer {
    /// Queues the ACK of a read, as `push_control` does; `answerable`: the application was
    /// waiting in its inbox for what the read delivered, and may answer at once (the writer
    /// may then hold the ACK back a moment for the answer: see `Take::Control`).
    pub(crate) fn push_ack(&self, frame: Bytes, answerable: bool) {
        let mut st = self.lock();
        if st.slot.is_up() {
            st.outbox.push_control_frame(frame);
            st.ack_answerable = answerable;
            self.wake_writer(st);
        }
    }

    /// Moves everything unwritten into `batch` (for the writer of link `link`).
    pub(crate) fn take(&self, batch: &mut Vec<Bytes>) -> Take {
        let mut st = self.lock();
        if st.held {
            if !st.outbox.has_control() {
                if st.closing || st.slot.closed_by_peer() {
                    return Take::Drained;
                }
                st.writer_idle = true;
                return Take::Idle;
            }
            st.outbox.take_control(batch);
            drop(st);
            self.forward_room.notify_waiters();
            return Take::Data;
        }
        if !st.outbox.has_unwritten() {
            if st.closing || st.slot.closed_by_peer() {
                return Take::Drained;
            }
            st.writer_idle = true;
            return Take::Idle;
        }
        let had_control = st.outbox.control_bytes() > 0;
        // A lone ACK of what the application waited for (no message, no other control frame,
        // no close coming) may wait for the answer that would go with it (see
        // `Take::Control`): the next push wakes the writer.
        let lone_ack = std::mem::take(&mut st.ack_answerable)
            && st.outbox.only_an_ack_waits()
            && !st.outbox.has_unwritten_messages()
            && !st.closing
            && !st.slot.closed_by_peer();
        st.writer_idle = lone_ack;
        st.outbox.take_unwritten(batch);
        drop(st);
        if had_control {
            self.forward_room.notify_waiters();
        }
        if lone_ack {
            Take::Control
        } else {
            Take::Data
        }
    }
}
