// A game lobby on busway, in C++ inside its own epoll loop: it serves requests
// ("enter ROOM NAME" -> "welcome NAME to ROOM"), is a member of the group "lobby", publishes
// each arrival to the room's group "room-ROOM", and says when a peer goes down. SIGINT or
// SIGTERM stops it cleanly (exit 0).
//
//   lobby ID LISTEN_ADDR [UPSTREAM_ADDR]
//
// Behind an upstream (a `busway node` hub), every node that reaches the hub reaches the lobby.
#include "busway.hpp"

#include <csignal>
#include <pthread.h>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

namespace {

// Answers one request; the arrival goes to the room's group.
void serve_request(const busway::node &bus, const busway::batch &b, std::size_t i) {
    std::string_view req = b[i];
    std::string room, name;
    if (req.substr(0, 6) == "enter ") {
        auto rest = req.substr(6);
        auto space = rest.find(' ');
        room = std::string(rest.substr(0, space));
        name = space == std::string_view::npos ? "someone" : std::string(rest.substr(space + 1));
    }
    std::string answer = room.empty() ? "error: say \"enter ROOM NAME\"" : "welcome " + name + " to " + room;
    if (auto s = bus.reply_to(b, i, answer); !s) {
        std::fprintf(stderr, "lobby: reply to %llu: %s\n", (unsigned long long)b.src(), s.message().c_str());
    }
    if (!room.empty()) {
        auto places = bus.publish("room-" + room, name + " entered");
        if (!places) std::fprintf(stderr, "lobby: publish: %s\n", places.error().message().c_str());
    }
}

// Takes everything waiting: messages and requests, then events.
void drain(const busway::node &bus) {
    for (auto b = bus.recv(); b; b = bus.recv()) {
        for (std::size_t i = 0; i < b->size(); i++) {
            if (b->is_request(i)) {
                serve_request(bus, *b, i);
            } else {
                std::string group = b->group();
                std::printf("%s from %llu: %.*s\n", group.empty() ? "message" : group.c_str(),
                            (unsigned long long)b->src(), (int)(*b)[i].size(), (*b)[i].data());
            }
        }
    }
    for (auto e = bus.next_event(); e; e = bus.next_event()) {
        const busway_event &ev = e->raw();
        if (ev.kind == BUSWAY_EVENT_KIND_PEER_UP) std::printf("peer %llu up\n", (unsigned long long)ev.peer);
        if (ev.kind == BUSWAY_EVENT_KIND_PEER_DOWN)
            std::printf("peer %llu down: %s\n", (unsigned long long)ev.peer, ev.text);
    }
}

} // namespace

int main(int argc, char **argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: lobby ID LISTEN_ADDR [UPSTREAM_ADDR]\n");
        return 2;
    }
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    // The stop signals are blocked before the node starts: its threads inherit the mask, so
    // SIGTERM waits for this loop's signalfd instead of killing the process on their thread.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    std::string upstream = argc > 3 ? argv[3] : "";
    auto started = busway::node::start(std::strtoull(argv[1], nullptr, 10), {argv[2]}, {}, upstream);
    if (!started) {
        std::fprintf(stderr, "lobby: %s\n", started.error().message().c_str());
        return 1;
    }
    busway::node bus = std::move(*started);
    if (auto s = bus.join("lobby"); !s) {
        std::fprintf(stderr, "lobby: join: %s\n", s.message().c_str());
        return 1;
    }

    // One loop: the bus's descriptor and the stop signals.
    int sfd = signalfd(-1, &stop, SFD_CLOEXEC);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event bus_ev{}, sig_ev{};
    bus_ev.events = EPOLLIN;
    bus_ev.data.fd = bus.fd();
    sig_ev.events = EPOLLIN;
    sig_ev.data.fd = sfd;
    epoll_ctl(ep, EPOLL_CTL_ADD, bus.fd(), &bus_ev);
    epoll_ctl(ep, EPOLL_CTL_ADD, sfd, &sig_ev);

    std::printf("listening on %s\n", bus.listen_addr().c_str());
    for (bool running = true; running;) {
        epoll_event ready[2];
        int n = epoll_wait(ep, ready, 2, -1);
        for (int i = 0; i < n; i++) {
            if (ready[i].data.fd == sfd) running = false;
        }
        drain(bus);
    }
    std::printf("stopping\n");
    bus.stop(2000);
    close(ep);
    close(sfd);
    return 0;
}
