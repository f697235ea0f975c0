//! A writer process killed with SIGKILL mid-stream: the reader delivers only whole, checked
//! records (each the next in sequence), a new writer process resumes on the same ring, and no
//! segment is left behind. The writer is this test binary run again with `BUSWAY_SHM_WRITER`
//! set (see `writer_process`).

#![cfg(not(feature = "loom"))]

use busway_shm::ring::{Ring, Wait};
use busway_shm::Segment;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

fn payload(seq: u64, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&seq.to_le_bytes());
    out.resize(8 + (seq % 300) as usize, seq as u8);
}

/// In the child: writes records numbered from `BUSWAY_SHM_FIRST` into the ring whose
/// descriptor is `BUSWAY_SHM_WRITER`, until killed. In a normal test run: does nothing.
#[test]
fn writer_process() {
    let Some(fd) = std::env::var("BUSWAY_SHM_WRITER").ok() else {
        return;
    };
    let first: u64 = std::env::var("BUSWAY_SHM_FIRST").unwrap().parse().unwrap();
    // SAFETY: the parent passed this descriptor to us open and owns no copy in this process.
    let fd = unsafe { OwnedFd::from_raw_fd(fd.parse().unwrap()) };
    let ring = Ring::open(
        Segment::from_fd(fd).unwrap(),
        &Default::default(),
        usize::MAX,
    )
    .unwrap();
    let mut p = ring.producer();
    let mut buf = Vec::new();
    for seq in first.. {
        payload(seq, &mut buf);
        while !p.try_push(&buf).unwrap() {
            p.publish();
            p.wait_for_room(buf.len(), Duration::from_millis(100));
        }
        if seq % 8 == 0 {
            p.publish();
        }
    }
}

fn spawn_writer(ring: &Ring, first: u64) -> Child {
    // A copy of the descriptor without close-on-exec, for the child only.
    let fd = rustix::io::dup(ring.segment().fd()).unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "writer_process",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("BUSWAY_SHM_WRITER", fd.as_raw_fd().to_string())
    .env("BUSWAY_SHM_FIRST", first.to_string());
    cmd.stdout(std::process::Stdio::null());
    let child = cmd.spawn().unwrap();
    drop(fd);
    child
}

/// Reads until `until` records arrived (or, with `None`, until the ring stays empty for a
/// moment); checks each. Returns the next expected number.
fn read_checked(c: &mut busway_shm::Consumer, mut expected: u64, until: Option<u64>) -> u64 {
    let mut want = Vec::new();
    let started = Instant::now();
    loop {
        c.read(usize::MAX, |m| {
            payload(expected, &mut want);
            assert_eq!(m, want.as_slice(), "record {expected} whole and in order");
            expected += 1;
        })
        .expect("no corrupt record");
        if until.is_some_and(|n| expected >= n) {
            return expected;
        }
        let wait = if until.is_some() {
            WAIT
        } else {
            Duration::from_millis(200)
        };
        match c.wait_readable(0, wait) {
            Wait::Ready => {}
            Wait::TimedOut if until.is_none() => return expected,
            other => panic!(
                "reader {other:?} at {expected} after {:?}",
                started.elapsed()
            ),
        }
    }
}

/// In the child: creates a ring, writes one record, prints `pid fd inode`, and waits for its
/// stdin to close. In a normal test run: does nothing.
#[test]
fn holder_process() {
    if std::env::var_os("BUSWAY_SHM_HOLDER").is_none() {
        return;
    }
    let ring = Ring::create("busway-holder", 4096).unwrap();
    let mut p = ring.producer();
    p.try_push(b"from another process").unwrap();
    p.publish();
    let seg = ring.segment();
    println!(
        "HOLDER {} {} {}",
        std::process::id(),
        seg.fd().as_raw_fd(),
        seg.inode().unwrap()
    );
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

#[test]
fn a_segment_is_opened_from_another_process_by_pid_descriptor_and_inode() {
    use std::io::{BufRead, BufReader};
    if std::env::var_os("BUSWAY_SHM_WRITER").is_some()
        || std::env::var_os("BUSWAY_SHM_HOLDER").is_some()
    {
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "holder_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BUSWAY_SHM_HOLDER", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("HOLDER ") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the holder printed its segment"
        );
        line = line
            .trim_start_matches("running 1 test")
            .trim_start()
            .to_string();
        if let Some(at) = line.find("HOLDER ") {
            line = line[at..].to_string();
        }
    }
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap())
        .collect();
    let (pid, fd, inode) = (f[0] as u32, f[1] as u32, f[2]);
    let err = Segment::open_from_process(pid, fd, inode + 1)
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("not the announced segment"),
        "{err}"
    );
    let ring = Ring::open(
        Segment::open_from_process(pid, fd, inode).unwrap(),
        &Default::default(),
        usize::MAX,
    )
    .unwrap();
    let mut got = Vec::new();
    ring.consumer()
        .unwrap()
        .read(1, |m| got = m.to_vec())
        .unwrap();
    assert_eq!(got, b"from another process");
    drop(child.stdin.take());
    child.wait().unwrap();
}

fn shm_entries() -> usize {
    std::fs::read_dir("/dev/shm").map_or(0, |d| d.count())
}

#[test]
fn a_writer_killed_mid_stream_leaves_only_whole_records_and_a_new_writer_resumes() {
    if std::env::var_os("BUSWAY_SHM_WRITER").is_some()
        || std::env::var_os("BUSWAY_SHM_HOLDER").is_some()
    {
        return;
    }
    let shm_before = shm_entries();
    let ring = Ring::create("busway-crash", 64 << 10).unwrap();
    let mut c = ring.consumer().unwrap();
    let mut next = 0;
    for round in 0..3 {
        let mut writer = spawn_writer(&ring, next);
        next = read_checked(&mut c, next, Some(next + 50_000));
        // SIGKILL mid-stream: it is writing records as fast as the reader frees room.
        writer.kill().unwrap();
        writer.wait().unwrap();
        // What it published arrives whole; a record it was writing never shows.
        next = read_checked(&mut c, next, None);
        assert!(next >= (round + 1) * 50_000);
    }
    drop(c);
    drop(ring);
    assert_eq!(shm_entries(), shm_before, "no segment left in /dev/shm");
}
