//! The bare ring's throughput between two threads (the raw baseline the shm channel is held
//! against): records of uniform random size in [MIN, MAX] bytes, published in batches.
//!
//! `cargo run --release -p busway-shm --example ring_throughput -- [MIN MAX [SECONDS]]`

mod common;

use busway_shm::ring::{Ring, Wait, RING_CAPACITY_DEFAULT};
use std::time::{Duration, Instant};

/// Records written between two publications.
const PUBLISH_EVERY: usize = 64;

fn main() {
    let (min, max, secs) = common::size_args(3);
    let ring = Ring::create("busway-bench", RING_CAPACITY_DEFAULT).unwrap();
    let mut p = ring.producer();
    let mut c = ring.consumer().unwrap();
    let sizes = common::sizes(min, max, 0);
    let buf = vec![7u8; max as usize];
    let stop = Instant::now() + Duration::from_secs(secs);
    let producer = std::thread::spawn(move || {
        let mut i = 0usize;
        'outer: loop {
            for _ in 0..PUBLISH_EVERY {
                let n = sizes[i % sizes.len()];
                while !p.try_push(&buf[..n]).unwrap() {
                    p.publish();
                    if p.wait_for_room(n, Duration::from_millis(100)) == Wait::Closed {
                        break 'outer;
                    }
                }
                i += 1;
            }
            p.publish();
            if i % (PUBLISH_EVERY * 64) == 0 && Instant::now() >= stop {
                break;
            }
        }
        p.close();
    });
    let started = Instant::now();
    let (mut msgs, mut bytes) = (0u64, 0u64);
    loop {
        c.read(usize::MAX, |m| {
            msgs += 1;
            bytes += m.len() as u64;
        })
        .unwrap();
        if c.wait_readable(1000, Duration::from_secs(1)) == Wait::Closed {
            c.read(usize::MAX, |m| {
                msgs += 1;
                bytes += m.len() as u64;
            })
            .unwrap();
            break;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    producer.join().unwrap();
    println!(
        "ring {min}-{max} B: {:.1} M msg/s, {:.2} GB/s ({msgs} records in {secs:.2} s)",
        msgs as f64 / secs / 1e6,
        bytes as f64 / secs / 1e9
    );
}
