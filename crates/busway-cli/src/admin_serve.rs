//! Serves the admin endpoint's connections with limits (see `limits`): a request head must
//! come whole within `ADMIN_HEADER_TIMEOUT_MS` (which closes idle keep-alive connections
//! too) and be at most `ADMIN_REQUEST_HEAD_MAX_BYTES`, at most `ADMIN_CONNECTIONS_MAX`
//! connections are open, none for longer than `ADMIN_CONNECTION_LIFETIME_MAX_MS`. What the
//! connections hold together is bounded by `ADMIN_MEMORY_MAX_BYTES`.
//!
//! HTTP/1 only, by hyper's own connection builder rather than `axum::serve`, which sets no
//! timer (so no header timeout), no cap and hyper's default 408 KiB buffer.

mod limits;

use limits::*;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

// hyper has one timer for both: see `ADMIN_HEADER_TIMEOUT_MS`.
const _: () = assert!(ADMIN_IDLE_TIMEOUT_MS == ADMIN_HEADER_TIMEOUT_MS);

/// A listener the endpoint accepts connections on: TCP or unix.
pub(crate) trait Listen {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept_io(&self) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

impl Listen for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept_io(&self) -> io::Result<Self::Io> {
        self.accept().await.map(|(s, _)| s)
    }
}

impl Listen for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept_io(&self) -> io::Result<Self::Io> {
        self.accept().await.map(|(s, _)| s)
    }
}

/// Serves `app` on the connections of `listener` until dropped (which ends every connection
/// too). Never returns.
pub(crate) async fn serve<L: Listen>(listener: L, app: Router) -> Result<(), String> {
    let http = http1_builder();
    let slots = Arc::new(Semaphore::new(ADMIN_CONNECTIONS_MAX));
    // Owned here: dropping the endpoint aborts its connections.
    let mut connections = JoinSet::new();
    let mut refusals = Burst::default();
    let mut accept_errors = Burst::default();
    loop {
        let io = tokio::select! {
            accepted = listener.accept_io() => accepted,
            // Reaps finished connections, so that the set holds only open ones.
            Some(done) = connections.join_next(), if !connections.is_empty() => {
                if let Err(e) = done {
                    tracing::warn!("an admin connection failed: {e}");
                }
                continue;
            }
        };
        let io = match io {
            Ok(io) => io,
            // The connection's own trouble (reset before it was accepted): nothing to wait for.
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                if accept_errors.starts(Instant::now()) {
                    tracing::warn!(
                        "admin endpoint cannot accept connections: {e}; retrying every \
                         {ADMIN_ACCEPT_ERROR_PAUSE_MS} ms (logged once until it accepts \
                         again for {ADMIN_REFUSALS_QUIET_MS} ms)"
                    );
                }
                tokio::time::sleep(Duration::from_millis(ADMIN_ACCEPT_ERROR_PAUSE_MS)).await;
                continue;
            }
        };
        // Over the cap, the connection is accepted and closed at once rather than left in
        // the listen backlog: there no timer of ours runs, the kernel holds what the client
        // sends, and a client waits for as long as the slots stay taken. Closed, a scraper
        // or browser sees its failure at once (and retries at its next scrape or reload).
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if refusals.starts(Instant::now()) {
                tracing::warn!(
                    "admin endpoint: {ADMIN_CONNECTIONS_MAX} connections open, the most it \
                     serves; closing new ones at once (logged once per burst: until none \
                     is refused for {ADMIN_REFUSALS_QUIET_MS} ms)"
                );
            }
            tracing::debug!("admin connection refused: {ADMIN_CONNECTIONS_MAX} open");
            drop(io);
            continue;
        };
        connections.spawn(serve_connection(http.clone(), io, app.clone(), slot));
    }
}

/// hyper's HTTP/1 connection settings for the admin endpoint.
fn http1_builder() -> http1::Builder {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(ADMIN_HEADER_TIMEOUT_MS))
        .max_buf_size(ADMIN_REQUEST_HEAD_MAX_BYTES)
        .max_header_size(ADMIN_REQUEST_HEAD_MAX_BYTES)
        .keep_alive(true);
    http
}

/// Serves one connection to its end or to `ADMIN_CONNECTION_LIFETIME_MAX_MS`, holding
/// `slot` meanwhile.
async fn serve_connection<I>(http: http1::Builder, io: I, app: Router, slot: OwnedSemaphorePermit)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = http.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    tokio::pin!(conn);
    let lifetime = Duration::from_millis(ADMIN_CONNECTION_LIFETIME_MAX_MS);
    let ended = tokio::select! {
        r = conn.as_mut() => r,
        () = tokio::time::sleep(lifetime) => {
            // Ends an idle connection at once, one in a request after its response.
            conn.as_mut().graceful_shutdown();
            let grace = Duration::from_millis(ADMIN_CLOSE_GRACE_MS);
            tokio::time::timeout(grace, conn.as_mut())
                .await
                .unwrap_or(Ok(()))
        }
    };
    if let Err(e) = ended {
        tracing::debug!("admin connection closed: {e}");
    }
    // The slot is free before the socket closes: a client that sees the close may connect
    // again at once.
    drop(slot);
}

/// Errors of one connection, not of the listener (as hyper 0.14 and axum tell them).
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Events that come in bursts, logged once per burst: a burst ends after
/// `ADMIN_REFUSALS_QUIET_MS` without one.
#[derive(Default)]
struct Burst {
    last: Option<Instant>,
}

impl Burst {
    /// Records an event at `now`; true if it starts a burst.
    fn starts(&mut self, now: Instant) -> bool {
        let quiet = Duration::from_millis(ADMIN_REFUSALS_QUIET_MS);
        let starts = self
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= quiet);
        self.last = Some(now);
        starts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_logged_once_and_a_quiet_pause_ends_it() {
        let mut b = Burst::default();
        let t = Instant::now();
        let quiet = Duration::from_millis(ADMIN_REFUSALS_QUIET_MS);
        assert!(b.starts(t));
        assert!(!b.starts(t + Duration::from_millis(1)));
        // Events closer together than the quiet pause keep the burst going, however long.
        assert!(!b.starts(t + quiet));
        assert!(!b.starts(t + quiet * 2 - Duration::from_millis(1)));
        assert!(b.starts(t + quiet * 4));
    }
}
