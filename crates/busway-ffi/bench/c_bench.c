/*
 * The C ABI's throughput and calls, measured as `busway bench` measures the Rust API's (see
 * scripts/bench-c, which runs both side by side): a sender process and a receiver process on
 * loopback TCP, payloads of sizes drawn uniformly from MIN..MAX.
 *
 *   c_bench recv ID [TOML_EXTRA]            listen on tcp://127.0.0.1:0, print "ready ADDR";
 *                                           count messages until an empty one, answer requests
 *   c_bench send ADDR ID TO SECS API MIN MAX [TOML_EXTRA]
 *                                           API batch (busway_send_batch of 256) or single
 *                                           (busway_send per message), for SECS seconds
 *   c_bench calls ADDR ID TO SECS INFLIGHT [TOML_EXTRA]
 *                                           busway_call_start with INFLIGHT calls in flight
 *
 * Each prints one JSON line: {"msgs": N, "secs": S, "per_sec": R}.
 */
#define _GNU_SOURCE
#include "busway.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#define SEND_BATCH_MSGS 256
#define SIZE_POOL_LEN 4096
#define WAIT_MS 10000

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void die(const char *what) {
    fprintf(stderr, "c_bench: %s: %s\n", what, busway_last_error());
    exit(1);
}

static busway_node *start(uint64_t id, const char *listen, const char *connect, const char *extra) {
    char toml[512];
    int n = snprintf(toml, sizeof toml, "id = %" PRIu64 "\n", id);
    if (listen) n += snprintf(toml + n, sizeof toml - n, "listen = [\"%s\"]\n", listen);
    if (connect) n += snprintf(toml + n, sizeof toml - n, "connect = [\"%s\"]\n", connect);
    if (extra) snprintf(toml + n, sizeof toml - n, "%s\n", extra);
    busway_node *node = NULL;
    if (busway_start_toml(toml, &node) != BUSWAY_STATUS_OK) die("start");
    return node;
}

static int recv_mode(uint64_t id, const char *extra) {
    busway_node *node = start(id, "tcp://127.0.0.1:0", NULL, extra);
    char addr[128];
    busway_listen_addr(node, 0, addr, sizeof addr);
    printf("ready %s\n", addr);
    fflush(stdout);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    epoll_ctl(ep, EPOLL_CTL_ADD, busway_fd(node), &ev);
    uint64_t msgs = 0;
    double first = 0, last = 0;
    for (int done = 0; !done;) {
        struct epoll_event out;
        epoll_wait(ep, &out, 1, 100);
        busway_batch *b;
        while (busway_recv(node, &b) == BUSWAY_STATUS_OK) {
            size_t n = busway_batch_len(b);
            for (size_t i = 0; i < n; i++) {
                size_t len;
                const uint8_t *p = busway_batch_payload(b, i, &len);
                if (busway_batch_is_request(b, i)) {
                    busway_reply_to(node, b, i, p, len, true);
                    continue;
                }
                if (len == 0) {
                    done = 1;
                    continue;
                }
                msgs++;
            }
            last = now_s();
            if (first == 0) first = last;
            busway_batch_release(b);
        }
        busway_event e;
        while (busway_next_event(node, &e) == BUSWAY_STATUS_OK) busway_event_release(&e);
    }
    double secs = last - first;
    printf("{\"msgs\": %" PRIu64 ", \"secs\": %.6f, \"per_sec\": %.1f}\n", msgs, secs, secs > 0 ? msgs / secs : 0.0);
    busway_stop(node, 1000);
    close(ep);
    return 0;
}

static int send_mode(const char *addr, uint64_t id, uint64_t to, double secs, const char *api, size_t min,
                     size_t max, const char *extra) {
    busway_node *node = start(id, NULL, addr, extra);
    if (!busway_wait_peer(node, to, WAIT_MS)) die("wait for the receiver");
    static uint8_t base[65536];
    memset(base, 0xA5, sizeof base);
    static size_t sizes[SIZE_POOL_LEN];
    srand(7);
    for (size_t i = 0; i < SIZE_POOL_LEN; i++) sizes[i] = min + (size_t)rand() % (max - min + 1);
    busway_slice batch[SEND_BATCH_MSGS];
    int single = strcmp(api, "single") == 0;
    uint64_t msgs = 0;
    size_t next = 0;
    double start_t = now_s(), elapsed = 0;
    while ((elapsed = now_s() - start_t) < secs) {
        if (single) {
            for (int i = 0; i < SEND_BATCH_MSGS; i++, next = (next + 1) % SIZE_POOL_LEN) {
                if (busway_send(node, to, base, sizes[next], NULL) != BUSWAY_STATUS_OK) die("send");
            }
        } else {
            for (int i = 0; i < SEND_BATCH_MSGS; i++, next = (next + 1) % SIZE_POOL_LEN) {
                batch[i].data = base;
                batch[i].len = sizes[next];
            }
            if (busway_send_batch(node, to, batch, SEND_BATCH_MSGS, NULL) != BUSWAY_STATUS_OK) die("send_batch");
        }
        msgs += SEND_BATCH_MSGS;
    }
    if (busway_send(node, to, NULL, 0, NULL) != BUSWAY_STATUS_OK) die("the end marker");
    busway_flush(node, 60000);
    printf("{\"msgs\": %" PRIu64 ", \"secs\": %.6f, \"per_sec\": %.1f}\n", msgs, elapsed, msgs / elapsed);
    busway_stop(node, 1000);
    return 0;
}

static int calls_mode(const char *addr, uint64_t id, uint64_t to, double secs, int inflight, const char *extra) {
    busway_node *node = start(id, NULL, addr, extra);
    if (!busway_wait_peer(node, to, WAIT_MS)) die("wait for the receiver");
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    epoll_ctl(ep, EPOLL_CTL_ADD, busway_fd(node), &ev);
    uint8_t payload[64];
    memset(payload, 1, sizeof payload);
    uint64_t token = 0, done = 0;
    for (; token < (uint64_t)inflight; token++) busway_call_start(node, to, payload, sizeof payload, WAIT_MS, token);
    double start_t = now_s(), elapsed = 0;
    while ((elapsed = now_s() - start_t) < secs) {
        struct epoll_event out;
        epoll_wait(ep, &out, 1, 100);
        busway_event e;
        while (busway_next_event(node, &e) == BUSWAY_STATUS_OK) {
            if (e.kind == BUSWAY_EVENT_KIND_CALL_DONE) {
                if (e.status != BUSWAY_STATUS_OK) die(e.text);
                done++;
                busway_call_start(node, to, payload, sizeof payload, WAIT_MS, token++);
            }
            busway_event_release(&e);
        }
    }
    printf("{\"msgs\": %" PRIu64 ", \"secs\": %.6f, \"per_sec\": %.1f}\n", done, elapsed, done / elapsed);
    busway_free(node);
    close(ep);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "recv") == 0) return recv_mode(strtoull(argv[2], NULL, 10), argc > 3 ? argv[3] : NULL);
    if (argc >= 9 && strcmp(argv[1], "send") == 0)
        return send_mode(argv[2], strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10), atof(argv[5]), argv[6],
                         strtoul(argv[7], NULL, 10), strtoul(argv[8], NULL, 10), argc > 9 ? argv[9] : NULL);
    if (argc >= 7 && strcmp(argv[1], "calls") == 0)
        return calls_mode(argv[2], strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10), atof(argv[5]),
                          atoi(argv[6]), argc > 7 ? argv[7] : NULL);
    fprintf(stderr, "usage: see the comment at the top of c_bench.c\n");
    return 2;
}
