//! What a node does with the publishes it receives (see `groups` for where they come in): a
//! PUBLISH (one publish, a batch or a mark) is taken only from a link that may speak for its
//! publisher and only as permitted, handed to the group state (`busway_core::group::intake`),
//! passed on to each peer that asked (waiting for room toward a full peer as its policy says,
//! skipped past its wait: `busway_core::group::forwards`), and what the member's stream holds
//! next is handed over in order (`handover`).

use crate::handover::Delivered;
use crate::limits::{GROUP_HOP_WAIT_MS, GROUP_SLOW_MEMBER_WAIT_MS, ROUTED_RETRY_INTERVAL_MS};
use crate::shared::Shared;
use crate::stats::bump;
use busway_core::frame::FrameKind;
use busway_core::group::forwards::Push;
use busway_core::group::intake::{Handed, Intake};
use busway_core::group::{decode_publish, split_publish_batch};
use busway_core::{group, BusId};
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

impl Shared {
    /// Passes on the publishes that wait for room, in order, as far as the queues allow
    /// (cut-off ones past their time are dropped instead, see `forward_publish`); returns the
    /// first that still waits: its peer, length and give-up time.
    pub(crate) fn push_blocked_forwards(
        &self,
    ) -> Option<(Arc<crate::peer::Peer>, usize, Option<u64>)> {
        let now_ms = self.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
        let upstream = self.upstream_id();
        let pushed = self.groups.waiting.push(now_ms, |id, body| {
            // A forward that waited may no longer go up: its publisher's range was taken back
            // meanwhile (see `forward_publish`).
            if Some(id) == upstream
                && decode_publish(body).is_ok_and(|h| !self.may_pass_to(id, h.publisher))
            {
                self.forwards_dropped(body);
                return Push::Gone;
            }
            match self
                .peer(id)
                .map(|p| p.push_framed(FrameKind::Publish, &[], body))
            {
                Some(Err(crate::peer::PushError::Full)) => Push::Full,
                Some(Ok(_)) => Push::Sent,
                // Gone: that peer will not hear it.
                _ => {
                    self.forwards_dropped(body);
                    Push::Gone
                }
            }
        });
        for (i, (id, body)) in pushed.dropped.iter().enumerate() {
            if i == 0 || pushed.dropped[i - 1].0 != *id {
                // A peer's dropped publishes come together: one skip each.
                bump(&self.counters.group_links_skipped);
            }
            self.forwards_dropped(body);
            if let Ok(head) = decode_publish(body) {
                self.groups.owe_mark(*id, head.publisher, head.name);
            }
        }
        if !pushed.dropped.is_empty() {
            tracing::debug!(
                dropped = pushed.dropped.len(),
                "a link to members stayed full: its cut-off publishes are dropped until it has room"
            );
        }
        let (id, len, give_up_at) = pushed.waits?;
        match self.peer(id) {
            Some(p) => Some((p, len, give_up_at)),
            None => self.push_blocked_forwards(),
        }
    }

    /// Waits until every publish that waited for room is passed on, or (cut-off) given up
    /// on (the caller's link, to `link_peer`, stops reading meanwhile). Not while the first
    /// waits for `link_peer` itself: the room toward it comes with the acknowledgements
    /// that link reads (unless `WAITING_BYTES_MAX` wait already).
    pub(crate) async fn wait_blocked_forwards(&self, link_peer: BusId) {
        while let Some((peer, len, give_up_at)) = self.push_blocked_forwards() {
            if peer.id == link_peer && !self.groups.waiting.over_bound() {
                return;
            }
            match give_up_at {
                None => peer.wait_for_room(len).await,
                Some(at) => {
                    let now = self.coarse_ms.load(std::sync::atomic::Ordering::Relaxed);
                    // The coarse clock moves every `ROUTED_RETRY_INTERVAL_MS`: one more
                    // interval and the give-up time is surely past on it.
                    let left = at.saturating_sub(now) + ROUTED_RETRY_INTERVAL_MS;
                    let _ =
                        tokio::time::timeout(Duration::from_millis(left), peer.wait_for_room(len))
                            .await;
                }
            }
        }
    }

    /// A PUBLISH (one publish, a batch or a mark) from the direct peer `from`, its body
    /// `body` at `start` of `chunk`: passed on, and for this node's application if a member;
    /// true if a gap is open.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn publish_received(
        &self,
        from: BusId,
        link: &mut Option<busway_core::relay::Sources>,
        chunk: &Bytes,
        start: u32,
        body: &Bytes,
        now_ms: u64,
        out: &mut Delivered<'_>,
    ) -> bool {
        let Ok(head) = decode_publish(body) else {
            return false;
        };
        let what = if head.mark { "PUBLISH mark" } else { "PUBLISH" };
        if let Err(why) = self.may_speak_for(from, head.publisher, what, link) {
            bump(&self.counters.publishes_refused);
            self.refuse_link(from, why);
            return false;
        }
        if !self.publish_permitted(head.publisher, head.name, head.count, now_ms) {
            return false;
        }
        let intake = self
            .groups
            .take_publish(self.config.id, from, body, &head, now_ms, out);
        let source = (head.publisher, head.name);
        self.act_on_intake(chunk, start as usize, source, intake, now_ms, out)
    }

    /// Acts on what the group table made of publishes of `source` (publisher, group) whose
    /// body starts at `base` of `chunk` (see `busway_core::group::intake`): passes them on,
    /// tells of a restarted stream, hands over what is next, counts copies and publishes
    /// nobody wants. True if a gap is open.
    pub(crate) fn act_on_intake(
        &self,
        chunk: &Bytes,
        base: usize,
        (publisher, group): (BusId, &str),
        intake: Intake,
        now_ms: u64,
        out: &mut Delivered<'_>,
    ) -> bool {
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        self.counters
            .group_copies_dropped
            .fetch_add(intake.copies, relaxed);
        if intake.unwanted > 0 {
            tracing::debug!(%publisher, group, "publishes for a group nobody here wants");
            self.counters
                .publishes_unwanted
                .fetch_add(intake.unwanted, relaxed);
        }
        for onward in intake.onward {
            // Made or checked by the group table: it decodes (else counted, not sent).
            let Ok(head) = decode_publish(&onward.body) else {
                for _ in &onward.to {
                    self.forwards_dropped(&onward.body);
                }
                continue;
            };
            for id in onward.to {
                self.forward_publish(id, &onward.body, &head, now_ms);
            }
        }
        if let Some(ended) = intake.ended {
            let why = format!(
                "publisher {publisher} restarted before they came (a new incarnation's stream starts afresh)"
            );
            let mut link = None;
            let host = &mut self.group_host(out, &mut link);
            group::node::skipped(host, (publisher, group), ended, (why, false), now_ms);
        }
        let at = |(start, len): (usize, usize)| ((base + start) as u32, len as u32);
        for handed in intake.handed {
            match handed {
                Handed::Spans(spans) if spans.len() == 1 => {
                    out.span(publisher, Some(group), chunk, at(spans[0]));
                }
                Handed::Spans(spans) => {
                    let spans = spans.into_iter().map(at).collect();
                    out.run(publisher, group, chunk, spans);
                }
                Handed::Waited(payloads) => out.payloads(publisher, Some(group), payloads),
            }
        }
        intake.gap
    }

    /// The publishes of a PUBLISH `body` (a batch's each) could not be passed on: counted.
    pub(crate) fn forwards_dropped(&self, body: &[u8]) {
        let n = decode_publish(body).map_or(1, |h| h.count.max(1));
        self.counters
            .group_forwards_dropped
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Passes a publish (or mark) `body` on to the peer `id`, behind any that wait for it.
    /// One that does not fit waits (the links that bring publishes stop reading meanwhile,
    /// see `push_blocked_forwards`): under backpressure as long as it takes, under cut-off
    /// at most `group_wait_ms`, then it is dropped for that peer, which is owed a mark and
    /// skipped at once while it stays full (it lags).
    pub(crate) fn forward_publish(
        &self,
        id: BusId,
        body: &Bytes,
        head: &busway_core::group::PublishHead<'_>,
        now_ms: u64,
    ) {
        let waiting = &self.groups.waiting;
        let Some(peer) = self.peer(id) else {
            self.forwards_dropped(body);
            return;
        };
        if head.batch && !peer.takes_publish_batches() {
            // A peer that does not read batches has them publish by publish.
            for one in split_publish_batch(body, head) {
                let one = Bytes::from(one);
                if let Ok(h) = decode_publish(&one) {
                    self.forward_publish(id, &one, &h, now_ms);
                }
            }
            return;
        }
        // A frame past the peer's stated limit would close its link: not sent. Nor one in
        // the name of a publisher the upstream does not hold registered for us (a publisher
        // whose registration was refused, or is on its way: see `registrations`).
        if peer.frame_body_max().is_some_and(|m| body.len() > m)
            || !self.may_pass_to(id, head.publisher)
        {
            self.forwards_dropped(body);
            return;
        }
        let lagging = !head.backpressure && waiting.is_lagging(id);
        // A lagging peer's cut-off publishes go past what waits for it (only backpressure
        // publishes do: its cut-off ones were dropped), a mark never does: it may be of one
        // of those streams (a mark does not say its stream's policy), and ahead of them it
        // would show a gap that is not there.
        if !waiting.waits_for(id) || (lagging && !head.mark) {
            match peer.push_framed(FrameKind::Publish, &[], body) {
                Ok(_) => {
                    // A look at the queue only if it lags.
                    if lagging && peer.has_caught_up() {
                        waiting.caught_up(id);
                    }
                    return;
                }
                Err(crate::peer::PushError::Full) => {}
                // Closed or given up: that peer will not hear it.
                Err(_) => {
                    self.forwards_dropped(body);
                    return;
                }
            }
        }
        if lagging {
            // Its members ask the publisher for what they missed, or are told they lost it. It is owed
            // a mark, in case this was the end of the stream.
            self.groups.owe_mark(id, head.publisher, head.name);
            self.forwards_dropped(body);
            return;
        }
        let give_up_at = (!head.backpressure).then(|| now_ms + self.group_wait_ms(&peer));
        waiting.wait(id, body.clone(), give_up_at);
    }

    /// How long a cut-off publish waits for room toward `peer`: `GROUP_HOP_WAIT_MS` if it
    /// passes groups on, `GROUP_SLOW_MEMBER_WAIT_MS` otherwise.
    pub(crate) fn group_wait_ms(&self, peer: &crate::peer::Peer) -> u64 {
        if self.passes_groups_on(peer) {
            GROUP_HOP_WAIT_MS
        } else {
            GROUP_SLOW_MEMBER_WAIT_MS
        }
    }
}
