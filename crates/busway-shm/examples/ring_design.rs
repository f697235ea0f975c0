//! The measurement behind the ring design (`docs/SHM.md`): one single-producer ring per writer
//! (busway) against libatbus's one multi-writer ring per receiver, whose writers reserve room
//! with a compare-and-swap on a shared tail and commit each record by stamping its position.
//! W writer threads send records of uniform random size in [MIN, MAX] bytes to one reader
//! thread for SECONDS; the reader counts them. Nobody sleeps: a side with nothing to do yields.
//!
//! `cargo run --release -p busway-shm --example ring_design -- [MIN MAX [SECONDS]]`

mod common;

use busway_shm::ring::{Ring, RING_CAPACITY_DEFAULT};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Header of a record in the multi-writer ring: the commit stamp (position + 1) and the length.
const MW_HEADER_BYTES: usize = 16;
/// Length that marks padding to the end of the ring.
const MW_PAD: u32 = u32::MAX;

/// libatbus's shape: any number of writers, one reader.
struct MultiWriterRing {
    words: Box<[AtomicU64]>,
    capacity: usize,
    /// End of what writers reserved.
    tail: AtomicU64,
    /// Start of what the reader has not consumed.
    head: AtomicU64,
}

impl MultiWriterRing {
    fn new(capacity: usize) -> Self {
        Self {
            words: (0..capacity / 8)
                .map(|_| AtomicU64::new(u64::MAX))
                .collect(),
            capacity,
            tail: AtomicU64::new(0),
            head: AtomicU64::new(0),
        }
    }

    fn stamp(&self, at: u64) -> &AtomicU64 {
        &self.words[(at as usize & (self.capacity - 1)) / 8]
    }

    fn write(&self, at: u64, bytes: &[u8]) {
        let idx = at as usize & (self.capacity - 1);
        assert!(idx + bytes.len() <= self.capacity);
        // SAFETY: in bounds (asserted); the range was reserved by this writer alone with the
        // compare-and-swap on `tail`, and the reader reads it only after the Acquire load of
        // its stamp that pairs with the Release store in `push`.
        unsafe {
            let base = self.words.as_ptr() as *mut u8;
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(idx), bytes.len());
        }
    }

    fn read<R>(&self, at: u64, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        let idx = at as usize & (self.capacity - 1);
        assert!(idx + len <= self.capacity);
        // SAFETY: in bounds (asserted) and committed: the reader loaded the record's stamp with
        // Acquire after its writer's Release store; no writer reuses it before `head` passes.
        f(unsafe { std::slice::from_raw_parts((self.words.as_ptr() as *const u8).add(idx), len) })
    }

    /// Reserves room with a compare-and-swap on `tail`, writes, commits: false if full.
    fn push(&self, payload: &[u8]) -> bool {
        let size = (MW_HEADER_BYTES + payload.len()).next_multiple_of(MW_HEADER_BYTES) as u64;
        loop {
            // Relaxed, here and in the compare-and-swap: the reservation orders no data; the
            // record's bytes are published by the Release store of its stamp.
            let cur = self.tail.load(Relaxed);
            let to_end = self.capacity as u64 - (cur & (self.capacity as u64 - 1));
            let pad = if to_end < size { to_end } else { 0 };
            // Acquire pairs with the reader's Release store of `head`.
            if cur + pad + size - self.head.load(Acquire) > self.capacity as u64 {
                return false;
            }
            if self
                .tail
                .compare_exchange_weak(cur, cur + pad + size, Relaxed, Relaxed)
                .is_err()
            {
                continue;
            }
            if pad > 0 {
                self.write(cur + 8, &MW_PAD.to_le_bytes());
                // Release pairs with the reader's Acquire load of the stamp.
                self.stamp(cur).store(cur + 1, Release);
            }
            let at = cur + pad;
            self.write(at + 8, &(payload.len() as u32).to_le_bytes());
            self.write(at + MW_HEADER_BYTES as u64, payload);
            // Release pairs with the reader's Acquire load of the stamp.
            self.stamp(at).store(at + 1, Release);
            return true;
        }
    }

    /// Reads committed records in order from `head`; returns how many.
    fn drain(&self, head: &mut u64, mut f: impl FnMut(&[u8])) -> u64 {
        let mut n = 0;
        // Acquire pairs with the writer's Release store of the stamp.
        while self.stamp(*head).load(Acquire) == *head + 1 {
            let len = self.read(*head + 8, 4, |b| {
                u32::from_le_bytes([b[0], b[1], b[2], b[3]])
            });
            if len == MW_PAD {
                *head += self.capacity as u64 - (*head & (self.capacity as u64 - 1));
                continue;
            }
            self.read(*head + MW_HEADER_BYTES as u64, len as usize, &mut f);
            *head += (MW_HEADER_BYTES + len as usize).next_multiple_of(MW_HEADER_BYTES) as u64;
            n += 1;
        }
        // Release pairs with the writers' Acquire load of `head`: the bytes before it are free.
        self.head.store(*head, Release);
        n
    }
}

/// Records per second through W single-producer rings read round robin; each writer
/// publishes every `publish_every` records.
fn single_writer_rings(w: usize, min: u64, max: u64, secs: f64, publish_every: usize) -> f64 {
    let rings: Vec<_> = (0..w)
        .map(|_| Ring::create_unchecked("busway-design", RING_CAPACITY_DEFAULT).unwrap())
        .collect();
    // Relaxed, here and below: `stop` is a flag that orders no data.
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = rings
        .iter()
        .enumerate()
        .map(|(k, r)| {
            let (mut p, stop) = (r.producer(), stop.clone());
            let (sizes, buf) = (common::sizes(min, max, k as u64), vec![7u8; max as usize]);
            std::thread::spawn(move || {
                let mut i = 0usize;
                while !stop.load(Relaxed) {
                    let n = sizes[i % sizes.len()];
                    if p.try_push(&buf[..n]).unwrap() {
                        i += 1;
                        if i % publish_every == 0 {
                            p.publish();
                        }
                    } else {
                        p.publish();
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let mut consumers: Vec<_> = rings.iter().map(|r| r.consumer().unwrap()).collect();
    let (start, mut msgs) = (Instant::now(), 0u64);
    while start.elapsed() < Duration::from_secs_f64(secs) {
        let mut n = 0;
        for c in &mut consumers {
            n += c.read(usize::MAX, |_| {}).unwrap();
        }
        if n == 0 {
            std::thread::yield_now();
        }
        msgs += n as u64;
    }
    let rate = msgs as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Relaxed);
    writers.into_iter().for_each(|t| t.join().unwrap());
    rate
}

/// Records per second through one multi-writer ring.
fn multi_writer_ring(w: usize, min: u64, max: u64, secs: f64) -> f64 {
    let ring = Arc::new(MultiWriterRing::new(RING_CAPACITY_DEFAULT));
    // Relaxed, here and below: `stop` is a flag that orders no data.
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..w)
        .map(|k| {
            let (ring, stop) = (ring.clone(), stop.clone());
            let (sizes, buf) = (common::sizes(min, max, k as u64), vec![7u8; max as usize]);
            std::thread::spawn(move || {
                let mut i = 0usize;
                while !stop.load(Relaxed) {
                    if ring.push(&buf[..sizes[i % sizes.len()]]) {
                        i += 1;
                    } else {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let (start, mut msgs, mut head) = (Instant::now(), 0u64, 0u64);
    while start.elapsed() < Duration::from_secs_f64(secs) {
        let n = ring.drain(&mut head, |_| {});
        if n == 0 {
            std::thread::yield_now();
        }
        msgs += n;
    }
    let rate = msgs as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Relaxed);
    writers.into_iter().for_each(|t| t.join().unwrap());
    rate
}

fn main() {
    let (min, max, secs) = common::size_args(2);
    let secs = secs as f64;
    println!("records of {min}-{max} B, {secs} s per row, M records/s read by one thread");
    for w in [1, 2] {
        let each = single_writer_rings(w, min, max, secs, 1);
        let batched = single_writer_rings(w, min, max, secs, 64);
        let multi = multi_writer_ring(w, min, max, secs);
        println!(
            "{w} writer(s): one ring per writer {:.1} (published per record), {:.1} (every 64); one multi-writer ring {:.1}",
            each / 1e6,
            batched / 1e6,
            multi / 1e6
        );
    }
}
