//! Round trips over two bare rings between two threads: the one sends a 64-byte record, the
//! other echoes it; p50/p99/p99.9 in microseconds, sleeping on the futex (blocking) or spinning
//! first (latency mode).
//!
//! `cargo run --release -p busway-shm --example ring_latency -- [ROUND_TRIPS]`

use busway_shm::ring::{Ring, Wait, SPINS_BEFORE_SLEEP_DEFAULT};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(5);

fn run(round_trips: usize, spins: u32) -> Vec<u64> {
    let there = Ring::create("busway-lat-a", 1 << 16).unwrap();
    let back = Ring::create("busway-lat-b", 1 << 16).unwrap();
    let (mut tx, mut rx_far) = (there.producer(), there.consumer().unwrap());
    let (mut tx_far, mut rx) = (back.producer(), back.consumer().unwrap());
    let echo = std::thread::spawn(move || loop {
        let mut got = Vec::new();
        rx_far.read(1, |m| got = m.to_vec()).unwrap();
        if got.is_empty() {
            if rx_far.wait_readable(spins, WAIT) != Wait::Ready {
                return;
            }
            continue;
        }
        tx_far.try_push(&got).unwrap();
        tx_far.publish();
    });
    let msg = [1u8; 64];
    let mut samples = Vec::with_capacity(round_trips);
    for _ in 0..round_trips {
        let t = Instant::now();
        tx.try_push(&msg).unwrap();
        tx.publish();
        loop {
            if rx.read(1, |_| {}).unwrap() == 1 {
                break;
            }
            assert_eq!(rx.wait_readable(spins, WAIT), Wait::Ready);
        }
        samples.push(t.elapsed().as_nanos() as u64);
    }
    tx.close();
    echo.join().unwrap();
    samples.sort_unstable();
    samples
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(100_000, |a| a.parse().unwrap());
    for (mode, spins) in [
        ("blocking", 0),
        ("spin 2k then block (default)", SPINS_BEFORE_SLEEP_DEFAULT),
        ("spin 20k then block", 20_000),
        ("spinning", 1_000_000),
    ] {
        let s = run(n, spins);
        let pct = |p: f64| s[((s.len() as f64 * p) as usize).min(s.len() - 1)] as f64 / 1000.0;
        println!(
            "ring round trip, {mode}: p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us ({n} round trips)",
            pct(0.50),
            pct(0.99),
            pct(0.999)
        );
    }
}
