//! busway from C and C++: a C ABI over the `busway` runtime, and [`bus::Bus`], the safe Rust
//! type under it (also under the Python package). The header is
//! `include/busway.h` (made by cbindgen from this crate); `include/busway.hpp` wraps it for C++.
//!
//! # How it fits a program's own event loop
//!
//! A node started here runs on threads of its own: its I/O threads, and one more that takes
//! what arrives (message batches, events, finished calls) and queues it for the caller. The
//! caller gets one file descriptor (`busway_fd`, an eventfd) that is readable while anything
//! waits, and adds it to its epoll, libuv or asio loop like a socket; when it is readable it
//! calls `busway_recv` and `busway_next_event` until they say `BUSWAY_STATUS_EMPTY`. Nothing
//! is called back on busway's threads.
//!
//! # Lifetimes and threads
//!
//! - A `busway_node` lives from `busway_start*` to `busway_stop`/`busway_free`; every other call
//!   on it may come from any thread at any time before that.
//! - A received `busway_batch` is read in place (no copy) until `busway_batch_release`, from any
//!   one thread at a time; it stays valid after its node is stopped.
//! - A `busway_event` or `busway_reply` holds its pointers until its `_release` call.
//! - Payloads passed in are copied before the call returns.
//! - `busway_last_error` is per thread, valid until the next failure on that thread.

// C's names for C's types: `busway_node`, `busway_status`, as the header spells them.
#![allow(non_camel_case_types)]

pub mod bus;
mod event;
mod node;
mod ready;
mod recv;
mod send;
mod status;

pub use event::{busway_event, busway_event_kind, busway_event_release};
pub use node::{
    busway_config, busway_config_connect, busway_config_free, busway_config_listen,
    busway_config_new, busway_config_secret, busway_config_upstream, busway_fd, busway_flush,
    busway_free, busway_get_stats, busway_id, busway_listen_addr, busway_node, busway_start,
    busway_start_file, busway_start_toml, busway_stats, busway_stop, busway_wait_peer,
};
pub use ready::{ReadyEvent, BUSWAY_READY_BATCH_BYTES_MAX, BUSWAY_READY_EVENTS_MAX};
pub use recv::{
    busway_batch, busway_batch_group, busway_batch_is_request, busway_batch_len,
    busway_batch_payload, busway_batch_release, busway_batch_src, busway_next_event, busway_recv,
    busway_reply_to,
};
pub use send::{
    busway_call, busway_call_start, busway_join, busway_leave, busway_multicast, busway_publish,
    busway_reply, busway_reply_release, busway_send, busway_send_batch, busway_slice,
    busway_try_send,
};
pub use status::{busway_last_error, busway_status};
