//! The limits of the admin endpoint's HTTP connections. Constants, not settings: the endpoint
//! serves a few scrapers, browsers and `busway status` runs, and these only bound what a
//! client that misbehaves can hold. `tests/admin_limits.rs` includes this file, so the test
//! checks the same numbers.

// Each of the binary and the test uses only some.
#![allow(dead_code)]

/// Open admin connections at most. A browser opens up to 6 connections to a host, a scraper
/// or a `busway status` run one: 32 leaves room for several of each, while keeping what
/// they can hold small (`ADMIN_MEMORY_MAX_BYTES`).
pub(crate) const ADMIN_CONNECTIONS_MAX: usize = 32;

/// How long a client has to send a whole request head, in milliseconds. hyper's timer for
/// it (1.12) runs from the moment the connection waits for a head: from the accept for the
/// first request, from the end of the previous response for the next ones on a keep-alive
/// connection. A local scraper or browser sends its head in well under a millisecond; 5 s
/// still covers a loaded machine or a slow link, and a client that sends nothing holds its
/// connection that long at most.
pub(crate) const ADMIN_HEADER_TIMEOUT_MS: u64 = 5_000;

/// How long a keep-alive connection may stay open with no request, in milliseconds. The
/// same timer as `ADMIN_HEADER_TIMEOUT_MS` (see there), so the same value: an idle
/// connection is closed that long after its last response. A status page reloading itself
/// every 2 s keeps its connection; a scraper every 15 s or more connects for each scrape
/// (a handshake, on loopback or a LAN).
pub(crate) const ADMIN_IDLE_TIMEOUT_MS: u64 = ADMIN_HEADER_TIMEOUT_MS;

/// Largest request head (request line and headers), in bytes; a larger one is answered 431
/// and the connection closed. Also hyper's read buffer limit (`max_buf_size`), so it bounds
/// what a connection buffers of a request. Scrapers send under 1 KiB, browsers 1 to 2 KiB
/// plus the cookies they hold for the host (up to 4 KiB each): 16 KiB leaves room for
/// those, and is 25 times under hyper's default of 408 KiB. hyper needs at least 8 KiB.
pub(crate) const ADMIN_REQUEST_HEAD_MAX_BYTES: usize = 16 * 1024;

/// What one open admin connection may hold in memory, in bytes, the response being written
/// aside: its read buffer (at most `ADMIN_REQUEST_HEAD_MAX_BYTES` of data, but allocated in
/// doublings, so up to twice that), hyper's 8 KiB buffer for response heads, and its task,
/// connection state and parsed head (a few KiB), rounded up.
pub(crate) const ADMIN_CONNECTION_MEMORY_MAX_BYTES: usize = 64 * 1024;

/// What all admin connections together may hold in memory, in bytes (responses being
/// written aside): 2 MiB. Connections over `ADMIN_CONNECTIONS_MAX` are closed at once and
/// hold nothing.
pub(crate) const ADMIN_MEMORY_MAX_BYTES: usize =
    ADMIN_CONNECTIONS_MAX * ADMIN_CONNECTION_MEMORY_MAX_BYTES;

const _: () = assert!(
    2 * ADMIN_REQUEST_HEAD_MAX_BYTES + 8 * 1024 + 16 * 1024 <= ADMIN_CONNECTION_MEMORY_MAX_BYTES,
    "a connection's read buffer, response head buffer and state fit its memory bound"
);
const _: () = assert!(
    ADMIN_REQUEST_HEAD_MAX_BYTES >= 8192,
    "hyper's max_buf_size is at least 8 KiB"
);

/// Longest an admin connection stays open, in milliseconds, however it is used. The
/// timeouts above only cover waiting for a request: without this, a client that sends
/// requests and never reads the responses (or reads them a byte at a time) would hold its
/// connection, and with `ADMIN_CONNECTIONS_MAX` of them the endpoint, for ever. A minute is
/// far more than any response takes; a browser whose connection is closed between two
/// reloads opens another.
pub(crate) const ADMIN_CONNECTION_LIFETIME_MAX_MS: u64 = 60_000;

/// At `ADMIN_CONNECTION_LIFETIME_MAX_MS`, how long a response being written still gets
/// before the connection is cut, in milliseconds (an idle connection closes at once).
pub(crate) const ADMIN_CLOSE_GRACE_MS: u64 = 2_000;

/// How long without a refused connection ends a burst of them, in milliseconds: the warning
/// that connections are refused over `ADMIN_CONNECTIONS_MAX` is logged once per burst, not
/// once per connection (the same for accept errors).
pub(crate) const ADMIN_REFUSALS_QUIET_MS: u64 = 10_000;

/// After an accept error other than a connection's own (e.g. out of file descriptors), how
/// long the endpoint waits before accepting again, in milliseconds: retrying at once would
/// spin; descriptors are likely freed within a second (as hyper 0.14 and axum do).
pub(crate) const ADMIN_ACCEPT_ERROR_PAUSE_MS: u64 = 1_000;
