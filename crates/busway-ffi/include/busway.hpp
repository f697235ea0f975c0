// busway.hpp: busway from C++17, header-only, over the C ABI of busway.h.
//
// Results, not exceptions: every call that can fail returns `busway::status` or
// `busway::result<T>` (a value or a status), and nothing here throws. A game server is often
// built with -fno-exceptions, and on a bus a full queue (`status::full()`) or an empty inbox is
// the normal course of a loop, not an exceptional one. A status carries its words
// (`message()`), taken from busway_last_error() on the failing thread.
//
// RAII: `node`, `batch`, `event` and `reply` release what they hold when they go out of scope;
// they move and do not copy. Payloads are `std::string_view`s (or pointer and length) read in
// place until their batch, event or reply is released. Threads: as busway.h says for the C
// calls underneath (a node may be used from any thread; a batch from one at a time).
#ifndef BUSWAY_HPP
#define BUSWAY_HPP

#include "busway.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace busway {

/// The outcome of a call: ok, or a code (`busway_status`) and its words.
class status {
  public:
    status() = default;
    explicit status(busway_status code) : code_(code) {
        if (code != BUSWAY_STATUS_OK && code != BUSWAY_STATUS_EMPTY) message_ = busway_last_error();
    }
    bool ok() const { return code_ == BUSWAY_STATUS_OK; }
    explicit operator bool() const { return ok(); }
    /// Nothing was waiting (a receive or an event): no failure.
    bool empty() const { return code_ == BUSWAY_STATUS_EMPTY; }
    /// A queue is full: the same call may succeed later.
    bool full() const { return code_ == BUSWAY_STATUS_FULL; }
    busway_status code() const { return code_; }
    /// What failed and where (empty when ok).
    const std::string &message() const { return message_; }

  private:
    busway_status code_ = BUSWAY_STATUS_OK;
    std::string message_;
};

/// A value, or the status that kept it from being made.
template <typename T> class result {
  public:
    result(T value) : value_(std::move(value)), ok_(true) {}
    result(status failed) : status_(std::move(failed)) {}
    bool ok() const { return ok_; }
    explicit operator bool() const { return ok_; }
    T &value() { return value_; }
    T &operator*() { return value_; }
    T *operator->() { return &value_; }
    const busway::status &error() const { return status_; }

  private:
    T value_{};
    busway::status status_;
    bool ok_ = false;
};

/// Received messages from one sender, read in place until this goes out of scope.
class batch {
  public:
    batch() = default;
    explicit batch(busway_batch *b) : b_(b) {}
    batch(batch &&o) noexcept : b_(std::exchange(o.b_, nullptr)) {}
    batch &operator=(batch &&o) noexcept {
        std::swap(b_, o.b_);
        return *this;
    }
    batch(const batch &) = delete;
    batch &operator=(const batch &) = delete;
    ~batch() { busway_batch_release(b_); }

    std::size_t size() const { return busway_batch_len(b_); }
    std::uint64_t src() const { return busway_batch_src(b_); }
    /// Message `i`'s payload, valid while this batch lives.
    std::string_view operator[](std::size_t i) const {
        std::size_t len = 0;
        const std::uint8_t *p = busway_batch_payload(b_, i, &len);
        return {reinterpret_cast<const char *>(p), len};
    }
    /// The group the messages were published to ("" if they were not).
    std::string group() const {
        std::string g(busway_batch_group(b_, nullptr, 0), '\0');
        if (!g.empty()) busway_batch_group(b_, g.data(), g.size() + 1);
        return g;
    }
    bool is_request(std::size_t i) const { return busway_batch_is_request(b_, i); }
    busway_batch *get() const { return b_; }

  private:
    busway_batch *b_ = nullptr;
};

/// One event; its text and data are valid while it lives.
class event {
  public:
    event() : e_{} {}
    event(event &&o) noexcept : e_(o.e_) { o.e_ = busway_event{}; }
    event &operator=(event &&o) noexcept {
        std::swap(e_, o.e_);
        return *this;
    }
    event(const event &) = delete;
    event &operator=(const event &) = delete;
    ~event() { busway_event_release(&e_); }

    busway_event_kind kind() const { return e_.kind; }
    /// All fields, as busway.h describes them per kind.
    const busway_event &raw() const { return e_; }
    std::string_view text() const { return e_.text ? e_.text : ""; }
    /// A finished call's reply (CALL_DONE with status OK).
    std::string_view data() const { return {reinterpret_cast<const char *>(e_.data), e_.len}; }
    busway_event *out() { return &e_; }

  private:
    busway_event e_;
};

/// A call's reply, read in place while this lives.
class reply {
  public:
    reply() : r_{} {}
    reply(reply &&o) noexcept : r_(o.r_) { o.r_ = busway_reply{}; }
    reply &operator=(reply &&o) noexcept {
        std::swap(r_, o.r_);
        return *this;
    }
    reply(const reply &) = delete;
    reply &operator=(const reply &) = delete;
    ~reply() { busway_reply_release(&r_); }

    std::uint64_t src() const { return r_.src; }
    std::string_view data() const { return {reinterpret_cast<const char *>(r_.data), r_.len}; }
    busway_reply *out() { return &r_; }

  private:
    busway_reply r_;
};

inline const std::uint8_t *bytes(std::string_view s) {
    return reinterpret_cast<const std::uint8_t *>(s.data());
}

/// A running node: stopped gracefully (drain up to `drain_ms` given to `stop`, 1 s by default)
/// when it goes out of scope.
class node {
  public:
    node() = default;
    node(node &&o) noexcept : n_(std::exchange(o.n_, nullptr)) {}
    node &operator=(node &&o) noexcept {
        std::swap(n_, o.n_);
        return *this;
    }
    node(const node &) = delete;
    node &operator=(const node &) = delete;
    ~node() { stop(); }

    /// Starts a node from TOML (the keys of `busway node -c FILE`).
    static result<node> start_toml(const std::string &toml) {
        busway_node *n = nullptr;
        status s(busway_start_toml(toml.c_str(), &n));
        if (!s) return s;
        return node(n);
    }
    /// Starts a node from a TOML file.
    static result<node> start_file(const std::string &path) {
        busway_node *n = nullptr;
        status s(busway_start_file(path.c_str(), &n));
        if (!s) return s;
        return node(n);
    }
    /// Starts node `id` listening on, and dialing, the addresses given; `upstream` (if not
    /// empty) is the relay that bus ids it knows no way to are sent through, and that may send
    /// it others' messages.
    static result<node> start(std::uint64_t id, const std::vector<std::string> &listen,
                              const std::vector<std::string> &connect, const std::string &upstream = "") {
        busway_config *c = busway_config_new(id);
        if (!upstream.empty()) {
            status s(busway_config_upstream(c, upstream.c_str()));
            if (!s) return busway_config_free(c), s;
        }
        for (const auto &a : listen) {
            status s(busway_config_listen(c, a.c_str()));
            if (!s) return busway_config_free(c), s;
        }
        for (const auto &a : connect) {
            status s(busway_config_connect(c, a.c_str()));
            if (!s) return busway_config_free(c), s;
        }
        busway_node *n = nullptr;
        status s(busway_start(c, &n));
        if (!s) return s;
        return node(n);
    }

    /// Stops gracefully, waiting up to `drain_ms` for what was sent to be acknowledged.
    void stop(std::uint32_t drain_ms = 1000) { busway_stop(std::exchange(n_, nullptr), drain_ms); }

    std::uint64_t id() const { return busway_id(n_); }
    /// Readable while batches or events wait: add it to the loop, then drain `recv` and
    /// `next_event` until they are empty.
    int fd() const { return busway_fd(n_); }
    std::string listen_addr(std::size_t i = 0) const {
        std::string a(busway_listen_addr(n_, i, nullptr, 0), '\0');
        if (!a.empty()) busway_listen_addr(n_, i, a.data(), a.size() + 1);
        return a;
    }
    bool wait_peer(std::uint64_t id, std::uint32_t timeout_ms) const {
        return busway_wait_peer(n_, id, timeout_ms);
    }
    bool flush(std::uint32_t timeout_ms) const { return busway_flush(n_, timeout_ms); }

    /// Sends, waiting while the queue to `dst` is full.
    status send(std::uint64_t dst, std::string_view payload) const {
        return status(busway_send(n_, dst, bytes(payload), payload.size(), nullptr));
    }
    /// Sends without waiting (`full()`: try later).
    status try_send(std::uint64_t dst, std::string_view payload) const {
        return status(busway_try_send(n_, dst, bytes(payload), payload.size(), nullptr));
    }
    /// Sends many, in order, each copied once.
    status send_batch(std::uint64_t dst, const std::vector<std::string_view> &payloads) const {
        std::vector<busway_slice> s;
        s.reserve(payloads.size());
        for (auto p : payloads) s.push_back({bytes(p), p.size()});
        return status(busway_send_batch(n_, dst, s.data(), s.size(), nullptr));
    }
    /// The next batch, if one waits (`error().empty()`: none does).
    result<batch> recv() const {
        busway_batch *b = nullptr;
        busway_status s = busway_recv(n_, &b);
        if (s != BUSWAY_STATUS_OK) return status(s);
        return batch(b);
    }
    /// The next event, if one waits.
    result<event> next_event() const {
        event e;
        busway_status s = busway_next_event(n_, e.out());
        if (s != BUSWAY_STATUS_OK) return status(s);
        return e;
    }
    /// Answers request `i` of `b` (waiting while the caller's queue is full if `wait`).
    status reply_to(const batch &b, std::size_t i, std::string_view payload, bool wait = false) const {
        return status(busway_reply_to(n_, b.get(), i, bytes(payload), payload.size(), wait));
    }
    /// Calls `dst` and waits for the reply (blocks this thread; from a loop use `call_start`).
    result<reply> call(std::uint64_t dst, std::string_view payload, std::uint32_t timeout_ms) const {
        reply r;
        busway_status s = busway_call(n_, dst, bytes(payload), payload.size(), timeout_ms, r.out());
        if (s != BUSWAY_STATUS_OK) return status(s);
        return r;
    }
    /// Starts a call; its end comes as a CALL_DONE event with `token`.
    status call_start(std::uint64_t dst, std::string_view payload, std::uint32_t timeout_ms,
                      std::uint64_t token) const {
        return status(busway_call_start(n_, dst, bytes(payload), payload.size(), timeout_ms, token));
    }
    status join(const std::string &group) const { return status(busway_join(n_, group.c_str())); }
    status leave(const std::string &group) const { return status(busway_leave(n_, group.c_str())); }
    /// Publishes to `group`; how many links it went to (0: no member known yet).
    result<std::size_t> publish(const std::string &group, std::string_view payload) const {
        std::size_t places = 0;
        status s(busway_publish(n_, group.c_str(), bytes(payload), payload.size(), &places));
        if (!s) return s;
        return places;
    }
    /// Sends one payload to each of `ids`; how many it was queued for.
    result<std::size_t> multicast(const std::vector<std::uint64_t> &ids, std::string_view payload) const {
        std::size_t reached = 0;
        status s(busway_multicast(n_, ids.data(), ids.size(), bytes(payload), payload.size(), &reached));
        if (!s) return s;
        return reached;
    }
    busway_stats stats() const {
        busway_stats s{};
        busway_get_stats(n_, &s);
        return s;
    }
    busway_node *get() const { return n_; }

  private:
    explicit node(busway_node *n) : n_(n) {}
    busway_node *n_ = nullptr;
};

} // namespace busway

#endif
