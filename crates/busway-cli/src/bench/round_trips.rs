//! The raw baselines of `busway bench --latency`: the same round trip (one message out, its
//! echo back) with no bus, over the bare shared-memory ring and over a bare socket, measured
//! and summarised as the bus's round trips are.

use busway_shm::ring::{Ring, Wait};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// Smallest capacity of each bare ring of the round-trip baseline, in bytes; larger messages
/// get a ring that holds one of them (one message at a time crosses it).
const ROUND_TRIP_RING_BYTES_MIN: usize = 1 << 16;
/// How long either side of a bare round trip waits for the other before it gives up.
const ECHO_WAIT: Duration = Duration::from_secs(10);

/// Round trips measured before the clock counts: a tenth as many, and at least this many.
const WARMUP_MIN: usize = 100;

/// Round trips made before the `n` measured ones.
pub(crate) fn warmup(n: usize) -> usize {
    n / 10 + WARMUP_MIN
}

/// p50, p99 and p99.9 of `samples` (microseconds), which it sorts.
pub(crate) fn percentiles(samples: &mut [f64]) -> [f64; 3] {
    if samples.is_empty() {
        return [0.0; 3];
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    [pct(0.5), pct(0.99), pct(0.999)]
}

/// Round trips of a `size`-byte record over two bare rings between this thread and an echoing
/// one, each reader spinning `spins` times before it sleeps on the ring's futex (as the bus's
/// reader does with the same `shm_spins`).
pub(crate) fn over_rings(n: usize, size: usize, spins: u32) -> Result<[f64; 3], String> {
    let err = |e: busway_shm::ring::RingError| e.to_string();
    // A record may take at most half a ring (with its header and padding).
    let capacity = (2 * (size + 64))
        .next_power_of_two()
        .max(ROUND_TRIP_RING_BYTES_MIN);
    let there = Ring::create_unchecked("busway-bench-rtt", capacity).map_err(err)?;
    let back = Ring::create_unchecked("busway-bench-rtt", capacity).map_err(err)?;
    let (mut tx, mut far_rx) = (there.producer(), there.consumer().unwrap());
    let (mut far_tx, mut rx) = (back.producer(), back.consumer().unwrap());
    let echo = std::thread::spawn(move || -> Result<(), String> {
        let mut got = Vec::with_capacity(size);
        loop {
            got.clear();
            let n = far_rx.read_into(1, &mut got).map_err(|e| e.to_string())?;
            if n == 0 {
                match far_rx.wait_readable(spins, ECHO_WAIT) {
                    Wait::Ready => continue,
                    Wait::Closed => return Ok(()),
                    Wait::TimedOut => return Err("the bare ring's pinger went quiet".into()),
                }
            }
            if !far_tx.try_push(&got).map_err(|e| e.to_string())? {
                return Err("the bare echo ring is full".into());
            }
            far_tx.publish();
        }
    });
    let msg = vec![0x5Au8; size];
    let mut got = Vec::with_capacity(size);
    let mut samples = Vec::with_capacity(n);
    for i in 0..warmup(n) + n {
        let t = Instant::now();
        if !tx.try_push(&msg).map_err(|e| e.to_string())? {
            return Err("the bare ring is full".into());
        }
        tx.publish();
        loop {
            got.clear();
            if rx.read_into(1, &mut got).map_err(|e| e.to_string())? == 1 {
                break;
            }
            if rx.wait_readable(spins, ECHO_WAIT) != Wait::Ready {
                return Err("no echo over the bare ring".into());
            }
        }
        if i >= warmup(n) {
            samples.push(t.elapsed().as_nanos() as f64 / 1000.0);
        }
    }
    tx.close();
    echo.join()
        .map_err(|_| "the bare ring's echo thread panicked".to_string())??;
    Ok(percentiles(&mut samples))
}

/// Round trips of a `size`-byte message over a connected socket whose other end runs
/// [`echo`]: one `write`, then `read`s until the echo is whole.
pub(crate) fn ping(
    stream: &mut (impl Read + Write),
    n: usize,
    size: usize,
) -> Result<[f64; 3], String> {
    let msg = vec![0x5Au8; size];
    let mut got = vec![0u8; size];
    let mut samples = Vec::with_capacity(n);
    for i in 0..warmup(n) + n {
        let t = Instant::now();
        stream.write_all(&msg).map_err(|e| e.to_string())?;
        stream.read_exact(&mut got).map_err(|e| e.to_string())?;
        if i >= warmup(n) {
            samples.push(t.elapsed().as_nanos() as f64 / 1000.0);
        }
    }
    Ok(percentiles(&mut samples))
}

/// Echoes `size`-byte messages until the other end closes; returns how many.
pub(crate) fn echo(stream: &mut (impl Read + Write), size: usize) -> Result<u64, String> {
    let mut buf = vec![0u8; size];
    let mut n = 0;
    loop {
        match stream.read_exact(&mut buf) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(n),
            Err(e) => return Err(e.to_string()),
        }
        stream.write_all(&buf).map_err(|e| e.to_string())?;
        n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_spread() {
        let mut s: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        assert_eq!(percentiles(&mut s), [501.0, 991.0, 1000.0]);
        assert_eq!(percentiles(&mut []), [0.0; 3]);
    }

    #[test]
    fn bare_rings_make_round_trips_in_both_modes_and_any_size() {
        for (spins, size) in [(0, 64), (1_000, 64), (1_000, 1 << 20)] {
            let [p50, p99, p999] = over_rings(50, size, spins).unwrap();
            assert!(0.0 < p50 && p50 <= p99 && p99 <= p999, "{p50} {p99} {p999}");
        }
    }

    #[test]
    fn a_bare_socket_echo_answers_each_ping() {
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let echoer = std::thread::spawn(move || echo(&mut b, 32).unwrap());
        let [p50, _, _] = ping(&mut a, 50, 32).unwrap();
        drop(a);
        assert_eq!(echoer.join().unwrap(), 50 + warmup(50) as u64);
        assert!(p50 > 0.0);
    }
}
