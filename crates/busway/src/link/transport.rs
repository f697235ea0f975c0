//! Stream transports: TCP (IPv4/IPv6), TCP to be wrapped in TLS (`tls://`; the TLS handshake
//! runs on the link's loop, see `link`), and Unix stream sockets (by path, or abstract for
//! `shm://NAME`, whose data then moves to shared memory; see `link`).
//!
//! The contract every transport keeps: `bind` gives a listener whose `accept` yields connected
//! streams; `dial` gives a connected stream; a stream splits into an owned read half and an owned
//! write half that support vectored writes. Accepted streams travel between loops as std
//! sockets (not bound to any runtime) and are registered with the loop that will own them.

use crate::addr::Addr;
use std::io;
use std::path::Path;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// A connected socket not yet registered with any event loop.
pub(crate) enum StdStream {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
    /// Accepted on a `tls://` listener: the TLS handshake is still to come (server side).
    TlsAccepted(std::net::TcpStream),
}

/// A socket registered with the current loop.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// Accepted on a `tls://` listener; the TLS handshake is still to come (server side).
    TlsAccepted(TcpStream),
    /// Dialed to a `tls://` address; the TLS handshake is still to come (client side).
    TlsDialed(TcpStream),
}

impl StdStream {
    /// Registers the socket with the runtime of the calling task.
    pub(crate) fn register(self) -> io::Result<Stream> {
        Ok(match self {
            StdStream::Tcp(s) => Stream::Tcp(TcpStream::from_std(s)?),
            StdStream::Unix(s) => Stream::Unix(UnixStream::from_std(s)?),
            StdStream::TlsAccepted(s) => Stream::TlsAccepted(TcpStream::from_std(s)?),
        })
    }
}

/// A bound listener, not yet registered with any loop.
pub(crate) enum StdListener {
    Tcp(std::net::TcpListener),
    Tls(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
    /// The control socket of `shm://NAME`.
    Shm(std::os::unix::net::UnixListener, String),
}

pub(crate) enum Listener {
    Tcp(TcpListener),
    Tls(TcpListener),
    Unix(UnixListener),
    Shm(UnixListener, String),
}

/// The abstract socket behind `shm://NAME`.
fn shm_socket(name: &str) -> io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(format!("busway/{name}"))
}

/// Binds `addr`; returns the listener and the address actually bound (port 0 resolved). A Unix
/// socket file left by a dead process (nobody accepts on it) is removed first.
pub(crate) fn bind(addr: &Addr) -> io::Result<(StdListener, Addr)> {
    match addr {
        Addr::Tcp(sa) => {
            let l = std::net::TcpListener::bind(sa)?;
            l.set_nonblocking(true)?;
            let bound = Addr::Tcp(l.local_addr()?);
            Ok((StdListener::Tcp(l), bound))
        }
        Addr::Tls(sa) => {
            let l = std::net::TcpListener::bind(sa)?;
            l.set_nonblocking(true)?;
            let bound = Addr::Tls(l.local_addr()?);
            Ok((StdListener::Tls(l), bound))
        }
        // A name: resolved now, the first address that binds is the one (std tries each).
        Addr::TcpHost(hp) => {
            let l =
                std::net::TcpListener::bind((hp.host(), hp.port())).map_err(|e| named(addr, e))?;
            l.set_nonblocking(true)?;
            let bound = Addr::Tcp(l.local_addr()?);
            Ok((StdListener::Tcp(l), bound))
        }
        Addr::TlsHost(hp) => {
            let l =
                std::net::TcpListener::bind((hp.host(), hp.port())).map_err(|e| named(addr, e))?;
            l.set_nonblocking(true)?;
            let bound = Addr::Tls(l.local_addr()?);
            Ok((StdListener::Tls(l), bound))
        }
        Addr::Unix(path) => {
            remove_stale_socket(path)?;
            let l = std::os::unix::net::UnixListener::bind(path)?;
            l.set_nonblocking(true)?;
            Ok((StdListener::Unix(l), addr.clone()))
        }
        Addr::Shm(name) => {
            let l = std::os::unix::net::UnixListener::bind_addr(&shm_socket(name)?).map_err(
                |e| match e.kind() {
                    io::ErrorKind::AddrInUse => io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!("{addr} is taken by another node of this host"),
                    ),
                    _ => e,
                },
            )?;
            l.set_nonblocking(true)?;
            Ok((StdListener::Shm(l, name.clone()), addr.clone()))
        }
    }
}

fn remove_stale_socket(path: &Path) -> io::Result<()> {
    if !path.exists() {
        return Ok(());
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("{} is in use by a live listener", path.display()),
        )),
        Err(_) => std::fs::remove_file(path),
    }
}

impl StdListener {
    pub(crate) fn register(self) -> io::Result<Listener> {
        Ok(match self {
            StdListener::Tcp(l) => Listener::Tcp(TcpListener::from_std(l)?),
            StdListener::Tls(l) => Listener::Tls(TcpListener::from_std(l)?),
            StdListener::Unix(l) => Listener::Unix(UnixListener::from_std(l)?),
            StdListener::Shm(l, name) => Listener::Shm(UnixListener::from_std(l)?, name),
        })
    }
}

impl Listener {
    /// The next connection, as a std socket ready to move to another loop, and the peer's
    /// address as text.
    pub(crate) async fn accept(&self) -> io::Result<(StdStream, String)> {
        match self {
            Listener::Tcp(l) => {
                let (s, peer) = l.accept().await?;
                s.set_nodelay(true)?;
                Ok((StdStream::Tcp(s.into_std()?), format!("tcp://{peer}")))
            }
            Listener::Tls(l) => {
                let (s, peer) = l.accept().await?;
                s.set_nodelay(true)?;
                Ok((
                    StdStream::TlsAccepted(s.into_std()?),
                    format!("tls://{peer}"),
                ))
            }
            Listener::Unix(l) => {
                let (s, _) = l.accept().await?;
                Ok((StdStream::Unix(s.into_std()?), "unix:(peer)".to_owned()))
            }
            Listener::Shm(l, name) => {
                let (s, _) = l.accept().await?;
                Ok((StdStream::Unix(s.into_std()?), format!("shm://{name}")))
            }
        }
    }
}

/// `e` with the address it came from when it is the resolver's (not the system's: its text
/// names no host), as is otherwise.
fn named(addr: &Addr, e: io::Error) -> io::Error {
    if e.raw_os_error().is_some() {
        return e;
    }
    io::Error::new(e.kind(), format!("resolving {addr}: {e}"))
}

/// Longest a connect to one of the addresses a host name resolved to may take, in
/// milliseconds: an address that drops packets (an AAAA record without an IPv6 route, a dead
/// A record) costs this, not the kernel's SYN timeout of minutes, before the next is tried.
const HOST_ADDRESS_CONNECT_TIMEOUT_MS: u64 = 3_000;

/// Resolves `hp` now and connects to the first of its addresses that answers, trying each in
/// turn; the error is the last address's.
async fn connect_host(addr: &Addr, hp: &crate::addr::HostPort) -> io::Result<TcpStream> {
    let resolved = tokio::net::lookup_host((hp.host(), hp.port()))
        .await
        .map_err(|e| named(addr, e))?;
    let mut last = io::Error::new(
        io::ErrorKind::NotFound,
        format!("resolving {addr}: no address"),
    );
    let wait = Duration::from_millis(HOST_ADDRESS_CONNECT_TIMEOUT_MS);
    for sa in resolved {
        match tokio::time::timeout(wait, TcpStream::connect(sa)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = e,
            Err(_) => {
                last = io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{sa} (of {addr}): no answer within {HOST_ADDRESS_CONNECT_TIMEOUT_MS} ms"
                    ),
                );
            }
        }
    }
    Err(last)
}

/// Connects to `addr` (from within the loop that will own the stream).
pub(crate) async fn dial(addr: &Addr) -> io::Result<Stream> {
    match addr {
        Addr::Tcp(sa) => {
            let s = TcpStream::connect(sa).await?;
            s.set_nodelay(true)?;
            Ok(Stream::Tcp(s))
        }
        Addr::Tls(sa) => {
            let s = TcpStream::connect(sa).await?;
            s.set_nodelay(true)?;
            Ok(Stream::TlsDialed(s))
        }
        // A name is resolved at each dial (a host that moved is found again) and every address
        // it resolves to is tried in turn; the error is the last address's.
        Addr::TcpHost(hp) => {
            let s = connect_host(addr, hp).await?;
            s.set_nodelay(true)?;
            Ok(Stream::Tcp(s))
        }
        Addr::TlsHost(hp) => {
            let s = connect_host(addr, hp).await?;
            s.set_nodelay(true)?;
            Ok(Stream::TlsDialed(s))
        }
        Addr::Unix(path) => Ok(Stream::Unix(UnixStream::connect(path).await?)),
        Addr::Shm(name) => {
            // Connecting to a local socket does not block beyond the kernel's own bookkeeping.
            let s = std::os::unix::net::UnixStream::connect_addr(&shm_socket(name)?)?;
            s.set_nonblocking(true)?;
            Ok(Stream::Unix(UnixStream::from_std(s)?))
        }
    }
}
