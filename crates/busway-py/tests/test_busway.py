"""The Python package against a real `busway node` (the command from this repository's build):
messages, calls, a group, a multicast, events and errors, blocking and asyncio.

The command is found at $BUSWAY_BIN, else at target/release/busway of this repository."""
import asyncio
import os
import struct
import subprocess
import threading
from pathlib import Path

import pytest

import busway

ROOT = Path(__file__).resolve().parents[3]
BIN = os.environ.get("BUSWAY_BIN", str(ROOT / "target" / "release" / "busway"))
#: Longest any wait of these tests, in seconds.
WAIT = 30.0


@pytest.fixture
def hub():
    """A `busway node` (bus id 1) on a free port: every Python node here dials it."""
    p = subprocess.Popen([BIN, "node", "--id", "1", "--listen", "tcp://127.0.0.1:0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.startswith("listening on "), line
    yield line.split()[-1]
    p.terminate()
    p.wait(timeout=WAIT)


def sequenced(n, size=16):
    return struct.pack("<Q", n) + b"\xa5" * (size - 8)


def test_a_hundred_thousand_messages_cross_the_hub_in_order(hub):
    with busway.Node(2, upstream=hub) as a, busway.Node(3, upstream=hub) as b:
        assert a.wait_peer(1, WAIT) and b.wait_peer(1, WAIT)
        count = 100_000
        # Through the hub: 2 knows 3 only behind it. Batches and single sends both.
        for start in range(0, count, 1000):
            if start % 2000 == 0:
                a.send_batch(3, [sequenced(i) for i in range(start, start + 1000)])
            else:
                for i in range(start, start + 1000):
                    a.send(3, sequenced(i))
        for i in range(count):
            m = b.recv(timeout=WAIT)
            assert m is not None, f"message {i} never came"
            assert (m.src, struct.unpack("<Q", m.payload[:8])[0]) == (2, i)
        assert a.flush(WAIT)
        assert b.stats()["msgs_in"] >= count


def test_calls_are_answered_blocking_and_errors_carry_their_kind(hub):
    with busway.Node(2, upstream=hub) as server, busway.Node(3, upstream=hub) as client:
        assert server.wait_peer(1, WAIT) and client.wait_peer(1, WAIT)

        def serve():
            for _ in range(3):
                m = server.recv(timeout=WAIT)
                assert m is not None and m.is_request
                m.reply(b"re: " + m.payload)

        t = threading.Thread(target=serve)
        t.start()
        for i in range(3):
            r = client.call(2, b"ping %d" % i, timeout=WAIT)
            assert (r.src, r.payload) == (2, b"re: ping %d" % i)
        t.join(WAIT)
        with pytest.raises(busway.BuswayError) as e:
            client.call(99, b"nobody", timeout=0.5)
        assert e.value.kind in ("no_route", "timeout"), e.value.kind
        with pytest.raises(busway.BuswayError) as e:
            client.send(2, b"x" * (64 << 20))
        assert e.value.kind == "too_large"
        with pytest.raises(busway.BuswayError) as e:
            client.join("")
        assert e.value.kind == "bad_argument"


def test_a_group_a_multicast_and_the_events_of_a_peer_that_goes(hub):
    with busway.Node(2, upstream=hub) as a:
        b = busway.Node(3, upstream=hub)
        assert a.wait_peer(1, WAIT) and b.wait_peer(1, WAIT)
        a.join("room")
        for _ in range(int(WAIT * 100)):
            if b.publish("room", b"dragon") > 0:
                break
            threading.Event().wait(0.01)
        else:
            pytest.fail("the member never became known")
        assert b.multicast([2], b"to you") == 1
        got = {}
        while len(got) < 2:
            m = a.recv(timeout=WAIT)
            assert m is not None
            got[m.payload] = m.group
        assert got == {b"dragon": "room", b"to you": None}
        ups = []
        while not ups:
            ev = a.next_event(timeout=WAIT)
            assert ev is not None
            if ev.kind == "peer_up":
                ups.append(ev.peer)
        assert ups == [1]
        b.stop()
        with pytest.raises(busway.BuswayError) as e:
            b.send(2, b"after the stop")
        assert e.value.kind == "closed"


def test_a_bad_setting_is_named():
    with pytest.raises(busway.BuswayError) as e:
        busway.Node(5, toml="heartbeat_interval = 5\n")
    assert e.value.kind == "config"
    assert "heartbeat_interval" in str(e.value)
    with pytest.raises(busway.BuswayError):
        busway.Node(5, listen=["tcp://nowhere"])


def test_busway_listen_verifies_what_python_sends():
    listen = subprocess.Popen([BIN, "listen", "--id", "7", "--listen", "tcp://127.0.0.1:0", "--count",
                               "50000", "--verify"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    addr = listen.stdout.readline().split()[-1]
    with busway.Node(8, connect=[addr]) as n:
        assert n.wait_peer(7, WAIT)
        for start in range(0, 50_000, 5000):
            n.send_batch(7, [sequenced(i) for i in range(start, start + 5000)])
        assert n.flush(WAIT)
    out, err = listen.communicate(timeout=WAIT)
    assert listen.returncode == 0, err
    assert "received 50000, missing 0, duplicates 0, out-of-order 0" in out


def test_asyncio_recv_call_and_events(hub):
    async def main():
        server = busway.AsyncNode(2, upstream=hub)
        client = busway.AsyncNode(3, upstream=hub)
        assert await server.wait_peer(1, WAIT) and await client.wait_peer(1, WAIT)

        async def serve():
            while True:
                m = await server.recv()
                if m.is_request:
                    m.reply(m.payload.upper())
                else:
                    return m.payload

        serving = asyncio.create_task(serve())
        replies = await asyncio.wait_for(
            asyncio.gather(*(client.call(2, b"call %d" % i, WAIT) for i in range(50))), WAIT)
        assert replies == [b"CALL %d" % i for i in range(50)]
        await client.send(2, b"done")
        assert await asyncio.wait_for(serving, WAIT) == b"done"
        ev = await asyncio.wait_for(client.next_event(), WAIT)
        assert ev.kind == "peer_up" and ev.peer == 1
        with pytest.raises(busway.BuswayError) as e:
            await client.call(99, b"nobody", 0.5)
        assert e.value.kind in ("no_route", "timeout")
        await client.stop()
        await server.stop()

    asyncio.run(main())
