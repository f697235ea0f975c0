//! What a node makes of a PUBLISH a peer passed it (one publish, a batch or a mark), once it
//! found that the link may speak for the publisher and the publisher may publish there: the
//! group state's answer ([`GroupState::received`], [`GroupState::received_run`]) turned into
//! what to pass on to whom, what to hand to this node's application, in order, and what to
//! count. Sans-IO: the runtime and the group simulation act on it alike.

use super::state::{Fresh, GroupState, Run};
use super::stream::{Offer, Skipped};
use super::{encode_publish_body, for_each_publish, PublishHead};
use crate::BusId;
use bytes::Bytes;

/// A PUBLISH body to pass on: the frame as it came, or (a batch that was not all new here)
/// the part of it that is, made anew.
#[derive(Debug, PartialEq, Eq)]
pub struct Onward {
    /// The peers that asked for it (never its publisher nor the peer it came from).
    pub to: Vec<BusId>,
    /// The PUBLISH body to send them.
    pub body: Bytes,
}

/// Publishes for this node's application, in their stream's order.
#[derive(Debug, PartialEq, Eq)]
pub enum Handed {
    /// Payloads at `(start, len)` of the body received.
    Spans(Vec<(usize, usize)>),
    /// Payloads that waited for a gap before them to fill.
    Waited(Vec<Bytes>),
}

/// What to do with a PUBLISH received (see the module doc), in this order: pass `onward` on,
/// tell the application of `ended`, hand it `handed`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Intake {
    /// The PUBLISH bodies to pass on, each to its peers.
    pub onward: Vec<Onward>,
    /// The publisher restarted: what its old stream held and what it never got.
    pub ended: Option<Skipped>,
    /// Publishes for this node's application, in their stream's order.
    pub handed: Vec<Handed>,
    /// A gap is open in this member's stream: ask for it.
    pub gap: bool,
    /// Publishes (or marks) dropped as copies already seen.
    pub copies: u64,
    /// Publishes nobody here wants (no member, nobody to pass them on to), dropped.
    pub unwanted: u64,
    /// Publishes a gap mark named dropped on the way before where the member's stream began:
    /// they never come (the member is told).
    pub lost_before: u64,
}

impl Intake {
    /// Whether it hands the application anything, or tells it of an ended stream: only then
    /// does its order among other deliveries matter.
    pub fn delivers(&self) -> bool {
        !self.handed.is_empty() || self.ended.is_some()
    }

    /// What the group state made of one publish or mark received (its payload at `payload`
    /// of the body): `fresh`, or `None` for a copy. Its peers to pass it on to were taken.
    fn one(&mut self, fresh: Option<Fresh>, payload: (usize, usize)) {
        let Some(fresh) = fresh else {
            self.copies += 1;
            return;
        };
        self.unwanted += u64::from(fresh.unwanted);
        self.lost_before += fresh.lost_before;
        if fresh.ended.is_some() {
            self.ended = fresh.ended;
        }
        match fresh.offer {
            Some(Offer::Deliver { then }) => {
                self.handed.push(Handed::Spans(vec![payload]));
                if !then.is_empty() {
                    self.handed.push(Handed::Waited(then));
                }
            }
            Some(Offer::Stale) => self.copies += 1,
            _ => {}
        }
        // The stream as the last publish left it.
        self.gap = fresh.gap;
    }
}

impl GroupState {
    /// A PUBLISH (one publish, a batch or a mark) from the peer `from` (this node is `me`),
    /// its body `body` and its head `head` as `decode_publish` read them, at `now_ms`.
    pub fn take_publish(
        &mut self,
        me: BusId,
        from: BusId,
        body: &Bytes,
        head: &PublishHead,
        now_ms: u64,
    ) -> Intake {
        let mut out = Intake::default();
        let not_back = |to: Vec<BusId>| -> Vec<BusId> {
            to.into_iter().filter(|&p| p != head.publisher).collect()
        };
        if !head.batch {
            let payload = (head.payload_at, body.len() - head.payload_at);
            let fresh = self.received(me, from, head, now_ms, || body.slice(head.payload_at..));
            if let Some(f) = &fresh {
                let to = not_back(f.forward_to.clone());
                if !to.is_empty() {
                    out.onward.push(Onward {
                        to,
                        body: body.clone(),
                    });
                }
            }
            out.one(fresh, payload);
            return out;
        }
        let mut heads = Vec::with_capacity(head.count as usize);
        let mut spans = Vec::with_capacity(head.count as usize);
        for_each_publish(body, head, |number, at, len| {
            heads.push(PublishHead {
                number,
                payload_at: at,
                batch: false,
                count: 1,
                ..*head
            });
            spans.push((at, len));
        });
        self.intake_run(me, from, &heads, body, spans, Some(body), now_ms)
    }

    /// Publishes of one publisher to one group in its order, not marks (a read of its group
    /// log, whose numbers may skip: the caller checked them, see `log_records`), `heads`,
    /// their payloads at `spans` of `buf`, from the peer `from`. What is passed on goes one
    /// PUBLISH per record, under its own number.
    pub fn take_run(
        &mut self,
        me: BusId,
        from: BusId,
        heads: &[PublishHead],
        buf: &Bytes,
        spans: Vec<(usize, usize)>,
        now_ms: u64,
    ) -> Intake {
        self.intake_run(me, from, heads, buf, spans, None, now_ms)
    }

    /// [`GroupState::take_run`], passed on as `whole` (a batch as it came) when all of them
    /// are new here.
    #[allow(clippy::too_many_arguments)]
    fn intake_run(
        &mut self,
        me: BusId,
        from: BusId,
        heads: &[PublishHead],
        buf: &Bytes,
        spans: Vec<(usize, usize)>,
        whole: Option<&Bytes>,
        now_ms: u64,
    ) -> Intake {
        let mut out = Intake::default();
        let Some(first) = heads.first() else {
            return out;
        };
        let not_back = |to: Vec<BusId>| -> Vec<BusId> {
            to.into_iter().filter(|&p| p != first.publisher).collect()
        };
        let payload = |i: usize| {
            let (at, len) = spans[i];
            buf.slice(at..at + len)
        };
        match self.received_run(me, from, heads, now_ms, payload, whole.is_none()) {
            Run::Whole {
                forward_to,
                delivered,
                gap,
                unwanted,
            } => {
                let to = not_back(forward_to);
                match whole {
                    _ if to.is_empty() => {}
                    Some(b) => out.onward.push(Onward {
                        to,
                        body: b.clone(),
                    }),
                    // A log's records go on one by one, as they were published.
                    None => {
                        for (i, head) in heads.iter().enumerate() {
                            out.onward.push(Onward {
                                to: to.clone(),
                                body: publish_body(head, &[payload(i)]),
                            });
                        }
                    }
                }
                out.gap = gap;
                out.unwanted = if unwanted { heads.len() as u64 } else { 0 };
                if delivered {
                    out.handed.push(Handed::Spans(spans));
                }
            }
            Run::Each(fresh) => {
                // The publishes to pass on, and to whom: those new here are in a row (the
                // tail, as numbers ascend), one frame per run going to the same peers.
                let mut onward: Vec<(usize, Vec<BusId>)> = Vec::new();
                for (i, mut f) in fresh.into_iter().enumerate() {
                    if let Some(f) = f.as_mut().filter(|f| !f.forward_to.is_empty()) {
                        onward.push((i, not_back(std::mem::take(&mut f.forward_to))));
                    }
                    out.one(f, spans[i]);
                }
                onward.retain(|(_, to)| !to.is_empty());
                out.onward
                    .extend(onward_in_rows(heads, &onward, whole.is_some(), payload));
            }
        }
        out
    }
}

/// The frames that pass on the fresh publishes `onward` (index in `heads`, peers to go to).
/// Of a batch (`batched`), publishes numbered in a row (of one incarnation) going to the same
/// peers share a frame; a log's records go one by one.
fn onward_in_rows(
    heads: &[PublishHead],
    onward: &[(usize, Vec<BusId>)],
    batched: bool,
    payload: impl Fn(usize) -> Bytes,
) -> Vec<Onward> {
    let in_a_row = |a: &(usize, Vec<BusId>), b: &(usize, Vec<BusId>)| {
        let (x, y) = (&heads[a.0], &heads[b.0]);
        batched && y.number == x.number + 1 && y.incarnation == x.incarnation && a.1 == b.1
    };
    onward
        .chunk_by(in_a_row)
        .map(|run| {
            let parts: Vec<Bytes> = run.iter().map(|&(i, _)| payload(i)).collect();
            Onward {
                to: run[0].1.clone(),
                body: publish_body(&heads[run[0].0], &parts),
            }
        })
        .collect()
}

/// The PUBLISH body of `payloads`, publishes in a row from `first`'s number (see
/// [`encode_publish_body`]).
pub fn publish_body(first: &PublishHead, payloads: &[Bytes]) -> Bytes {
    let parts: Vec<&[u8]> = payloads.iter().map(|p| &p[..]).collect();
    Bytes::from(encode_publish_body(first, &parts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::{decode_publish, encode_publish_head};

    const G: &str = "g";

    fn publishes(from: u64, n: u64) -> Vec<Bytes> {
        (from..from + n)
            .map(|i| Bytes::copy_from_slice(&i.to_le_bytes()))
            .collect()
    }

    fn take(state: &mut GroupState, body: Bytes) -> Intake {
        let head = decode_publish(&body).unwrap();
        state.take_publish(BusId(1), BusId(2), &body, &head, 0)
    }

    fn first(number: u64) -> PublishHead<'static> {
        PublishHead {
            publisher: BusId(7),
            incarnation: 1,
            number,
            name: G,
            payload_at: 0,
            mark: false,
            backpressure: false,
            batch: false,
            count: 1,
            gap_from: None,
        }
    }

    #[test]
    fn a_relay_passes_a_new_batch_on_as_it_came_and_only_the_new_tail_of_one_it_half_saw() {
        let mut relay = GroupState::new(1 << 20, Default::default());
        relay.interest(BusId(3), true, G, 16);
        relay.interest(BusId(7), true, G, 16);
        let batch = publish_body(&first(1), &publishes(1, 4));
        let got = take(&mut relay, batch.clone());
        // Never back to its publisher (7 asked too).
        assert_eq!(
            got.onward,
            vec![Onward {
                to: vec![BusId(3)],
                body: batch
            }]
        );
        assert!(got.handed.is_empty() && got.copies == 0);
        // 3 and 4 again with 5 and 6: 5 and 6 go on as a batch of their own.
        let got = take(&mut relay, publish_body(&first(3), &publishes(3, 4)));
        assert_eq!(got.copies, 2);
        assert_eq!(
            got.onward,
            vec![Onward {
                to: vec![BusId(3)],
                body: publish_body(&first(5), &publishes(5, 2))
            }]
        );
        // And one new publish after copies goes on as a single PUBLISH.
        let got = take(&mut relay, publish_body(&first(6), &publishes(6, 2)));
        let body = &got.onward[0].body;
        let head = decode_publish(body).unwrap();
        assert!(!head.batch && head.number == 7 && body[head.payload_at..] == 7u64.to_le_bytes());
    }

    /// Records of a group log (bodies one after another in `buf`) as `take_run` takes them.
    fn log_run(state: &mut GroupState, numbers: &[u64], len: usize) -> Intake {
        let mut buf = Vec::new();
        let mut heads = Vec::new();
        let mut spans = Vec::new();
        for &n in numbers {
            let start = buf.len();
            buf.extend_from_slice(&encode_publish_head(BusId(7), 1, n, G));
            let at = buf.len();
            buf.extend(std::iter::repeat_n(n as u8, len));
            heads.push(PublishHead {
                number: n,
                payload_at: at - start,
                ..first(n)
            });
            spans.push((at, len));
        }
        state.take_run(BusId(1), BusId(7), &heads, &Bytes::from(buf), spans, 0)
    }

    #[test]
    fn a_logs_records_go_on_one_by_one_under_their_own_numbers() {
        let mut relay = GroupState::new(1 << 20, Default::default());
        relay.interest(BusId(3), true, G, 16);
        // 5 and 7 (6 went by the link), each 70,000 bytes: more than a batch could hold.
        for numbers in [&[5u64, 7][..], &[8, 9]] {
            let got = log_run(&mut relay, numbers, 70_000);
            let sent: Vec<(u64, bool, usize)> = got
                .onward
                .iter()
                .map(|o| {
                    let h = decode_publish(&o.body).unwrap();
                    assert_eq!(o.to, vec![BusId(3)]);
                    (h.number, h.batch, o.body.len() - h.payload_at)
                })
                .collect();
            let want: Vec<(u64, bool, usize)> =
                numbers.iter().map(|&n| (n, false, 70_000)).collect();
            assert_eq!(sent, want);
        }
        // Half new (9 seen): 10 alone, under its number.
        let got = log_run(&mut relay, &[9, 10], 10);
        assert_eq!(got.copies, 1);
        let h = decode_publish(&got.onward[0].body).unwrap();
        assert_eq!((got.onward.len(), h.number, h.batch), (1, 10, false));
    }

    #[test]
    fn a_member_takes_a_batch_next_in_its_stream_as_one_run_and_holds_one_after_a_gap() {
        let mut member = GroupState::new(1 << 20, Default::default());
        member.join(G).unwrap();
        let single = publish_body(&first(1), &publishes(1, 1));
        let got = take(&mut member, single.clone());
        assert_eq!(got.handed, vec![Handed::Spans(vec![(26, 8)])]);
        let batch = publish_body(&first(2), &publishes(2, 3));
        let got = take(&mut member, batch.clone());
        let head = decode_publish(&batch).unwrap();
        let at = head.payload_at;
        assert_eq!(
            got.handed,
            vec![Handed::Spans(vec![(at + 2, 8), (at + 12, 8), (at + 22, 8)])]
        );
        assert!(!got.gap && got.onward.is_empty());
        // 7 and 8 after a gap (5, 6): held, a gap to ask for; then 5 and 6 bring them out.
        let got = take(&mut member, publish_body(&first(7), &publishes(7, 2)));
        assert!(got.gap && got.handed.is_empty());
        let got = take(&mut member, publish_body(&first(5), &publishes(5, 2)));
        assert!(!got.gap);
        let waited: Vec<Bytes> = publishes(7, 2);
        assert_eq!(got.handed.last(), Some(&Handed::Waited(waited)));
        // A copy of the lot: nothing handed twice.
        let got = take(&mut member, publish_body(&first(1), &publishes(1, 8)));
        assert!(got.handed.is_empty());
        assert_eq!(got.copies, 8);
    }

    /// A log's records can overtake what their publisher queued on the link before them:
    /// they never begin a member's stream; the link does, and what the log brought first is
    /// a gap the member asks for.
    #[test]
    fn a_group_log_s_records_do_not_begin_a_member_s_stream() {
        let mut member = GroupState::new(1 << 20, Default::default());
        member.join(G).unwrap();
        let early = log_run(&mut member, &[2, 3], 10);
        assert!(early.handed.is_empty() && !early.gap);
        let one = publish_body(&first(1), &publishes(1, 1));
        let by_link = take(&mut member, one);
        assert_eq!(by_link.handed.len(), 1, "the link's first begins it");
        let later = log_run(&mut member, &[4], 10);
        assert!(
            later.handed.is_empty() && later.gap,
            "2 and 3 are asked for"
        );
    }
}
