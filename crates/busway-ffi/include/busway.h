/*
 * busway.h: busway from C (and C++ through busway.hpp).
 * Made by cbindgen from crates/busway-ffi; do not edit: change the Rust and run
 * `BUSWAY_FFI_BLESS=1 cargo test --release -p busway-ffi --test header`.
 */

#ifndef BUSWAY_H
#define BUSWAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Bytes of received batches held for the caller before the inbox is left unread (the node's
// links then stop reading: its flow control, nothing dropped).
#define BUSWAY_READY_BATCH_BYTES_MAX (8 << 20)

// Events held for the caller before the node's events are left unread (the node then counts
// the events it drops, `Stats::events_dropped`, except reports of messages given up, which it
// keeps).
#define BUSWAY_READY_EVENTS_MAX 4096

// What an event tells. The fields of `busway_event` that each kind sets are named at the kind;
// the others are 0 or null.
typedef enum busway_event_kind {
  // A peer's link came up: `peer`, `incarnation`, `text` (its address).
  BUSWAY_EVENT_KIND_PEER_UP = 0,
  // A peer's link went down: `peer`, `count` (messages kept for its next link), `text` (why).
  BUSWAY_EVENT_KIND_PEER_DOWN = 1,
  // busway gave up on messages `first..end` (numbers as the sends returned them) to `peer`:
  // not confirmed (some may have arrived); `incarnation` (0 if not learned), `text` (why).
  BUSWAY_EVENT_KIND_UNDELIVERABLE = 2,
  // A connection was refused in its handshake: `text` (why), `address` (the remote).
  BUSWAY_EVENT_KIND_REJECTED = 3,
  // A dial failed (busway retries): `text` (why), `address`.
  BUSWAY_EVENT_KIND_DIAL_FAILED = 4,
  // `count` publishes of `peer` to `group` never came (the node stays a member): `text`.
  BUSWAY_EVENT_KIND_GROUP_GAP = 5,
  // The node fell behind in `group` and left it, `count` publishes of `peer` lost: `text`.
  BUSWAY_EVENT_KIND_GROUP_CUT_OFF = 6,
  // `peer` refused this node's join of `group` (`count` 0) or its publishes (`count` 1): `text`.
  BUSWAY_EVENT_KIND_GROUP_REFUSED = 7,
  // `count` multicasts of `peer` never reached this node: `text`.
  BUSWAY_EVENT_KIND_MULTICAST_GAP = 8,
  // Relay `peer` could not pass multicast `first` on toward `end` (the receiver): `text`.
  BUSWAY_EVENT_KIND_MULTICAST_UNREACHABLE = 9,
  // A call started with `busway_call_start` ended: `token` (the caller's), `status`
  // (`BUSWAY_STATUS_OK` with the reply in `data`/`len` from `peer`, or why it failed in `text`).
  BUSWAY_EVENT_KIND_CALL_DONE = 10,
  // An event this version of the header does not know: `text` describes it.
  BUSWAY_EVENT_KIND_OTHER = 11,
} busway_event_kind;

// The result of a call. `BUSWAY_STATUS_OK` is 0; every other code is a failure whose words
// `busway_last_error` gives, except `BUSWAY_STATUS_EMPTY` (nothing is waiting: no failure).
typedef enum busway_status {
  // Done.
  BUSWAY_STATUS_OK = 0,
  // Nothing is waiting now (a receive, an event): not a failure; wait for the descriptor.
  BUSWAY_STATUS_EMPTY = 1,
  // A queue holds its limit: the same call may succeed later (retry, or use the waiting form).
  BUSWAY_STATUS_FULL = 2,
  // The node is shutting down or stopped.
  BUSWAY_STATUS_CLOSED = 3,
  // No way to the destination is known.
  BUSWAY_STATUS_NO_ROUTE = 4,
  // The destination stayed down past its deadline, or shut down.
  BUSWAY_STATUS_PEER_DOWN = 5,
  // The payload does not fit one frame.
  BUSWAY_STATUS_TOO_LARGE = 6,
  // No answer within the time given.
  BUSWAY_STATUS_TIMEOUT = 7,
  // busway gave up on a message it had taken (the peer was given up or restarted).
  BUSWAY_STATUS_GAVE_UP = 8,
  // A request arrived but nothing answered it.
  BUSWAY_STATUS_NO_HANDLER = 9,
  // As many calls are pending as a node keeps.
  BUSWAY_STATUS_TOO_MANY_PENDING = 10,
  // The message answered is not a request, or was answered already.
  BUSWAY_STATUS_NOT_ANSWERABLE = 11,
  // An argument is not one the call takes (a null pointer, an index past the end, a bad
  // address or group name, text that is not UTF-8).
  BUSWAY_STATUS_BAD_ARGUMENT = 12,
  // The configuration is not one a node can run with (the message names the setting).
  BUSWAY_STATUS_CONFIG = 13,
  // A system call failed.
  BUSWAY_STATUS_IO = 14,
} busway_status;

// Messages from one sender, in the order sent, sharing one buffer: read each payload in place
// with `busway_batch_payload` until `busway_batch_release`.
//
// Thread safety: a batch may move between threads; it must not be used by two at once.
typedef struct busway_batch busway_batch;

// A configuration being built with setters; `busway_start` takes it.
typedef struct busway_config busway_config;

// A running node. Made by `busway_start`, `busway_start_toml` or `busway_start_file`; ended by
// `busway_stop` or `busway_free`, which release it.
//
// Thread safety: every call taking a `busway_node` may be made from any thread at the same
// time as others, except `busway_stop` and `busway_free`, which must be the last call on it
// (no other call in flight, none after).
typedef struct busway_node busway_node;

// One event. Every pointer in it stays valid until `busway_event_release` is called on it.
typedef struct busway_event {
  // What the event tells.
  enum busway_event_kind kind;
  // The bus id it is about (a peer, a publisher, a source, a relay, a callee).
  uint64_t peer;
  // The peer's incarnation, if the event names one.
  uint64_t incarnation;
  // First message number given up (`Undeliverable`), multicast number (`MulticastUnreachable`).
  uint64_t first;
  // One past the last number given up (`Undeliverable`), the receiver (`MulticastUnreachable`).
  uint64_t end;
  // A count: messages kept, publishes or multicasts missed, or 1 for a refused publish.
  uint64_t count;
  // `CallDone`: the token given to `busway_call_start`.
  uint64_t token;
  // `CallDone`: the call's status.
  enum busway_status status;
  // `CallDone` that succeeded: the reply's payload (no copy), `len` bytes.
  const uint8_t *data;
  // The length of `data` in bytes.
  size_t len;
  // Why, or what: NUL-terminated UTF-8, never null (empty if nothing to say).
  const char *text;
  // The group the event is about (NUL-terminated), or null.
  const char *group;
  // The remote address (NUL-terminated) of `Rejected` and `DialFailed`, or null.
  const char *address;
  // busway's own; the caller leaves it alone.
  void *owner;
} busway_event;

// A snapshot of a node's main counters.
typedef struct busway_stats {
  // Messages received.
  uint64_t msgs_in;
  // Payload bytes received.
  uint64_t bytes_in;
  // Messages queued for sending to peers.
  uint64_t msgs_out;
  // Messages written again after a link dropped or a path may have lost them.
  uint64_t msgs_resent;
  // Messages passed on as a relay.
  uint64_t relayed_msgs;
  // Peers up now.
  uint64_t peers_up;
  // Connections open now.
  uint64_t connections_open;
  // Handshakes that failed.
  uint64_t handshake_failures;
  // Links closed for invalid frames.
  uint64_t protocol_errors;
  // Calls made and not ended yet.
  uint64_t calls_pending;
  // Events the node dropped because they were not read in time.
  uint64_t events_dropped;
} busway_stats;

// A payload in C's memory: `len` bytes at `data`.
typedef struct busway_slice {
  // The first byte (may be null when `len` is 0).
  const uint8_t *data;
  // How many bytes.
  size_t len;
} busway_slice;

// A reply handed to C without a copy: `len` bytes at `data` from bus id `src`, valid until
// `busway_reply_release`.
typedef struct busway_reply {
  // The node that answered.
  uint64_t src;
  // The reply's payload.
  const uint8_t *data;
  // Its length in bytes.
  size_t len;
  // busway's own; the caller leaves it alone.
  void *owner;
} busway_reply;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// Releases what `ev`'s pointers point into and clears it. Releasing a cleared or zeroed event
// does nothing; `ev` may be null.
//
// # Safety
// `ev` is null or points to a `busway_event` filled by `busway_next_event` (or zeroed), and no
// other thread uses it during the call.
void busway_event_release(struct busway_event *ev);

// Starts a node from a TOML configuration (the keys of `busway node -c FILE`, see
// docs/OPERATIONS.md) and sets `*node` to it; on a failure `*node` is null and
// `busway_last_error` says why (a configuration error names the key and its line).
//
// The node's threads inherit the calling thread's signal mask: a program that reads SIGTERM
// or SIGINT through a signalfd blocks them before it starts a node, or they may end the
// process on one of those threads.
//
// # Safety
// `toml` is a NUL-terminated string valid for the call; `node` is writable.
enum busway_status busway_start_toml(const char *toml, struct busway_node **node);

// Starts a node from a TOML configuration file and sets `*node` to it, as
// `busway_start_toml` does.
//
// # Safety
// `path` is a NUL-terminated string valid for the call; `node` is writable.
enum busway_status busway_start_file(const char *path, struct busway_node **node);

// A new configuration for bus id `id`, every other setting at its default. Give it to
// `busway_start`, or release it with `busway_config_free`.
struct busway_config *busway_config_new(uint64_t id);

// Listens on `addr` (`tcp://127.0.0.1:7000`, `tcp://[::1]:0`, `unix:///run/x.sock`,
// `shm://NAME`, `tls://HOST:PORT`); may be called more than once.
//
// # Safety
// `config` is null or a configuration from `busway_config_new` not yet given to
// `busway_start` or freed, used by no other thread during the call; `addr` is a
// NUL-terminated string valid for the call.
enum busway_status busway_config_listen(struct busway_config *config, const char *addr);

// Dials `addr` and keeps a link to the node there; may be called more than once.
//
// # Safety
// As for `busway_config_listen`.
enum busway_status busway_config_connect(struct busway_config *config, const char *addr);

// Dials `addr` as this node's upstream: bus ids it knows no way to go through it.
//
// # Safety
// As for `busway_config_listen`.
enum busway_status busway_config_upstream(struct busway_config *config, const char *addr);

// Sets the shared secret every node of the bus authenticates with (at least 16 bytes).
//
// # Safety
// As for `busway_config_listen`, `secret` in place of `addr`.
enum busway_status busway_config_secret(struct busway_config *config, const char *secret);

// Releases a configuration not given to `busway_start`. `config` may be null.
//
// # Safety
// `config` is null or a configuration from `busway_config_new` not yet given to
// `busway_start` or freed.
void busway_config_free(struct busway_config *config);

// Starts a node from `config`, which it takes (released, started or not), and sets `*node`
// to it, as `busway_start_toml` does.
//
// # Safety
// `config` is a configuration from `busway_config_new` not yet given to `busway_start` or
// freed, used by no other thread during the call; `node` is writable.
enum busway_status busway_start(struct busway_config *config, struct busway_node **node);

// Stops the node gracefully and releases it: waits up to `drain_ms` milliseconds for what was
// sent to be acknowledged (or reported), closes its links with a CLOSE that tells its peers
// it shut down, then stops its threads. Batches and events not yet taken are dropped (batches
// taken and not released stay valid until released). `node` may be null.
//
// # Safety
// `node` is null or a node not yet stopped or freed, with no other call on it in flight and
// none after.
void busway_stop(struct busway_node *node, uint32_t drain_ms);

// Stops the node at once and releases it: no wait for acknowledgements (its peers keep what
// it had not acknowledged for its next incarnation, or report it). `node` may be null.
//
// # Safety
// As for `busway_stop`.
void busway_free(struct busway_node *node);

// The descriptor (an eventfd) that is readable while received batches or events wait: add it
// to an epoll, libuv or asio loop for reading; when it is readable, call `busway_recv` and
// `busway_next_event` until both say `BUSWAY_STATUS_EMPTY` (busway clears it itself; never
// read or close it). -1 if `node` is null.
//
// # Safety
// `node` is null or a node not yet stopped or freed.
int32_t busway_fd(const struct busway_node *node);

// This node's bus id (0 if `node` is null).
//
// # Safety
// `node` is null or a node not yet stopped or freed.
uint64_t busway_id(const struct busway_node *node);

// Writes the `index`-th address this node listens on (with the port it got, for port 0) into
// `buf` as a NUL-terminated string, at most `cap` bytes with the NUL. Returns the string's
// length without the NUL (larger than `cap - 1`: cut short; call again with more room), or 0
// if there is no such address.
//
// # Safety
// `node` is null or a node not yet stopped or freed; `buf` is null (with `cap` 0) or points
// to `cap` writable bytes.
size_t busway_listen_addr(const struct busway_node *node, size_t index, char *buf, size_t cap);

// Waits up to `timeout_ms` milliseconds for a link to bus id `id`; true if it is up.
//
// # Safety
// `node` is null or a node not yet stopped or freed.
bool busway_wait_peer(const struct busway_node *node, uint64_t id, uint32_t timeout_ms);

// Waits up to `timeout_ms` milliseconds until every message sent so far is acknowledged by its
// destination (or reported undeliverable); true if so.
//
// # Safety
// `node` is null or a node not yet stopped or freed.
bool busway_flush(const struct busway_node *node, uint32_t timeout_ms);

// Fills `out` with the node's counters.
//
// # Safety
// `node` is null or a node not yet stopped or freed; `out` is null or points to a writable
// `busway_stats`.
enum busway_status busway_get_stats(const struct busway_node *node, struct busway_stats *out);

// Takes the next batch of received messages without waiting: `BUSWAY_STATUS_OK` with
// `*batch` set (release it with `busway_batch_release`), or `BUSWAY_STATUS_EMPTY` when none
// waits (wait for `busway_fd` to be readable).
//
// # Safety
// `node` is null or a node not yet stopped or freed; `batch` points to a writable pointer.
enum busway_status busway_recv(const struct busway_node *node, struct busway_batch **batch);

// Takes the next event (links, messages given up, groups, finished calls) without waiting:
// `BUSWAY_STATUS_OK` with `*event` filled (release it with `busway_event_release`), or
// `BUSWAY_STATUS_EMPTY`.
//
// # Safety
// `node` is null or a node not yet stopped or freed; `event` points to a writable
// `busway_event` (one holding an unreleased event leaks that one).
enum busway_status busway_next_event(const struct busway_node *node, struct busway_event *event);

// How many messages the batch holds (0 if `batch` is null).
//
// # Safety
// `batch` is null or a batch not yet released.
size_t busway_batch_len(const struct busway_batch *batch);

// The bus id that sent every message of the batch (for publishes, their publisher).
//
// # Safety
// `batch` is null or a batch not yet released.
uint64_t busway_batch_src(const struct busway_batch *batch);

// The payload of message `index`: its first byte (null past the end), its length in `*len`.
// Valid, in place, until the batch is released.
//
// # Safety
// `batch` is null or a batch not yet released; `len` is null or writable.
const uint8_t *busway_batch_payload(const struct busway_batch *batch, size_t index, size_t *len);

// Writes the group the batch's messages were published to into `buf` (NUL-terminated, at most
// `cap` bytes with the NUL); returns its length without the NUL (0: not a publish).
//
// # Safety
// `batch` is null or a batch not yet released; `buf` is null (with `cap` 0) or points to `cap`
// writable bytes.
size_t busway_batch_group(const struct busway_batch *batch, char *buf, size_t cap);

// Whether message `index` is a request (sent with `busway_call`): answer it with
// `busway_reply_to`. A request released unanswered gets an error reply at once.
//
// # Safety
// `batch` is null or a batch not yet released.
bool busway_batch_is_request(const struct busway_batch *batch, size_t index);

// Answers request `index` of the batch with `len` bytes at `data`. With `wait` false it never
// waits (`BUSWAY_STATUS_FULL`: the caller's queue is full; the request stays unanswered and
// may be answered again), with `wait` true it waits while that queue is full.
//
// # Safety
// `node` is null or a node not yet stopped or freed; `batch` is null or a batch not yet
// released; `data` is null with `len` 0 or points to `len` readable bytes.
enum busway_status busway_reply_to(const struct busway_node *node,
                                   const struct busway_batch *batch,
                                   size_t index,
                                   const uint8_t *data,
                                   size_t len,
                                   bool wait);

// Releases a batch: its payloads may not be read after this; its unanswered requests get an
// error reply. `batch` may be null.
//
// # Safety
// `batch` is null or a batch from `busway_recv` not yet released, used by no other thread.
void busway_batch_release(struct busway_batch *batch);

// Queues one message of `len` bytes at `data` for bus id `dst`, waiting while its queue is
// full. On success, `*seq` (if not null) gets the message's number to `dst` (what an
// `UNDELIVERABLE` event names).
//
// # Safety
// `node` is null or a node not yet stopped or freed; `data` is null with `len` 0 or points to
// `len` readable bytes; `seq` is null or writable.
enum busway_status busway_send(const struct busway_node *node,
                               uint64_t dst,
                               const uint8_t *data,
                               size_t len,
                               uint64_t *seq);

// Queues one message for bus id `dst` without waiting: `BUSWAY_STATUS_FULL` if its queue has
// no room (try again later). `*seq` as for `busway_send`.
//
// # Safety
// As for `busway_send`.
enum busway_status busway_try_send(const struct busway_node *node,
                                   uint64_t dst,
                                   const uint8_t *data,
                                   size_t len,
                                   uint64_t *seq);

// Queues `count` messages for bus id `dst`, in order, each copied once into the link's write
// buffer under one lock: the cheapest way to send many small messages. Waits for room as
// needed. On success `*first_seq` (if not null) gets the first message's number (the others
// follow it). On a failure, the messages before the failing one are queued.
//
// # Safety
// `node` is null or a node not yet stopped or freed; `msgs` is null with `count` 0 or points
// to `count` readable `busway_slice`s, each of which points to its `len` readable bytes;
// `first_seq` is null or writable.
enum busway_status busway_send_batch(const struct busway_node *node,
                                     uint64_t dst,
                                     const struct busway_slice *msgs,
                                     size_t count,
                                     uint64_t *first_seq);

// Joins `group`: publishes to it reach this node from now on (in each publisher's order).
//
// # Safety
// `node` is null or a node not yet stopped or freed; `group` is a NUL-terminated string valid
// for the call.
enum busway_status busway_join(const struct busway_node *node, const char *group);

// Leaves `group` (nothing happens if this node is not a member).
//
// # Safety
// As for `busway_join`.
enum busway_status busway_leave(const struct busway_node *node, const char *group);

// Publishes one message to `group`'s members, packed once and sent once per link toward
// them; waits while a queue is full. `*places` (if not null) gets how many links it went to
// (0: no member is known now).
//
// # Safety
// As for `busway_join`, with `data`/`len` as for `busway_send` and `places` null or writable.
enum busway_status busway_publish(const struct busway_node *node,
                                  const char *group,
                                  const uint8_t *data,
                                  size_t len,
                                  size_t *places);

// Sends one message to each of the `count` bus ids at `ids`, one frame per link on the way.
// `*receivers` (if not null) gets how many of them it was queued for.
//
// # Safety
// `node` as for `busway_send`; `ids` points to `count` readable ids; `data`/`len` as for
// `busway_send`; `receivers` null or writable.
enum busway_status busway_multicast(const struct busway_node *node,
                                    const uint64_t *ids,
                                    size_t count,
                                    const uint8_t *data,
                                    size_t len,
                                    size_t *receivers);

// Sends a request to bus id `dst` and waits for its reply, at most `timeout_ms` milliseconds.
// On success `*reply` holds the answer until `busway_reply_release`. Blocks the calling
// thread: from an event loop, use `busway_call_start`.
//
// # Safety
// `node` and `data`/`len` as for `busway_send`; `reply` points to a writable `busway_reply`.
enum busway_status busway_call(const struct busway_node *node,
                               uint64_t dst,
                               const uint8_t *data,
                               size_t len,
                               uint32_t timeout_ms,
                               struct busway_reply *reply);

// Releases a reply's payload and clears it; a cleared or zeroed reply (or null) is left alone.
//
// # Safety
// `reply` is null or a `busway_reply` filled by `busway_call` (or zeroed), used by no other
// thread during the call.
void busway_reply_release(struct busway_reply *reply);

// Starts a call to bus id `dst` without waiting: its end comes as a `CALL_DONE` event
// carrying `token` (the caller's own number for it) from `busway_next_event`, with the reply
// or why it failed, within `timeout_ms` milliseconds. Fails at once only for a bad argument
// or a stopped node; every other failure comes as the event.
//
// # Safety
// As for `busway_send`.
enum busway_status busway_call_start(const struct busway_node *node,
                                     uint64_t dst,
                                     const uint8_t *data,
                                     size_t len,
                                     uint32_t timeout_ms,
                                     uint64_t token);

// The words of the last failed call on the calling thread: what failed and where, as
// NUL-terminated UTF-8. Never null (empty before any failure).
//
// Lifetime: valid until the next failing busway call on the same thread; copy it to keep it.
// Thread safety: each thread has its own.
const char *busway_last_error(void);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* BUSWAY_H */
