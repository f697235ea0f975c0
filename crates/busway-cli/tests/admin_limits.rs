//! The admin endpoint of `busway node --admin` under clients that misbehave (#28 point 11):
//! half-sent request heads, idle keep-alive connections, oversized heads, more connections
//! than it serves. Real processes on loopback, with the endpoint's own limits (no test-only
//! settings): the tests wait for its timeouts, with generous margins for a busy machine.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The endpoint's limits: the very file the binary is built with.
#[path = "../src/admin_serve/limits.rs"]
mod limits;
use limits::*;

const BIN: &str = env!("CARGO_BIN_EXE_busway");
/// Longest a node may take to start listening.
const START_LIMIT: Duration = Duration::from_secs(60);
/// Added to a timeout of the endpoint before a test gives up waiting for it: a busy 2-core
/// machine can delay the node's timers and this process by seconds.
const MARGIN: Duration = Duration::from_secs(20);
/// How much earlier than its timeout a connection may be seen closed: the tests read their
/// clock before they connect or send the last request, so the node's timer (from the accept
/// or the end of its response) starts later, and timers do not fire early; this only
/// absorbs rounding.
const EARLY: Duration = Duration::from_millis(20);
/// The flood: this many connections, each sending this much of a request head, unfinished.
const FLOOD_CONNECTIONS: usize = 300;
const FLOOD_PAD_BYTES: usize = 400 * 1024;

fn header_timeout() -> Duration {
    Duration::from_millis(ADMIN_HEADER_TIMEOUT_MS)
}

/// `busway node` with its admin endpoint, killed when dropped.
struct Node {
    child: Child,
    /// What it printed after "admin on ": `tcp://HOST:PORT` or `unix://PATH`.
    admin: String,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Node {
    fn start(admin: &str) -> Self {
        let mut child = Command::new(BIN)
            .args([
                "node",
                "--id",
                "1",
                "--listen",
                "tcp://127.0.0.1:0",
                "--admin",
                admin,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("busway starts");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = mpsc::channel();
        // Reads every line, so that the node never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut stderr = child.stderr.take().unwrap();
        let stderr = Some(std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        }));
        let mut node = Node {
            child,
            admin: String::new(),
            stderr,
        };
        let deadline = Instant::now() + START_LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(a) = line.trim().strip_prefix("admin on ") {
                        node.admin = a.to_owned();
                        return node;
                    }
                }
                Err(_) => {
                    let err = node.stop();
                    panic!("the node printed no admin address within {START_LIMIT:?}: {err}");
                }
            }
        }
    }

    fn tcp(&self) -> &str {
        self.admin
            .strip_prefix("tcp://")
            .expect("a tcp admin address")
    }

    /// The node's resident memory, in bytes.
    fn rss(&self) -> u64 {
        let path = format!("/proc/{}/status", self.child.id());
        let status = std::fs::read_to_string(&path).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmRSS in {status}"));
        kb * 1024
    }

    /// Stops the node; returns what it wrote to stderr.
    fn stop(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client connection, TCP or unix.
trait Conn: Read + Write {
    fn read_timeout(&self, d: Duration);
}

impl Conn for TcpStream {
    fn read_timeout(&self, d: Duration) {
        self.set_read_timeout(Some(d.max(Duration::from_millis(1))))
            .unwrap();
    }
}

impl Conn for UnixStream {
    fn read_timeout(&self, d: Duration) {
        self.set_read_timeout(Some(d.max(Duration::from_millis(1))))
            .unwrap();
    }
}

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
    s
}

/// Reads until the server closes the connection (end of stream, or reset) or `deadline`;
/// returns whether it closed, and what it sent before.
fn wait_closed(s: &mut impl Conn, deadline: Instant) -> (bool, Vec<u8>) {
    let mut got = Vec::new();
    let mut buf = [0; 16 * 1024];
    loop {
        s.read_timeout(deadline.saturating_duration_since(Instant::now()));
        match s.read(&mut buf) {
            Ok(0) => return (true, got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if Instant::now() >= deadline {
                    return (false, got);
                }
            }
            Err(_) => return (true, got),
        }
    }
}

/// Whether the server still holds the connection open: nothing to read, no end of stream.
fn still_open(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let open = matches!(s.peek(&mut [0; 1]), Err(e) if e.kind() == ErrorKind::WouldBlock);
    s.set_nonblocking(false).unwrap();
    open
}

/// One request on a keep-alive connection: its status and body (by its Content-Length).
fn request(s: &mut impl Conn, path: &str) -> (u16, String) {
    request_with(s, path, "")
}

/// `request` with more header lines (each ending in CRLF).
fn request_with(s: &mut impl Conn, path: &str, headers: &str) -> (u16, String) {
    write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n{headers}\r\n").unwrap();
    s.read_timeout(MARGIN);
    let mut got = Vec::new();
    let mut buf = [0; 4096];
    let head_end = loop {
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut buf).expect("an answer");
        assert!(
            n > 0,
            "closed mid-answer: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_lowercase();
    assert!(!head.contains("connection: close"), "{head}");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no content-length in {head}"));
    while got.len() < head_end + len {
        let n = s.read(&mut buf).expect("the body");
        assert!(n > 0, "closed mid-body");
        got.extend_from_slice(&buf[..n]);
    }
    let code = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, String::from_utf8_lossy(&got[head_end..]).into_owned())
}

/// One request on a connection of its own: status and body.
fn get(addr: &str, path: &str) -> (u16, String) {
    request(&mut connect(addr), path)
}

/// A request head of `len` bytes, cut before its end.
fn partial_head(len: usize) -> Vec<u8> {
    let mut head = b"GET / HTTP/1.1\r\nX-Pad: ".to_vec();
    head.resize(len, b'a');
    head
}

#[test]
fn three_hundred_half_sent_400_kb_heads_are_closed_and_hold_no_memory() {
    let mut node = Node::start("tcp://127.0.0.1:0");
    let addr = node.tcp().to_owned();
    // Warm: the first requests allocate what every later one reuses.
    for path in ["/status.json", "/metrics", "/"] {
        assert_eq!(get(&addr, path).0, 200);
    }
    let baseline = node.rss();
    let mut peak = baseline;
    let head = partial_head(FLOOD_PAD_BYTES);
    // All connected first, as clients that hold connections would: more than the endpoint
    // serves at once.
    let mut flood: Vec<TcpStream> = (0..FLOOD_CONNECTIONS).map(|_| connect(&addr)).collect();
    for s in &mut flood {
        // Fails when the server closed the connection first: the point.
        let _ = s.write_all(&head);
        peak = peak.max(node.rss());
    }
    let sent = Instant::now();
    // (a) Every connection is closed by the server: over the cap at once, else by the size cap
    // or the header timeout.
    let deadline = sent + header_timeout() + MARGIN;
    let mut open = 0;
    for s in &mut flood {
        let (closed, _) = wait_closed(s, deadline);
        open += usize::from(!closed);
        peak = peak.max(node.rss());
    }
    // (b) What the node held stays within the endpoint's bound.
    let held = peak.saturating_sub(baseline);
    eprintln!(
        "{open} of {FLOOD_CONNECTIONS} still open {:?} after the last head was sent; the \
         node's resident memory: {baseline} bytes, at most {held} more (bound \
         {ADMIN_MEMORY_MAX_BYTES})",
        sent.elapsed()
    );
    assert_eq!(open, 0, "half-sent heads still open");
    assert!(
        held < ADMIN_MEMORY_MAX_BYTES as u64,
        "the node's resident memory grew by {held} bytes (from {baseline}), over the bound of \
         {ADMIN_MEMORY_MAX_BYTES}"
    );
    // (c) It still answers.
    let (code, json) = get(&addr, "/status.json");
    assert_eq!(code, 200, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["id"], "1");
    let (code, metrics) = get(&addr, "/metrics");
    assert_eq!(code, 200, "{metrics}");
    assert!(metrics.contains("busway_info"), "{metrics}");
    // Connections over the cap were refused, and that was said once, not per connection (a
    // stall of the machine longer than ADMIN_REFUSALS_QUIET_MS could make it two bursts).
    let err = node.stop();
    let warnings = err.matches("closing new ones at once").count();
    assert!((1..=2).contains(&warnings), "{warnings} warnings: {err}");
}

#[test]
fn a_half_sent_head_is_closed_after_the_header_timeout() {
    let node = Node::start("tcp://127.0.0.1:0");
    let start = Instant::now();
    let mut s = connect(node.tcp());
    s.write_all(&partial_head(1024)).unwrap();
    let (closed, got) = wait_closed(&mut s, start + header_timeout() + MARGIN);
    let took = start.elapsed();
    assert!(closed, "still open after {took:?}");
    assert!(took >= header_timeout() - EARLY, "closed after {took:?}");
    // A timeout has no answer.
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
}

#[test]
fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let node = Node::start("tcp://127.0.0.1:0");
    let mut s = connect(node.tcp());
    // Two requests on the connection: it is kept alive between them. The idle time counts
    // from the end of the last response, after this clock reading.
    assert_eq!(request(&mut s, "/status.json").0, 200);
    let idle = Instant::now();
    assert_eq!(request(&mut s, "/metrics").0, 200);
    let timeout = Duration::from_millis(ADMIN_IDLE_TIMEOUT_MS);
    let (closed, got) = wait_closed(&mut s, idle + timeout + MARGIN);
    let took = idle.elapsed();
    assert!(closed, "still open after {took:?} idle");
    assert!(took >= timeout - EARLY, "closed after {took:?} idle");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
}

#[test]
fn a_request_head_over_the_cap_is_answered_431() {
    let node = Node::start("tcp://127.0.0.1:0");
    let addr = node.tcp();
    let deadline = || Instant::now() + header_timeout() + MARGIN;
    // A head reaching the cap unfinished: refused as it reaches it (not at the timeout, which
    // answers nothing). Nothing of it left unread, so the answer is not lost to a reset.
    let mut s = connect(addr);
    s.write_all(&partial_head(ADMIN_REQUEST_HEAD_MAX_BYTES))
        .unwrap();
    let (closed, got) = wait_closed(&mut s, deadline());
    let got = String::from_utf8_lossy(&got);
    assert!(closed, "still open: {got}");
    assert!(got.starts_with("HTTP/1.1 431 "), "{got}");
    // A whole head over the cap: 431 or closed (the rest of it unread may reset the
    // connection before the answer is read), never served.
    let mut s = connect(addr);
    let mut head = partial_head(ADMIN_REQUEST_HEAD_MAX_BYTES + 1024);
    head.extend_from_slice(b"\r\n\r\n");
    let _ = s.write_all(&head);
    let (closed, got) = wait_closed(&mut s, deadline());
    let got = String::from_utf8_lossy(&got);
    assert!(closed, "still open: {got}");
    assert!(got.is_empty() || got.starts_with("HTTP/1.1 431 "), "{got}");
    // Half the cap (a browser with many cookies) is served.
    let cookie = format!(
        "Cookie: x={}\r\n",
        "c".repeat(ADMIN_REQUEST_HEAD_MAX_BYTES / 2)
    );
    assert_eq!(request_with(&mut connect(addr), "/", &cookie).0, 200);
}

#[test]
fn connections_over_the_cap_are_closed_at_once_until_one_closes() {
    let node = Node::start("tcp://127.0.0.1:0");
    let addr = node.tcp();
    // Every slot taken by a connection that sends nothing, accepted in this order.
    let held: Vec<TcpStream> = (0..ADMIN_CONNECTIONS_MAX).map(|_| connect(addr)).collect();
    let mut over = connect(addr);
    let (closed, got) = wait_closed(&mut over, Instant::now() + header_timeout() + MARGIN);
    assert!(
        closed && got.is_empty(),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // Closed for the cap, not by its header timeout: those that hold the slots, accepted
    // before it, are still open.
    let open = held.iter().filter(|s| still_open(s)).count();
    assert_eq!(open, ADMIN_CONNECTIONS_MAX, "closed by the cap");
    // Once they are closed (by the header timeout), the endpoint serves again.
    for mut s in held {
        assert!(wait_closed(&mut s, Instant::now() + header_timeout() + MARGIN).0);
    }
    assert_eq!(get(addr, "/status.json").0, 200);
}

#[test]
fn the_limits_hold_on_a_unix_admin_socket_too() {
    let path =
        std::env::temp_dir().join(format!("busway-admin-limits-{}.sock", std::process::id()));
    let node = Node::start(&format!("unix://{}", path.display()));
    assert_eq!(node.admin, format!("unix://{}", path.display()));
    let start = Instant::now();
    let mut half = UnixStream::connect(&path).unwrap();
    half.write_all(&partial_head(1024)).unwrap();
    let mut big = UnixStream::connect(&path).unwrap();
    big.write_all(&partial_head(ADMIN_REQUEST_HEAD_MAX_BYTES))
        .unwrap();
    let (closed, got) = wait_closed(&mut big, start + header_timeout() + MARGIN);
    let got = String::from_utf8_lossy(&got);
    assert!(closed && got.starts_with("HTTP/1.1 431 "), "{got}");
    let (closed, _) = wait_closed(&mut half, start + header_timeout() + MARGIN);
    let took = start.elapsed();
    assert!(closed && took >= header_timeout() - EARLY, "{took:?}");
    let mut s = UnixStream::connect(&path).unwrap();
    assert_eq!(request(&mut s, "/status.json").0, 200);
    drop(node);
    let _ = std::fs::remove_file(&path);
}
