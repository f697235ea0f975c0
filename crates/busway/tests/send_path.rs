//! The one send path (`route::outgoing`: `try_enqueue`, `enqueue`) and the one receive
//! dispatcher (`node::dispatch`) over a socket, a ring and a relay: `try_send`, `send`,
//! `send_batch`, a call and its reply go the same way, numbered one after another in the
//! pair's sequence, sorted the same way on arrival (plain messages and the request to the
//! inbox, the reply to its call) and delivered in that order.

mod common;

use busway::{BusId, Node};
use bytes::Bytes;
use common::*;

/// A and B linked over `way`: "tcp4" (a socket), "shm" (a ring), or "relay" (both below a
/// hub that does not hint them to each other).
async fn linked(way: &str) -> (Node, Node, Vec<Node>) {
    if way != "relay" {
        let (a, b) = pair(way, config(1), config(2)).await;
        return (a, b, Vec::new());
    }
    let hub = start(config(100).listen(listen_addr("tcp4"))).await;
    let below = |id| {
        let mut c = config(id).upstream(hub.listen_addrs()[0].clone());
        c.direct_links = false;
        c
    };
    let a = start(below(1)).await;
    let b = start(below(2)).await;
    for id in [1, 2] {
        assert!(hub.wait_for_peer(BusId(id), WAIT).await);
    }
    for n in [&a, &b] {
        assert!(n.wait_for_peer(BusId(100), WAIT).await);
    }
    (a, b, vec![hub])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_send_takes_the_same_path_in_one_numbering() {
    for way in ["tcp4", "shm", "relay"] {
        let (a, b, others) = linked(way).await;
        let mut inbox = b.take_inbox().unwrap();
        // The caller reads its inbox, as an application does: over a ring, replies come in it.
        let mut caller_inbox = a.take_inbox().unwrap();
        let reader = tokio::spawn(async move { while caller_inbox.recv().await.is_some() {} });
        let first = a
            .try_send(BusId(2), Bytes::from_static(b"try_send"))
            .unwrap();
        let second = a.send(BusId(2), Bytes::from_static(b"send")).await.unwrap();
        let batch = a
            .send_batch(BusId(2), &[b"batch 0", b"batch 1", b"batch 2"])
            .await
            .unwrap();
        assert_eq!(second, first + 1, "{way}");
        assert_eq!(batch, first + 2..first + 5, "{way}");
        let call = {
            let a = a.clone();
            tokio::spawn(async move { a.call(BusId(2), Bytes::from_static(b"ask"), WAIT).await })
        };
        for expected in [
            &b"try_send"[..],
            b"send",
            b"batch 0",
            b"batch 1",
            b"batch 2",
        ] {
            let m = next_message(&mut inbox).await;
            assert_eq!((m.src, &m.payload[..]), (BusId(1), expected), "{way}");
        }
        let request = next_message(&mut inbox).await;
        assert_eq!(
            &request.payload[..],
            b"ask",
            "{way}: the call comes after, in order"
        );
        request.reply(Bytes::from_static(b"answer")).await.unwrap();
        let reply = call.await.unwrap().unwrap();
        assert_eq!(&reply.payload[..], b"answer", "{way}");
        let path = a.peers().iter().any(|p| p.id == BusId(2));
        assert_eq!(path, way != "relay", "{way}: direct only where linked");
        assert!(a.flush(WAIT).await, "{way}: everything acknowledged");
        let relayed = a.relayed_peers();
        if way == "relay" {
            assert_eq!(relayed.len(), 1, "{way}: B is reached through the hub");
            assert_eq!(relayed[0].unacked_msgs, 0);
        }
        for n in [a, b].into_iter().chain(others) {
            n.shutdown().await;
        }
        reader.abort();
    }
}
