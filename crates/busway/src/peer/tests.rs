//! The peer's queue rules: holding, taking, acknowledging.
use super::*;
use busway_core::handshake::{local_hello, Established};

fn peer() -> Peer {
    let hello = local_hello(BusId(2), 9, 0, [0; 16], vec![]);
    let p = Peer::new(hello, "tcp://127.0.0.1:1".into(), 1 << 20, true);
    p.lock().slot.attach(1);
    p
}

#[tokio::test]
async fn room_acknowledged_by_a_new_links_handshake_wakes_waiting_senders() {
    let hello = local_hello(BusId(2), 9, 0, [0; 16], vec![]);
    let p = std::sync::Arc::new(Peer::new(
        hello.clone(),
        "tcp://127.0.0.1:1".into(),
        100,
        true,
    ));
    p.lock().slot.attach(1);
    // The queue fills, is written, and the link drops before the peer's ACK arrives.
    let queued = p.push_copies(&[[0u8; 30]; 5]).unwrap();
    assert_eq!(queued, 0..2, "two fit");
    let mut batch = Vec::new();
    p.take(&mut batch);
    p.detach(1).unwrap();
    let waiter = {
        let p = p.clone();
        tokio::spawn(async move { p.wait_for_room(30).await })
    };
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished(), "no room yet");
    // The next link's handshake says the peer got both.
    let auth = |next_send_seq, next_expected_seq| busway_core::handshake::Auth {
        next_send_seq,
        next_expected_seq,
        proof: None,
    };
    let est = Established {
        peer: hello,
        peer_auth: auth(0, 2),
        own_auth: auth(0, 0),
    };
    p.attach(2, &est, "tcp://127.0.0.1:1").unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
        .await
        .expect("the waiting sender wakes")
        .unwrap();
}

#[test]
fn a_held_peer_writes_control_frames_and_keeps_messages_until_released() {
    let p = peer();
    p.hold();
    p.push_copies(&[b"m0", b"m1"]).unwrap();
    p.push_forward(vec![Bytes::from_static(b"routed")], None);
    let mut batch = Vec::new();
    assert!(matches!(p.take(&mut batch), Take::Data));
    assert_eq!(batch, vec![Bytes::from_static(b"routed")], "control only");
    batch.clear();
    assert!(matches!(p.take(&mut batch), Take::Idle), "messages wait");
    p.release();
    assert!(matches!(p.take(&mut batch), Take::Data));
    assert!(!batch.is_empty(), "the messages go once released");
}

#[test]
fn bytes_sent_counts_what_was_queued_for_the_peer_messages_and_forwarded_frames() {
    let p = peer();
    p.push_copies(&[b"m0", b"m1"]).unwrap();
    p.push_framed(FrameKind::Publish, b"head", &Bytes::from_static(b"payload"))
        .unwrap();
    p.push_forward(vec![Bytes::from_static(b"routed")], None);
    let mut batch = Vec::new();
    assert!(matches!(p.take(&mut batch), Take::Data));
    let written: usize = batch.iter().map(Bytes::len).sum();
    assert_eq!(p.snapshot().bytes_sent, written as u64);
    // One DATA_BATCH frame (a header and two entries), one PUBLISH frame, the routed bytes.
    let framing = busway_core::frame::HEADER_LEN;
    assert_eq!(written, framing + 2 * (2 + 2) + framing + 4 + 7 + 6);
}

#[tokio::test]
async fn a_flush_waiting_on_a_peer_wakes_at_its_last_acknowledgement_not_before() {
    let p = std::sync::Arc::new(peer());
    p.push_copies(&[b"m0", b"m1", b"m2"]).unwrap();
    let mut batch = Vec::new();
    p.take(&mut batch);
    let waiter = {
        let p = p.clone();
        tokio::spawn(async move { p.wait_all_acked().await })
    };
    tokio::task::yield_now().await;
    p.ack(2).unwrap();
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished(), "one message is still unacknowledged");
    assert_eq!(p.unacked(), 1);
    p.ack(3).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
        .await
        .expect("the last acknowledgement wakes it")
        .unwrap();
}

#[test]
fn only_a_lone_ack_may_wait_for_the_answer_that_would_go_with_it() {
    use busway_core::control::ack_frame;
    use busway_core::frame::{frame_bytes, FrameKind};
    let p = peer();
    let mut batch = Vec::new();
    p.push_ack(ack_frame(1), true);
    assert!(matches!(p.take(&mut batch), Take::Control), "a lone ACK");
    // One of what the application was not waiting for (it is busy, or reads no inbox).
    p.push_ack(ack_frame(1), false);
    assert!(matches!(p.take(&mut batch), Take::Data), "not answerable");
    // Anything else beside it goes at once: a PONG (a round trip measured), a relayed frame,
    // a message.
    p.push_ack(ack_frame(2), true);
    p.push_control(frame_bytes(FrameKind::Pong, &7u64.to_le_bytes()));
    assert!(matches!(p.take(&mut batch), Take::Data), "ACK and PONG");
    p.push_ack(ack_frame(3), true);
    assert!(p.push_forward(vec![Bytes::from_static(b"routed")], None));
    assert!(
        matches!(p.take(&mut batch), Take::Data),
        "ACK and a relayed frame"
    );
    p.push_ack(ack_frame(4), true);
    p.push_copies(&[b"answer"]).unwrap();
    assert!(
        matches!(p.take(&mut batch), Take::Data),
        "ACK and a message"
    );
    // Nor does an ACK wait when the link is closing: its CLOSE comes next.
    p.push_ack(ack_frame(5), true);
    p.close();
    assert!(!matches!(p.take(&mut batch), Take::Control), "closing");
}
