//! Two threads push a few million records of random sizes through a small ring, publishing in
//! random batches and sleeping on each other; every record must arrive whole and in order. A
//! watchdog fails the test instead of letting a lost wake-up hang it.

#![cfg(not(feature = "loom"))]

use busway_shm::ring::{Ring, Wait};
use std::sync::mpsc;
use std::time::Duration;

const RECORDS: u64 = 2_000_000;
const WATCHDOG: Duration = Duration::from_secs(120);
const WAIT: Duration = Duration::from_secs(5);

fn payload(seq: u64, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&seq.to_le_bytes());
    let filler = (seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize;
    out.resize(8 + filler, seq as u8);
}

#[test]
fn millions_of_records_cross_two_threads_whole_and_in_order() {
    let ring = Ring::create("busway-stress", 16 << 10).unwrap();
    let mut p = ring.producer();
    let mut c = ring.consumer().unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let producer = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut batch = 0u64;
        for seq in 0..RECORDS {
            payload(seq, &mut buf);
            while !p.try_push(&buf).unwrap() {
                p.publish();
                assert_ne!(
                    p.wait_for_room(buf.len(), WAIT),
                    Wait::TimedOut,
                    "producer stuck"
                );
            }
            batch += 1;
            // Publish after 1..=64 records: both sleeping and busy paths get exercised.
            if batch > seq.wrapping_mul(31) % 64 {
                p.publish();
                batch = 0;
            }
        }
        p.close();
    });
    let consumer = std::thread::spawn(move || {
        let mut expected = 0u64;
        let mut want = Vec::new();
        loop {
            c.read(usize::MAX, |m| {
                payload(expected, &mut want);
                assert_eq!(m, want.as_slice(), "record {expected}");
                expected += 1;
            })
            .unwrap();
            match c.wait_readable(if expected % 2 == 0 { 100 } else { 0 }, WAIT) {
                Wait::Ready => {}
                Wait::Closed => {
                    c.read(usize::MAX, |_| expected += 1).unwrap();
                    break;
                }
                Wait::TimedOut => panic!("consumer stuck at {expected}"),
            }
        }
        done_tx.send(expected).unwrap();
    });
    let got = done_rx
        .recv_timeout(WATCHDOG)
        .expect("finished before the watchdog");
    assert_eq!(got, RECORDS);
    producer.join().unwrap();
    consumer.join().unwrap();
}
