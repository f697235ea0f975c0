//! `busway bench --idle N[,N...]`: the memory a `busway node` keeps per idle connection. A node
//! runs in a child process; this process opens N connections to it, completes each handshake
//! as a distinct bus id, answers its heartbeats, and reads the node's resident memory
//! (`VmRSS` of `/proc/PID/status`) before and after. The figure is the growth divided by N.

use busway_core::control::ping_frame;
use busway_core::frame::{FrameKind, HANDSHAKE_BODY_LEN_MAX};
use busway_core::handshake::{local_hello, Handshake, NonceCache, Role, Step, NONCE_LEN};
use busway_core::{BusId, FrameDecoder};
use bytes::BytesMut;
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long the connections stay idle (answering heartbeats) before the node's memory is read,
/// in seconds: a few heartbeats, so every link's timers, buffers and queues have been used.
const SETTLE_SECS: u64 = 3;
/// Longest the whole set of handshakes may take, in seconds.
const CONNECT_SECS: u64 = 120;
/// First bus id of the idle peers (the node is bus id 1).
const FIRST_PEER_ID: u64 = 1_000;
/// Handshakes this process runs at once: well under the node's
/// `busway::limits::HANDSHAKES_IN_FLIGHT_MAX`, which would refuse the rest.
const HANDSHAKES_AT_ONCE: usize = busway::limits::HANDSHAKES_IN_FLIGHT_MAX / 2;

/// One row of the idle-connection table.
#[derive(Serialize, Debug)]
pub(crate) struct IdleRow {
    workload: &'static str,
    connections: usize,
    rss_before_kib: u64,
    rss_after_kib: u64,
    kib_per_connection: f64,
    connect_secs: f64,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn rss_kib(pid: u32) -> Result<u64, String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("reading the node's memory: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmRSS in the node's status".to_string())
}

/// A `busway node` child listening on loopback; returns it and its address.
fn start_node() -> Result<(Child, String), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(["node", "--id", "1", "--listen", "tcp://127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting a node: {e}"))?;
    let out = child.stdout.take().ok_or("no stdout from the node")?;
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let addr = line
        .trim()
        .strip_prefix("listening on tcp://")
        .ok_or_else(|| format!("the node said {line:?}"))?
        .to_string();
    Ok((child, addr))
}

/// One idle peer: completes the handshake as `id` (holding `turn` meanwhile), then answers the
/// node's PINGs until the connection ends. Sends `true` on `ready` once established, `false`
/// if it could not be.
async fn idle_peer(
    addr: String,
    id: u64,
    turn: tokio::sync::OwnedSemaphorePermit,
    ready: tokio::sync::mpsc::Sender<bool>,
) {
    let mut turn = Some(turn);
    idle_peer_inner(addr, id, &mut turn, &ready).await;
    if turn.is_some() {
        let _ = ready.send(false).await;
    }
}

async fn idle_peer_inner(
    addr: String,
    id: u64,
    turn: &mut Option<tokio::sync::OwnedSemaphorePermit>,
    ready: &tokio::sync::mpsc::Sender<bool>,
) {
    let Ok(mut s) = TcpStream::connect(&addr).await else {
        return;
    };
    let hello = local_hello(
        BusId(id),
        id,
        now_ms(),
        [(id % 251) as u8; NONCE_LEN],
        vec![],
    );
    let mut hs = Handshake::new(Role::Dialer, hello, None);
    if s.write_all(&hs.hello_frame()).await.is_err() {
        return;
    }
    let mut dec = FrameDecoder::new(HANDSHAKE_BODY_LEN_MAX);
    let mut buf = BytesMut::new();
    let mut nonces = NonceCache::default();
    let mut up = false;
    loop {
        while let Ok(Some(f)) = dec.decode(&mut buf) {
            if up {
                if f.kind == FrameKind::Ping && f.body.len() == 8 {
                    let token = u64::from_le_bytes(f.body[..8].try_into().unwrap_or_default());
                    if s.write_all(&ping_frame(FrameKind::Pong, token))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                continue;
            }
            match hs.handle_frame(&f, now_ms(), &mut nonces) {
                Ok(Step::PeerHello(_)) => {
                    if s.write_all(&hs.auth_frame(0, 0)).await.is_err() {
                        return;
                    }
                }
                Ok(Step::Established(_)) => {
                    up = true;
                    dec.set_body_len_max(1 << 20);
                    turn.take();
                    let _ = ready.send(true).await;
                }
                Err(_) => return,
            }
        }
        match s.read_buf(&mut buf).await {
            Ok(n) if n > 0 => {}
            _ => return,
        }
    }
}

/// Measures one row: `n` idle connections to a fresh node.
fn measure(n: usize) -> Result<IdleRow, String> {
    let (mut child, addr) = start_node()?;
    let pid = child.id();
    let result = (|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let before = rss_kib(pid)?;
            let started = Instant::now();
            let (tx, mut rx) = tokio::sync::mpsc::channel(n.max(1));
            let turns = std::sync::Arc::new(tokio::sync::Semaphore::new(HANDSHAKES_AT_ONCE));
            let spawner = {
                let addr = addr.clone();
                async move {
                    for i in 0..n {
                        let Ok(turn) = turns.clone().acquire_owned().await else {
                            return;
                        };
                        let id = FIRST_PEER_ID + i as u64;
                        tokio::spawn(idle_peer(addr.clone(), id, turn, tx.clone()));
                    }
                }
            };
            tokio::spawn(spawner);
            let all_up = async {
                let (mut up, mut seen) = (0, 0);
                while seen < n {
                    match rx.recv().await {
                        Some(ok) => {
                            seen += 1;
                            up += usize::from(ok);
                        }
                        None => break,
                    }
                }
                up
            };
            let up = tokio::time::timeout(Duration::from_secs(CONNECT_SECS), all_up)
                .await
                .unwrap_or(0);
            if up < n {
                return Err(format!("only {up} of {n} connections came up"));
            }
            let connect_secs = started.elapsed().as_secs_f64();
            // Idle, answering heartbeats: the condition measured, not a wait for an event.
            tokio::time::sleep(Duration::from_secs(SETTLE_SECS)).await;
            let after = rss_kib(pid)?;
            Ok(IdleRow {
                workload: "idle",
                connections: n,
                rss_before_kib: before,
                rss_after_kib: after,
                kib_per_connection: after.saturating_sub(before) as f64 / n as f64,
                connect_secs,
            })
        })
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// Runs `--idle`: one row per count, as a table or JSON lines.
pub(crate) fn run(counts: &[usize], json: bool) -> Result<(), String> {
    if !json {
        println!(
            "busway bench --idle: resident memory of a `busway node` per idle connection (handshake done, heartbeats answered for {SETTLE_SECS} s)"
        );
        println!(
            "{:>12} {:>14} {:>14} {:>12} {:>10}",
            "connections", "rss before KiB", "rss after KiB", "KiB / conn", "connect s"
        );
    }
    for &n in counts {
        let row = measure(n)?;
        if json {
            println!("{}", serde_json::to_string(&row).unwrap_or_default());
        } else {
            println!(
                "{:>12} {:>14} {:>14} {:>12.2} {:>10.2}",
                row.connections,
                row.rss_before_kib,
                row.rss_after_kib,
                row.kib_per_connection,
                row.connect_secs
            );
        }
    }
    Ok(())
}
