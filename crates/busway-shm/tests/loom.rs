//! Loom models of the ring: every interleaving (within a preemption bound) of a producer and a
//! consumer publishing, consuming, wrapping with padding and sleeping for each other. Loom
//! reports a read of unpublished bytes (the data area is made of tracked cells), a wrong
//! ordering on `tail` or `head`, and a lost wake-up (as a deadlock: the futex stand-in blocks
//! until woken).
//!
//! Run: `cargo test --release -p busway-shm --features loom --test loom`.

#![cfg(feature = "loom")]

use busway_shm::ring::{Ring, Wait};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(3600);

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    // Bounded so that CI finishes in seconds; 3 preemptions find the classic lost-wake-up and
    // publication bugs.
    b.preemption_bound = Some(3);
    b.check(f);
}

/// Sizes chosen for a 32-byte ring: records of 8, 16 and 16 bytes, so the third needs padding
/// to the end and a wrap, and the producer has to wait for room.
fn messages() -> Vec<Vec<u8>> {
    vec![vec![], vec![1; 8], vec![2; 5]]
}

#[test]
fn records_arrive_whole_in_order_and_nobody_sleeps_forever() {
    model(|| {
        let ring = Ring::in_heap(32).unwrap();
        let mut p = ring.producer();
        let mut c = ring.consumer().unwrap();
        let producer = loom::thread::spawn(move || {
            for m in messages() {
                while !p.try_push(&m).unwrap() {
                    p.publish();
                    assert_eq!(p.wait_for_room(m.len(), LONG), Wait::Ready);
                }
            }
            p.publish();
        });
        let mut got = Vec::new();
        while got.len() < messages().len() {
            c.read(usize::MAX, |m| got.push(m.to_vec())).unwrap();
            if got.len() < messages().len() {
                assert_eq!(c.wait_readable(0, LONG), Wait::Ready);
            }
        }
        producer.join().unwrap();
        assert_eq!(got, messages());
    });
}

#[test]
fn closing_ends_the_other_sides_wait() {
    model(|| {
        let ring = Ring::in_heap(32).unwrap();
        let mut p = ring.producer();
        let c = ring.consumer().unwrap();
        let producer = loom::thread::spawn(move || p.close());
        assert_eq!(c.wait_readable(0, LONG), Wait::Closed);
        producer.join().unwrap();
    });
}

#[test]
fn a_consumer_asleep_before_the_first_record_is_woken() {
    model(|| {
        let ring = Ring::in_heap(32).unwrap();
        let mut p = ring.producer();
        let mut c = ring.consumer().unwrap();
        let producer = loom::thread::spawn(move || {
            p.try_push(b"x").unwrap();
            p.publish();
        });
        assert_eq!(c.wait_readable(0, LONG), Wait::Ready);
        assert_eq!(c.read(9, |_| {}).unwrap(), 1);
        producer.join().unwrap();
    });
}

#[test]
fn a_consumer_sleeps_again_between_two_publishes() {
    model(|| {
        let ring = Ring::in_heap(64).unwrap();
        let mut p = ring.producer();
        let mut c = ring.consumer().unwrap();
        let producer = loom::thread::spawn(move || {
            p.try_push(b"x").unwrap();
            p.publish();
            p.try_push(b"y").unwrap();
            p.publish();
        });
        let mut n = 0;
        while n < 2 {
            n += c.read(9, |_| {}).unwrap();
            if n < 2 {
                assert_eq!(c.wait_readable(0, LONG), Wait::Ready);
            }
        }
        producer.join().unwrap();
    });
}

#[test]
fn a_waiter_thread_is_woken_for_a_record_its_consumer_has_not_read() {
    model(|| {
        let ring = Ring::in_heap(32).unwrap();
        let mut p = ring.producer();
        let mut c = ring.consumer().unwrap();
        let waiter = c.waiter();
        let producer = loom::thread::spawn(move || {
            p.try_push(b"x").unwrap();
            p.publish();
        });
        // The application's thread reads; another thread sleeps for it.
        let sleeper = loom::thread::spawn(move || waiter.wait_readable(LONG));
        assert_eq!(sleeper.join().unwrap(), Wait::Ready);
        assert_eq!(c.read(9, |_| {}).unwrap(), 1);
        producer.join().unwrap();
    });
}

#[test]
fn a_room_waiter_is_woken_when_the_consumer_frees_space() {
    model(|| {
        let ring = Ring::in_heap(32).unwrap();
        let mut p = ring.producer();
        let mut c = ring.consumer().unwrap();
        // 16 + 16 bytes fill the ring; the third record must wait for room.
        assert!(p.try_push(&[1; 8]).unwrap());
        assert!(p.try_push(&[2; 8]).unwrap());
        assert!(!p.try_push(&[3; 8]).unwrap());
        p.publish();
        let room = p.room_waiter(8);
        let consumer = loom::thread::spawn(move || {
            assert_eq!(c.read(1, |_| {}).unwrap(), 1);
            c
        });
        assert_eq!(room.wait(LONG), Wait::Ready);
        assert!(p.try_push(&[3; 8]).unwrap());
        consumer.join().unwrap();
    });
}
