//! Every limit holds against a flood, refuses with a reason past it, and frees its place when
//! the connection goes (issue #11, item 3): connections open, handshakes in progress.

mod common;

use busway::limits::HANDSHAKES_IN_FLIGHT_MAX;
use busway::{BusId, Node};
use busway_core::frame::{FrameKind, HANDSHAKE_BODY_LEN_MAX};
use busway_core::FrameDecoder;
use bytes::BytesMut;
use common::*;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The first frame the node sends on a fresh connection: its HELLO if admitted, a CLOSE (with
/// its reason) if refused.
async fn first_frame(s: &mut TcpStream) -> (FrameKind, String) {
    let mut buf = BytesMut::new();
    let mut dec = FrameDecoder::new(HANDSHAKE_BODY_LEN_MAX);
    tokio::time::timeout(WAIT, async {
        loop {
            if let Some(f) = dec.decode(&mut buf).unwrap() {
                let reason = busway_core::control::Close::decode(&f.body).reason;
                return (f.kind, reason);
            }
            assert!(
                s.read_buf(&mut buf).await.unwrap() > 0,
                "closed with nothing"
            );
        }
    })
    .await
    .expect("a first frame")
}

fn tcp_addr(node: &Node) -> std::net::SocketAddr {
    match node.listen_addrs()[0].clone() {
        busway::Addr::Tcp(a) => a,
        other => panic!("not tcp: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_refused_with_the_reason_until_one_goes() {
    let mut ca = config(1);
    ca.connections_max = 3;
    let (a, _b) = pair("tcp4", ca, config(2)).await;
    let addr = tcp_addr(&a);
    let mut idle = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        assert_eq!(first_frame(&mut s).await.0, FrameKind::Hello);
        idle.push(s);
    }
    let mut over = TcpStream::connect(addr).await.unwrap();
    let (kind, reason) = first_frame(&mut over).await;
    assert_eq!(kind, FrameKind::Close);
    assert!(
        reason.contains("3 connections open, its limit (connections_max)"),
        "{reason}"
    );
    assert_eq!(a.stats().connections_refused, 1);
    // One goes: its place is free again.
    drop(idle.pop());
    until("the node sees it go", || a.stats().connections_open == 2).await;
    let mut again = TcpStream::connect(addr).await.unwrap();
    assert_eq!(first_frame(&mut again).await.0, FrameKind::Hello);
    assert!(a.peers().iter().any(|p| p.id == BusId(2) && p.up));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_in_their_handshake_are_bounded_and_honest_peers_get_in_after() {
    let a = start(config(1).listen(listen_addr("tcp4"))).await;
    let addr = tcp_addr(&a);
    let mut strangers = Vec::new();
    for _ in 0..HANDSHAKES_IN_FLIGHT_MAX {
        strangers.push(TcpStream::connect(addr).await.unwrap());
    }
    until("every stranger is in its handshake", || {
        a.stats().connections_open == HANDSHAKES_IN_FLIGHT_MAX as u64
    })
    .await;
    let mut one_more = TcpStream::connect(addr).await.unwrap();
    let (kind, reason) = first_frame(&mut one_more).await;
    assert_eq!(kind, FrameKind::Close);
    assert!(reason.contains("handshakes in progress"), "{reason}");
    drop(strangers);
    until("the strangers are gone", || a.stats().connections_open == 0).await;
    let b = start(config(2).connect(a.listen_addrs()[0].clone())).await;
    assert!(
        b.wait_for_peer(BusId(1), WAIT).await,
        "an honest peer gets in"
    );
    b.shutdown().await;
    a.shutdown().await;
}
