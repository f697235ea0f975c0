/*
 * The C ABI end to end, as a C server uses it: nodes started from TOML and from setters, an
 * epoll loop over busway_fd, 1,000,000 verified messages each way, blocking and non-blocking
 * calls, a group, a multicast, a peer stopped and back, and bad input named. Built and run
 * (under AddressSanitizer) by tests/c_programs.rs.
 *
 *   ffi_test self                       everything above, in one process
 *   ffi_test send ADDR ID TO COUNT      a node ID dials ADDR and sends COUNT sequenced messages
 *                                       (an 8-byte little-endian number first, as
 *                                       `busway send --count` does) to TO
 *   ffi_test serve ID COUNT             a node ID listens on a free port (prints
 *                                       "listening on ADDR"), answers every request with its
 *                                       payload, and exits once COUNT sequenced messages
 *                                       arrived in order
 *
 * Exit 0 when every check held; otherwise a line names the check and exit 1.
 */
#define _GNU_SOURCE
#include "busway.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#define CHECK(cond, ...)                                                                    \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "ffi_test:%d: check failed: %s: ", __LINE__, #cond);            \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fprintf(stderr, " (last error: %s)\n", busway_last_error());                    \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

/* Longest any wait of this program may take, in milliseconds. */
#define WAIT_MS 30000
/* Messages per busway_send_batch call. */
#define BATCH 1024
/* Bytes of each sequenced payload: the number, then filler. */
#define PAYLOAD 16

static uint64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* Waits up to `ms` for the node's descriptor to be readable; 0 if it did not become so. */
static int wait_ready(busway_node *node, int ms) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    CHECK(ep >= 0, "epoll_create1: %s", strerror(errno));
    struct epoll_event ev = {.events = EPOLLIN, .data = {.ptr = node}};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, busway_fd(node), &ev) == 0, "epoll_ctl: %s", strerror(errno));
    struct epoll_event out;
    int n;
    do {
        n = epoll_wait(ep, &out, 1, ms);
    } while (n < 0 && errno == EINTR);
    close(ep);
    return n > 0;
}

/* ---- sequenced streams ---- */

struct sender {
    busway_node *node;
    uint64_t to;
    uint64_t count;
};

/* Sends `count` sequenced messages to `to` in batches (run on a thread of its own). */
static void *send_sequenced(void *arg) {
    struct sender *s = arg;
    static __thread uint8_t bufs[BATCH][PAYLOAD];
    busway_slice slices[BATCH];
    for (uint64_t seq = 0; seq < s->count;) {
        size_t n = 0;
        for (; n < BATCH && seq < s->count; n++, seq++) {
            memcpy(bufs[n], &seq, 8); /* little-endian on every target this runs on */
            memset(bufs[n] + 8, 0xA5, PAYLOAD - 8);
            slices[n].data = bufs[n];
            slices[n].len = PAYLOAD;
        }
        uint64_t first = 0;
        busway_status st = busway_send_batch(s->node, s->to, slices, n, &first);
        CHECK(st == BUSWAY_STATUS_OK, "send_batch at %" PRIu64 ": status %d", seq, st);
    }
    return NULL;
}

/* What one receive loop saw. */
struct received {
    uint64_t next;      /* the next sequence number expected */
    uint64_t requests;  /* requests answered */
    uint64_t peer_ups;
    uint64_t peer_downs;
    uint64_t from;      /* the sender every sequenced message must come from (0: any) */
};

/* Takes what waits: checks sequenced messages in order, echoes requests, counts events. */
static void drain(busway_node *node, struct received *r) {
    busway_batch *b;
    while (busway_recv(node, &b) == BUSWAY_STATUS_OK) {
        size_t n = busway_batch_len(b);
        for (size_t i = 0; i < n; i++) {
            size_t len = 0;
            const uint8_t *p = busway_batch_payload(b, i, &len);
            if (busway_batch_is_request(b, i)) {
                CHECK(busway_reply_to(node, b, i, p, len, true) == BUSWAY_STATUS_OK, "reply");
                r->requests++;
                continue;
            }
            if (busway_batch_group(b, NULL, 0) > 0 || len != PAYLOAD) {
                continue; /* a publish or a text: not part of the stream */
            }
            uint64_t seq;
            memcpy(&seq, p, 8);
            CHECK(seq == r->next, "message %" PRIu64 " came where %" PRIu64 " was due", seq, r->next);
            CHECK(r->from == 0 || busway_batch_src(b) == r->from, "from %" PRIu64, busway_batch_src(b));
            r->next++;
        }
        busway_batch_release(b);
    }
    busway_event ev;
    while (busway_next_event(node, &ev) == BUSWAY_STATUS_OK) {
        if (ev.kind == BUSWAY_EVENT_KIND_PEER_UP) r->peer_ups++;
        if (ev.kind == BUSWAY_EVENT_KIND_PEER_DOWN) r->peer_downs++;
        busway_event_release(&ev);
    }
}

/* Runs the loop until `until(r)` holds, at most WAIT_MS. */
static void serve_until(busway_node *node, struct received *r, int (*until)(struct received *, void *),
                        void *arg) {
    uint64_t deadline = now_ms() + WAIT_MS;
    drain(node, r);
    while (!until(r, arg)) {
        CHECK(now_ms() < deadline, "no progress within %d ms (at %" PRIu64 ")", WAIT_MS, r->next);
        wait_ready(node, 100);
        drain(node, r);
    }
}

static int got_all(struct received *r, void *count) { return r->next >= *(uint64_t *)count; }

static busway_node *start_listener(uint64_t id, char *addr, size_t cap) {
    char toml[128];
    snprintf(toml, sizeof toml, "id = %" PRIu64 "\nlisten = [\"tcp://127.0.0.1:0\"]\n", id);
    busway_node *node = NULL;
    CHECK(busway_start_toml(toml, &node) == BUSWAY_STATUS_OK && node != NULL, "start node %" PRIu64 " from TOML", id);
    CHECK(busway_id(node) == id, "id");
    size_t len = busway_listen_addr(node, 0, addr, cap);
    CHECK(len > 0 && len < cap, "listen address");
    return node;
}

static busway_node *start_dialer(uint64_t id, const char *addr) {
    busway_config *c = busway_config_new(id);
    CHECK(busway_config_connect(c, addr) == BUSWAY_STATUS_OK, "connect %s", addr);
    busway_node *node = NULL;
    CHECK(busway_start(c, &node) == BUSWAY_STATUS_OK && node != NULL, "start node %" PRIu64 " from setters", id);
    return node;
}

/* ---- the pieces of `self` ---- */

static void million_each_way(busway_node *a, busway_node *b) {
    const uint64_t count = 1000000;
    struct received at_a = {.from = 2}, at_b = {.from = 1};
    struct sender to_a = {b, 1, count}, to_b = {a, 2, count};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, send_sequenced, &to_a);
    pthread_create(&tb, NULL, send_sequenced, &to_b);
    /* One loop serves both nodes, as a server with two buses would. */
    uint64_t deadline = now_ms() + 4 * WAIT_MS;
    while (at_a.next < count || at_b.next < count) {
        CHECK(now_ms() < deadline, "1,000,000 each way: %" PRIu64 " at 1, %" PRIu64 " at 2", at_a.next,
              at_b.next);
        wait_ready(a, 1);
        drain(a, &at_a);
        drain(b, &at_b);
    }
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    busway_stats s;
    CHECK(busway_get_stats(a, &s) == BUSWAY_STATUS_OK, "stats");
    CHECK(s.msgs_in >= count, "msgs_in %" PRIu64, s.msgs_in);
    CHECK(busway_flush(b, WAIT_MS), "flush");
    printf("1,000,000 verified messages each way\n");
}

struct caller {
    busway_node *node;
    int done;
};

static void *call_blocking(void *arg) {
    struct caller *c = arg;
    busway_reply reply = {0};
    busway_status st = busway_call(c->node, 1, (const uint8_t *)"ping", 4, WAIT_MS, &reply);
    CHECK(st == BUSWAY_STATUS_OK, "call: %d", st);
    CHECK(reply.src == 1 && reply.len == 4 && memcmp(reply.data, "ping", 4) == 0, "the reply");
    busway_reply_release(&reply);
    busway_reply_release(&reply); /* twice: the second does nothing */
    __atomic_store_n(&c->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int call_answered(struct received *r, void *c) {
    (void)r;
    return __atomic_load_n(&((struct caller *)c)->done, __ATOMIC_ACQUIRE);
}

static void calls(busway_node *a, busway_node *b) {
    struct received at_a = {0};
    /* Blocking: a thread waits in busway_call while 1's loop answers. */
    struct caller c = {b, 0};
    pthread_t t;
    pthread_create(&t, NULL, call_blocking, &c);
    serve_until(a, &at_a, call_answered, &c);
    pthread_join(t, NULL);
    /* Non-blocking: 100 calls in flight from 2's loop, their ends as CALL_DONE events. */
    for (uint64_t token = 0; token < 100; token++) {
        char payload[32];
        int len = snprintf(payload, sizeof payload, "call %" PRIu64, token);
        CHECK(busway_call_start(b, 1, (const uint8_t *)payload, (size_t)len, WAIT_MS, token) ==
                  BUSWAY_STATUS_OK,
              "call_start");
    }
    int done[100] = {0}, ended = 0;
    uint64_t deadline = now_ms() + WAIT_MS;
    while (ended < 100) {
        CHECK(now_ms() < deadline, "%d of 100 calls ended", ended);
        wait_ready(b, 1);
        drain(a, &at_a);
        busway_event ev;
        while (busway_next_event(b, &ev) == BUSWAY_STATUS_OK) {
            if (ev.kind == BUSWAY_EVENT_KIND_CALL_DONE) {
                char want[32];
                int len = snprintf(want, sizeof want, "call %" PRIu64, ev.token);
                CHECK(ev.token < 100 && !done[ev.token], "token %" PRIu64, ev.token);
                CHECK(ev.status == BUSWAY_STATUS_OK, "call %" PRIu64 ": %s", ev.token, ev.text);
                CHECK(ev.peer == 1 && ev.len == (size_t)len && memcmp(ev.data, want, ev.len) == 0,
                      "reply to call %" PRIu64, ev.token);
                done[ev.token] = 1;
                ended++;
            }
            busway_event_release(&ev);
        }
    }
    /* A call to nobody fails as its event, with the reason. */
    CHECK(busway_call_start(b, 77, (const uint8_t *)"x", 1, 200, 500) == BUSWAY_STATUS_OK, "call_start");
    deadline = now_ms() + WAIT_MS;
    for (int seen = 0; !seen;) {
        CHECK(now_ms() < deadline, "the failed call's event");
        wait_ready(b, 100);
        busway_event ev;
        while (busway_next_event(b, &ev) == BUSWAY_STATUS_OK) {
            if (ev.kind == BUSWAY_EVENT_KIND_CALL_DONE && ev.token == 500) {
                CHECK(ev.status != BUSWAY_STATUS_OK && strlen(ev.text) > 0, "failed call %d", ev.status);
                seen = 1;
            }
            busway_event_release(&ev);
        }
    }
    CHECK(at_a.requests == 101, "%" PRIu64 " requests answered", at_a.requests);
    printf("calls: 1 blocking, 100 in flight, 1 to nobody\n");
}

static void group_and_multicast(busway_node *a, busway_node *b) {
    CHECK(busway_join(a, "room-7") == BUSWAY_STATUS_OK, "join");
    /* The join reaches 2 through the link: publish until 2 knows a member. */
    size_t places = 0;
    uint64_t deadline = now_ms() + WAIT_MS;
    while (places == 0) {
        CHECK(now_ms() < deadline, "the member never became known");
        CHECK(busway_publish(b, "room-7", (const uint8_t *)"hello room", 10, &places) == BUSWAY_STATUS_OK,
              "publish");
    }
    uint64_t ids[] = {1};
    size_t reached = 0;
    CHECK(busway_multicast(b, ids, 1, (const uint8_t *)"to you", 6, &reached) == BUSWAY_STATUS_OK &&
              reached == 1,
          "multicast reached %zu", reached);
    int got_publish = 0, got_multicast = 0;
    deadline = now_ms() + WAIT_MS;
    while (!got_publish || !got_multicast) {
        CHECK(now_ms() < deadline, "publish %d multicast %d", got_publish, got_multicast);
        wait_ready(a, 100);
        busway_batch *batch;
        while (busway_recv(a, &batch) == BUSWAY_STATUS_OK) {
            char group[64];
            size_t glen = busway_batch_group(batch, group, sizeof group);
            for (size_t i = 0; i < busway_batch_len(batch); i++) {
                size_t len;
                const uint8_t *p = busway_batch_payload(batch, i, &len);
                if (glen == 6 && strcmp(group, "room-7") == 0 && len == 10 && memcmp(p, "hello room", 10) == 0)
                    got_publish = 1;
                if (glen == 0 && len == 6 && memcmp(p, "to you", 6) == 0) got_multicast = 1;
            }
            busway_batch_release(batch);
        }
    }
    CHECK(busway_leave(a, "room-7") == BUSWAY_STATUS_OK, "leave");
    printf("a group and a multicast\n");
}

static int peer_down_seen(struct received *r, void *unused) {
    (void)unused;
    return r->peer_downs > 0;
}

static int peer_up_seen(struct received *r, void *unused) {
    (void)unused;
    return r->peer_ups > 0;
}

static void bad_input(busway_node *a) {
    /* Each fails with its status and words; the node goes on. */
    busway_node *never = NULL;
    CHECK(busway_start_toml("id = 1\nlisten = [\"tcp://127.0.0.1:0\"]\nheartbeat_interval = 5\n", &never) ==
                  BUSWAY_STATUS_CONFIG &&
              never == NULL && strstr(busway_last_error(), "heartbeat_interval") != NULL,
          "an unknown key is named: %s", busway_last_error());
    CHECK(busway_start_toml(NULL, &never) == BUSWAY_STATUS_BAD_ARGUMENT, "a null text");
    CHECK(busway_start_file("/nonexistent/busway.toml", &never) == BUSWAY_STATUS_CONFIG &&
              strstr(busway_last_error(), "/nonexistent/busway.toml") != NULL,
          "a missing file is named: %s", busway_last_error());
    busway_config *c = busway_config_new(9);
    CHECK(busway_config_listen(c, "tcp://nowhere") == BUSWAY_STATUS_BAD_ARGUMENT, "a bad address");
    CHECK(strlen(busway_last_error()) > 0, "its words");
    CHECK(busway_config_secret(c, "short") == BUSWAY_STATUS_CONFIG, "a short secret");
    busway_config_free(c);
    CHECK(busway_send(a, 4242, (const uint8_t *)"x", 1, NULL) == BUSWAY_STATUS_NO_ROUTE &&
              strstr(busway_last_error(), "4242") != NULL,
          "no route names the id: %s", busway_last_error());
    CHECK(busway_send(a, 2, NULL, 5, NULL) == BUSWAY_STATUS_BAD_ARGUMENT, "a null payload");
    CHECK(busway_send(NULL, 2, NULL, 0, NULL) == BUSWAY_STATUS_BAD_ARGUMENT, "a null node");
    CHECK(busway_join(a, "") != BUSWAY_STATUS_OK, "an empty group name");
    static uint8_t big[17 << 20];
    CHECK(busway_try_send(a, 2, big, sizeof big, NULL) == BUSWAY_STATUS_TOO_LARGE, "too large");
    busway_batch *none;
    CHECK(busway_recv(a, NULL) == BUSWAY_STATUS_BAD_ARGUMENT, "a null out pointer");
    CHECK(busway_batch_len(NULL) == 0 && busway_batch_payload(NULL, 0, NULL) == NULL, "a null batch");
    CHECK(busway_reply_to(a, NULL, 0, NULL, 0, false) == BUSWAY_STATUS_BAD_ARGUMENT, "reply to nothing");
    (void)none;
    busway_event_release(NULL);
    busway_batch_release(NULL);
    busway_stop(NULL, 0);
    busway_free(NULL);
    printf("bad input named\n");
}

static int self_test(void) {
    char addr[128];
    busway_node *a = start_listener(1, addr, sizeof addr);
    busway_node *b = start_dialer(2, addr);
    CHECK(busway_wait_peer(b, 1, WAIT_MS), "2 reaches 1 at %s", addr);
    CHECK(busway_wait_peer(a, 2, WAIT_MS), "1 sees 2");
    million_each_way(a, b);
    calls(a, b);
    group_and_multicast(a, b);
    bad_input(a);
    /* A peer stopped at once (as if killed: no drain, no CLOSE) and back: 1 sees it go and come. */
    struct received at_a = {0};
    drain(a, &at_a);
    at_a.peer_downs = at_a.peer_ups = 0;
    busway_free(b);
    serve_until(a, &at_a, peer_down_seen, NULL);
    b = start_dialer(2, addr);
    serve_until(a, &at_a, peer_up_seen, NULL);
    struct sender again = {b, 1, 10000};
    struct received after = {.from = 2};
    send_sequenced(&again);
    uint64_t count = 10000;
    serve_until(a, &after, got_all, &count);
    printf("a peer stopped and back\n");
    /* A batch outlives its node: released after the stop. */
    CHECK(busway_send(b, 1, (const uint8_t *)"last", 4, NULL) == BUSWAY_STATUS_OK, "send");
    busway_batch *kept = NULL;
    uint64_t deadline = now_ms() + WAIT_MS;
    while (busway_recv(a, &kept) != BUSWAY_STATUS_OK) {
        CHECK(now_ms() < deadline, "the last message");
        wait_ready(a, 100);
    }
    busway_free(b);
    busway_stop(a, 0);
    size_t len;
    const uint8_t *p = busway_batch_payload(kept, 0, &len);
    CHECK(len == 4 && memcmp(p, "last", 4) == 0, "a batch kept after the stop");
    busway_batch_release(kept);
    printf("ok\n");
    return 0;
}

/* ---- against other processes ---- */

static int send_mode(const char *addr, uint64_t id, uint64_t to, uint64_t count) {
    busway_node *node = start_dialer(id, addr);
    CHECK(busway_wait_peer(node, to, WAIT_MS), "%" PRIu64 " up at %s", to, addr);
    struct sender s = {node, to, count};
    send_sequenced(&s);
    CHECK(busway_flush(node, WAIT_MS), "everything acknowledged");
    busway_stop(node, 1000);
    printf("sent %" PRIu64 "\n", count);
    return 0;
}

static int serve_mode(uint64_t id, uint64_t count) {
    char addr[128];
    busway_node *node = start_listener(id, addr, sizeof addr);
    printf("listening on %s\n", addr);
    fflush(stdout);
    struct received r = {0};
    uint64_t deadline = now_ms() + 4 * WAIT_MS;
    while (r.next < count) {
        CHECK(now_ms() < deadline, "%" PRIu64 " of %" PRIu64 " arrived", r.next, count);
        wait_ready(node, 100);
        drain(node, &r);
    }
    printf("received %" PRIu64 " in order, answered %" PRIu64 " requests\n", r.next, r.requests);
    busway_stop(node, 1000);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 2 && strcmp(argv[1], "self") == 0) return self_test();
    if (argc == 6 && strcmp(argv[1], "send") == 0)
        return send_mode(argv[2], strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10),
                         strtoull(argv[5], NULL, 10));
    if (argc == 4 && strcmp(argv[1], "serve") == 0)
        return serve_mode(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10));
    fprintf(stderr, "usage: ffi_test self | send ADDR ID TO COUNT | serve ID COUNT\n");
    return 2;
}
