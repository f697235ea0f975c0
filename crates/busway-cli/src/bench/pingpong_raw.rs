//! The raw baseline of `busway bench --pingpong`: muduo's own ping-pong (seed 002) with no bus.
//! N connections between two processes, each side a set of mio (epoll) event loops, one per
//! thread, the connections spread over them; each connection starts with one block of S bytes
//! from the client, and both sides write back whatever they read. The client counts what it
//! reads while the clock runs.

use super::pingpong_bus::PingpongRun;
use super::report::Report;
use busway::Addr;
use mio::event::Source;
use mio::net::{TcpStream, UnixStream};
use mio::{Events, Interest, Poll, Registry, Token};
use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

/// Bytes one event loop reads per `read` call (shared by its connections).
const READ_SCRATCH_BYTES: usize = 64 << 10;
/// Readiness events taken per `poll`.
const EVENTS_PER_POLL: usize = 1024;
/// How long an echoing loop waits with no event before it decides the client is gone.
const ECHO_IDLE_WAIT: Duration = Duration::from_secs(10);
/// How long the client keeps trying to connect (the server may not listen yet).
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// A non-blocking connection of either kind.
enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(buf),
            Conn::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(buf),
            Conn::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Source for Conn {
    fn register(&mut self, r: &Registry, t: Token, i: Interest) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.register(r, t, i),
            Conn::Unix(s) => s.register(r, t, i),
        }
    }
    fn reregister(&mut self, r: &Registry, t: Token, i: Interest) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.reregister(r, t, i),
            Conn::Unix(s) => s.reregister(r, t, i),
        }
    }
    fn deregister(&mut self, r: &Registry) -> std::io::Result<()> {
        match self {
            Conn::Tcp(s) => s.deregister(r),
            Conn::Unix(s) => s.deregister(r),
        }
    }
}

/// One connection and the bytes it read but could not write back yet.
struct Session {
    conn: Option<Conn>,
    unsent: Vec<u8>,
}

impl Session {
    /// Writes what is unsent until the socket takes no more; false if the connection failed.
    fn write_unsent(&mut self) -> bool {
        let Some(conn) = self.conn.as_mut() else {
            return false;
        };
        let mut done = 0;
        while done < self.unsent.len() {
            match conn.write(&self.unsent[done..]) {
                Ok(0) => return false,
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        self.unsent.drain(..done);
        true
    }

    /// Reads all there is, queues it to be written back; returns the bytes read and whether
    /// the connection is still open.
    fn read_all(&mut self, scratch: &mut [u8]) -> (usize, bool) {
        let Some(conn) = self.conn.as_mut() else {
            return (0, false);
        };
        let mut total = 0;
        loop {
            match conn.read(scratch) {
                Ok(0) => return (total, false),
                Ok(n) => {
                    total += n;
                    self.unsent.extend_from_slice(&scratch[..n]);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return (total, true),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return (total, false),
            }
        }
    }
}

/// When the client's loops count and stop; the server's run until their connections close.
#[derive(Clone, Copy)]
struct Window {
    measured_from: Instant,
    end: Instant,
}

/// One event loop: echoes on its connections; with `window`, counts the bytes read inside it
/// and stops at its end (the client), else runs until every connection closed (the server).
fn event_loop(
    conns: Vec<Conn>,
    first_block: Option<usize>,
    window: Option<Window>,
) -> Result<u64, String> {
    let err = |e: std::io::Error| e.to_string();
    let mut poll = Poll::new().map_err(err)?;
    let mut sessions: Vec<Session> = Vec::with_capacity(conns.len());
    for (i, mut conn) in conns.into_iter().enumerate() {
        poll.registry()
            .register(&mut conn, Token(i), Interest::READABLE | Interest::WRITABLE)
            .map_err(err)?;
        sessions.push(Session {
            conn: Some(conn),
            unsent: first_block.map(|s| vec![0x5A; s]).unwrap_or_default(),
        });
    }
    let mut open = sessions.len();
    let mut events = Events::with_capacity(EVENTS_PER_POLL);
    let mut scratch = vec![0u8; READ_SCRATCH_BYTES];
    let mut counted = 0u64;
    while open > 0 {
        let timeout = match window {
            Some(w) => w.end.saturating_duration_since(Instant::now()),
            None => ECHO_IDLE_WAIT,
        };
        if window.is_some() && timeout.is_zero() {
            break;
        }
        poll.poll(&mut events, Some(timeout)).map_err(err)?;
        if window.is_none() && events.is_empty() {
            return Err("the ping-pong client went quiet".into());
        }
        let counting = window.is_some_and(|w| Instant::now() >= w.measured_from);
        for ev in events.iter() {
            let s = &mut sessions[ev.token().0];
            let mut alive = s.conn.is_some();
            if alive && ev.is_readable() {
                let (n, still) = s.read_all(&mut scratch);
                if counting {
                    counted += n as u64;
                }
                alive = still;
            }
            if alive && (ev.is_writable() || !s.unsent.is_empty()) {
                alive = s.write_unsent();
            }
            if !alive && s.conn.is_some() {
                if let Some(mut c) = s.conn.take() {
                    let _ = poll.registry().deregister(&mut c);
                }
                open -= 1;
            }
        }
    }
    Ok(counted)
}

/// Spreads `conns` over `loops` threads, each running [`event_loop`]; the sum of their counts.
fn on_loops(
    conns: Vec<Conn>,
    loops: usize,
    first_block: Option<usize>,
    window: Option<Window>,
) -> Result<u64, String> {
    let loops = loops.max(1);
    let mut shares: Vec<Vec<Conn>> = (0..loops).map(|_| Vec::new()).collect();
    for (i, c) in conns.into_iter().enumerate() {
        shares[i % loops].push(c);
    }
    let threads: Vec<_> = shares
        .into_iter()
        .map(|share| std::thread::spawn(move || event_loop(share, first_block, window)))
        .collect();
    let mut total = 0;
    for t in threads {
        total += t
            .join()
            .map_err(|_| "an event loop thread panicked".to_string())??;
    }
    Ok(total)
}

/// The client: opens `sessions` connections to `addr`, starts one block on each, echoes for
/// the run; reports what it read after the warm-up.
pub(crate) fn client(addr: &Addr, run: &PingpongRun) -> Result<Report, String> {
    let mut conns = Vec::with_capacity(run.sessions);
    for i in 0..run.sessions {
        conns.push(connect(addr).map_err(|e| {
            format!(
                "connection {} of {} to {addr}: {e} (each session is a connection: raise `ulimit -n` for many)",
                i + 1,
                run.sessions
            )
        })?);
    }
    let window = run.window();
    let bytes = on_loops(conns, run.loops, Some(run.size), Some(window))?;
    let secs = (window.end - window.measured_from).as_secs_f64();
    Ok(Report {
        msgs: bytes / run.size.max(1) as u64,
        bytes,
        secs,
        ..Report::default()
    })
}

/// The server: listens at `addr` (announcing where), accepts `sessions` connections and
/// echoes on them until they close.
pub(crate) fn server(
    addr: &Addr,
    run: &PingpongRun,
    ready: impl FnOnce(String),
) -> Result<Report, String> {
    let err = |e: std::io::Error| format!("{addr}: {e}");
    let mut conns = Vec::with_capacity(run.sessions);
    match addr {
        Addr::Tcp(a) => {
            let l = std::net::TcpListener::bind(a).map_err(err)?;
            ready(Addr::Tcp(l.local_addr().map_err(err)?).to_string());
            for _ in 0..run.sessions {
                let (s, _) = l.accept().map_err(err)?;
                s.set_nodelay(true).map_err(err)?;
                s.set_nonblocking(true).map_err(err)?;
                conns.push(Conn::Tcp(TcpStream::from_std(s)));
            }
        }
        Addr::Unix(p) => {
            let _ = std::fs::remove_file(p);
            let l = std::os::unix::net::UnixListener::bind(p).map_err(err)?;
            ready(addr.to_string());
            for _ in 0..run.sessions {
                let (s, _) = l.accept().map_err(err)?;
                s.set_nonblocking(true).map_err(err)?;
                conns.push(Conn::Unix(UnixStream::from_std(s)));
            }
            let _ = std::fs::remove_file(p);
        }
        _ => {
            return Err(format!(
                "{addr}: the raw ping-pong runs over tcp:// or unix://"
            ))
        }
    }
    let bytes = on_loops(conns, run.loops, None, None)?;
    Ok(Report {
        msgs: bytes,
        ..Report::default()
    })
}

/// One non-blocking connection to `addr`, retried until `CONNECT_WAIT` (the server may not
/// listen yet).
fn connect(addr: &Addr) -> std::io::Result<Conn> {
    let deadline = Instant::now() + CONNECT_WAIT;
    loop {
        let attempt = match addr {
            Addr::Tcp(a) => std::net::TcpStream::connect(a).and_then(|s| {
                s.set_nodelay(true)?;
                s.set_nonblocking(true)?;
                Ok(Conn::Tcp(TcpStream::from_std(s)))
            }),
            Addr::Unix(p) => std::os::unix::net::UnixStream::connect(p).and_then(|s| {
                s.set_nonblocking(true)?;
                Ok(Conn::Unix(UnixStream::from_std(s)))
            }),
            _ => {
                return Err(std::io::Error::new(
                    ErrorKind::InvalidInput,
                    "the raw ping-pong runs over tcp:// or unix://",
                ))
            }
        };
        match attempt {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

impl PingpongRun {
    fn window(&self) -> Window {
        let (measured_from, end) = self.clock();
        Window { measured_from, end }
    }
}
