//! What one exchange (a message and its answer) costs on the wire: the node's answer and its
//! acknowledgement of the message answered go out in one write.

mod common;

use busway::{BusId, IoThreads, NodeConfig};
use busway_core::control::{ack_frame, decode_token};
use busway_core::frame::{frame_bytes, FrameKind};
use busway_core::FrameDecoder;
use bytes::BytesMut;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Exchanges measured: each must come back as one write.
const EXCHANGES: u64 = 50;

/// The frames of one read: (kind, body).
fn frames_of(buf: &mut BytesMut) -> Vec<(FrameKind, Vec<u8>)> {
    let mut dec = FrameDecoder::new(1 << 20);
    let mut frames = Vec::new();
    while let Some(f) = dec.decode(buf).expect("the node sends well-formed frames") {
        frames.push((f.kind, f.body.to_vec()));
    }
    frames
}

// The links on the application's one thread (`IoThreads::Current`): the application and the
// link's task take turns on it, and the answer always comes before the ACK is written. With the
// links on an I/O thread of their own (the default), it comes in time when the application is
// back in its inbox before the next read, which is a race between two threads: there the
// ACK goes with the answer most of the time, not every time.
#[tokio::test(flavor = "current_thread")]
async fn an_answer_goes_out_in_the_same_write_as_the_acknowledgement_of_what_it_answers() {
    let config = NodeConfig::new(BusId(1))
        .listen(listen_addr("tcp4"))
        .io_threads(IoThreads::Current);
    let node = start(config).await;
    let busway::Addr::Tcp(addr) = node.listen_addrs()[0].clone() else {
        unreachable!()
    };
    let mut inbox = node.take_inbox().unwrap();
    let echo = node.clone();
    tokio::spawn(async move {
        while let Some(m) = inbox.recv().await {
            if echo.send(m.src, m.payload).await.is_err() {
                return;
            }
        }
    });
    let mut s = authenticated(addr, 9, None).await;
    assert!(node.wait_for_peer(BusId(9), WAIT).await);
    for n in 1..=EXCHANGES {
        s.write_all(&frame_bytes(FrameKind::Data, b"ping"))
            .await
            .unwrap();
        // Reads until the answer came: the read that holds it holds the ACK of message `n`
        // too. Apart, the ACK would come first, in a read of its own.
        let mut answered = false;
        while !answered {
            let mut buf = BytesMut::new();
            let read = tokio::time::timeout(WAIT, s.read_buf(&mut buf)).await;
            assert!(read.expect("the node answers").unwrap() > 0, "link closed");
            let frames = frames_of(&mut buf);
            let acked = frames
                .iter()
                .any(|(k, body)| *k == FrameKind::Ack && decode_token(body) == Some(n));
            answered = frames
                .iter()
                .any(|(k, _)| matches!(k, FrameKind::Data | FrameKind::DataBatch));
            assert_eq!(
                acked, answered,
                "exchange {n}: the ACK and the answer came in different writes: {frames:?}"
            );
        }
        s.write_all(&ack_frame(n)).await.unwrap();
    }
    // The link ends with the socket (the node's shutdown would wait for this side's CLOSE).
    drop(s);
    node.shutdown().await;
}
