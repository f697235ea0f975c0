//! Request/reply (`Node::call`): answered over every transport and through a relay, in order
//! with plain messages; a timeout, a cancellation, a request dropped unanswered, an unknown id,
//! a restarted or dead peer each end only their own calls, with the reason; replies nobody
//! waits for are dropped and counted.

mod common;

use busway::{BusId, CallError, CallOptions, Inbox, Node, WhenFull};
use bytes::Bytes;
use common::*;
use std::time::{Duration, Instant};

/// Answers every request with "re:" and its payload; plain messages are ignored.
fn echo(mut inbox: Inbox) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(m) = inbox.recv().await {
            if m.request.is_some() {
                let mut answer = b"re:".to_vec();
                answer.extend_from_slice(&m.payload);
                m.reply(Bytes::from(answer)).await.unwrap();
            }
        }
    })
}

/// A call from a task of its own, waiting at most `WAIT`.
fn spawn_call(
    from: &Node,
    to: BusId,
    payload: Bytes,
) -> tokio::task::JoinHandle<Result<busway::Reply, CallError>> {
    let from = from.clone();
    tokio::spawn(async move { from.call(to, payload, WAIT).await })
}

fn payload(i: u64) -> Bytes {
    Bytes::from(i.to_le_bytes().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_answered_over_every_transport_in_order_with_plain_messages() {
    for t in transports() {
        let (a, b) = pair(t, config(1), config(2)).await;
        let mut inbox = a.take_inbox().unwrap();
        // The caller receives too, as an application does: over a ring, replies are read
        // with the rest of the inbox.
        let caller_inbox = echo(b.take_inbox().unwrap());
        // A plain message, a call, a plain message: a receives them in that order.
        b.send(a.id(), Bytes::from_static(b"before")).await.unwrap();
        let call = spawn_call(&b, BusId(1), Bytes::from_static(b"ping"));
        let first = tokio::time::timeout(WAIT, inbox.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (&first.payload[..], first.request.is_none()),
            (&b"before"[..], true)
        );
        let request = tokio::time::timeout(WAIT, inbox.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&request.payload[..], b"ping", "over {t}");
        assert_eq!(request.request.as_ref().unwrap().from(), b.id());
        b.send(a.id(), Bytes::from_static(b"after")).await.unwrap();
        request.reply(Bytes::from_static(b"pong")).await.unwrap();
        let reply = call.await.unwrap().unwrap();
        assert_eq!(
            (reply.src, &reply.payload[..]),
            (a.id(), &b"pong"[..]),
            "over {t}"
        );
        // A second answer is refused; the first one stands.
        assert_eq!(
            request.reply(Bytes::from_static(b"again")).await,
            Err(busway::ReplyError::AlreadyAnswered)
        );
        let after = tokio::time::timeout(WAIT, inbox.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&after.payload[..], b"after");
        // Many at once, each answered to its own caller.
        let server = echo(inbox);
        let calls: Vec<_> = (0..200u64)
            .map(|i| spawn_call(&b, BusId(1), payload(i)))
            .collect();
        for (i, c) in calls.into_iter().enumerate() {
            let (i, reply) = (i as u64, c.await.unwrap());
            let mut expected = b"re:".to_vec();
            expected.extend_from_slice(&payload(i));
            assert_eq!(&reply.unwrap().payload[..], &expected[..], "over {t}");
        }
        assert_eq!(b.stats().calls_pending, 0);
        server.abort();
        caller_inbox.abort();
        b.shutdown().await;
        a.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_concurrent_calls_each_get_their_own_reply() {
    let (a, b) = pair("tcp4", config(1), config(2)).await;
    let server = echo(a.take_inbox().unwrap());
    let calls: Vec<_> = (0..10_000u64)
        .map(|i| spawn_call(&b, BusId(1), payload(i)))
        .collect();
    for (i, c) in calls.into_iter().enumerate() {
        let (i, reply) = (i as u64, c.await.unwrap());
        let reply = reply.unwrap();
        assert_eq!(&reply.payload[3..], &payload(i)[..], "call {i}");
    }
    let s = b.stats();
    assert_eq!(
        (s.calls_pending, s.late_replies, s.misdirected_replies),
        (0, 0, 0)
    );
    server.abort();
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_itself_is_answered_by_its_own_inbox() {
    let a = start(config(1)).await;
    let server = echo(a.take_inbox().unwrap());
    let reply = a
        .call(BusId(1), Bytes::from_static(b"me"), WAIT)
        .await
        .unwrap();
    assert_eq!(&reply.payload[..], b"re:me");
    server.abort();
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_through_a_relay_is_answered() {
    let r = start(config(100).listen(listen_addr("tcp4"))).await;
    let addr = r.listen_addrs()[0].clone();
    let below = |id| {
        let mut c = config(id).upstream(addr.clone());
        c.direct_links = false;
        start(c)
    };
    let (a, b) = (below(1).await, below(2).await);
    assert!(a.wait_for_peer(BusId(100), WAIT).await && b.wait_for_peer(BusId(100), WAIT).await);
    let server = echo(a.take_inbox().unwrap());
    for i in 0..100u64 {
        let reply = b.call(BusId(1), payload(i), WAIT).await.unwrap();
        assert_eq!(&reply.payload[3..], &payload(i)[..]);
    }
    assert!(
        b.relayed_peers().iter().any(|p| p.id == BusId(1)),
        "went through the relay"
    );
    server.abort();
    for n in [b, a, r] {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_ends_only_that_call_and_its_late_reply_is_counted() {
    let (a, b) = pair("tcp4", config(1), config(2)).await;
    let mut inbox = a.take_inbox().unwrap();
    let started = Instant::now();
    let slow = b.call(
        BusId(1),
        Bytes::from_static(b"slow"),
        Duration::from_millis(200),
    );
    assert_eq!(slow.await, Err(CallError::Timeout { after_ms: 200 }));
    assert!(started.elapsed() < WAIT);
    // The request did arrive; answered now, its reply finds no call.
    let request = tokio::time::timeout(WAIT, inbox.recv())
        .await
        .unwrap()
        .unwrap();
    request
        .reply(Bytes::from_static(b"too late"))
        .await
        .unwrap();
    until("the late reply is counted", || b.stats().late_replies == 1).await;
    // The link and the next call are fine.
    let server = echo(inbox);
    let reply = b
        .call(BusId(1), Bytes::from_static(b"next"), WAIT)
        .await
        .unwrap();
    assert_eq!(&reply.payload[..], b"re:next");
    server.abort();
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_call_is_cancelled_and_its_reply_is_never_given_to_another() {
    let (a, b) = pair("tcp4", config(1), config(2)).await;
    let mut inbox = a.take_inbox().unwrap();
    {
        let call = b.call(BusId(1), Bytes::from_static(b"first"), WAIT);
        // Polled until its request is out, then dropped.
        tokio::select! {
            _ = call => panic!("nothing answers yet"),
            m = inbox.recv() => {
                let m = m.unwrap();
                assert_eq!(&m.payload[..], b"first");
                // Held: answered after the cancellation and after a second call started.
                let second = spawn_call(&b, BusId(1), Bytes::from_static(b"second"));
                let m2 = tokio::time::timeout(WAIT, inbox.recv()).await.unwrap().unwrap();
                m.reply(Bytes::from_static(b"for first")).await.unwrap();
                m2.reply(Bytes::from_static(b"for second")).await.unwrap();
                assert_eq!(&second.await.unwrap().unwrap().payload[..], b"for second");
            }
        }
    }
    until("the cancelled call's reply is counted", || {
        b.stats().late_replies == 1
    })
    .await;
    assert_eq!(b.stats().calls_pending, 0);
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_unanswered_fails_its_call_at_once() {
    let (a, b) = pair("tcp4", config(1), config(2)).await;
    let mut inbox = a.take_inbox().unwrap();
    let dropper = tokio::spawn(async move {
        drop(next_message(&mut inbox).await);
        inbox
    });
    let started = Instant::now();
    match b.call(BusId(1), Bytes::from_static(b"x"), WAIT).await {
        Err(CallError::NoHandler { peer, reason }) => {
            assert_eq!(peer, BusId(1));
            assert!(reason.contains("dropped unanswered"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < WAIT / 2, "not a timeout");
    // With no inbox at all, a request is answered with the same error.
    drop(dropper.await.unwrap());
    assert!(matches!(
        b.call(BusId(1), Bytes::from_static(b"y"), WAIT).await,
        Err(CallError::NoHandler { .. })
    ));
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_id_fails_at_once_and_pending_calls_are_bounded() {
    let (a, b) = pair("tcp4", config(1), config(2)).await;
    let unknown = b
        .call(BusId(99), Bytes::from_static(b"anyone?"), WAIT)
        .await;
    assert_eq!(
        unknown,
        Err(CallError::Send(busway::SendError::NoRoute(BusId(99))))
    );
    let e = unknown.unwrap_err();
    assert_eq!(e.kind(), busway::ErrorKind::NoRoute, "the send's kind");
    let source = std::error::Error::source(&e).expect("the send's error is kept");
    assert!(source.to_string().contains("99"), "{source}");
    // Past the limit, a caller that chose not to wait fails at once.
    let _inbox = a.take_inbox().unwrap();
    let options = CallOptions {
        timeout: WAIT,
        when_full: WhenFull::Fail,
    };
    let held: Vec<_> = (0..busway::limits::CALLS_PENDING_MAX)
        .map(|i| spawn_call(&b, BusId(1), payload(i as u64)))
        .collect();
    until("every slot is taken", || {
        b.stats().calls_pending == busway::limits::CALLS_PENDING_MAX as u64
    })
    .await;
    assert_eq!(
        b.call_with(BusId(1), Bytes::from_static(b"one more"), options)
            .await,
        Err(CallError::TooManyPending {
            max: busway::limits::CALLS_PENDING_MAX
        })
    );
    held.iter().for_each(|h| h.abort());
    until("aborted calls free their slots", || {
        b.stats().calls_pending == 0
    })
    .await;
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_restarts_stays_down_or_shuts_down_fails_its_pending_calls_with_the_reason() {
    let mut cb = config(2);
    cb.dial_backoff_min_ms = 5;
    cb.peer_dead_after_ms = 500;
    let (a, b) = pair("tcp4", config(1), cb).await;
    let addr = a.listen_addrs()[0].clone();
    let mut inbox = a.take_inbox().unwrap();
    let pending = spawn_call(&b, BusId(1), Bytes::from_static(b"q"));
    // Received, never answered: the node restarts (a new incarnation at the same address).
    let request = tokio::time::timeout(WAIT, inbox.recv())
        .await
        .unwrap()
        .unwrap();
    std::mem::forget(request); // its node is going; no error reply from it
                               // Dropped, not shut down: it ends as a crash does, with no CLOSE.
    drop(a);
    let a2 = start_again(config(1).listen(addr.clone())).await;
    match tokio::time::timeout(WAIT, pending).await.unwrap().unwrap() {
        Err(CallError::Failed { peer, reason }) => {
            assert_eq!(peer, BusId(1));
            assert!(reason.contains("restarted"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // The new one is called as usual; then it goes for good with a request it received and
    // never answered: the call fails at the deadline.
    let mut inbox2 = a2.take_inbox().unwrap();
    let hi = spawn_call(&b, BusId(1), Bytes::from_static(b"hi"));
    let m = tokio::time::timeout(WAIT, inbox2.recv())
        .await
        .unwrap()
        .unwrap();
    m.reply(Bytes::from_static(b"hello")).await.unwrap();
    assert_eq!(&hi.await.unwrap().unwrap().payload[..], b"hello");
    let pending = spawn_call(&b, BusId(1), Bytes::from_static(b"q2"));
    let m2 = tokio::time::timeout(WAIT, inbox2.recv())
        .await
        .unwrap()
        .unwrap();
    std::mem::forget(m2);
    drop(a2);
    match tokio::time::timeout(WAIT, pending).await.unwrap().unwrap() {
        Err(CallError::Failed { reason, .. }) => {
            assert!(reason.contains("stayed down"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    drop(inbox2);
    // A node that shuts down says so: its pending calls fail at once, not at the deadline.
    let a3 = start_again(config(1).listen(addr.clone())).await;
    let mut inbox3 = a3.take_inbox().unwrap();
    // Given up on, so sends to it fail fast until it is back.
    assert!(b.wait_for_peer(BusId(1), WAIT).await);
    let pending = spawn_call(&b, BusId(1), Bytes::from_static(b"q3"));
    let m3 = tokio::time::timeout(WAIT, inbox3.recv())
        .await
        .unwrap()
        .unwrap();
    std::mem::forget(m3);
    a3.shutdown().await;
    match tokio::time::timeout(WAIT, pending).await.unwrap().unwrap() {
        Err(CallError::Failed { reason, .. }) => {
            assert!(reason.contains("bus id 1 shut down"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_to_no_call_or_from_the_wrong_node_and_malformed_requests_disturb_nothing_else() {
    use busway_core::frame::{frame_bytes, FrameKind};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (a, b) = pair("tcp4", config(1), config(2)).await;
    let a_addr = match &a.listen_addrs()[0] {
        busway::Addr::Tcp(s) => *s,
        other => panic!("{other}"),
    };
    let mut b_inbox = b.take_inbox().unwrap();
    let mut events = a.take_events().unwrap();
    let pending = spawn_call(&a, BusId(2), Bytes::from_static(b"q"));
    let request = tokio::time::timeout(WAIT, b_inbox.recv())
        .await
        .unwrap()
        .unwrap();
    let id = request.request.as_ref().unwrap().id();
    // A stranger with a link of its own answers that call, and one nobody made.
    let mut liar = authenticated(a_addr, 3, None).await;
    let reply = |id: u64| {
        let mut body = id.to_le_bytes().to_vec();
        body.push(0);
        body.extend_from_slice(b"forged");
        frame_bytes(FrameKind::Reply, &body)
    };
    liar.write_all(&reply(id)).await.unwrap();
    liar.write_all(&reply(u64::MAX)).await.unwrap();
    until("both replies are counted", || {
        let s = a.stats();
        s.misdirected_replies == 1 && s.late_replies == 1
    })
    .await;
    assert!(
        !pending.is_finished(),
        "the call still waits for its own reply"
    );
    // A request too short for its call id: that link ends with the reason, nothing else does.
    liar.write_all(&frame_bytes(FrameKind::Call, b"abc"))
        .await
        .unwrap();
    let why = wait_event(&mut events, |e| match e {
        busway::Event::PeerDown {
            peer: BusId(3),
            reason: busway::DownReason::ProtocolError(why),
            ..
        } => Some(why.clone()),
        _ => None,
    })
    .await;
    assert!(why.contains("Call body of 3 bytes"), "{why}");
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(WAIT, liar.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the liar's link was closed");
    assert_eq!(a.stats().protocol_errors, 1);
    request.reply(Bytes::from_static(b"real")).await.unwrap();
    let reply = pending.await.unwrap().unwrap();
    assert_eq!((reply.src, &reply.payload[..]), (BusId(2), &b"real"[..]));
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_does_not_read_its_inbox_still_gets_its_replies_over_rings() {
    for t in ["shm", "mem"] {
        let (a, b) = pair(t, config(1), config(2)).await;
        let server = echo(a.take_inbox().unwrap());
        // b's inbox is taken and not read: messages a sends it meanwhile must wait for it, in
        // order, while b's replies come through the same ring.
        let mut inbox = b.take_inbox().unwrap();
        for i in 0..20u64 {
            a.send(b.id(), payload(i)).await.unwrap();
            let reply = b.call(a.id(), payload(i), WAIT).await;
            assert_eq!(&reply.unwrap().payload[3..], &payload(i)[..], "over {t}");
        }
        assert!(
            b.stats().shm_channels + b.stats().mem_channels > 0,
            "the replies came over a ring ({t})"
        );
        for i in 0..20u64 {
            let m = tokio::time::timeout(WAIT, inbox.recv())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(&m.payload[..], &payload(i)[..], "over {t}");
        }
        server.abort();
        b.shutdown().await;
        a.shutdown().await;
    }
    // A caller that never takes its inbox at all.
    let (a, b) = pair("mem", config(1), config(2)).await;
    let server = echo(a.take_inbox().unwrap());
    for i in 0..20u64 {
        b.call(a.id(), payload(i), WAIT).await.unwrap();
    }
    server.abort();
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_survive_a_cut_link_and_each_request_is_handled_once() {
    for t in ["tcp4", "shm"] {
        let mut cb = config(2);
        cb.dial_backoff_min_ms = 5;
        let (a, b) = pair(t, config(1), cb).await;
        let mut inbox = a.take_inbox().unwrap();
        let handled = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
        // The server holds its answers until the link was cut: every call is pending then.
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let server = {
            let handled = handled.clone();
            tokio::spawn(async move {
                let mut go = Some(go_rx);
                while let Some(m) = inbox.recv().await {
                    if m.request.is_some() {
                        if let Some(go) = go.take() {
                            let _ = go.await;
                        }
                        *handled
                            .lock()
                            .unwrap()
                            .entry(m.payload.clone())
                            .or_insert(0) += 1;
                        m.reply(m.payload.clone()).await.unwrap();
                    }
                }
            })
        };
        let calls: Vec<_> = (0..2_000u64)
            .map(|i| spawn_call(&b, BusId(1), payload(i)))
            .collect();
        // The link is cut three times while the calls are pending.
        let links_before = b.stats().connections;
        for k in 1..=3 {
            until("calls are pending", || b.stats().calls_pending > 0).await;
            assert!(b.disconnect(BusId(1)), "a link to cut ({t})");
            until("the link is back", || {
                b.stats().connections >= links_before + k
            })
            .await;
            assert!(
                b.wait_for_peer(BusId(1), WAIT).await,
                "the link comes back ({t})"
            );
        }
        go_tx.send(()).unwrap();
        for (i, c) in calls.into_iter().enumerate() {
            let (i, reply) = (i as u64, c.await.unwrap());
            assert_eq!(&reply.unwrap().payload[..], &payload(i)[..], "over {t}");
        }
        let handled = handled.lock().unwrap().clone();
        assert_eq!(handled.len(), 2_000, "every request handled ({t})");
        assert!(handled.values().all(|&n| n == 1), "each once ({t})");
        server.abort();
        b.shutdown().await;
        a.shutdown().await;
    }
}
