//! The one receive dispatcher: what a read delivered is sorted the same way whichever way it
//! came (a socket, a relay, a peer's ring), by each message's kind ([`Span::kind`]), each body
//! parsed here (or, for group messages, by the group part) once into its typed value
//! ([`Body`]): answers to this node's log offers and then the group messages go to the group
//! part, a peer's offers of its group logs to the reader's own rule, replies to the calls
//! waiting for them; plain messages and requests go on to the inbox as one batch.

use crate::node::message::MessageBatch;
use crate::peer::ring_link::GroupMessages;
use crate::rpc::call_table::CallTable;
use crate::rpc::request::Request;
use busway_core::body::{Body, BodyKind, Span};
use busway_core::group::{GroupLog, LogOffer};
use busway_core::BusId;
use bytes::Bytes;

/// Sorts what one read delivered from `src` (the `spans` of `chunk`, each checked by its
/// reader): group messages to `groups` (the node; `None` once it is gone), the peer's offers
/// of its group logs to `log_offer` (a ring's reader attaches them, as they live with its
/// ring; a socket's reader declines them), replies to the calls in `calls`. Returns the batch
/// left for the inbox (plain messages, and requests with the handle to answer them), if
/// anything is left, and whether group publishes went to the inbox.
pub(crate) fn dispatch(
    groups: Option<&dyn GroupMessages>,
    calls: &CallTable,
    src: BusId,
    chunk: Bytes,
    mut spans: Vec<Span>,
    mut log_offer: impl FnMut(LogOffer<'_>),
) -> (Option<MessageBatch>, bool) {
    let (data, group_n) = count_kinds(&spans);
    // The common reads, one kind only, handed on as they came: plain messages (every read of
    // every link passes here; nothing parsed), or group messages (a stream of publishes).
    if data == spans.len() {
        let batch = (!spans.is_empty()).then(|| MessageBatch::new(src, chunk, spans));
        return (batch, false);
    }
    if group_n == spans.len() {
        return (None, groups.is_some_and(|g| g.read(src, &chunk, &spans)));
    }
    let mut kept = 0;
    let mut requests = Vec::new();
    let mut group = Vec::with_capacity(group_n);
    // Taken out in order, acted on below in the order of the old three passes.
    let (mut logs, mut replies) = (Vec::new(), Vec::new());
    for i in 0..spans.len() {
        let span = spans[i];
        match span.kind() {
            BodyKind::Data => {}
            BodyKind::Call => {
                if let Some(request) = request_of(calls, src, &chunk, span) {
                    requests.push((kept as u32, request));
                }
            }
            BodyKind::Reply => {
                replies.push(span);
                continue;
            }
            BodyKind::GroupLog => {
                logs.push(span);
                continue;
            }
            _ => {
                group.push(span);
                continue;
            }
        }
        // A plain message or a request: kept for the inbox, in order.
        spans[kept] = span;
        kept += 1;
    }
    spans.truncate(kept);
    // An answer to a log's offer counts before the publishes that came with it; the group
    // messages go in one go, under the group part's lock; then the offers, then the replies
    // end their calls (a caller woken by its reply finds what came before it handed over).
    let mut offers = Vec::new();
    for body in logs.iter().filter_map(|s| parsed(s.parse(&chunk), src)) {
        match body {
            Body::GroupLog(GroupLog::Offer(offer)) => offers.push(offer),
            Body::GroupLog(answer) => {
                if let Some(groups) = groups {
                    groups.log_answered(src, answer);
                }
            }
            _ => {}
        }
    }
    let handed = !group.is_empty() && groups.is_some_and(|g| g.read(src, &chunk, &group));
    offers.into_iter().for_each(&mut log_offer);
    for span in replies {
        if let Some(Body::Reply { id, status, .. }) = parsed(span.parse(&chunk), src) {
            calls.on_reply(src, id, status, chunk.slice(span.payload_range()));
        }
    }
    let batch =
        (!spans.is_empty()).then(|| MessageBatch::with_requests(src, chunk, spans, requests));
    (batch, handed)
}

/// How many of `spans` are plain messages, and how many group messages.
fn count_kinds(spans: &[Span]) -> (usize, usize) {
    let (mut data, mut group) = (0, 0);
    for span in spans {
        if span.is_data() {
            data += 1;
        } else if span.kind().is_group() {
            group += 1;
        }
    }
    (data, group)
}

/// The handle to answer the request at `span` of `chunk` from `src`.
fn request_of(calls: &CallTable, src: BusId, chunk: &[u8], span: Span) -> Option<Request> {
    match parsed(span.parse(chunk), src)? {
        Body::Call { id, .. } => calls.request(src, id),
        _ => None,
    }
}

/// A body its reader checked (`body::message_spans`, which closes the link on one that does
/// not parse): `None` only for a reader that did not.
fn parsed(body: Result<Body<'_>, String>, src: BusId) -> Option<Body<'_>> {
    body.inspect_err(|why| debug_assert!(false, "unchecked body from {src}: {why}"))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::stats::Counters;
    use crate::rpc::request::Replier;
    use busway_core::body::message_spans;
    use busway_core::frame::{FrameKind, REPLY_OK};
    use busway_core::group::{encode_log_answer, encode_log_offer};
    use std::sync::{Arc, Mutex};

    /// A node's group part as the dispatcher sees it: what it was handed.
    #[derive(Default)]
    struct Groups {
        read: Mutex<Vec<Vec<BodyKind>>>,
        answers: Mutex<Vec<(BusId, String, bool)>>,
    }

    impl GroupMessages for Groups {
        fn read(&self, _: BusId, _: &Bytes, spans: &[Span]) -> bool {
            let kinds = spans.iter().map(|s| s.kind()).collect();
            self.read.lock().unwrap().push(kinds);
            true
        }
        fn log_answered(&self, from: BusId, answer: GroupLog<'_>) {
            if let GroupLog::Answer { name, accept, .. } = answer {
                self.answers
                    .lock()
                    .unwrap()
                    .push((from, name.to_owned(), accept));
            }
        }
        fn backlogged(&self, _: BusId) -> bool {
            false
        }
        fn open_log(
            &self,
            _: BusId,
            _: &LogOffer<'_>,
        ) -> Result<crate::group::log_in::AttachedLog, String> {
            Err("not in this test".into())
        }
        fn wants_group(&self, _: &str) -> bool {
            false
        }
        fn sort_out_log(
            &self,
            _: BusId,
            _: &busway_core::group::state::GroupName,
            _: &Bytes,
            _: &[(u32, u32)],
        ) -> Result<bool, String> {
            Ok(false)
        }
    }

    /// A node that answers nothing (its requests' handles need one).
    struct NoReplies;

    impl Replier for NoReplies {
        fn reply(&self, _: BusId, _: u64, _: u8, _: Bytes) -> crate::rpc::request::ReplyFuture<'_> {
            Box::pin(async { Ok(()) })
        }
        fn try_reply(
            &self,
            _: BusId,
            _: u64,
            _: u8,
            _: Bytes,
        ) -> Result<(), crate::rpc::request::ReplyError> {
            Ok(())
        }
    }

    /// One read of `frames`, laid end to end as a reader finds them: its buffer and spans.
    fn read_of(frames: &[(FrameKind, Vec<u8>)]) -> (Bytes, Vec<Span>) {
        let (mut buf, mut spans) = (Vec::new(), Vec::new());
        for (kind, body) in frames {
            message_spans(*kind, body, buf.len(), &mut spans).unwrap();
            buf.extend_from_slice(body);
        }
        (Bytes::from(buf), spans)
    }

    #[test]
    fn a_read_is_sorted_by_kind_and_its_plain_messages_keep_their_order() {
        let counters = Arc::new(Counters::default());
        let calls = CallTable::new(counters.clone(), 1);
        let replier: Arc<dyn Replier> = Arc::new(NoReplies);
        calls.set_replier(replier.clone());
        let mut call = 7u64.to_le_bytes().to_vec();
        call.extend_from_slice(b"ask");
        let mut reply = 9u64.to_le_bytes().to_vec();
        reply.extend_from_slice(&[REPLY_OK, b'x']);
        let offer = LogOffer {
            name: "g",
            token: 1,
            serial: 2,
            pid: 3,
            fd: 4,
            inode: 5,
            capacity: 6,
        };
        let (chunk, spans) = read_of(&[
            (FrameKind::Data, b"one".to_vec()),
            (
                FrameKind::Interest,
                busway_core::group::encode_interest(true, "g"),
            ),
            (FrameKind::Call, call),
            (FrameKind::Reply, reply),
            (FrameKind::GroupLog, encode_log_offer(&offer)),
            (FrameKind::GroupLog, encode_log_answer("h", 1, 2, true)),
            (FrameKind::Data, b"two".to_vec()),
        ]);
        let groups = Groups::default();
        let mut offers = Vec::new();
        let (batch, handed) = dispatch(Some(&groups), &calls, BusId(5), chunk, spans, |o| {
            offers.push(o.name.to_owned())
        });
        let batch = batch.expect("plain messages and the request are left for the inbox");
        let payloads: Vec<&[u8]> = batch.iter().collect();
        assert_eq!(payloads, [&b"one"[..], b"ask", b"two"]);
        let requests: Vec<bool> = (0..3).map(|i| batch.request(i).is_some()).collect();
        assert_eq!(
            requests,
            [false, true, false],
            "the request keeps its place"
        );
        assert!(handed, "the group part said publishes went to the inbox");
        assert_eq!(*groups.read.lock().unwrap(), [vec![BodyKind::Interest]]);
        assert_eq!(
            *groups.answers.lock().unwrap(),
            [(BusId(5), "h".into(), true)]
        );
        assert_eq!(offers, ["g"]);
        // The reply went to the calls, found none (none was made): counted late.
        let late = counters
            .late_replies
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(late, 1);
    }

    #[test]
    fn a_read_of_plain_messages_is_handed_over_whole() {
        let calls = CallTable::new(Arc::new(Counters::default()), 1);
        let (chunk, spans) = read_of(&[(FrameKind::Data, b"a".to_vec())]);
        let (batch, handed) = dispatch(None, &calls, BusId(5), chunk, spans, |_| {
            panic!("no offer in this read")
        });
        assert_eq!(batch.map(|b| b.len()), Some(1));
        assert!(!handed);
        let (batch, _) = dispatch(None, &calls, BusId(5), Bytes::new(), Vec::new(), |_| {});
        assert!(
            batch.is_none(),
            "an empty read leaves nothing for the inbox"
        );
    }

    #[test]
    fn a_read_of_group_messages_goes_to_the_group_part_whole() {
        let calls = CallTable::new(Arc::new(Counters::default()), 1);
        let interest = busway_core::group::encode_interest(true, "g");
        let (chunk, spans) = read_of(&[
            (FrameKind::Interest, interest.clone()),
            (FrameKind::Interest, interest),
        ]);
        let groups = Groups::default();
        let (batch, handed) = dispatch(Some(&groups), &calls, BusId(5), chunk, spans, |_| {});
        assert!(batch.is_none() && handed);
        let read = groups.read.lock().unwrap();
        assert_eq!(*read, [vec![BodyKind::Interest, BodyKind::Interest]]);
    }
}
